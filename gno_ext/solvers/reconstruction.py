r"""High-resolution face reconstruction and the advective transport operator.

Face states at $x_{i+1/2}$ are reconstructed from cell averages padded with three ghost
cells on each side:

* ``weno5``: fifth-order WENO-Z (Borges et al. 2008) on the three-point candidate stencils;
* ``muscl``: second-order MUSCL with the monotonised-central limiter.

The transport term $v \cdot \nabla u$ is discretised in flux-difference form

$$
(v \cdot \nabla u)_i \approx \sum_a \frac{1}{h_a}\Big[v_{i+1/2}\,(u^*_{i+1/2} - u_i)
- v_{i-1/2}\,(u^*_{i-1/2} - u_i)\Big],
$$

with the upwind state $u^*$ chosen by the sign of the face velocity. For constant
velocity this is the usual conservative scheme; in general it is consistent with the
advective (non-conservative) form and conserves $\sum_i u_i$ whenever the face
velocities are discretely divergence-free.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from gno_ext.schema import Grid

N_GHOST = 3
SCHEMES = ("weno5", "muscl")


def _weno5_left(a: Tensor, b: Tensor, c: Tensor, d: Tensor, e: Tensor, eps: float) -> Tensor:
    """WENO-Z state at the right face of cell ``c`` from the stencil ``a b c d e``."""
    p0 = (2 * a - 7 * b + 11 * c) / 6
    p1 = (-b + 5 * c + 2 * d) / 6
    p2 = (2 * c + 5 * d - e) / 6
    b0 = 13 / 12 * (a - 2 * b + c) ** 2 + 0.25 * (a - 4 * b + 3 * c) ** 2
    b1 = 13 / 12 * (b - 2 * c + d) ** 2 + 0.25 * (b - d) ** 2
    b2 = 13 / 12 * (c - 2 * d + e) ** 2 + 0.25 * (3 * c - 4 * d + e) ** 2
    tau = (b0 - b2).abs()
    w0 = 0.1 * (1 + (tau / (b0 + eps)) ** 2)
    w1 = 0.6 * (1 + (tau / (b1 + eps)) ** 2)
    w2 = 0.3 * (1 + (tau / (b2 + eps)) ** 2)
    return (w0 * p0 + w1 * p1 + w2 * p2) / (w0 + w1 + w2)


def _muscl_left(b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """MUSCL (monotonised-central limiter) state at the right face of cell ``c``."""
    dl, dr = c - b, d - c
    slope = torch.sign(dl) * torch.minimum(torch.minimum(2 * dl.abs(), 2 * dr.abs()),
                                           0.5 * (dl + dr).abs())
    slope = torch.where(dl * dr > 0, slope, torch.zeros_like(slope))
    return c + 0.5 * slope


def face_states(padded: Tensor, dim: int, scheme: str) -> tuple[Tensor, Tensor]:
    """Left and right states at the ``N + 1`` faces of a padded axis.

    Parameters
    ----------
    padded : Tensor
        Cell values with `N_GHOST` ghost cells on both sides of ``dim`` (length ``N + 6``).
    dim : int
        The axis to reconstruct along.
    scheme : {"weno5", "muscl"}

    Returns
    -------
    left, right : Tensor
        States at faces ``-1/2, 1/2, ..., N - 1/2`` (length ``N + 1`` along ``dim``).
    """
    n = padded.shape[dim] - 2 * N_GHOST
    cell = lambda k: padded.narrow(dim, k, n + 1)  # cell index (face index + k - 3)
    if scheme == "weno5":
        eps = 1e-30 if padded.dtype == torch.float64 else 1e-12
        left = _weno5_left(cell(0), cell(1), cell(2), cell(3), cell(4), eps)
        right = _weno5_left(cell(5), cell(4), cell(3), cell(2), cell(1), eps)
    elif scheme == "muscl":
        left = _muscl_left(cell(1), cell(2), cell(3))
        right = _muscl_left(cell(4), cell(3), cell(2))
    else:
        raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")
    return left, right


def transport(u: Tensor, padded: list[Tensor], face_velocity: list[Tensor],
              spacing: tuple[float, ...], scheme: str) -> Tensor:
    r"""The discrete $v \cdot \nabla u$ of the module docstring.

    Parameters
    ----------
    u : Tensor, shape (B, C, *S)
        Cell values.
    padded : list of Tensor
        ``padded[a]`` is ``u`` with ghost cells along spatial axis ``a`` only.
    face_velocity : list of Tensor
        ``face_velocity[a]`` has shape ``(B, 1, *S)`` with ``N_a + 1`` along axis ``a``:
        the normal velocity at every face of that axis.
    spacing : tuple of float
        Cell sizes.
    scheme : {"weno5", "muscl"}
    """
    out = torch.zeros_like(u)
    for axis, (pad, vel, h) in enumerate(zip(padded, face_velocity, spacing)):
        dim = axis + 2
        n = u.shape[dim]
        left, right = face_states(pad, dim, scheme)
        upwind = torch.where(vel > 0, left, right)
        flux = vel * upwind
        # v_{i+1/2}(u*_{i+1/2} - u_i) - v_{i-1/2}(u*_{i-1/2} - u_i)
        out = out + (flux.narrow(dim, 1, n) - flux.narrow(dim, 0, n)
                     - u * (vel.narrow(dim, 1, n) - vel.narrow(dim, 0, n))) / h
    return out


def check_transport_options(grid: Grid, scheme: str, cfl: float, max_cfl: float) -> None:
    """Validate the options shared by the WENO/MUSCL solvers (advection, Burgers)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")
    if not 0 < cfl <= max_cfl:
        raise ValueError(f"cfl: must be in (0, {max_cfl}], got {cfl}")
    if min(grid.shape) < N_GHOST:
        raise ValueError(f"grid: every axis needs at least {N_GHOST} cells, got {grid.shape}")


