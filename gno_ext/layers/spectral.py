r"""A gated mixture of neuraloperator ``SpectralConv`` kernels, usable as ``conv_module``.

neuraloperator's ``FNOBlocks`` builds its convolutions as
``conv_module(in_channels, out_channels, n_modes, **kwargs)`` and calls them as
``conv(x, output_shape=...)``, with no room for the PDE parameters. `GatedSpectralConv` is
built the same way and reads $\theta$ from a context that its owner sets for the duration of
a forward pass: `GatedFNO` does so itself; with your own ``FNOBlocks`` use `condition_on`::

    blocks = FNOBlocks(32, 32, (12, 12), conv_module=partial(GatedSpectralConv, n_params=2))
    with condition_on(blocks, theta):
        y = blocks(x, 0)

Requires the optional dependency ``neuraloperator`` (``pip install gno-ext[neuralop]``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from neuralop.layers.base_spectral_conv import BaseSpectralConv
from neuralop.layers.spectral_convolution import SpectralConv
from torch import Tensor, nn

from gno_ext.layers.gate import ParameterGate
from gno_ext.layers.mixture import dispatch

__all__ = ["FullPrecisionSpectralConv", "GatedSpectralConv", "condition_on"]


class FullPrecisionSpectralConv(SpectralConv):
    """neuraloperator's ``SpectralConv`` that runs under autocast: with its default
    ``fno_block_precision="full"`` it takes a bf16 or float16 input in float32.

    Under autocast the layers before a spectral convolution hand it bf16 (or float16)
    activations, and cuFFT has no bf16 transform (``RuntimeError: Unsupported dtype
    BFloat16``) and float16 ones only for power-of-two sizes. The transforms and the spectral
    product then run in float32 (complex64), as ``"full"`` means; the output is float32, and the
    layers after it return to the autocast type. ``"half"`` and ``"mixed"`` keep neuraloperator's
    own handling. The FNO-based models of this package build their convolutions from it.
    """

    def forward(self, x: Tensor, output_shape: Any = None) -> Tensor:
        if self.fno_block_precision == "full" and x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return super().forward(x, output_shape=output_shape)


class GatedSpectralConv(BaseSpectralConv):
    r"""``K`` ``SpectralConv`` kernels selected per sample by a `ParameterGate` on $\theta$.

    Parameters
    ----------
    in_channels, out_channels : int
    n_modes : int or tuple of int
        As for ``SpectralConv``.
    n_kernels : int
        Number of spectral kernels ``K``.
    n_params : int
        Size of the (normalised) $\theta$ the gate reads.
    gate_hidden : int
        Hidden width of the gate's score MLP.
    **spectral_kwargs
        Passed to every ``SpectralConv`` (``FNOBlocks`` passes its factorisation, precision...).
    """

    dispatches = True  # only each sample's kernel runs (see `gno_ext.layers.mixture.has_dispatch`)

    def __init__(self, in_channels: int, out_channels: int, n_modes: Any, n_kernels: int = 4,
                 n_params: int = 1, gate_hidden: int = 32, **spectral_kwargs: Any) -> None:
        super().__init__(device=spectral_kwargs.get("device"))
        self.kernels = nn.ModuleList(FullPrecisionSpectralConv(in_channels, out_channels, n_modes, **spectral_kwargs)
                                     for _ in range(n_kernels))
        self.gate = ParameterGate(n_params, n_kernels, gate_hidden)
        self.theta: Tensor | None = None
        self.last_routing = None

    @property
    def n_modes(self) -> Any:
        return self.kernels[0].n_modes

    @n_modes.setter
    def n_modes(self, n_modes: Any) -> None:
        for kernel in self.kernels:
            kernel.n_modes = n_modes

    def transform(self, x: Tensor, output_shape: Any = None) -> Tensor:
        """Resampling of the skip connection (identical for all kernels)."""
        return self.kernels[0].transform(x, output_shape=output_shape)

    def forward(self, x: Tensor, output_shape: Any = None) -> Tensor:
        """Apply each sample's selected spectral kernel to ``x`` of shape ``(B, C, *S)``."""
        if self.theta is None:
            raise RuntimeError("GatedSpectralConv: no theta set; call it inside condition_on(module, theta) "
                               "or through GatedFNO(x, theta=...)")
        if self.theta.shape[0] != x.shape[0]:
            raise ValueError(f"theta: batch size {self.theta.shape[0]} does not match x's {x.shape[0]}")
        routing = self.gate(self.theta)
        self.last_routing = routing
        return dispatch(self.kernels, routing, x, output_shape=output_shape)


@contextlib.contextmanager
def condition_on(module: nn.Module, theta: Tensor) -> Iterator[None]:
    """Set ``theta`` (B, n_params) on every `GatedSpectralConv` inside ``module`` for a block."""
    convs = [m for m in module.modules() if isinstance(m, GatedSpectralConv)]
    for conv in convs:
        conv.theta = theta
    try:
        yield
    finally:
        for conv in convs:
            conv.theta = None
