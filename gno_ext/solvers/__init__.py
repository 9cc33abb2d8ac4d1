"""Batched torch PDE solvers and random fields (data generation and runtime baselines).

Every solver takes a batch of initial conditions ``(B, C, *S)`` with per-sample parameters
(and boundary data, where it applies), runs on CPU or CUDA in float32 or float64, and returns
the trajectory at the requested output times, ``(B, T, C, *S)``.
"""

from gno_ext.solvers.advection import solve_advection
from gno_ext.solvers.burgers import solve_burgers
from gno_ext.solvers.heat import heat_max_dt, solve_heat
from gno_ext.solvers.navier_stokes import (
    kolmogorov_forcing,
    solve_navier_stokes,
    velocity_from_vorticity,
)
from gno_ext.solvers.random_fields import gaussian_random_field, random_velocity

__all__ = [
    "solve_heat",
    "heat_max_dt",
    "solve_advection",
    "solve_burgers",
    "solve_navier_stokes",
    "velocity_from_vorticity",
    "kolmogorov_forcing",
    "gaussian_random_field",
    "random_velocity",
]
