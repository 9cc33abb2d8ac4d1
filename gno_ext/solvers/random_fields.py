r"""Gaussian random fields for initial conditions and velocity fields.

A field is drawn in Fourier space with the Matérn-like spectrum

$$
\sqrt{S(k)} \propto \left(\tau^2 + |k|^2\right)^{-\gamma/2}, \qquad k = 2\pi n / L,
$$

then rescaled so that its sample standard deviation is ``sigma`` (per sample, mean removed).
``length_scale`` sets $\tau = 2\pi / \ell$; larger ``gamma`` gives smoother fields.

* ``periodic=True``: the field lives on the torus of the box (for periodic boundaries).
* ``periodic=False``: the field is drawn on a box twice as large in every direction and the
  first half is kept, so opposite faces are not correlated (for bounded boxes).

Reproducibility: sample ``i`` is drawn from its own generator seeded with ``seeds[i]`` on the
CPU, so the same seed gives the same field in any batch and on any device.

Velocities (`random_velocity`) are the curl of a random stream function
(2-D, $v = (\partial_y \psi, -\partial_x \psi)$) or of a random vector potential
(3-D, $v = \nabla \times A$): divergence-free in the continuum. Derivatives are spectral
on periodic boxes and second-order central differences (one-sided at the faces) otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gno_ext.schema import Grid

__all__ = ["gaussian_random_field", "random_velocity"]


def _noise(seeds: Sequence[int], shape: tuple[int, ...], channels: int) -> Tensor:
    out = []
    for seed in seeds:
        gen = torch.Generator().manual_seed(int(seed))
        out.append(torch.randn((channels, *shape), generator=gen, dtype=torch.float64))
    return torch.stack(out)


def gaussian_random_field(grid: Grid, seeds: Sequence[int], *, channels: int = 1,
                          length_scale: float = 0.25, gamma: float = 3.0, sigma: float = 1.0,
                          periodic: bool = True, dtype: torch.dtype = torch.float32,
                          device: torch.device | str | None = None) -> Tensor:
    r"""Draw one Gaussian random field per seed.

    Parameters
    ----------
    grid : Grid
        Grid of the field.
    seeds : sequence of int, length B
        One seed per sample.
    channels : int
        Independent fields per sample.
    length_scale : float
        Correlation length $\ell$ (same units as ``grid.extent``), > 0.
    gamma : float
        Spectral decay exponent, > ``grid.ndim / 2`` for a well-defined field.
    sigma : float
        Standard deviation of each returned field (mean removed), >= 0.
    periodic : bool
        Periodic field on the box, or a non-periodic one (see module docstring).

    Returns
    -------
    Tensor, shape (B, channels, *grid.shape)
    """
    if len(seeds) == 0:
        raise ValueError("seeds: expected at least one seed")
    if not length_scale > 0:
        raise ValueError(f"length_scale: must be positive, got {length_scale}")
    if not gamma > grid.ndim / 2:
        raise ValueError(f"gamma: must exceed ndim/2 = {grid.ndim / 2} for a finite variance, got {gamma}")
    if not sigma >= 0:
        raise ValueError(f"sigma: must be >= 0, got {sigma}")
    factor = 1 if periodic else 2
    shape = tuple(n * factor for n in grid.shape)
    extent = tuple(length * factor for length in grid.extent)
    noise = _noise(seeds, shape, channels)
    ks = torch.meshgrid(*[torch.fft.fftfreq(n, d=length / n, dtype=torch.float64) * 2 * math.pi
                          for n, length in zip(shape, extent)], indexing="ij")
    k2 = sum(k ** 2 for k in ks)
    tau = 2 * math.pi / length_scale
    amplitude = (tau ** 2 + k2) ** (-gamma / 2)
    amplitude[(0,) * len(shape)] = 0.0
    dims = tuple(range(2, 2 + grid.ndim))
    field = torch.fft.ifftn(torch.fft.fftn(noise, dim=dims) * amplitude, dim=dims).real
    field = field[(slice(None), slice(None)) + tuple(slice(0, n) for n in grid.shape)]
    field = field - field.mean(dim=dims, keepdim=True)
    std = field.flatten(2).std(-1).clamp_min(1e-300).view(*field.shape[:2], *([1] * grid.ndim))
    return (sigma * field / std).to(device=device, dtype=dtype)


def _derivative(f: Tensor, axis: int, grid: Grid, periodic: bool) -> Tensor:
    """d f / d x_axis of ``f`` (B, *S): spectral if periodic, else central differences."""
    dim = axis + 1
    if periodic:
        n = grid.shape[axis]
        k = torch.fft.fftfreq(n, d=grid.spacing[axis] / (2 * math.pi), dtype=torch.float64)
        shape = [1] * f.ndim
        shape[dim] = n
        return torch.fft.ifft(1j * k.view(shape) * torch.fft.fft(f, dim=dim), dim=dim).real
    return torch.gradient(f, spacing=grid.spacing[axis], dim=dim, edge_order=2)[0]


def random_velocity(grid: Grid, seeds: Sequence[int], *, length_scale: float = 0.5,
                    gamma: float = 4.0, speed: float = 1.0, periodic: bool = True,
                    dtype: torch.dtype = torch.float32,
                    device: torch.device | str | None = None) -> Tensor:
    r"""Draw divergence-free random velocity fields, scaled to RMS speed ``speed``.

    Parameters
    ----------
    grid : Grid
        A 2-D or 3-D grid.
    seeds : sequence of int, length B
        One seed per sample.
    length_scale, gamma : float
        Spectrum of the potential (see `gaussian_random_field`).
    speed : float
        Root-mean-square of $|v|$ over the box, per sample.
    periodic : bool
        Periodic potential and spectral derivatives, or non-periodic.

    Returns
    -------
    Tensor, shape (B, d, *grid.shape)
        Cell-centred velocity components ``(v_x, v_y[, v_z])``.
    """
    if grid.ndim not in (2, 3):
        raise ValueError(f"random_velocity: needs a 2-D or 3-D grid, got {grid.ndim}-D")
    channels = 1 if grid.ndim == 2 else 3
    pot = gaussian_random_field(grid, seeds, channels=channels, length_scale=length_scale,
                                gamma=gamma, periodic=periodic, dtype=torch.float64)
    if periodic:
        # Drop Nyquist modes: their odd derivatives are not real, and without them the curl is
        # exactly divergence-free under any spectral derivative.
        dims = tuple(range(2, 2 + grid.ndim))
        spec = torch.fft.fftn(pot, dim=dims)
        for axis, n in enumerate(grid.shape):
            if n % 2 == 0:
                spec.select(axis + 2, n // 2).zero_()
        pot = torch.fft.ifftn(spec, dim=dims).real
    d = lambda c, a: _derivative(pot[:, c], a, grid, periodic)
    if grid.ndim == 2:
        v = torch.stack([d(0, 1), -d(0, 0)], 1)
    else:
        v = torch.stack([d(2, 1) - d(1, 2), d(0, 2) - d(2, 0), d(1, 0) - d(0, 1)], 1)
    rms = v.pow(2).sum(1).flatten(1).mean(-1).sqrt().clamp_min(1e-300)
    v = speed * v / rms.view(-1, *([1] * (grid.ndim + 1)))
    return v.to(device=device, dtype=dtype)
