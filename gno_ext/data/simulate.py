"""Run the solvers for a batch of trajectories of a preset (all of one boundary type)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gno_ext.data.presets import Preset, Trajectory, _seed
from gno_ext.schema import BCType, BoundarySpec, Grid
from gno_ext.solvers import (gaussian_random_field, random_velocity, solve_advection, solve_burgers, solve_heat,
                             solve_navier_stokes)

__all__ = ["Simulated", "simulate", "KIND_OF", "ROBIN_COEFFS"]

KIND_OF = {"periodic": BCType.PERIODIC, "dirichlet": BCType.DIRICHLET, "neumann": BCType.NEUMANN,
           "robin": BCType.ROBIN, "dirichlet-time": BCType.DIRICHLET}
ROBIN_COEFFS = (1.0, 0.1)  # a u + b du/dn = g


@dataclass
class Simulated:
    """Output of `simulate` (CPU tensors).

    Attributes
    ----------
    u : Tensor, shape (n, T, C, *S), float32
    theta : Tensor, shape (n,)
    theta_field : Tensor, shape (n, d, *S) or None
        The advection velocity.
    bc : BoundarySpec
        Batched, with ``values`` of shape (n, F, T_bc, 1): ``T_bc = T`` for time-dependent data.
    field_names : list of str
    """

    u: Tensor
    theta: Tensor
    theta_field: Tensor | None
    bc: BoundarySpec
    field_names: list[str]


def _boundary(preset: Preset, trajs: Sequence[Trajectory], times: Tensor, device: str) -> tuple[BoundarySpec, object]:
    kind = trajs[0].boundary
    n, faces = len(trajs), 2 * preset.ndim
    values = torch.tensor([t.face_values for t in trajs], dtype=torch.float32)
    kinds = torch.full((n, faces), int(KIND_OF[kind]), dtype=torch.long)
    coeffs = torch.tensor(ROBIN_COEFFS).expand(n, faces, 2).clone() if kind == "robin" else None
    if kind != "dirichlet-time":
        return BoundarySpec(kinds, values[:, :, None, None], coeffs), None
    # g(t) = g0 (1 + 0.5 sin(2 pi t / t_end)): data that changes during the trajectory
    t_end = float(times[-1])

    def g(t: float) -> Tensor:
        return (values * (1 + 0.5 * math.sin(2 * math.pi * t / t_end)))[:, :, None].to(device)

    series = torch.stack([g(float(t)).cpu()[:, :, 0] for t in times], 2)[..., None]  # (n, F, T, 1)
    return BoundarySpec(kinds, series, coeffs), g


def simulate(preset: Preset, trajs: Sequence[Trajectory], size: str, device: str = "cpu") -> Simulated:
    """Solve the trajectories ``trajs`` (one boundary type) of ``preset`` at ``size``.

    On CUDA the WENO transport of advection and Burgers is ``torch.compile``d.
    """
    if len({t.boundary for t in trajs}) != 1:
        raise ValueError("simulate: a batch must share one boundary type")
    n_cells = preset.resolution[size]
    grid = Grid((n_cells,) * preset.ndim)
    times = torch.arange(preset.frames[size], dtype=torch.float64) * preset.frame_dt
    seeds = [t.seed for t in trajs]
    theta = torch.tensor([t.theta for t in trajs], dtype=torch.float64)
    periodic = trajs[0].boundary == "periodic"
    bc, boundary_fn = _boundary(preset, trajs, times, device)
    bc_dev = BoundarySpec(bc.kind, bc.values[:, :, :1], bc.coeffs).to(device)
    field = None
    if preset.family == "heat":
        u0 = gaussian_random_field(grid, seeds, length_scale=0.2, periodic=periodic, device=device)
        u = solve_heat(u0, theta.float().to(device), bc_dev, times, grid=grid, boundary_fn=boundary_fn)
        names = ["u"]
    elif preset.family == "advection":
        # one velocity field per parameter value, shared by its trajectories
        vel_seeds = [_seed(preset.name, "velocity", t.param_index if preset.fixed_parameter is None else 0)
                     for t in trajs]
        field = random_velocity(grid, vel_seeds, speed=1.0, periodic=periodic, device=device)
        field = field * theta.float().to(device).view(-1, *([1] * (grid.ndim + 1)))
        u0 = gaussian_random_field(grid, seeds, length_scale=0.2, periodic=periodic, device=device)
        u = solve_advection(u0, field, bc_dev, times, grid=grid, boundary_fn=boundary_fn,
                            compile=device.startswith("cuda"))
        names = ["u"]
    elif preset.family == "burgers":
        u0 = gaussian_random_field(grid, seeds, channels=2, length_scale=0.3, device=device)
        u = solve_burgers(u0, theta.float().to(device), times, grid=grid, compile=device.startswith("cuda"))
        names = ["velocity_x", "velocity_y"]
    elif preset.family == "ns":
        w0 = gaussian_random_field(grid, seeds, length_scale=0.2, sigma=3.0, device=device)
        u = solve_navier_stokes(w0, (1.0 / theta).float().to(device), times, grid=grid, output="velocity")
        names = ["velocity_x", "velocity_y"]
    else:
        raise ValueError(f"unknown family {preset.family!r}")
    return Simulated(u.float().cpu(), theta, None if field is None else field.float().cpu(), bc, names)
