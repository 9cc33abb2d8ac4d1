r"""The GNO on irregular domains (`get_model("gno_mesh")`): gated graph kernels and the boundary
transfer operator over the nodes of a mesh or point set (`gno_ext.mesh`).

Per block, as in the grid GNO:

$$
h \leftarrow h + \sum_k g_k(\theta)\, \mathcal K_k\big[\mathrm{LN}(h);\ \text{neighbours},
\ \text{boundary tokens}\big], \qquad h \leftarrow h + \mathrm{MLP}(\mathrm{LN}(h)),
$$

where the boundary tokens are one latent Dirichlet vector per boundary segment
(`GraphBoundaryTransfer`, from the current latent state at the boundary nodes and their
conditions), the kernels are `GraphAttentionKernel`s (``kernel="attention"``: over each node's
neighbours and its graph's boundary tokens) or `GraphKernelIntegral`s (``kernel="integral"``,
neighbours only; the boundary tokens then enter through a projection added to every node), and
each graph's gate reads its normalised parameters and the mean and RMS of its field
parameters. The gate either chooses one kernel per graph (the grid GNO's rule) or, with
``soft_routing``, mixes them by its probabilities; with ``boundary_nodes`` each boundary
node's own vector of the transfer (before the segment's average) is also added to that node's
state, so that a node knows its own condition and datum. The `gno_mesh` recipe configuration
sets both: on the square's heat trajectories they took the model's rollout error from 0.92 to
0.09 (docs/irregular-domains.md). The nodes are lifted from their input frames (normalised), positions and field
parameters; the output is the next frame at every node, ``u_in[:, -1] + std * delta``.

The model takes a batch of `MeshSample`s as torch-geometric builds it (`collate_meshes`), with
``edge_index`` (a mesh's edges, or `gno_ext.mesh.radius_edges`). Requires torch-geometric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.utils import scatter

from gno_ext.checks import require_at_least
from gno_ext.layers.embeddings import ParameterNormalizer
from gno_ext.layers.gate import ParameterGate
from gno_ext.layers.graph import GraphAttentionKernel, GraphBoundaryTransfer, GraphKernelIntegral, GraphKernelMixture
from gno_ext.models.registry import register_model

__all__ = ["GNOMesh", "MeshModel"]

KERNELS = ("attention", "integral")


class MeshModel(nn.Module):
    """What the models of meshes share: the data sizes, the parameters' and fields'
    normalisation (`fit_normalization`) and the check of a batch's inputs.

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As for `GNOMesh`.
    """

    data_kind = "mesh"  # the recipes' data it takes: torch-geometric batches of mesh samples

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2,
                 t_in: int = 1, log_params: Sequence[bool] | None = None) -> None:
        super().__init__()
        require_at_least(1, in_channels=in_channels, t_in=t_in)
        require_at_least(0, n_params=n_params, field_channels=field_channels)
        if ndim not in (2, 3):
            raise ValueError(f"ndim: expected 2 or 3, got {ndim}")
        self.in_channels, self.n_params, self.field_channels, self.ndim, self.t_in = (
            in_channels, n_params, field_channels, ndim, t_in)
        self.param_norm = ParameterNormalizer(n_params, log_params) if n_params else None
        self.register_buffer("u_mean", torch.zeros(in_channels))
        self.register_buffer("u_std", torch.ones(in_channels))

    @torch.no_grad()
    def fit_normalization(self, u: Tensor, theta: Tensor | None = None) -> MeshModel:
        """Field statistics from node values ``u`` (..., C) and the parameters' from ``theta`` (G, P)."""
        if u.shape[-1] != self.in_channels:
            raise ValueError(f"u: expected {self.in_channels} channels on the last axis, got shape {tuple(u.shape)}")
        flat = u.reshape(-1, self.in_channels).float()
        if theta is not None and self.param_norm is not None:
            self.param_norm.fit(theta)
        self.u_mean.copy_(flat.mean(0))
        self.u_std.copy_(flat.std(0, unbiased=False).clamp_min(1e-6))
        return self

    def node_inputs(self, data: Any) -> Tensor:
        """The batch checked, and each node's normalised input frames, positions and field
        parameters, ``(N, T_in C + d + C_f)``."""
        for name in ("edge_index", "batch"):
            if getattr(data, name, None) is None:
                raise ValueError(f"data.{name}: {type(self).__name__} needs it (collate_meshes with samples that "
                                 "have edges)")
        u = data.u_in
        if u.ndim != 3 or u.shape[1:] != (self.t_in, self.in_channels):
            raise ValueError(f"data.u_in: expected shape (N, {self.t_in}, {self.in_channels}), got {tuple(u.shape)}")
        x = ((u - self.u_mean) / self.u_std).flatten(1)
        parts = [x, data.pos.to(x.dtype)]
        if self.field_channels:
            parts.append(data.theta_field.to(x.dtype))
        return torch.cat(parts, 1)

    def next_frame(self, data: Any, delta: Tensor) -> Tensor:
        """``u_in[:, -1] + std * delta``, shaped ``(N, 1, C)``."""
        return (data.u_in[:, -1] + delta * self.u_std)[:, None]