@functools.cache
def _compiled_transport() -> Callable[..., Tensor]:
    return torch.compile(transport)


def transport_fn(compile: bool) -> Callable[..., Tensor]:
    """`transport`, or its ``torch.compile``d version (compiled once per process; shapes that
    change between calls are compiled dynamically).

    Compiling fuses the few hundred element-wise operations of WENO into a handful of kernels:
    worth it on GPUs for long runs (data generation); it costs tens of seconds up front.
    """
    return _compiled_transport() if compile else transport


def ssp_rk3(u: Tensor, rhs, dt: Tensor, t: Tensor) -> Tensor:
    """One step of the three-stage, third-order strong-stability-preserving Runge-Kutta method.

    ``rhs(u, t) -> du/dt``; ``dt`` and ``t`` have shape ``(B,)``. ``rhs`` is called three
    times, in order, for the stages at ``t``, ``t + dt`` and ``t + dt / 2``.
    """
    shape = (-1,) + (1,) * (u.ndim - 1)
    h = dt.view(shape)
    u1 = u + h * rhs(u, t)
    u2 = 0.75 * u + 0.25 * (u1 + h * rhs(u1, t + dt))
    return u / 3 + 2 / 3 * (u2 + h * rhs(u2, t + 0.5 * dt))


def ssp_rk3_boundary_stages(g0: Tensor, g_half: Tensor, g1: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""Boundary data for the three stages of `ssp_rk3` that keep its third order.

    The intermediate stages of SSP-RK3 approximate the solution at $t + \Delta t$ and
    $t + \Delta t / 2$ only to first and second order, so imposing the data $g$ at those
    times lowers the scheme's order next to a time-dependent boundary (Carpenter et al.
    1995). The consistent stage data are $g$, $g + \Delta t\, g'$ and
    $g + \tfrac{\Delta t}{2} g' + \tfrac{\Delta t^2}{4} g''$; here $g'$ and $g''$ come from
    the quadratic through $g$ at $t$, $t + \Delta t / 2$ and $t + \Delta t$.

    Parameters
    ----------
    g0, g_half, g1 : Tensor
        The data at $t$, $t + \Delta t / 2$ and $t + \Delta t$.

    Returns
    -------
    tuple of Tensor
        The data for the first, second and third stage.
    """
    return g0, 4 * g_half - 2 * g0 - g1, 0.5 * (g0 + g1)
