r"""Reference problems with analytic solutions, for convergence studies.

Each :class:`ConvergenceCase` maps a resolution ``n`` to the RMS error of a solver against
an exact solution; :func:`observed_orders` turns a sequence of errors into convergence orders.
The test-suite asserts these orders and ``recipes/solver_convergence.py`` prints the table in
the documentation, from the same code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gno_ext.schema import BoundarySpec, Grid
from gno_ext.solvers.advection import solve_advection
from gno_ext.solvers.burgers import solve_burgers
from gno_ext.solvers.heat import solve_heat
from gno_ext.solvers.navier_stokes import solve_navier_stokes

__all__ = ["ConvergenceCase", "CASES", "observed_orders", "rms"]

F64 = torch.float64
PI = math.pi


def rms(a: Tensor, b: Tensor) -> float:
    """Root-mean-square difference of two tensors."""
    return float((a - b).pow(2).mean().sqrt())


def observed_orders(errors: Sequence[float], resolutions: Sequence[float]) -> list[float]:
    r"""Orders $\log(e_i / e_{i+1}) / \log(n_{i+1} / n_i)$ between successive refinements."""
    return [math.log(e0 / e1) / math.log(n1 / n0)
            for e0, e1, n0, n1 in zip(errors, errors[1:], resolutions, resolutions[1:])]


@dataclass(frozen=True)
class ConvergenceCase:
    """One convergence study.

    Attributes
    ----------
    name : str
        Short identifier.
    description : str
        The exact solution and what is refined.
    error : callable
        ``error(n) -> float``: RMS error at resolution ``n``.
    resolutions : tuple of int
        Refinement sequence (cells per axis, or inverse time step where stated).
    expected : float
        Design order of accuracy of the combined space-time error.
    """

    name: str
    description: str
    error: Callable[[int], float]
    resolutions: tuple[int, ...]
    expected: float

    def run(self) -> tuple[list[float], list[float]]:
        """Errors and observed orders over :attr:`resolutions`."""
        errors = [self.error(n) for n in self.resolutions]
        return errors, observed_orders(errors, self.resolutions)


def _heat_mode(kind: str) -> Callable[[int], float]:
    def error(n: int) -> float:
        grid = Grid((n, n))
        x, y = grid.coordinates(F64)
        trig = torch.sin if kind == "dirichlet" else torch.cos
        mode = trig(PI * x) * trig(2 * PI * y)
        alpha, t = 0.1, 0.3
        bc = BoundarySpec.from_types([kind] * 4, 0.0, batch_size=1, dtype=F64)
        u = solve_heat(mode[None, None], alpha, bc, [t], grid=grid)
        return rms(u[0, 0, 0], mode * math.exp(-alpha * 5 * PI ** 2 * t))
    return error


def heat_manufactured(x: Tensor, y: Tensor, t: float, alpha: float) -> Tensor:
    """An exact heat solution with time-dependent, non-uniform boundary values."""
    return (math.exp(-5 * alpha * PI ** 2 * t) * torch.sin(PI * x + 0.4) * torch.sin(2 * PI * y + 0.9)
            + 4 * alpha * t + x ** 2 + y ** 2)


def _heat_time_dependent(n: int) -> float:
    alpha, t_end = 0.2, 0.25
    grid = Grid((n, n))
    pts = [grid.face_coordinates(f, F64) for f in range(4)]
    x, y = grid.coordinates(F64)

    def boundary(t: float) -> Tensor:
        return torch.stack([heat_manufactured(p[0], p[1], t, alpha) for p in pts])[None]

    bc = BoundarySpec(torch.ones(1, 4, dtype=torch.long), boundary(0.0)[:, :, None])
    u = solve_heat(heat_manufactured(x, y, 0.0, alpha)[None, None], alpha, bc, [t_end], grid=grid,
                   boundary_fn=boundary, dt=0.4 / n)
    return rms(u[0, 0, 0], heat_manufactured(x, y, t_end, alpha))


def _advection_shift(scheme: str) -> Callable[[int], float]:
    def error(n: int) -> float:
        grid = Grid((n, n))
        x, y = grid.coordinates(F64)
        f = lambda x, y: torch.sin(2 * PI * x) * torch.cos(2 * PI * y)
        vel = torch.stack([torch.full(grid.shape, 1.0, dtype=F64), torch.full(grid.shape, 0.5, dtype=F64)])
        u = solve_advection(f(x, y)[None, None], vel[None], BoundarySpec.periodic(2, 1, F64), [0.5],
                            grid=grid, scheme=scheme, cfl=0.4)
        return rms(u[0, 0, 0], f(x - 0.5, y - 0.25))
    return error


def _advection_rotation(n: int) -> float:
    grid = Grid((n, n))
    x, y = grid.coordinates(F64)
    vel = torch.stack([-2 * PI * (y - 0.5), 2 * PI * (x - 0.5)])[None]
    blob = lambda x, y: torch.exp(-((x - 0.75) ** 2 + (y - 0.5) ** 2) / 0.004)
    bc = BoundarySpec.from_types(["dirichlet"] * 4, 0.0, batch_size=1, dtype=F64)
    u = solve_advection(blob(x, y)[None, None], vel, bc, [0.25], grid=grid)
    return rms(u[0, 0, 0], blob(y, 1.0 - x))  # a quarter turn: (x, y) <- (y, 1 - x)


def _advection_through_faces(kind: str) -> Callable[[int], float]:
    """Transport of a non-periodic profile by v = (1, 0.6) through a box with inflow on two faces
    and outflow on the others; inflow data (Dirichlet values or Neumann fluxes) from the exact
    solution, so it varies along each face and in time."""
    v = (1.0, 0.6)
    f = lambda x, y: torch.sin(2 * PI * (x + 0.3)) * torch.cos(PI * (y - 0.2)) + 0.5 * torch.cos(3 * x + 2 * y)
    fx = lambda x, y: (2 * PI * torch.cos(2 * PI * (x + 0.3)) * torch.cos(PI * (y - 0.2))
                       - 1.5 * torch.sin(3 * x + 2 * y))
    fy = lambda x, y: -PI * torch.sin(2 * PI * (x + 0.3)) * torch.sin(PI * (y - 0.2)) - torch.sin(3 * x + 2 * y)

    def error(n: int) -> float:
        grid = Grid((n, n))
        x, y = grid.coordinates(F64)
        s = (torch.arange(n, dtype=F64) + 0.5) / n
        zero, one = torch.zeros(n, dtype=F64), torch.ones(n, dtype=F64)
        faces = [((zero, s), (-1, 0)), ((one, s), (1, 0)), ((s, zero), (0, -1)), ((s, one), (0, 1))]

        def data(t: float) -> Tensor:
            out = []
            for (px, py), (nx, ny) in faces:
                X, Y = px - v[0] * t, py - v[1] * t
                out.append(f(X, Y) if kind == "dirichlet" else nx * fx(X, Y) + ny * fy(X, Y))
            return torch.stack(out)[None]

        bc = BoundarySpec.from_types([kind] * 4, 0.0, batch_size=1, dtype=F64)
        vel = torch.stack([torch.full(grid.shape, c, dtype=F64) for c in v])[None]
        u = solve_advection(f(x, y)[None, None], vel, bc, [0.7], grid=grid, boundary_fn=data, cfl=0.4)
        return rms(u[0, 0, 0], f(x - 0.7 * v[0], y - 0.7 * v[1]))
    return error


def cole_hopf(x: Tensor, y: Tensor, t: float, nu: float) -> Tensor:
    r"""Exact 2-D Burgers velocity $u = -2\nu \nabla \log \phi$, $\phi_t = \nu \Delta \phi$, $\phi > 0$."""
    k1, k2 = 2 * PI, 4 * PI
    e1, e2 = math.exp(-nu * k1 ** 2 * t), math.exp(-nu * (k1 ** 2 + k2 ** 2) * t)
    phi = 2.5 + e1 * torch.cos(k1 * x) + e2 * torch.sin(k1 * x + k2 * y)
    px = -k1 * e1 * torch.sin(k1 * x) + k1 * e2 * torch.cos(k1 * x + k2 * y)
    py = k2 * e2 * torch.cos(k1 * x + k2 * y)
    return torch.stack([-2 * nu * px / phi, -2 * nu * py / phi])


def _burgers_cole_hopf(n: int) -> float:
    nu, grid = 0.05, Grid((n, n))
    x, y = grid.coordinates(F64)
    u = solve_burgers(cole_hopf(x, y, 0.0, nu)[None], nu, [0.1], grid=grid)
    return rms(u[0, 0], cole_hopf(x, y, 0.1, nu))


def _taylor_green(steps_per_unit: int) -> float:
    grid, nu, k = Grid((32, 32)), 0.01, 2 * PI
    x, y = grid.coordinates(F64)
    w0 = (2 * k * torch.cos(k * x) * torch.cos(k * y))[None, None]
    w = solve_navier_stokes(w0, nu, [1.0], grid=grid, forcing=None, dt=1.0 / steps_per_unit)
    return rms(w[:, 0], w0 * math.exp(-2 * nu * k * k))


CASES: dict[str, ConvergenceCase] = {c.name: c for c in [
    ConvergenceCase("heat-dirichlet", "heat, sin(pi x) sin(2 pi y) mode, homogeneous Dirichlet, exact path; grid refined",
                    _heat_mode("dirichlet"), (16, 32, 64), 2.0),
    ConvergenceCase("heat-neumann", "heat, cos(pi x) cos(2 pi y) mode, homogeneous Neumann, exact path; grid refined",
                    _heat_mode("neumann"), (16, 32, 64), 2.0),
    ConvergenceCase("heat-time-dependent", "heat, manufactured solution with time-dependent non-uniform Dirichlet "
                    "data, ETD2; grid and step refined together", _heat_time_dependent, (16, 32, 64), 2.0),
    ConvergenceCase("advection-weno5", "advection, exact shift of a periodic mode by a constant velocity, "
                    "WENO-Z + SSP-RK3 at CFL 0.4 (time error dominates)", _advection_shift("weno5"), (16, 32, 64), 3.0),
    ConvergenceCase("advection-muscl", "advection, same shift, MUSCL (MC limiter) + SSP-RK3",
                    _advection_shift("muscl"), (16, 32, 64), 2.0),
    ConvergenceCase("advection-rotation", "advection, solid-body rotation of a Gaussian in a Dirichlet box, "
                    "quarter turn, WENO-Z", _advection_rotation, (32, 64, 128), 3.0),
    ConvergenceCase("advection-inflow-dirichlet", "advection, a profile carried through the faces of a box by "
                    "v = (1, 0.6), time-dependent Dirichlet inflow data varying along each face, WENO-Z",
                    _advection_through_faces("dirichlet"), (32, 64, 128), 3.0),
    ConvergenceCase("advection-inflow-neumann", "advection, the same flow with Neumann inflow data (normal "
                    "derivative of the exact solution), WENO-Z", _advection_through_faces("neumann"), (32, 64, 128), 3.0),
    ConvergenceCase("burgers-cole-hopf", "Burgers, Cole-Hopf exact solution (nu = 0.05), Strang splitting "
                    "with WENO-Z; grid and step refined together", _burgers_cole_hopf, (32, 64, 128), 2.0),
    ConvergenceCase("ns-taylor-green", "Navier-Stokes, Taylor-Green vortex decay (nu = 0.01, 32^2), "
                    "IMEX RK3-CN; time step refined (resolution = steps per unit time)", _taylor_green,
                    (100, 200, 400), 2.0),
]}
