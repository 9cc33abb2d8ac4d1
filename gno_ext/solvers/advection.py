r"""Batched linear advection $u_t + v(x) \cdot \nabla u = 0$ in 2-D and 3-D (1-D too).

The advective (non-conservative) form is solved, as in the paper; for a divergence-free
velocity it equals the conservative form. Space: WENO-Z (fifth order) or MUSCL face
reconstruction in the flux-difference form of `gno_ext.solvers.reconstruction`; time:
SSP-RK3 with a per-sample CFL step $\Delta t = \mathrm{cfl} / \sum_a (\max|v_a| / h_a)$.

Boundaries (per face, per sample), with three ghost cells:

* periodic: wrap-around;
* Dirichlet ``g``: imposed where the flow *enters* (``v . n < 0``: ghost cells equal ``g``);
* Neumann ``q = du/dn``: imposed where the flow enters, by the reflected ghost cells
  $u_{-k} = u_{k-1} + (2k - 1) h q$;
* at outflow points (``v . n >= 0``) a hyperbolic equation admits no boundary condition: the
  data is ignored there and ghost cells copy the boundary cell (zero-gradient extrapolation).

Face velocities are averages of the two adjacent cell-centred velocities (linear
extrapolation at non-periodic faces).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from gno_ext.schema import BCType, BoundarySpec, Grid, face_view
from gno_ext.solvers._common import (
    batch_parameter,
    boundary_data,
    check_boundary,
    check_field,
    check_times,
    march,
)
from gno_ext.solvers.reconstruction import (
    N_GHOST,
    check_transport_options,
    ssp_rk3,
    transport_fn,
)

__all__ = ["solve_advection", "advection_max_dt", "face_velocities", "GhostCells"]

ADVECTION_BC = (BCType.PERIODIC, BCType.DIRICHLET, BCType.NEUMANN)
MAX_CFL = 1.0


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
    """

    def __init__(self, grid: Grid, bc: BoundarySpec, face_vel: list[Tensor]) -> None:
        self.grid = grid
        dtype, device = face_vel[0].dtype, face_vel[0].device
        shape = (-1,) + (1,) * (grid.ndim + 1)
        self.faces = []
        for face in range(grid.n_faces):
            axis, lo = face // 2, face % 2 == 0
            dim = axis + 2
            n = grid.shape[axis]
            kind = bc.kind[:, face].view(shape)
            vel = face_vel[axis].narrow(dim, 0 if lo else n, 1)
            dist = torch.arange(2 * N_GHOST - 1, 0, -2, dtype=dtype, device=device) * grid.spacing[axis]
            dist = (dist if lo else dist.flip(0)).view([N_GHOST if k == dim else 1 for k in range(grid.ndim + 2)])
            self.faces.append({
                "periodic": kind == BCType.PERIODIC,
                "dirichlet": kind == BCType.DIRICHLET,
                "inflow": (vel > 0) if lo else (vel < 0),
                "dist": dist,
            })

    def pad(self, u: Tensor, axis: int, values: Tensor) -> Tensor:
        """``u`` (B, C, *S) with ghost cells on both ends of ``axis``; data ``values`` (B, F, N_face)."""
        dim = axis + 2
        n = u.shape[dim]
        layers = []
        for face in (2 * axis, 2 * axis + 1):
            lo = face % 2 == 0
            f = self.faces[face]
            g = face_view(values, face, self.grid).unsqueeze(1).unsqueeze(dim)
            wrap = u.narrow(dim, n - N_GHOST, N_GHOST) if lo else u.narrow(dim, 0, N_GHOST)
            # Reflected cells in array order: lo -> u_2, u_1, u_0; hi -> u_{N-1}, u_{N-2}, u_{N-3}.
            mirror = (u.narrow(dim, 0, N_GHOST) if lo else u.narrow(dim, n - N_GHOST, N_GHOST)).flip(dim)
            edge = u.narrow(dim, 0 if lo else n - 1, 1).expand_as(wrap)
            bounded = torch.where(f["dirichlet"], g.expand_as(wrap), mirror + f["dist"] * g)
            layers.append(torch.where(f["periodic"], wrap, torch.where(f["inflow"], bounded, edge)))
        return torch.cat([layers[0], u, layers[1]], dim)


def solve_advection(u0: Tensor, velocity: Tensor, bc: BoundarySpec, times: Sequence[float] | Tensor,
                    *, grid: Grid | None = None, scheme: str = "weno5", cfl: float = 0.5,
                    dt: float | None = None,
                    boundary_fn: Callable[[float], Tensor] | None = None,
                    stats: dict | None = None, compile: bool = False) -> Tensor:
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

    def data_at(t: Tensor) -> Tensor:  # all samples share the step when boundary_fn is given
        return boundary_data(bc, grid, boundary_fn, float(t[0]), u0)

    ghosts = GhostCells(grid, bc, fvel)
    transport_op = transport_fn(compile)

    def rhs(u: Tensor, t: Tensor) -> Tensor:
        data = data_at(t)
        padded = [ghosts.pad(u, a, data) for a in range(grid.ndim)]
        return -transport_op(u, padded, fvel, grid.spacing, scheme)

    limit = advection_max_dt(fvel, grid, cfl if dt is None else MAX_CFL)
    if boundary_fn is not None and dt is None:
        dt = float(limit.min())
    frames = march(u0, t_out, lambda u: limit, lambda u, h, t: ssp_rk3(u, rhs, h, t), dt,
                   stats=stats)
    return torch.stack(frames, 1)