class GNOMeshBlock(nn.Module):
    """One block: the gated graph kernel with the boundary tokens as context (beside it, with
    ``local``, an ungated kernel integral over the mesh's edges), then an MLP."""

    def __init__(self, dim: int, ndim: int, heads: int, n_kernels: int, gate_inputs: int, gate_hidden: int,
                 kernel: str, boundary_transfer: bool, mlp_ratio: float, soft_routing: bool = False,
                 relative_positions: bool = False, local: bool = False, boundary_nodes: bool = False) -> None:
        super().__init__()
        make = (lambda: GraphAttentionKernel(dim, heads, ndim if relative_positions else None)) \
            if kernel == "attention" else (lambda: GraphKernelIntegral(dim, ndim, 2 * dim))
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mixture = GraphKernelMixture([make() for _ in range(n_kernels)],
                                          ParameterGate(max(gate_inputs, 1), n_kernels, gate_hidden), soft_routing)
        self.boundary = GraphBoundaryTransfer(dim, ndim, 2 * dim) if boundary_transfer else None
        # the integral kernel takes no context: its graph's boundary tokens reach the nodes through this
        self.to_nodes = nn.Linear(dim, dim) if boundary_transfer and kernel == "integral" else None
        # each boundary node's own vector of the transfer, added to its state
        self.to_boundary_nodes = nn.Linear(dim, dim) if boundary_transfer and boundary_nodes else None
        self.local = GraphKernelIntegral(dim, ndim, dim) if local else None
        self.mlp = nn.Sequential(nn.Linear(dim, int(mlp_ratio * dim)), nn.GELU(), nn.Linear(int(mlp_ratio * dim), dim))

    def forward(self, h: Tensor, gate_in: Tensor, data: Any, scale: Tensor) -> Tensor:
        context = context_batch = None
        # a padded batch (`gno_ext.mesh.PaddedMeshes`) gives its sizes: static shapes, no host reads
        n_segments = getattr(data, "n_segments", None)
        n_graphs = data.num_graphs if n_segments is not None else None
        if self.boundary is not None:
            per_node = self.boundary.describe(
                h, data.pos, data.boundary_index, data.boundary_kind, data.boundary_values, data.boundary_normal,
                getattr(data, "boundary_coeffs", None), scale)
            context, context_batch = self.boundary.pool(per_node, data.batch, data.boundary_index,
                                                        data.boundary_segment,
                                                        None if n_graphs is None else (n_graphs, n_segments))
            if self.to_boundary_nodes is not None:
                # (in the state's type: under autocast the projection gives bf16, the residual stream is float32)
                h = h.index_add(0, data.boundary_index, self.to_boundary_nodes(per_node).to(h.dtype))
        x = self.norm1(h)
        if self.to_nodes is not None:
            pooled = scatter(context, context_batch, 0, dim_size=gate_in.shape[0], reduce="mean")
            x = x + self.to_nodes(pooled).index_select(0, data.batch)
            context = context_batch = None
        h = h + self.mixture(x, gate_in, data.edge_index, data.batch, data.pos, context, context_batch, n_graphs)
        if self.local is not None:
            h = h + self.local(x, data.edge_index, data.batch, data.pos.to(x.dtype))
        return h + self.mlp(self.norm2(h))


