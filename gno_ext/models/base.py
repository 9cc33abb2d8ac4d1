"""What every grid model shares (the GNO, the GNO on the FNO and every baseline): the schema
forward, the input checks, the normalisation, and condition encodings.

A model predicts the next frame from ``u_in`` (B, T_in, C, *S) through
``forward(u_in, theta=, theta_field=, bc=, grid=)`` (or a `PDEBatch`), as an increment over
the last input frame in the units of the training data's per-channel statistics. What a model
uses of ``theta``, ``theta_field`` and ``bc`` is its own affair and said in its docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gno_ext.layers.embeddings import ParameterNormalizer, field_statistics
from gno_ext.layers.gate import gate_input
from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch, check_model_inputs, face_view, model_inputs

__all__ = ["SchemaModel", "TransformerBlock", "boundary_summary", "boundary_channels", "neuralop_fno", "N_TYPES"]

N_TYPES = len(BCType)


def boundary_summary(bc: BoundarySpec, scale: Tensor | float = 1.0) -> Tensor:
    """A fixed-size description of a batched boundary spec, ``(B, F * (N_TYPES + 2))``: per face
    the one-hot type, and the mean data at the input and the target time divided by ``scale``."""
    kind = F.one_hot(bc.kind.long(), N_TYPES).to(bc.values.dtype)  # (B, F, N_TYPES)
    start = bc.values[:, :, 0].mean(-1, keepdim=True) / scale
    target = bc.values[:, :, -1].mean(-1, keepdim=True) / scale
    return torch.cat([kind, start, target], -1).flatten(1)


def boundary_channels(bc: BoundarySpec, grid: Grid, scale: Tensor | float = 1.0) -> Tensor:
    """The boundary description painted on the grid, ``(B, N_TYPES + 1, *S)``: on the layer of
    cells next to each face, the face's type (one-hot) and its data at the target time
    (divided by ``scale``); zero inside. Corner cells take the sum of their faces."""
    b = bc.kind.shape[0]
    out = bc.values.new_zeros(b, N_TYPES + 1, *grid.shape)
    for face in range(grid.n_faces):
        axis, side = divmod(face, 2)
        index = [slice(None)] * grid.ndim
        index[axis] = 0 if side == 0 else grid.shape[axis] - 1
        data = face_view(bc.values[:, :, -1], face, grid) / scale  # (B, *face_shape)
        kind = F.one_hot(bc.kind[:, face].long(), N_TYPES).to(out.dtype)  # (B, N_TYPES)
        view = out[(slice(None), slice(None), *index)]  # (B, N_TYPES + 1, *face_shape)
        shape = (b, N_TYPES) + (1,) * (view.ndim - 2)
        view[:, :N_TYPES] += kind.view(shape)
        view[:, N_TYPES] += data
    return out


def neuralop_fno(ndim: int, n_modes: int, in_channels: int, out_channels: int, hidden_channels: int,
                 n_layers: int, fourier: str = "dft", activations: str = "float32",
                 conv_module: Any = None, checkpoint_blocks: bool = False) -> nn.Module:
    """neuraloperator's ``FNO`` (an optional dependency, imported here) with ``n_modes`` modes on
    each of ``ndim`` axes, its spectral convolutions `FullPrecisionSpectralConv`s (their
    transforms by ``fourier``: the retained modes alone, or the FFT) so that it trains under
    bf16 autocast (cuFFT has no bf16 transform), or ``conv_module`` where given, and its grid
    coordinates `GridCoordinates` (made at each call: compiled once, capturable);
    ``activations``: their type under autocast (`gno_ext.layers.spectral.ACTIVATIONS`);
    ``checkpoint_blocks``: recompute its blocks in the backward pass
    (`gno_ext.layers.spectral.checkpoint_blocks`)."""
    import functools

    from neuralop.models import FNO

    from gno_ext.layers.embeddings import use_grid_coordinates
    from gno_ext.layers.spectral import FullPrecisionSpectralConv, checkpoint_blocks as recompute, with_activations

    conv = functools.partial(FullPrecisionSpectralConv, fourier=fourier) if conv_module is None else conv_module
    net = FNO((n_modes,) * ndim, in_channels, out_channels, hidden_channels, n_layers=n_layers, conv_module=conv)
    return recompute(with_activations(use_grid_coordinates(net), activations), checkpoint_blocks)


class TransformerBlock(nn.Module):
    """Pre-norm self-attention (``scaled_dot_product_attention``) and MLP."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}")
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        hidden = int(mlp_ratio * dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def attention(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, n, d))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SchemaModel(nn.Module):
    """Base of the grid models: input checks, field and parameter normalisation, the increment.

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in : int
        Read from the data by the recipes.
    log_params : sequence of bool, optional
        Parameters normalised on a log scale.
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2,
                 t_in: int = 1, log_params: Sequence[bool] | None = None) -> None:
        super().__init__()
        self.in_channels, self.n_params, self.field_channels = in_channels, n_params, field_channels
        self.ndim, self.t_in = ndim, t_in
        self.register_buffer("u_mean", torch.zeros(in_channels))
        self.register_buffer("u_std", torch.ones(in_channels))
        self.param_norm = ParameterNormalizer(n_params, log_params)

    @torch.no_grad()
    def fit_normalization(self, u: Tensor, theta: Tensor | None = None) -> SchemaModel:
        """Set the field statistics from samples ``u`` (N, T, C, *S) and the parameter
        normalisation from ``theta`` (N, P)."""
        mean, std = field_statistics(u, self.in_channels, self.ndim)
        if theta is not None and self.n_params:
            self.param_norm.fit(theta)  # (checked before any statistic is set)
        self.u_mean.copy_(mean)
        self.u_std.copy_(std)
        return self

    def _std(self) -> Tensor:
        return self.u_std.view(1, 1, -1, *([1] * self.ndim))

    def check(self, u_in: Tensor, theta: Tensor | None, theta_field: Tensor | None) -> None:
        """Raise a `ValueError` naming the input whose shape does not fit (`check_model_inputs`)."""
        check_model_inputs(u_in, theta, theta_field, t_in=self.t_in, in_channels=self.in_channels, ndim=self.ndim,
                           n_params=self.n_params, field_channels=self.field_channels)

    def normalized_input(self, u_in: Tensor) -> Tensor:
        """Input frames, normalised, stacked on channels: ``(B, T_in * C, *S)``."""
        std = self._std()
        return ((u_in - self.u_mean.view_as(std)) / std).flatten(1, 2)

    def increment(self, u_in: Tensor, delta: Tensor) -> Tensor:
        """The next frame from a normalised increment ``delta`` (B, C, *S)."""
        return u_in[:, -1:] + delta[:, None] * self._std()

    def condition(self, theta: Tensor | None, theta_field: Tensor | None, bc: BoundarySpec,
                  batch: int, dtype: torch.dtype, use_boundary: bool = True) -> Tensor:
        """Domain-wise condition vector: the gates' input (`gno_ext.layers.gate.gate_input`:
        normalised ``theta``, the mean and RMS of each field parameter channel) and
        (``use_boundary``) the `boundary_summary` of ``bc`` (as `inputs` returns it)."""
        gated = gate_input(self.param_norm(theta) if self.n_params else None,
                           theta_field if self.field_channels else None, self.ndim)
        parts = [] if gated is None else [gated]
        if use_boundary:
            parts.append(boundary_summary(bc, self.u_std.mean()))
        if not parts:
            return self.u_std.new_zeros(batch, 1).to(dtype)
        return torch.cat(parts, 1).to(dtype)

    def condition_size(self, use_boundary: bool = True) -> int:
        """Length of `condition`'s vector."""
        n = self.n_params + 2 * self.field_channels + (2 * self.ndim * (N_TYPES + 2) if use_boundary else 0)
        return max(n, 1)

    def inputs(self, u_in: Tensor | PDEBatch, theta: Tensor | None, theta_field: Tensor | None,
               bc: BoundarySpec | None, grid: Grid | None) -> tuple:
        """``forward``'s arguments (from a `PDEBatch` or as given), checked, with the defaults
        filled in: periodic faces on ``u_in``'s device and the unit box of its shape."""
        return model_inputs(u_in, theta, theta_field, bc, grid, ndim=self.ndim, check=self.check)

    def parameter_channels(self, x: Tensor, theta: Tensor | None, theta_field: Tensor | None) -> list[Tensor]:
        """The normalised ``theta`` broadcast over the grid of ``x`` (B, *, *S) and the field
        parameters, as extra input channels (none without parameters)."""
        parts = []
        if self.n_params:
            t = self.param_norm(theta).to(x.dtype)
            parts.append(t.view(*t.shape, *([1] * self.ndim)).expand(-1, -1, *x.shape[2:]))
        if self.field_channels:
            parts.append(theta_field.to(x.dtype))
        return parts

    def condition_encoder(self, width: int) -> nn.Sequential:
        """An MLP from the `condition` vector to ``width`` features."""
        return nn.Sequential(nn.Linear(self.condition_size(), width), nn.GELU(), nn.Linear(width, width))
