"""Run the solvers for a batch of trajectories of a preset (all of one boundary type)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gno_ext.data.presets import Preset, Trajectory
from gno_ext.schema import BCType, BoundarySpec
from gno_ext.solvers import (gaussian_random_field, random_velocity, solve_advection, solve_burgers, solve_heat,
                             solve_navier_stokes)
from gno_ext.solvers.advection import CLOSURE_DEGREE

__all__ = ["Simulated", "simulate", "velocity_fields", "KIND_OF", "ROBIN_COEFFS", "SOLVER_SETTINGS"]

# Everything besides the preset that fixes a trajectory: part of every dataset's fingerprint
# (`gno_ext.data.fingerprint`), so a change here makes cached datasets stale. Lengths are in
# units of the box's side (a preset's `extent`).
SOLVER_SETTINGS = {
    "heat": {"initial_length_scale": 0.2, "time": "exact; etd2 with time-dependent data"},
    "advection": {"initial_length_scale": 0.2, "velocity_length_scale": 0.5, "velocity_rms": 1.0,
                  "scheme": "weno5", "cfl": 0.5, "time": "ssp-rk3, consistent stage boundary data",
                  "boundary_closure": f"weno extrapolation, degree {CLOSURE_DEGREE}"},
    "burgers": {"initial_length_scale": 0.3, "scheme": "weno5, strang splitting"},
    "ns": {"initial_length_scale": 0.2, "initial_sigma": 3.0, "solver": "pseudo-spectral, imex rk3-cn"},
    "dirichlet_time": "g0 (1 + 0.5 sin(2 pi t / t_end))",
    "robin": {"a": 1.0, "b": 0.1},
}
KIND_OF = {"periodic": BCType.PERIODIC, "dirichlet": BCType.DIRICHLET, "neumann": BCType.NEUMANN,
           "robin": BCType.ROBIN, "dirichlet-time": BCType.DIRICHLET}
ROBIN_COEFFS = (SOLVER_SETTINGS["robin"]["a"], SOLVER_SETTINGS["robin"]["b"])  # a u + b du/dn = g


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


def velocity_fields(preset: Preset, trajs: Sequence[Trajectory], size: str, device: str = "cpu") -> Tensor:
    """The advection velocity of each trajectory, shape ``(n, d, *S)``: the random field of its
    ``field_seed`` (RMS speed 1) times its speed ``theta``; the Frobenius norm is proportional to
    ``theta``."""
    if any(t.field_seed is None for t in trajs):
        raise ValueError(f"{preset.name}: its trajectories have no velocity field")
    settings = SOLVER_SETTINGS["advection"]
    grid = preset.grid(size)
    periodic = trajs[0].boundary == "periodic"
    field = random_velocity(grid, [t.field_seed for t in trajs],
                            length_scale=settings["velocity_length_scale"] * preset.extent,
                            speed=settings["velocity_rms"], periodic=periodic, device=device)
    speed = torch.tensor([t.theta for t in trajs], dtype=field.dtype, device=field.device)
    return field * speed.view(-1, *([1] * (grid.ndim + 1)))


def simulate(preset: Preset, trajs: Sequence[Trajectory], size: str, device: str = "cpu") -> Simulated:
    """Solve the trajectories ``trajs`` (one boundary type) of ``preset`` at ``size``.

    On CUDA the WENO transport of advection and Burgers is ``torch.compile``d.
    """
    if len({t.boundary for t in trajs}) != 1:
        raise ValueError("simulate: a batch must share one boundary type")
    grid = preset.grid(size)
    times = torch.arange(preset.frames[size], dtype=torch.float64) * preset.frame_dt
    seeds = [t.seed for t in trajs]
    theta = torch.tensor([t.theta for t in trajs], dtype=torch.float64)
    periodic = trajs[0].boundary == "periodic"
    bc, boundary_fn = _boundary(preset, trajs, times, device)
    bc_dev = BoundarySpec(bc.kind, bc.values[:, :, :1], bc.coeffs).to(device)
    field = None
    settings = SOLVER_SETTINGS.get(preset.family, {})
    length = settings.get("initial_length_scale", 0.0) * preset.extent  # the initial fields' correlation length
    if preset.family == "heat":
        u0 = gaussian_random_field(grid, seeds, length_scale=length, periodic=periodic, device=device)
        u = solve_heat(u0, theta.float().to(device), bc_dev, times, grid=grid, boundary_fn=boundary_fn)
        names = ["u"]
    elif preset.family == "advection":
        field = velocity_fields(preset, trajs, size, device)
        u0 = gaussian_random_field(grid, seeds, length_scale=length, periodic=periodic, device=device)
        u = solve_advection(u0, field, bc_dev, times, grid=grid, boundary_fn=boundary_fn, scheme=settings["scheme"],
                            cfl=settings["cfl"], compile=device.startswith("cuda"))
        names = ["u"]
    elif preset.family == "burgers":
        u0 = gaussian_random_field(grid, seeds, channels=2, length_scale=length, device=device)
        u = solve_burgers(u0, theta.float().to(device), times, grid=grid, compile=device.startswith("cuda"))
        names = ["velocity_x", "velocity_y"]
    elif preset.family == "ns":
        w0 = gaussian_random_field(grid, seeds, length_scale=length, sigma=settings["initial_sigma"], device=device)
        u = solve_navier_stokes(w0, (1.0 / theta).float().to(device), times, grid=grid, output="velocity")
        names = ["velocity_x", "velocity_y"]
    else:
        raise ValueError(f"unknown family {preset.family!r}")
    return Simulated(u.float().cpu(), theta, None if field is None else field.float().cpu(), bc, names)
