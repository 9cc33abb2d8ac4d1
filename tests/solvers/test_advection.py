import math

import pytest
import torch

from gno_ext.schema import BoundarySpec, Grid
from gno_ext.solvers import solve_advection
from gno_ext.solvers.verification import rms

from .conftest import F64

PI = math.pi


def constant_velocity(grid, *v, batch=1):
    return torch.stack([torch.full(grid.shape, c, dtype=F64) for c in v])[None].expand(batch, -1, *grid.shape)


def test_three_dimensional_shift():
    grid = Grid((16, 16, 16))
    x, y, z = grid.coordinates(F64)
    f = lambda x, y, z: torch.sin(2 * PI * x) * torch.sin(2 * PI * (y + z))
    u = solve_advection(f(x, y, z)[None, None], constant_velocity(grid, 1.0, -1.0, 0.5),
                        BoundarySpec.periodic(3, 1, F64), [0.25], grid=grid)
    assert rms(u[0, 0, 0], f(x - 0.25, y + 0.25, z - 0.125)) < 5e-3


def test_mass_is_conserved_for_a_discretely_divergence_free_periodic_flow():
    grid = Grid((32, 32))
    x, y = grid.coordinates(F64)
    velocity = torch.stack([torch.sin(2 * PI * y), torch.zeros_like(y)])[None]  # shear flow
    u0 = torch.exp(-((x - 0.5) ** 2 + (y - 0.3) ** 2) / 0.02)[None, None]
    u = solve_advection(u0, velocity, BoundarySpec.periodic(2, 1, F64), [0.2, 0.6], grid=grid)
    assert abs(float(u[0, -1].sum() - u0.sum())) < 1e-10 * float(u0.sum())


def test_dirichlet_enters_at_inflow_and_outflow_data_is_ignored():
    grid = Grid((64, 8))
    velocity = constant_velocity(grid, 1.0, 0.0)
    u0 = torch.zeros(1, 1, 64, 8, dtype=F64)
    results = []
    for outflow_value in (0.0, 7.0):
        bc = BoundarySpec.from_types(["dirichlet", "dirichlet", "periodic", "periodic"],
                                     [2.0, outflow_value, 0, 0], batch_size=1, dtype=F64)
        results.append(solve_advection(u0, velocity, bc, [0.5], grid=grid)[0, 0, 0])
    x = grid.axis_coordinates(0)
    assert torch.allclose(results[0][x < 0.3], torch.tensor(2.0, dtype=F64), atol=1e-6)
    assert results[0][x > 0.7].abs().max() < 1e-6
    assert torch.equal(results[0], results[1])


def test_neumann_inflow_drives_the_boundary_value():
    # u0 = c - q x satisfies du/dn = q at x-; with v = (1, 0) the exact solution is u0 + q t.
    q, grid = 1.5, Grid((48, 6))
    x = grid.coordinates(F64)[0]
    u0 = (2.0 - q * x)[None, None]
    bc = BoundarySpec.from_types(["neumann", "neumann", "periodic", "periodic"], [q, 0, 0, 0],
                                 batch_size=1, dtype=F64)
    u = solve_advection(u0, constant_velocity(grid, 1.0, 0.0), bc, [0.3], grid=grid)
    # WENO's stencils reach two cells downwind, so the outflow kink leaks upstream, decaying
    # geometrically; far from it the linear profile is transported exactly.
    inner = x < 0.3
    assert (u[0, 0, 0][inner] - (u0[0, 0][inner] + q * 0.3)).abs().max() < 1e-10


def test_sample_result_does_not_depend_on_the_batch():
    grid = Grid((24, 24))
    x, y = grid.coordinates(F64)
    u0 = torch.stack([torch.sin(2 * PI * x), torch.cos(2 * PI * y)])[:, None]
    velocity = torch.cat([constant_velocity(grid, 0.2, 0.1), constant_velocity(grid, 3.0, -2.0)])
    bc = BoundarySpec.periodic(2, 2, F64)
    both = solve_advection(u0, velocity, bc, [0.1, 0.2], grid=grid)
    alone = solve_advection(u0[:1], velocity[:1], bc[0:1], [0.1, 0.2], grid=grid)
    assert torch.allclose(both[:1], alone, atol=1e-13, rtol=0)


def test_bad_input_errors():
    grid = Grid((16, 16))
    u0 = torch.zeros(1, 1, 16, 16, dtype=F64)
    v = constant_velocity(grid, 1.0, 1.0)
    bc = BoundarySpec.periodic(2, 1, F64)
    with pytest.raises(ValueError, match="dt=0.1 violates the stability limit"):
        solve_advection(u0, v, bc, [0.2], dt=0.1)
    with pytest.raises(ValueError, match="does not support ROBIN"):
        solve_advection(u0, v, BoundarySpec.from_types(["robin"] * 4, coeffs=[[1, 1]] * 4, batch_size=1), [0.1])
    with pytest.raises(ValueError, match=r"velocity: expected shape \(B, 2, 16, 16\)"):
        solve_advection(u0, v[:, :1], bc, [0.1])
    with pytest.raises(ValueError, match="scheme: expected one of"):
        solve_advection(u0, v, bc, [0.1], scheme="eno")
    with pytest.raises(ValueError, match="velocity: contains NaN"):
        solve_advection(u0, v * float("nan"), bc, [0.1])


@pytest.mark.slow
def test_compiled_transport_matches_eager():
    grid = Grid((16, 16))
    x, y = grid.coordinates(torch.float32)
    u0 = (torch.sin(2 * PI * x) * torch.cos(2 * PI * y))[None, None]
    velocity = torch.stack([torch.cos(2 * PI * y), torch.sin(2 * PI * x)])[None]
    bc = BoundarySpec.periodic(2, 1)
    eager = solve_advection(u0, velocity, bc, [0.05], grid=grid)
    compiled = solve_advection(u0, velocity, bc, [0.05], grid=grid, compile=True)
    assert torch.allclose(eager, compiled, atol=1e-5)


def test_time_dependent_inflow_data_is_checked():
    grid = Grid((16, 16))
    bc = BoundarySpec.from_types(["dirichlet"] * 4, 0.0, batch_size=1, dtype=F64)
    u0, v = torch.zeros(1, 1, 16, 16, dtype=F64), constant_velocity(grid, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"boundary_fn\(0\): returned NaN or Inf"):
        solve_advection(u0, v, bc, [0.1], grid=grid, boundary_fn=lambda t: torch.full((1, 4, 1), float("nan")))
    with pytest.raises(ValueError, match=r"expected shape \(1, 4, N_face\) with N_face in \(1, 16\)"):
        solve_advection(u0, v, bc, [0.1], grid=grid, boundary_fn=lambda t: torch.zeros(1, 4, 5))
