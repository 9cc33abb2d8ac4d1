r"""The Generalized Neural Operator.

$$
\mathcal{M}_\phi = \mathcal{Q} \circ \Phi_L \circ \dots \circ \Phi_1 \circ \mathcal{E},
$$

* $\mathcal{E}$: patch embedding of the input frames (normalised), plus a fixed positional
  encoding and, for field parameters $v(x)$, a patch embedding of the field.
* $\Phi_\ell$ (`GNOBlock`): the boundary transfer operator turns the boundary description and
  the near-boundary latent state into latent Dirichlet tokens $h_\ell$; a parameter-gated
  mixture of attention kernels integrates over the domain tokens and the context tokens
  $(\tilde\theta, h_\ell)$, running only each sample's selected kernel; the local term
  $W\langle\tilde\theta, \bar h_\ell, v\rangle + b$ and an MLP complete the block.
* $\mathcal{Q}$: each token back to its patch. The model predicts the increment over the last
  input frame (next-frame prediction).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from gno_ext.checks import require_at_least
from gno_ext.layers.attention import AttentionKernel, AttentionKernelBank
from gno_ext.layers.boundary import BoundaryTransfer, boundary_features, edge_tokens
from gno_ext.layers.embeddings import (
    ConvRefine,
    PatchEmbed,
    PatchProject,
    sincos_position,
    token_shape,
)
from gno_ext.layers.gate import ParameterGate, Routing, gate_input, route_all
from gno_ext.layers.mixture import GatedKernelMixture
from gno_ext.models.base import SchemaModel
from gno_ext.models.registry import register_model
from gno_ext.models.rollout import rollout
from gno_ext.schema import BoundarySpec, Grid, PDEBatch

__all__ = ["GNO", "GNOBlock"]


class GNOBlock(nn.Module):
    r"""One layer $\Phi_\ell$ of the GNO.

    Parameters
    ----------
    dim, heads, mlp_ratio : int, int, float
        Token width, attention heads, MLP width ratio.
    n_kernels : int
        Kernels in the mixture (1: a single attention kernel, no gate).
    gate_inputs : int
        Size of the gate's input.
    gate_hidden : int
        Hidden width of the gate.
    gate_noise : float
        Training-time noise on the gate scores.
    boundary : bool
        Whether the block has a boundary transfer operator.
    ndim : int
        Spatial dimension.
    """

    def __init__(self, dim: int, heads: int, mlp_ratio: float, n_kernels: int, gate_inputs: int,
                 gate_hidden: int, gate_noise: float, boundary: bool, ndim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.context_norm = nn.LayerNorm(dim)
        if n_kernels > 1:
            self.mixture = GatedKernelMixture(AttentionKernelBank(n_kernels, dim, heads),
                                              ParameterGate(gate_inputs, n_kernels, gate_hidden, gate_noise))
        else:
            self.mixture = None
            self.kernel = AttentionKernel(dim, heads)
        self.boundary = BoundaryTransfer(dim, ndim) if boundary else None
        self.local_state = nn.Linear(dim, dim)
        self.local_context = nn.Linear(2 * dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        hidden = int(mlp_ratio * dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor, theta_token: Tensor, routing: Routing | None,
                boundary: tuple[Tensor, ...] | None, grid_tokens: Sequence[int]) -> Tensor:
        """Update tokens ``x`` (B, N, D) given the parameter token (B, 1, D), the routing of this
        block's gate (computed by the model for all blocks at once) and boundary features."""
        context = theta_token
        h_mean = torch.zeros_like(theta_token)
        if self.boundary is not None and boundary is not None:
            h = self.boundary(boundary, edge_tokens(x, grid_tokens))
            context = torch.cat([theta_token, h], 1)
            h_mean = h.mean(1, keepdim=True)
        context = self.context_norm(context)
        xn = self.norm(x)
        if self.mixture is not None:
            integral = self.mixture(xn, None, routing=routing, context=context)
        else:
            integral = self.kernel(xn, context)
        local = self.local_state(xn) + self.local_context(torch.cat([theta_token, h_mean], -1))
        x = x + integral + local
        return x + self.mlp(self.mlp_norm(x))


