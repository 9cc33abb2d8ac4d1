r"""Batched incompressible Navier-Stokes in 2-D, vorticity form, periodic box.

$$
\omega_t + u \cdot \nabla \omega = \nu \Delta \omega + f, \qquad
u = (\partial_y \psi, -\partial_x \psi), \qquad -\Delta \psi = \omega,
$$

with $\nu = 1 / \mathrm{Re}$ (unit velocity and length scales, box $[0, 1]^2$).

Scheme: pseudo-spectral in space with the 2/3 rule on the nonlinear term; in time the
low-storage IMEX Runge-Kutta of Spalart, Moser & Rogers (1991): three explicit RK stages for
the advection (third order) and Crank-Nicolson for viscosity within each stage (second
order, A-stable). Step: $\Delta t = \mathrm{cfl} / \sum_a (\max|u_a| / h_a)$ per sample,
recomputed at every output interval.

Nyquist modes of the initial vorticity are dropped: they have no real velocity.

Default forcing (that of the FNO Navier-Stokes benchmark, Li et al. 2021):
$f(x, y) = 0.1\,(\sin 2\pi(x + y) + \cos 2\pi(x + y))$, steady. Pass ``forcing=None``
for decaying turbulence or any ``(B or 1, 1, H, W)`` tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gno_ext.schema import BCType, BoundarySpec, Grid
from gno_ext.solvers._common import (
    MAX_STEPS,
    batch_parameter,
    check_boundary,
    check_field,
    check_times,
    march,
)
from gno_ext.solvers.spectral import dealias_mask, wavenumbers

__all__ = ["solve_navier_stokes", "velocity_from_vorticity", "kolmogorov_forcing"]

# Spalart, Moser & Rogers (1991), J. Comput. Phys. 96, table 1.
_ALPHA = (29 / 96, -3 / 40, 1 / 6)
_BETA = (37 / 160, 5 / 24, 1 / 6)
_GAMMA = (8 / 15, 5 / 12, 3 / 4)
_ZETA = (0.0, -17 / 60, -5 / 12)
MAX_CFL = 0.8
DIMS = (-2, -1)


def kolmogorov_forcing(grid: Grid, dtype: torch.dtype = torch.float32,
                       device: torch.device | str | None = None) -> Tensor:
    r"""The default forcing $0.1 (\sin 2\pi(x+y) + \cos 2\pi(x+y))$, shape ``(1, 1, H, W)``."""
    x = grid.coordinates(torch.float64)
    phase = 2 * math.pi * (x[0] / grid.extent[0] + x[1] / grid.extent[1])
    return (0.1 * (torch.sin(phase) + torch.cos(phase)))[None, None].to(device=device, dtype=dtype)


def _streamfunction_velocity(w_hat: Tensor, kx: Tensor, ky: Tensor, grid: Grid) -> Tensor:
    k2 = kx ** 2 + ky ** 2
    psi_hat = w_hat / torch.where(k2 == 0, torch.ones_like(k2), k2)
    vel_hat = torch.cat([1j * ky * psi_hat, -1j * kx * psi_hat], 1)
    return torch.fft.irfft2(vel_hat, s=grid.shape, dim=DIMS)


def velocity_from_vorticity(w: Tensor, grid: Grid | None = None) -> Tensor:
    r"""Velocity of a periodic vorticity field (zero mean flow).

    Parameters
    ----------
    w : Tensor, shape (..., 1, H, W)

    Returns
    -------
    Tensor, shape (..., 2, H, W)
    """
    grid = grid or Grid(tuple(w.shape[-2:]))
    lead = w.shape[:-3]
    flat = w.reshape(-1, 1, *grid.shape)
    kx, ky = wavenumbers(grid, w.dtype, w.device)
    vel = _streamfunction_velocity(torch.fft.rfft2(flat, dim=DIMS), kx, ky, grid)
    return vel.reshape(*lead, 2, *grid.shape)


def _forcing_spectrum(forcing: Tensor | None | str, grid: Grid, w0: Tensor) -> Tensor | float:
    """The spectrum of the body force ``forcing`` ("kolmogorov", None: 0, or a tensor of shape
    (B or 1, 1, H, W)), checked against ``grid`` and the batch of ``w0``."""
    if isinstance(forcing, str):
        if forcing != "kolmogorov":
            raise ValueError(f"forcing: expected 'kolmogorov', None or a tensor, got {forcing!r}")
        forcing = kolmogorov_forcing(grid, w0.dtype, w0.device)
    if forcing is None:
        return 0.0
    forcing = torch.as_tensor(forcing, dtype=w0.dtype, device=w0.device)
    batch = w0.shape[0]
    if forcing.ndim != 4 or forcing.shape[0] not in (1, batch) or tuple(forcing.shape[1:]) != (1, *grid.shape):
        raise ValueError(f"forcing: expected shape (1 or {batch}, 1, {grid.shape[0]}, {grid.shape[1]}), "
                         f"got {tuple(forcing.shape)}")
    return torch.fft.rfft2(forcing, dim=DIMS)


def _without_nyquist(w_hat: Tensor, grid: Grid) -> Tensor:
    """``w_hat`` with its Nyquist modes zeroed (in place): they carry no real velocity (odd
    derivatives there are not real), so that the velocity and vorticity returned describe the
    same flow."""
    for axis, n in enumerate(grid.shape):
        if n % 2 == 0:
            w_hat.select(axis - 2, n // 2 if axis == 0 else -1).zero_()
    return w_hat


def solve_navier_stokes(w0: Tensor, nu: float | Tensor, times: Sequence[float] | Tensor, *,
                        grid: Grid | None = None, bc: BoundarySpec | None = None,
                        forcing: Tensor | None | str = "kolmogorov", cfl: float = 0.4,
                        dt: float | None = None, output: str = "vorticity",
                        stats: dict | None = None, max_steps: int = MAX_STEPS) -> Tensor:
    r"""Solve 2-D incompressible Navier-Stokes from an initial vorticity.

    Parameters
    ----------
    w0 : Tensor, shape (B, 1, H, W)
        Initial vorticity.
    nu : float or Tensor, shape (B,)
        Kinematic viscosity per sample (``1 / Re``), > 0.
    times : sequence of float, shape (T,)
        Output times.
    grid : Grid, optional
        A 2-D grid; defaults to the unit box.
    bc : BoundarySpec, optional
        Must be all periodic if given.
    forcing : "kolmogorov", None or Tensor, shape (B or 1, 1, H, W)
        Steady body force on the vorticity equation.
    cfl : float
        Courant number of the automatic step, in (0, 0.8].
    dt : float, optional
        Fixed step; rejected if its Courant number exceeds 0.8 at any output interval.
    output : {"vorticity", "velocity"}
        Which field to return.
    stats : dict, optional
        If given, ``stats["steps"]`` receives the number of time steps taken (largest over the
        batch).
    max_steps : int
        Refuse a plan of more time steps than this (`gno_ext.solvers._common.MAX_STEPS`) with an
        error that names the step count and the parameter that set the step.

    Returns
    -------
    Tensor, shape (B, T, 1, H, W) for vorticity or (B, T, 2, H, W) for velocity
    """
    grid = grid or Grid(tuple(w0.shape[2:]))
    if grid.ndim != 2:
        raise ValueError(f"grid: the Navier-Stokes solver is 2-D, got {grid.ndim}-D grid {grid.shape}")
    check_field("w0", w0, grid, channels=1)
    batch = w0.shape[0]
    nu_b = batch_parameter("nu", nu, batch, w0)
    if bc is not None:
        check_boundary(bc, grid, batch, (BCType.PERIODIC,), "Navier-Stokes")
    if not 0 < cfl <= MAX_CFL:
        raise ValueError(f"cfl: must be in (0, {MAX_CFL}], got {cfl}")
    if output not in ("vorticity", "velocity"):
        raise ValueError(f"output: expected 'vorticity' or 'velocity', got {output!r}")
    if dt is not None:
        batch_parameter("dt", dt, 1, w0)
    t_out = check_times(times)
    f_hat = _forcing_spectrum(forcing, grid, w0)
    kx, ky = wavenumbers(grid, w0.dtype, w0.device)
    lin = -nu_b.view(-1, 1, 1, 1) * (kx ** 2 + ky ** 2)
    mask = dealias_mask(grid, w0.device)
    view = (-1, 1, 1, 1)

    def nonlinear(w_hat: Tensor) -> Tensor:
        vel = _streamfunction_velocity(w_hat, kx, ky, grid)
        grad = torch.fft.irfft2(torch.cat([1j * kx * w_hat, 1j * ky * w_hat], 1), s=grid.shape, dim=DIMS)
        adv = (vel * grad).sum(1, keepdim=True)
        return -torch.fft.rfft2(adv, dim=DIMS) * mask + f_hat

    def step(w_hat: Tensor, h: Tensor, t: Tensor) -> Tensor:
        h = h.view(view)
        n_prev = torch.zeros_like(w_hat)
        for a, b, g, z in zip(_ALPHA, _BETA, _GAMMA, _ZETA):
            n_now = nonlinear(w_hat)
            w_hat = ((1 + a * h * lin) * w_hat + h * (g * n_now + z * n_prev)) / (1 - b * h * lin)
            n_prev = n_now
        return w_hat

    def max_dt(w_hat: Tensor) -> Tensor:
        vel = _streamfunction_velocity(w_hat, kx, ky, grid)
        courant = cfl if dt is None else MAX_CFL
        rate = sum(vel[:, a].abs().flatten(1).amax(1) / grid.spacing[a] for a in range(2))
        return courant / rate.clamp_min(1e-12)

    if output == "vorticity":
        record = lambda w_hat: torch.fft.irfft2(w_hat, s=grid.shape, dim=DIMS)
    else:
        record = lambda w_hat: _streamfunction_velocity(w_hat, kx, ky, grid)
    w_hat = _without_nyquist(torch.fft.rfft2(w0, dim=DIMS), grid)
    cause = lambda b, w: f"velocity (largest |u| {float(_streamfunction_velocity(w, kx, ky, grid)[b].abs().max()):.3g})"
    frames = march(w_hat, t_out, max_dt, step, dt, record, stats, max_steps, cause)
    return torch.stack(frames, 1)
