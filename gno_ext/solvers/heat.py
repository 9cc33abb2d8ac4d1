r"""Batched heat equation $u_t = \alpha \Delta u$ in 1-D, 2-D and 3-D boxes.

Space: periodic axes are Fourier-spectral; bounded axes use the second-order cell-centred
finite-difference Laplacian with ghost cells (`gno_ext.solvers.operators`), so every
face may carry its own periodic / Dirichlet / Neumann / Robin condition, per sample.

Time, ``method="exact"`` (default): the semi-discrete system
$\dot u = \alpha (A u + b)$ is diagonalised axis by axis, $A = \sum_a Q_a
\Lambda_a Q_a^T$, and integrated exactly,

$$
\hat u(t) = e^{\alpha \Lambda t} \hat u(0) + \alpha t\, \varphi_1(\alpha \Lambda t)\, \hat b,
\qquad \varphi_1(z) = (e^z - 1)/z,
$$

which is the lifting by the steady state, written so that it also holds for the singular
(pure Neumann or periodic) case. There is no time error and no step to choose. With
time-dependent data ``boundary_fn(t)`` the source varies and the same basis is stepped with the
second-order exponential integrator ETD2 (exact for data linear in time over a step,
unconditionally stable).

``method="ftcs"``: explicit forward Euler with the finite-difference stencil on every axis
(periodic ones too), a cheap runtime baseline; its step must satisfy
$\alpha\, dt \sum_a h_a^{-2} \le 1/2$.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from gno_ext.schema import BCType, BoundarySpec, Grid
from gno_ext.solvers._common import (
    MAX_STEPS,
    batch_parameter,
    boundary_data,
    check_boundary,
    check_field,
    check_times,
    march,
)
from gno_ext.solvers.operators import (
    AxisEigenbasis,
    FDLaplacian,
    boundary_source,
    ghost_coefficients,
)

__all__ = ["solve_heat", "heat_max_dt"]

HEAT_BC = (BCType.PERIODIC, BCType.DIRICHLET, BCType.NEUMANN, BCType.ROBIN)
BoundaryFn = Callable[[float], Tensor]


def _phi1(z: Tensor) -> Tensor:
    small = z.abs() < 1e-6
    safe = torch.where(small, torch.ones_like(z), z)
    return torch.where(small, 1 + z / 2 + z * z / 6, torch.expm1(safe) / safe)


def _phi2(z: Tensor) -> Tensor:
    small = z.abs() < 1e-3
    safe = torch.where(small, torch.ones_like(z), z)
    return torch.where(small, 0.5 + z / 6 + z * z / 24, (torch.expm1(safe) - safe) / safe ** 2)


def heat_max_dt(alpha: Tensor, grid: Grid) -> Tensor:
    r"""Largest stable FTCS step per sample, $1 / (2 \alpha \sum_a h_a^{-2})$."""
    return 0.5 / (alpha * sum(h ** -2 for h in grid.spacing))


def solve_heat(u0: Tensor, alpha: float | Tensor, bc: BoundarySpec, times: Sequence[float] | Tensor,
               *, grid: Grid | None = None, method: str = "exact", dt: float | None = None,
               boundary_fn: BoundaryFn | None = None, stats: dict | None = None, max_steps: int = MAX_STEPS) -> Tensor:
    r"""Solve $u_t = \alpha \Delta u$ for a batch of initial conditions.

    Parameters
    ----------
    u0 : Tensor, shape (B, C, *S)
        Initial conditions (float32 or float64, CPU or CUDA); channels share the boundary.
    alpha : float or Tensor, shape (B,)
        Diffusivity, one per sample, > 0.
    bc : BoundarySpec
        Batched boundary spec (``kind`` shape ``(B, 2 d)``); types PERIODIC, DIRICHLET,
        NEUMANN, ROBIN. Data is taken at ``values[:, :, 0]`` unless ``boundary_fn`` is given.
    times : sequence of float, shape (T,)
        Output times, increasing, >= 0.
    grid : Grid, optional
        Defaults to the unit box with ``u0``'s shape.
    method : {"exact", "ftcs"}
        See the module docstring.
    dt : float, optional
        Time step of the stepping paths (ETD2 with ``boundary_fn``; FTCS). ETD2 defaults to a
        twentieth of the smallest output interval; FTCS to its stability limit.
    boundary_fn : callable, optional
        ``boundary_fn(t) -> Tensor (B, F, N_face)``: time-dependent boundary data.
    stats : dict, optional
        If given, ``stats["steps"]`` receives the number of time steps taken (0 for the exact path with constant data) (largest over the
        batch).
    max_steps : int
        Refuse a plan of more time steps than this (`gno_ext.solvers._common.MAX_STEPS`) with an
        error that names the step count and the parameter that set the step.

    Returns
    -------
    Tensor, shape (B, T, C, *S)
        The solution at ``times``.
    """
    grid = grid or Grid(tuple(u0.shape[2:]))
    check_field("u0", u0, grid)
    batch = u0.shape[0]
    check_boundary(bc, grid, batch, HEAT_BC, "heat")
    alpha_b = batch_parameter("alpha", alpha, batch, u0)
    t_out = check_times(times)
    if method not in ("exact", "ftcs"):
        raise ValueError(f"method: expected 'exact' or 'ftcs', got {method!r}")
    if dt is not None and not dt > 0:
        raise ValueError(f"dt: must be positive, got {dt}")
    bc = bc.to(u0.device, dtype=u0.dtype)
    r, s = ghost_coefficients(bc, grid)

    def data_at(t: float) -> Tensor:
        return boundary_data(bc, grid, boundary_fn, t, u0)

    if method == "ftcs":
        if boundary_fn is not None and dt is None:
            # One common step keeps every sample at the same time, where boundary_fn is sampled.
            dt = float(heat_max_dt(alpha_b, grid).min())
        return _solve_ftcs(u0, alpha_b, bc, grid, t_out, dt, r, s, data_at, stats, max_steps)
    return _solve_spectral(u0, alpha_b, bc, grid, t_out, dt, r, s, data_at, boundary_fn is not None, stats, max_steps)


def _solve_spectral(u0, alpha, bc, grid, t_out, dt, r, s, data_at, time_dependent, stats, max_steps) -> Tensor:
    batch, channels = u0.shape[:2]
    periodic = (bc.kind == BCType.PERIODIC).cpu()
    bases = [AxisEigenbasis(grid, a, r.cpu(), periodic, u0.dtype, u0.device) for a in range(grid.ndim)]

    def fold(x: Tensor) -> Tensor:  # (B, C, *S) -> (B*C, *S) with bases repeated per channel
        return x.reshape(batch * channels, *grid.shape)

    lam = sum(b.lam.repeat_interleave(channels, 0).view(
        -1, *[grid.shape[a] if a == ax else 1 for a in range(grid.ndim)]) for ax, b in enumerate(bases))
    alpha_bc = alpha.repeat_interleave(channels).view(-1, *([1] * grid.ndim))

    def forward(x: Tensor) -> Tensor:
        for a, basis in enumerate(bases):
            x = basis.transform(x, a, repeat=channels)
        return x

    def inverse(x: Tensor) -> Tensor:
        for a, basis in enumerate(bases):
            x = basis.transform(x, a, inverse=True, repeat=channels)
        return x

    def source(t: float) -> Tensor:
        src = boundary_source(bc, grid, s, data_at(t))
        return forward(src.repeat_interleave(channels, 0))

    u_hat = forward(fold(u0))
    frames = []
    n_steps = 0
    if not time_dependent:
        b_hat = source(0.0)
        for t in t_out.tolist():
            z = alpha_bc * lam * t
            frames.append(inverse(torch.exp(z) * u_hat + alpha_bc * t * _phi1(z) * b_hat))
    else:
        t_now, b_now = 0.0, source(0.0)
        intervals = (t_out[1:] - t_out[:-1]).tolist() + ([float(t_out[0])] if t_out[0] > 0 else [])
        step = dt if dt is not None else min(intervals) / 20
        if float(t_out[-1]) / step > max_steps:
            raise ValueError(f"the time-step plan needs {float(t_out[-1]) / step:,.0f} steps to reach t={float(t_out[-1]):g}, "
                             f"more than max_steps={max_steps:,}: the step is dt={step:.3g}. Check that value (or "
                             "pass max_steps= to allow the plan)")
        for t_next in t_out.tolist():
            n_sub = max(1, int(torch.ceil(torch.tensor((t_next - t_now) / step - 1e-9))))
            h = (t_next - t_now) / n_sub
            if t_next > t_now:
                z = alpha_bc * lam * h
                e, p1, p2 = torch.exp(z), _phi1(z), _phi2(z)
                n_steps += n_sub
                for k in range(n_sub):
                    b_next = source(t_now + (k + 1) * h)
                    u_hat = e * u_hat + alpha_bc * h * (p1 * b_now + p2 * (b_next - b_now))
                    b_now = b_next
            frames.append(inverse(u_hat))
            t_now = t_next
    if stats is not None:
        stats["steps"] = stats.get("steps", 0) + n_steps
    out = torch.stack(frames, 1)
    return out.reshape(batch, channels, len(frames), *grid.shape).transpose(1, 2).contiguous()


def _solve_ftcs(u0, alpha, bc, grid, t_out, dt, r, s, data_at, stats, max_steps) -> Tensor:
    shape = (-1,) + (1,) * (grid.ndim + 1)
    laplacian = FDLaplacian(grid, bc, r, s)

    def step(u: Tensor, h: Tensor, t: Tensor) -> Tensor:
        return u + (h * alpha).view(shape) * laplacian(u, data_at(float(t[0])))

    frames = march(u0, t_out, lambda u: heat_max_dt(alpha, grid), step, dt, stats=stats, max_steps=max_steps,
                   cause=lambda b, u: f"diffusivity alpha={float(alpha[b]):.3g}")
    return torch.stack(frames, 1)
