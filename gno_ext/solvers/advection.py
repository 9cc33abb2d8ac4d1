r"""Batched linear advection $u_t + v(x) \cdot \nabla u = 0$ in 2-D and 3-D (1-D too).

The advective (non-conservative) form is solved, as in the paper; for a divergence-free
velocity it equals the conservative form. Space: WENO-Z (fifth order) or MUSCL face
reconstruction in the flux-difference form of `gno_ext.solvers.reconstruction`; time:
SSP-RK3 with a per-sample CFL step $\Delta t = \mathrm{cfl} / \sum_a (\max|v_a| / h_a)$.

Boundaries (per face, per sample), with three ghost cells:

* periodic: wrap-around;
* Dirichlet ``g``: imposed where the flow *enters* (``v . n < 0``);
* Neumann ``q = du/dn``: imposed where the flow enters;
* at outflow points (``v . n >= 0``) a hyperbolic equation admits no boundary condition: the
  data is ignored there and the ghost cells extrapolate the interior.

The ghost values are WENO-type extrapolations (`gno_ext.solvers.closure`): a polynomial of
degree 3 through the boundary datum and the nearest cells where the solution is smooth, which
keeps the scheme's order where the flow crosses a face (third order measured, with
time-dependent data), falling back to the constant (or linear) candidate at a jump such as
boundary data that does not match the initial condition. Time-dependent data enters the
Runge-Kutta stages as `gno_ext.solvers.reconstruction.ssp_rk3_boundary_stages` prescribes.

Face velocities are averages of the two adjacent cell-centred velocities (linear
extrapolation at non-periodic faces).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from gno_ext.schema import BCType, BoundarySpec, Grid, face_view
from gno_ext.solvers._common import (
    MAX_STEPS,
    batch_parameter,
    boundary_data,
    check_boundary,
    check_field,
    check_times,
    march,
)
from gno_ext.solvers.closure import CLOSURES, closure_weights, extrapolate
from gno_ext.solvers.reconstruction import (
    N_GHOST,
    check_transport_options,
    ssp_rk3,
    ssp_rk3_boundary_stages,
    transport_fn,
)

__all__ = ["solve_advection", "advection_max_dt", "face_velocities", "GhostCells"]

ADVECTION_BC = (BCType.PERIODIC, BCType.DIRICHLET, BCType.NEUMANN)
MAX_CFL = 1.0
CLOSURE_DEGREE = 3  # of the boundary polynomial: ghost values to O(h^4)


def face_velocities(velocity: Tensor, periodic_axes: Tensor) -> list[Tensor]:
    """Normal velocity at every face of every axis.

    Parameters
    ----------
    velocity : Tensor, shape (B, d, *S)
        Cell-centred velocity.
    periodic_axes : Tensor, shape (B, d), bool
        Whether each sample is periodic along each axis.

    Returns
    -------
    list of Tensor
        Entry ``a`` has shape ``(B, 1, *S)`` with ``N_a + 1`` points along axis ``a``.
    """
    d = velocity.shape[1]
    out = []
    for axis in range(d):
        dim = axis + 2
        v = velocity[:, axis : axis + 1]
        n = v.shape[dim]
        first, second = v.narrow(dim, 0, 1), v.narrow(dim, 1, 1)
        last, before = v.narrow(dim, n - 1, 1), v.narrow(dim, n - 2, 1)
        per = periodic_axes[:, axis].view(-1, *([1] * (v.ndim - 1)))
        wrap = 0.5 * (first + last)
        lo = torch.where(per, wrap, 1.5 * first - 0.5 * second)
        hi = torch.where(per, wrap, 1.5 * last - 0.5 * before)
        inner = 0.5 * (v.narrow(dim, 0, n - 1) + v.narrow(dim, 1, n - 1))
        out.append(torch.cat([lo, inner, hi], dim))
    return out


def advection_max_dt(face_vel: list[Tensor], grid: Grid, cfl: float) -> Tensor:
    """Per-sample step with ``sum_a max|v_a| dt / h_a = cfl``, shape ``(B,)``."""
    rate = sum(v.abs().flatten(1).amax(1) / h for v, h in zip(face_vel, grid.spacing))
    return cfl / rate.clamp_min(1e-12)


class GhostCells:
    """Fills `N_GHOST` ghost cells per face; everything fixed in time is precomputed.

    Parameters
    ----------
    grid : Grid
    bc : BoundarySpec
        Batched spec (types fixed in time).
    face_vel : list of Tensor
        Face velocities from `face_velocities` (steady), which fix inflow and outflow.
    degree : int
        Degree of the boundary polynomial (see `closure_weights`).
    """

    def __init__(self, grid: Grid, bc: BoundarySpec, face_vel: list[Tensor], degree: int = CLOSURE_DEGREE) -> None:
        self.grid, self.degree = grid, degree
        dtype, device = face_vel[0].dtype, face_vel[0].device
        shape = (-1,) + (1,) * (grid.ndim + 1)
        # per axis, since the linear weights depend on the cell size normal to the face
        self.weights = [{kind: closure_weights(kind, h, degree, N_GHOST).to(dtype, device) for kind in CLOSURES}
                        for h in grid.spacing]
        self.bounded = [bool((bc.kind[:, 2 * a : 2 * a + 2] != BCType.PERIODIC).any()) for a in range(grid.ndim)]
        for axis, (n, bounded) in enumerate(zip(grid.shape, self.bounded)):
            if bounded and n < degree + 1:
                raise ValueError(f"grid: a bounded axis needs at least {degree + 1} cells for the "
                                 f"boundary closure, axis {axis} has {n}")
        self.faces = []
        for face in range(grid.n_faces):
            axis, lo = face // 2, face % 2 == 0
            dim = axis + 2
            n = grid.shape[axis]
            kind = bc.kind[:, face].view(shape)
            vel = face_vel[axis].narrow(dim, 0 if lo else n, 1)
            inflow = (vel > 0) if lo else (vel < 0)
            bounded, dirichlet = kind != BCType.PERIODIC, kind == BCType.DIRICHLET
            # each closure's points; they are laid over each other in this order, each one where it applies
            where = {"outflow": bounded & ~inflow, "neumann": bounded & inflow & ~dirichlet,
                     "dirichlet": inflow & dirichlet}
            self.faces.append({
                "periodic": ~bounded,
                "closures": [(k, w) for k, w in where.items() if bool(w.any())],  # only those some point needs
            })

    def pad(self, u: Tensor, axis: int, values: Tensor) -> Tensor:
        """``u`` (B, C, *S) with ghost cells on both ends of ``axis``; data ``values`` (B, F, N_face)."""
        dim = axis + 2
        n = u.shape[dim]
        if not self.bounded[axis]:
            return torch.cat([u.narrow(dim, n - N_GHOST, N_GHOST), u, u.narrow(dim, 0, N_GHOST)], dim)
        h = self.grid.spacing[axis]
        layers = []
        for face in (2 * axis, 2 * axis + 1):
            lo = face % 2 == 0
            f = self.faces[face]
            g = face_view(values, face, self.grid).unsqueeze(1).unsqueeze(-1)  # (B, 1, *face, 1)
            m = self.degree + 1
            # interior cells counted inward from the face (j = 0 first), moved to the last axis
            inner = u.narrow(dim, 0, m) if lo else u.narrow(dim, n - m, m).flip(dim)
            inner = torch.movedim(inner, dim, -1)
            g = g.expand(*inner.shape[:-1], 1)
            cells = inner.narrow(-1, 0, self.degree)
            layer = None
            for kind, where in f["closures"]:
                data = {"outflow": None, "neumann": h * g, "dirichlet": g}[kind]
                x = inner if data is None else torch.cat([data, cells], -1)
                ghost = torch.movedim(extrapolate(x, self.weights[axis][kind]), -1, dim)
                layer = ghost if layer is None else torch.where(where, ghost, layer)
            if layer is None:  # every sample is periodic on this face
                layer = u.narrow(dim, 0, N_GHOST)
            # ghosts are built nearest first; the lo side's array order is farthest first
            layer = layer.flip(dim) if lo else layer
            wrap = u.narrow(dim, n - N_GHOST, N_GHOST) if lo else u.narrow(dim, 0, N_GHOST)
            layers.append(torch.where(f["periodic"], wrap, layer))
        return torch.cat([layers[0], u, layers[1]], dim)


def solve_advection(u0: Tensor, velocity: Tensor, bc: BoundarySpec, times: Sequence[float] | Tensor,
                    *, grid: Grid | None = None, scheme: str = "weno5", cfl: float = 0.5,
                    dt: float | None = None,
                    boundary_fn: Callable[[float], Tensor] | None = None,
                    stats: dict | None = None, compile: bool = False, max_steps: int = MAX_STEPS) -> Tensor:
    r"""Solve $u_t + v \cdot \nabla u = 0$ for a batch.

    Parameters
    ----------
    u0 : Tensor, shape (B, C, *S)
        Initial conditions; channels share velocity and boundary.
    velocity : Tensor, shape (B, d, *S)
        Cell-centred velocity per sample (steady).
    bc : BoundarySpec
        Batched; PERIODIC, DIRICHLET or NEUMANN per face (see module docstring).
    times : sequence of float, shape (T,)
        Output times.
    grid : Grid, optional
        Defaults to the unit box of ``u0``'s shape.
    scheme : {"weno5", "muscl"}
        Face reconstruction.
    cfl : float
        Courant number of the automatic step, in (0, 1].
    dt : float, optional
        A fixed step instead; rejected if its Courant number exceeds 1.
    boundary_fn : callable, optional
        ``boundary_fn(t) -> Tensor (B, F, N_face)``: time-dependent data (then all samples
        share the smallest step so that data is sampled at one time).
    stats : dict, optional
        If given, ``stats["steps"]`` receives the number of time steps taken (largest over the
        batch).
    max_steps : int
        Refuse a plan of more time steps than this (`gno_ext.solvers._common.MAX_STEPS`) with an
        error that names the step count and the parameter that set the step.
    compile : bool
        ``torch.compile`` the transport operator (see `gno_ext.solvers.reconstruction.transport_fn`).

    Returns
    -------
    Tensor, shape (B, T, C, *S)
    """
    grid = grid or Grid(tuple(u0.shape[2:]))
    check_field("u0", u0, grid)
    check_field("velocity", velocity, grid, channels=grid.ndim)
    batch = u0.shape[0]
    if velocity.shape[0] != batch:
        raise ValueError(f"velocity: expected batch size {batch}, got {velocity.shape[0]}")
    check_boundary(bc, grid, batch, ADVECTION_BC, "advection")
    check_transport_options(grid, scheme, cfl, MAX_CFL)
    if dt is not None:
        batch_parameter("dt", dt, 1, u0)
    t_out = check_times(times)
    bc = bc.to(u0.device, dtype=u0.dtype)
    velocity = velocity.to(u0)
    periodic_axes = (bc.kind[:, 0::2] == BCType.PERIODIC)
    fvel = face_velocities(velocity, periodic_axes)

    def data_at(t: float) -> Tensor:  # all samples share the step when boundary_fn is given
        return boundary_data(bc, grid, boundary_fn, t, u0)

    ghosts = GhostCells(grid, bc, fvel)
    transport_op = transport_fn(compile)
    constant = data_at(0.0) if boundary_fn is None else None  # read once: no time to look up per step

    def rhs(u: Tensor, data: Tensor) -> Tensor:
        padded = [ghosts.pad(u, a, data) for a in range(grid.ndim)]
        return -transport_op(u, padded, fvel, grid.spacing, scheme)

    def step(u: Tensor, h: Tensor, t: Tensor) -> Tensor:
        if constant is not None:
            return ssp_rk3(u, lambda v, _: rhs(v, constant), h, t)
        t0, dt_step = float(t[0]), float(h[0])
        stages = iter(ssp_rk3_boundary_stages(data_at(t0), data_at(t0 + 0.5 * dt_step), data_at(t0 + dt_step)))
        return ssp_rk3(u, lambda v, _: rhs(v, next(stages)), h, t)

    limit = advection_max_dt(fvel, grid, cfl if dt is None else MAX_CFL)
    if boundary_fn is not None and dt is None:
        dt = float(limit.min())
    speed = torch.stack([f.abs().flatten(1).amax(1) for f in fvel]).amax(0)
    frames = march(u0, t_out, lambda u: limit, step, dt, stats=stats, max_steps=max_steps,
                   cause=lambda b, u: f"velocity (largest face speed {float(speed[b]):.3g})")
    return torch.stack(frames, 1)
