r"""A graph baseline for the mesh recipes (`get_model("mesh_gnn")`): the information the mesh GNO
receives, given as node features to one graph kernel network.

Each node's features are its normalised input frames, its position, its field parameters, the
graph's normalised parameters $\theta$ (the same on every node) and, on boundary nodes, the
boundary condition: a one-hot of its type (Dirichlet, Neumann, Robin), its datum and its outward
normal (zeros on interior nodes). They are lifted to ``latent`` channels; ``depth`` residual
blocks follow, each a `GraphKernelIntegral` over the mesh's edges (an offset-dependent kernel
averaged over the neighbours) and an MLP; the output is the next frame, ``u_in[:, -1] + std *
delta``. There is no gate (one kernel for every $\theta$) and no boundary transfer operator
(the boundary enters only through its nodes' features): the row the mesh GNO must beat with
the same inputs.

`MeshPersistence` (`get_model("mesh_persistence")`) is the mesh recipes' ``persistence`` row:
the last input frame copied forward, no weights (the recipes evaluate it without training).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gno_ext.checks import require_at_least
from gno_ext.layers.graph import GraphKernelIntegral
from gno_ext.models.gno_mesh import MeshModel
from gno_ext.models.registry import register_model
from gno_ext.schema import BCType

__all__ = ["MeshGNN", "MeshPersistence"]

KINDS = (BCType.DIRICHLET, BCType.NEUMANN, BCType.ROBIN)


class MeshGNNBlock(nn.Module):
    """``h + K(LN(h))``, then ``h + MLP(LN(h))``."""

    def __init__(self, dim: int, ndim: int, hidden: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.kernel = GraphKernelIntegral(dim, ndim, hidden)
        width = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, width), nn.GELU(), nn.Linear(width, dim))

    def forward(self, h: Tensor, data: Any) -> Tensor:
        h = h + self.kernel(self.norm1(h), data.edge_index, data.batch, pos=data.pos.to(h.dtype))
        return h + self.mlp(self.norm2(h))


@register_model("mesh_gnn")
class MeshGNN(MeshModel):
    """The graph baseline (see the module's text).

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As for `gno_ext.models.gno_mesh.GNOMesh`.
    latent, depth : int
        Width and residual blocks.
    kernel_hidden : int
        Hidden width of each kernel's MLP.
    mlp_ratio : float
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2,
                 t_in: int = 1, log_params: Sequence[bool] | None = None, latent: int = 64, depth: int = 4,
                 kernel_hidden: int = 64, mlp_ratio: float = 2.0) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        require_at_least(1, latent=latent, depth=depth, kernel_hidden=kernel_hidden)
        features = t_in * in_channels + ndim + field_channels + n_params + len(KINDS) + 1 + ndim
        self.lift = nn.Linear(features, latent)
        self.blocks = nn.ModuleList(MeshGNNBlock(latent, ndim, kernel_hidden, mlp_ratio) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(latent), nn.Linear(latent, in_channels))

    def boundary_features(self, data: Any) -> Tensor:
        """Per node: the one-hot of its boundary type, its datum (first time) and its outward
        normal; zeros on interior nodes. ``(N, 3 + 1 + d)``."""
        n = data.pos.shape[0]
        out = data.pos.new_zeros(n, len(KINDS) + 1 + self.ndim)
        index, kind = data.boundary_index, data.boundary_kind.long()
        onehot = torch.stack([kind == int(k) for k in KINDS], 1).to(out.dtype)
        datum = data.boundary_values[:, :1].to(out.dtype) / self.u_std.mean()  # on the fields' scale
        out[index] = torch.cat([onehot, datum, data.boundary_normal.to(out.dtype)], 1)
        return out

    def forward(self, data: Any) -> Tensor:
        """The next frame at every node, ``(N, 1, C)``, of a torch-geometric batch of mesh samples."""
        x = self.node_inputs(data)
        parts = [x]
        if self.param_norm is not None:
            parts.append(self.param_norm(data.theta).to(x.dtype).index_select(0, data.batch))
        parts.append(self.boundary_features(data).to(x.dtype))
        h = self.lift(torch.cat(parts, 1))
        for block in self.blocks:
            h = block(h, data)
        return self.next_frame(data, self.head(h))


@register_model("mesh_persistence")
class MeshPersistence(MeshModel):
    """The last input frame as the prediction of the next, on every node: what a mesh model that
    has learnt nothing scores (the grid recipes' ``persistence``). No weights.

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As for `gno_ext.models.gno_mesh.GNOMesh` (the inputs are checked against them).
    """

    def forward(self, data: Any) -> Tensor:
        """``u_in[:, -1:]``, shape ``(N, 1, C)``."""
        self.node_inputs(data)  # the batch checked
        return data.u_in[:, -1:]
