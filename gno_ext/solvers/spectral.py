"""Fourier helpers for periodic boxes (real FFTs over the last ``d`` axes)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gno_ext.schema import Grid


def wavenumbers(grid: Grid, dtype: torch.dtype = torch.float64,
                device: torch.device | str | None = None) -> list[Tensor]:
    """Angular wavenumbers ``2 pi n / L`` of an ``rfftn`` over ``grid``, broadcastable to its
    spectrum shape (the last axis is the half spectrum)."""
    ks = []
    for axis, (n, length) in enumerate(zip(grid.shape, grid.extent)):
        last = axis == grid.ndim - 1
        kw = {"d": length / n, "dtype": torch.float64}
        freq = torch.fft.rfftfreq(n, **kw) if last else torch.fft.fftfreq(n, **kw)
        shape = [1] * grid.ndim
        shape[axis] = freq.numel()
        ks.append((2 * math.pi * freq).to(device=device, dtype=dtype).view(shape))
    return ks


def frequency_indices(shape: Sequence[int], device: torch.device | str | None = None) -> list[Tensor]:
    """The integer frequencies ``n_a`` of an ``rfftn`` over axes of sizes ``shape`` (the last axis
    the half spectrum), each broadcastable to the spectrum's shape."""
    out = []
    for axis, n in enumerate(shape):
        idx = torch.fft.rfftfreq(n, d=1 / n) if axis == len(shape) - 1 else torch.fft.fftfreq(n, d=1 / n)
        view = [1] * len(shape)
        view[axis] = idx.numel()
        out.append(idx.view(view).to(device))
    return out


def dealias_mask(grid: Grid, device: torch.device | str | None = None) -> Tensor:
    """Boolean mask of the rfft spectrum keeping modes with ``|n_a| < N_a / 3`` (2/3 rule)."""
    mask = None
    for idx, n in zip(frequency_indices(grid.shape, device), grid.shape):
        keep = idx.abs() < n / 3
        mask = keep if mask is None else mask & keep
    return mask


def spectral_dims(grid: Grid) -> tuple[int, ...]:
    """The spatial axes of a ``(B, C, *S)`` tensor."""
    return tuple(range(-grid.ndim, 0))
