r"""CAPE baselines: channel-attention parameter embedding in front of a U-Net, an FNO or a ViT.

CAPE (Takamoto, Alesiani and Niepert, 2023) turns the PDE parameters into extra input channels
of an ordinary surrogate. This implementation follows the method as described there and in the
GNO paper's Appendix E (widening factor 64, kernel size 5, normalised dimension 128, a final
1x1 convolution, 3 parameter-embedding channels): for each parameter $\theta_p$ an MLP of hidden
width ``norm_dim`` gives channel weights $a_p(\theta_p) \in \mathbb{R}^{3 \times w}$; the
input, widened to ``w = widening`` channels, passes three operators (point-wise 1x1, depth-wise
convolution of size ``kernel``, and a low-pass Fourier filter) whose outputs are weighted
channel-wise by $a_p$ (the "channel attention"), summed, normalised and projected by a 1x1
convolution to ``embed_channels`` channels, concatenated with the input frames.
The boundary conditions and field parameters are **not** used (CAPE conditions on scalars).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gno_ext.models.base import SchemaModel, neuralop_fno
from gno_ext.models.baselines.vit import ViTBackbone
from gno_ext.models.registry import register_model
from gno_ext.schema import BoundarySpec, Grid, PDEBatch

__all__ = ["CAPE", "UNet", "CAPEUNet", "CAPEFNO", "CAPEAttn"]

_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


class CAPE(nn.Module):
    """The parameter-embedding module: ``(x (B, C, *S), theta_n (B, P)) -> (B, embed_channels, *S)``.

    Parameters
    ----------
    in_channels, n_params, ndim : int
    widening : int
        Channels of the widened input (64).
    kernel : int
        Depth-wise convolution size (5).
    norm_dim : int
        Hidden width of the parameter MLPs (128).
    embed_channels : int
        Output channels (3).
    modes : int
        Fourier modes kept per axis by the low-pass branch.
    """

    def __init__(self, in_channels: int, n_params: int, ndim: int, widening: int = 64, kernel: int = 5,
                 norm_dim: int = 128, embed_channels: int = 3, modes: int = 8) -> None:
        super().__init__()
        conv = _CONV[ndim]
        self.ndim, self.widening, self.modes, self.n_params = ndim, widening, modes, max(n_params, 1)
        self.widen = conv(in_channels, widening, 1)
        self.point = conv(widening, widening, 1)
        self.local = conv(widening, widening, kernel, padding=kernel // 2, groups=widening)
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(1, norm_dim), nn.GELU(), nn.Linear(norm_dim, 3 * widening))
                                  for _ in range(self.n_params))
        self.norm = nn.GroupNorm(1, widening)
        self.final = conv(widening, embed_channels, 1)

    def _low_pass(self, h: Tensor) -> Tensor:
        dims = tuple(range(2, 2 + self.ndim))
        spec = torch.fft.rfftn(h.float(), dim=dims)
        mask = torch.ones(spec.shape[2:], dtype=torch.bool, device=h.device)
        for axis, n in enumerate(spec.shape[2:]):
            # frequencies made on the device: no host-to-device copy, so the step can be captured
            freq = torch.fft.rfftfreq(h.shape[-1], 1.0 / h.shape[-1], device=h.device) if axis == self.ndim - 1 \
                else torch.fft.fftfreq(h.shape[2 + axis], 1.0 / h.shape[2 + axis], device=h.device)
            keep = freq.abs() < self.modes
            mask = mask & keep.view(*([1] * axis), -1, *([1] * (self.ndim - axis - 1)))
        return torch.fft.irfftn(spec * mask, s=h.shape[2:], dim=dims).to(h.dtype)

    def forward(self, x: Tensor, theta_n: Tensor) -> Tensor:
        h = self.widen(x)
        branches = (self.point(h), self.local(h), self._low_pass(h))
        theta_n = theta_n if theta_n.shape[1] else theta_n.new_zeros(theta_n.shape[0], 1)
        out = 0
        for p, mlp in enumerate(self.mlps):
            a = mlp(theta_n[:, p : p + 1]).view(-1, 3, self.widening, *([1] * self.ndim))
            out = out + sum(a[:, k] * branches[k] for k in range(3))
        return self.final(F.gelu(self.norm(out)))


class UNet(nn.Module):
    """A U-Net (1-D, 2-D or 3-D): ``levels`` down/up stages from ``features`` channels, two 3x3
    convolutions with GroupNorm and GELU per stage, skip connections; inputs are padded to a
    multiple of ``2**levels`` and cropped back."""

    def __init__(self, in_channels: int, out_channels: int, ndim: int, features: int = 32, levels: int = 3) -> None:
        super().__init__()
        conv = _CONV[ndim]
        self.ndim, self.levels = ndim, levels

        def stage(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(conv(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.GELU(),
                                 conv(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.GELU())

        widths = [features * 2**k for k in range(levels + 1)]
        self.down = nn.ModuleList([stage(in_channels, widths[0])] + [stage(widths[k], widths[k + 1])
                                                                    for k in range(levels)])
        self.up = nn.ModuleList(stage(widths[k + 1] + widths[k], widths[k]) for k in reversed(range(levels)))
        self.head = conv(widths[0], out_channels, 1)
        self.pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[ndim]

    def forward(self, x: Tensor) -> Tensor:
        size = x.shape[2:]
        m = 2**self.levels
        pad = []
        for n in reversed(size):
            pad += [0, (-n) % m]
        h = F.pad(x, pad)
        skips = []
        for k, stage in enumerate(self.down):
            h = stage(h if k == 0 else self.pool(h, 2))
            skips.append(h)
        for stage, skip in zip(self.up, reversed(skips[:-1])):
            h = stage(torch.cat([F.interpolate(h, size=skip.shape[2:], mode="nearest"), skip], 1))
        out = self.head(h)
        return out[(slice(None), slice(None), *[slice(0, n) for n in size])]


class _CAPEModel(SchemaModel):
    """CAPE in front of a surrogate ``self.net`` taking ``t_in * C + embed_channels`` channels."""

    def _setup(self, cape: dict[str, Any]) -> None:
        self.cape = CAPE(self.t_in * self.in_channels, self.n_params, self.ndim, **cape)

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """Next frame ``(B, 1, C, *S)``; uses ``theta`` only."""
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        x = self.normalized_input(u_in)
        theta_n = self.param_norm(theta).to(x.dtype) if self.n_params else x.new_zeros(x.shape[0], 0)
        return self.increment(u_in, self.net(torch.cat([x, self.cape(x, theta_n)], 1)))


def _cape_kwargs(widening: int, kernel: int, norm_dim: int, embed_channels: int, modes: int) -> dict[str, int]:
    return {"widening": widening, "kernel": kernel, "norm_dim": norm_dim, "embed_channels": embed_channels,
            "modes": modes}


@register_model("cape_unet")
class CAPEUNet(_CAPEModel):
    """CAPE + U-Net (32 initial features).

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel`.
    features, levels : int
        U-Net width and depth.
    widening, kernel, norm_dim, embed_channels, cape_modes : int
        CAPE sizes (paper: 64, 5, 128, 3).
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 1,
                 log_params: Sequence[bool] | None = None, features: int = 32, levels: int = 3, widening: int = 64,
                 kernel: int = 5, norm_dim: int = 128, embed_channels: int = 3, cape_modes: int = 8) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        self._setup(_cape_kwargs(widening, kernel, norm_dim, embed_channels, cape_modes))
        self.net = UNet(t_in * in_channels + embed_channels, in_channels, ndim, features, levels)


@register_model("cape_fno")
class CAPEFNO(_CAPEModel):
    """CAPE + FNO (neuraloperator's ``FNO``, modes 12, width 20).

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel`.
    n_modes, hidden_channels, n_layers : int
        FNO sizes (the same number of modes on every axis).
    widening, kernel, norm_dim, embed_channels, cape_modes : int
        CAPE sizes, as `CAPEUNet`.
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 1,
                 log_params: Sequence[bool] | None = None, n_modes: int = 12, hidden_channels: int = 20,
                 n_layers: int = 4, widening: int = 64, kernel: int = 5, norm_dim: int = 128, embed_channels: int = 3,
                 cape_modes: int = 8) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        self._setup(_cape_kwargs(widening, kernel, norm_dim, embed_channels, cape_modes))
        self.net = neuralop_fno(ndim, n_modes, t_in * in_channels + embed_channels, in_channels, hidden_channels,
                                n_layers)


@register_model("cape_attn")
class CAPEAttn(_CAPEModel):
    """CAPE + ViT (CAPE+Attn).

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel`.
    latent, patch, depth, heads, mlp_ratio
        Backbone sizes (paper: 256, 16, 8, 8, 4).
    widening, kernel, norm_dim, embed_channels, cape_modes : int
        CAPE sizes, as `CAPEUNet`.
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 1,
                 log_params: Sequence[bool] | None = None, latent: int = 256, patch: int = 16, depth: int = 8,
                 heads: int = 8, mlp_ratio: float = 4.0, widening: int = 64, kernel: int = 5, norm_dim: int = 128,
                 embed_channels: int = 3, cape_modes: int = 8) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        self._setup(_cape_kwargs(widening, kernel, norm_dim, embed_channels, cape_modes))
        self.net = ViTBackbone(t_in * in_channels + embed_channels, in_channels, ndim, latent, patch, depth, heads,
                               mlp_ratio)
