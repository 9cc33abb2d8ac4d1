"""neuraloperator's FNO with the parameters and the boundary description as input channels.

A strong, widely used reference that the paper does not list: the input frames, the normalised
``theta`` broadcast over the grid, the field parameters, and the boundary conditions painted on
the cells next to each face (`gno_ext.models.base.boundary_channels`: type one-hot
and data at the target time) go into an ``FNO`` as channels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from gno_ext.models.base import N_TYPES, SchemaModel, boundary_channels, neuralop_fno
from gno_ext.models.registry import register_model
from gno_ext.schema import BoundarySpec, Grid, PDEBatch

__all__ = ["ChannelFNO"]


@register_model("fno")
class ChannelFNO(SchemaModel):
    """FNO (neuraloperator) with ``theta``, ``theta_field`` and boundary channels.

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel`.
    n_modes, hidden_channels, n_layers : int
        FNO sizes (the same number of modes on every axis).
    fourier : {"dft", "fft"}
        The spectral convolutions' transforms (`gno_ext.layers.spectral.TRANSFORMS`): the
        retained modes alone (default) or the full FFT.
    activations : {"float32", "autocast"}
        The activations' type between the layers under autocast (`gno_ext.layers.spectral.ACTIVATIONS`):
        float32 as neuraloperator's blocks give it (default), or the autocast type.
    checkpoint_blocks : bool
        Recompute the FNO's blocks in the backward pass instead of keeping their activations
        (`gno_ext.layers.spectral.checkpoint_blocks`): less GPU memory for a second forward pass
        of each block, the same values and gradients. Default False.
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 1,
                 log_params: Sequence[bool] | None = None, n_modes: int = 12, hidden_channels: int = 64,
                 n_layers: int = 4, fourier: str = "dft", activations: str = "float32",
                 checkpoint_blocks: bool = False) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        channels = t_in * in_channels + n_params + field_channels + N_TYPES + 1
        self.net = neuralop_fno(ndim, n_modes, channels, in_channels, hidden_channels, n_layers, fourier, activations,
                                checkpoint_blocks=checkpoint_blocks)

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """Next frame ``(B, 1, C, *S)``."""
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        x = self.normalized_input(u_in)
        boundary = boundary_channels(bc, grid, self.u_std.mean()).to(x.dtype)
        channels = [x, *self.parameter_channels(x, theta, theta_field), boundary]
        return self.increment(u_in, self.net(torch.cat(channels, 1)))