@register_model("gno_mesh")
class GNOMesh(MeshModel):
    """The GNO on graphs (see the module's text).

    Parameters
    ----------
    in_channels : int
        Field channels ``C``.
    n_params : int
        Scalar parameters ``P`` per graph.
    field_channels : int
        Field-parameter channels per node (0: none).
    ndim : int
        Dimension of the positions (2 or 3).
    t_in : int
        Input frames.
    log_params : sequence of bool, optional
        Parameters normalised on a log scale.
    latent, depth, heads : int
        Latent width, blocks, attention heads.
    n_kernels : int
        Kernels per block (1: no gate needed; with ``n_params = 0`` and no field parameters it
        must be 1).
    gate_hidden : int
    kernel : {"attention", "integral"}
    boundary_transfer : bool
        The boundary tokens (False: the ablation without them).
    mlp_ratio : float
    soft_routing : bool
        Mix the kernels by the gate's probabilities instead of choosing one per graph
        (`GraphKernelMixture`).
    relative_positions : bool
        The attention kernel reads each edge's offset (`GraphAttentionKernel`'s ``ndim``; the
        integral kernel always does).
    local : bool
        An ungated `GraphKernelIntegral` over the mesh's edges beside the gated kernel in every
        block: a local difference stencil that does not depend on the gate.
    boundary_nodes : bool
        Add each boundary node's vector of the boundary transfer (its type, data, normal and
        state) to that node's state, as well as averaging them into the segment's token
        (needs ``boundary_transfer``).
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2,
                 t_in: int = 1, log_params: Sequence[bool] | None = None, latent: int = 64, depth: int = 4,
                 heads: int = 4, n_kernels: int = 4, gate_hidden: int = 32, kernel: str = "attention",
                 boundary_transfer: bool = True, mlp_ratio: float = 2.0, soft_routing: bool = False,
                 relative_positions: bool = False, local: bool = False, boundary_nodes: bool = False) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        require_at_least(1, latent=latent, depth=depth, heads=heads, n_kernels=n_kernels, gate_hidden=gate_hidden)
        if kernel not in KERNELS:
            raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")
        gate_inputs = n_params + 2 * field_channels
        if n_kernels > 1 and gate_inputs == 0:
            raise ValueError(f"n_kernels={n_kernels}: the gate needs parameters or field parameters to read")
        if boundary_nodes and not boundary_transfer:
            raise ValueError("boundary_nodes=True: the boundary nodes' vectors come from the boundary transfer; "
                             "set boundary_transfer=True, or boundary_nodes=False for the ablation without it")
        self.lift = nn.Linear(t_in * in_channels + ndim + field_channels, latent)
        self.blocks = nn.ModuleList(
            GNOMeshBlock(latent, ndim, heads, n_kernels, gate_inputs, gate_hidden, kernel, boundary_transfer, mlp_ratio,
                         soft_routing, relative_positions, local, boundary_nodes)
            for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(latent), nn.Linear(latent, in_channels))

    def gate_input(self, data: Any) -> Tensor:
        """Each graph's gate input (G, P + 2 C_f): normalised parameters, then the mean and RMS over
        the graph's nodes of each field parameter (`gno_ext.layers.gate.gate_input` on a graph)."""
        graphs = data.num_graphs
        parts = [self.param_norm(data.theta)] if self.param_norm is not None else []
        if self.field_channels:
            f = data.theta_field.float()
            parts += [scatter(f, data.batch, 0, dim_size=graphs, reduce="mean"),
                      scatter(f.square(), data.batch, 0, dim_size=graphs, reduce="mean").sqrt()]
        return torch.cat(parts, 1) if parts else data.pos.new_zeros(graphs, 1)

    def forward(self, data: Any) -> Tensor:
        """The next frame at every node, ``(N, 1, C)``, of a torch-geometric batch of mesh samples."""
        h = self.lift(self.node_inputs(data))
        gate_in = self.gate_input(data).to(h.dtype)
        for block in self.blocks:
            h = block(h, gate_in, data, self.u_std.mean())
        return self.next_frame(data, self.head(h))