@register_model("gno")
class GNO(SchemaModel):
    r"""Generalized Neural Operator for next-frame prediction.

    Defaults are the paper's (Appendix E): latent 256, patch 16, 8 blocks, 8 heads, MLP
    ratio 4, ``K = 4`` kernels, gate hidden size 32.

    Parameters
    ----------
    in_channels : int
        Channels ``C`` of the field.
    out_channels : int, optional
        Output channels (default ``in_channels``; then the model predicts an increment).
    n_params : int
        Number of scalar parameters ``P`` in ``theta``.
    field_channels : int
        Channels of ``theta_field`` (e.g. 2 for a 2-D velocity), 0 if none.
    ndim : int
        Spatial dimension (1, 2 or 3).
    t_in : int
        Input frames ``T_in`` (1 in the paper).
    latent, patch, depth, heads, mlp_ratio : int, int, int, int, float
        Backbone sizes.
    n_kernels : int
        Kernels per block ``K``; 1 disables the mixture (ablation).
    gate_hidden : int
        Hidden width of each gate.
    gate_noise : float
        Standard deviation of training-time noise on the gate scores.
    boundary_transfer : bool
        False disables the boundary transfer operator (ablation).
    log_params : sequence of bool, optional
        Which parameters are normalised on a log scale (e.g. ``[True]`` for a diffusivity).
    decoder : {"linear", "conv"}
        ``linear`` (the paper's): each token to its patch by one linear map (`PatchProject`).
        ``conv``: that projection followed by `ConvRefine`, two 3x3 convolutions at full
        resolution that see the projection and the input frames, so that patches join smoothly.
    decoder_hidden : int
        Channels of the ``conv`` decoder's hidden convolution.

    Examples
    --------
    >>> model = GNO(latent=32, patch=8, depth=2, heads=4)
    >>> u = torch.randn(2, 1, 1, 32, 32)
    >>> model(u, theta=torch.rand(2, 1), bc=BoundarySpec.periodic(2, batch_size=2)).shape
    torch.Size([2, 1, 1, 32, 32])
    """

    def __init__(self, in_channels: int = 1, out_channels: int | None = None, n_params: int = 1,
                 field_channels: int = 0, ndim: int = 2, t_in: int = 1, latent: int = 256, patch: int = 16,
                 depth: int = 8, heads: int = 8, mlp_ratio: float = 4.0, n_kernels: int = 4,
                 gate_hidden: int = 32, gate_noise: float = 0.0, boundary_transfer: bool = True,
                 log_params: Sequence[bool] | None = None, decoder: str = "linear", decoder_hidden: int = 32) -> None:
        # (ndim is checked by PatchEmbed, built before anything that depends on it)
        require_at_least(1, in_channels=in_channels, t_in=t_in, latent=latent, patch=patch, depth=depth,
                         heads=heads, n_kernels=n_kernels, gate_hidden=gate_hidden)
        require_at_least(0, n_params=n_params, field_channels=field_channels, gate_noise=gate_noise)
        if out_channels is not None:
            require_at_least(1, out_channels=out_channels)
        if int(mlp_ratio * latent) < 1:
            raise ValueError(f"mlp_ratio: the MLP needs at least one unit, got {mlp_ratio} at latent {latent}")
        if decoder not in ("linear", "conv"):
            raise ValueError(f"decoder: expected 'linear' or 'conv', got {decoder!r}")
        out_channels = out_channels or in_channels
        gate_inputs = n_params + 2 * field_channels
        if n_kernels > 1 and gate_inputs == 0:
            raise ValueError("n_kernels > 1 needs something to gate on: n_params or field_channels must be > 0")
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        if not n_params:  # (no parameter statistics: the checkpoints of such GNOs hold none)
            self.param_norm = None
        self.out_channels, self.patch, self.boundary_transfer = out_channels, patch, boundary_transfer
        self.embed = PatchEmbed(t_in * in_channels, latent, patch, ndim)
        self.field_embed = PatchEmbed(field_channels, latent, patch, ndim) if field_channels else None
        self.theta_embed = nn.Sequential(nn.Linear(max(gate_inputs, 1), latent), nn.GELU(), nn.Linear(latent, latent))
        self.blocks = nn.ModuleList(
            GNOBlock(latent, heads, mlp_ratio, n_kernels, gate_inputs, gate_hidden, gate_noise, boundary_transfer, ndim)
            for _ in range(depth))
        self.project = PatchProject(latent, out_channels, patch, ndim)
        self.refine = ConvRefine(out_channels, t_in * in_channels, decoder_hidden, ndim) if decoder == "conv" else None

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        r"""Predict the next frame.

        Parameters
        ----------
        u_in : Tensor, shape (B, T_in, C, *S), or PDEBatch
            Input frames (or a whole batch, whose fields are then used).
        theta : Tensor, shape (B, P)
            Raw physical parameters.
        theta_field : Tensor, shape (B, C_f, *S), optional
            Field parameters.
        bc : BoundarySpec, optional
            Batched boundary spec; ``values[:, :, 0]`` is the data at the input time and
            ``values[:, :, -1]`` at the target time. Default: all faces periodic.
        grid : Grid, optional
            Default: the unit box of ``u_in``'s shape.

        Returns
        -------
        Tensor, shape (B, 1, C_out, *S)
        """
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        b, spatial = u_in.shape[0], tuple(u_in.shape[3:])
        grid_tokens = token_shape(spatial, self.patch)
        x = self.normalized_input(u_in)
        tokens = self.embed(x) + sincos_position(grid_tokens, self.embed.proj.out_channels, x.device, x.dtype)
        if self.field_embed is not None:
            tokens = tokens + self.field_embed(theta_field.to(x.dtype))
        conditions = gate_input(None if self.param_norm is None else self.param_norm(theta).to(x.dtype),
                                None if self.field_embed is None else theta_field.to(x.dtype), self.ndim)
        theta_token = self.theta_embed(conditions if conditions is not None else x.new_zeros(b, 1))[:, None]
        routings = route_all([blk.mixture.gate for blk in self.blocks if blk.mixture is not None], conditions)
        routing_of = iter(routings)
        features = None
        if self.boundary_transfer:
            features = boundary_features(bc, grid, self.patch, self.u_std.mean())
        for block in self.blocks:
            routing = next(routing_of) if block.mixture is not None else None
            tokens = block(tokens, theta_token, routing, features, grid_tokens)
        delta = self.project(tokens, grid_tokens)
        if self.refine is not None:
            delta = self.refine(delta, x)
        if self.out_channels == self.in_channels:
            return self.increment(u_in, delta)
        std = self._std()
        return delta[:, None] * std + self.u_mean.view_as(std)

    def rollout(self, batch: PDEBatch, steps: int) -> Tensor:
        """Autoregressive prediction of ``steps`` frames (see `gno_ext.models.rollout.rollout`).

        Returns
        -------
        Tensor, shape (B, steps, C, *S)
        """
        return rollout(self, batch, steps)
