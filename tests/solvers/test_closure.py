"""The ghost-cell closure at bounded faces: exact candidates, accuracy, no overshoot, stability."""

import math

import pytest
import torch

from gno_ext.schema import BoundarySpec, Grid
from gno_ext.solvers import solve_advection
from gno_ext.solvers.advection import GhostCells, face_velocities
from gno_ext.solvers.closure import closure_weights, extrapolate
from gno_ext.solvers.reconstruction import transport

from .conftest import F64

GHOSTS = -(torch.arange(1, 4, dtype=F64) - 0.5)  # ghost distances from the face, in cells
CELLS = torch.arange(5, dtype=F64) + 0.5


def inputs(kind, p, dp):
    """Closure inputs of the function p (distance in cells) with derivative dp, degree 3."""
    if kind == "outflow":
        return p(CELLS[:4])
    data = p(torch.zeros(1, dtype=F64)) if kind == "dirichlet" else -dp(torch.zeros(1, dtype=F64))
    return torch.cat([data, p(CELLS[:3])])


@pytest.mark.parametrize("kind", ["dirichlet", "neumann", "outflow"])
def test_each_candidate_reproduces_polynomials_of_its_degree(kind):
    w = closure_weights(kind, 1 / 64)
    for k, degree in enumerate(range(w.lowest_degree, 4)):
        coeffs = torch.tensor([0.3, -1.2, 0.7, 0.25], dtype=F64)[: degree + 1]
        p = lambda s: sum(c * s ** i for i, c in enumerate(coeffs))
        dp = lambda s: sum(i * c * s ** (i - 1) for i, c in enumerate(coeffs) if i)
        # the Neumann datum is h q = -dp/ds at the face (outward normal points to s < 0)
        assert torch.allclose(w.ghost[k] @ inputs(kind, p, dp), p(GHOSTS), atol=1e-12), (kind, degree)


@pytest.mark.parametrize("kind", ["dirichlet", "neumann", "outflow"])
def test_smooth_data_gets_fourth_order_ghost_values(kind):
    errors = []
    for n in (32, 64, 128, 256):
        h = 1.0 / n
        w = closure_weights(kind, h)
        f = lambda s: torch.sin(2.0 + 3.0 * s * h)  # a smooth profile sampled at s cells from the face
        df = lambda s: 3.0 * h * torch.cos(2.0 + 3.0 * s * h)
        errors.append(float((extrapolate(inputs(kind, f, df), w) - f(GHOSTS)).abs().max()))
    orders = [math.log2(a / b) for a, b in zip(errors, errors[1:])]
    assert min(orders) > 3.5, (errors, orders)


@pytest.mark.parametrize("kind", ["dirichlet", "outflow"])
def test_a_jump_falls_back_to_the_constant_candidate(kind):
    # Dirichlet: g = 10 against interior zeros; outflow: the face cell 10, the others 0
    ghosts = extrapolate(torch.tensor([10.0, 0.0, 0.0, 0.0], dtype=F64), closure_weights(kind, 1 / 64))
    assert (ghosts - 10.0).abs().max() < 1e-2, ghosts


def test_incompatible_inflow_data_does_not_overshoot():
    # u0 = 0 inside, g = 2 at the inflow face: a jump at t = 0 that a single high-degree polynomial
    # would extrapolate into ghost values of many times the jump
    grid = Grid((64, 8))
    velocity = torch.stack([torch.ones(64, 8, dtype=F64), torch.zeros(64, 8, dtype=F64)])[None]
    bc = BoundarySpec.from_types(["dirichlet", "dirichlet", "periodic", "periodic"], [2.0, 0, 0, 0],
                                 batch_size=1, dtype=F64)
    u = solve_advection(torch.zeros(1, 1, 64, 8, dtype=F64), velocity, bc, [0.02, 0.05, 0.2], grid=grid)
    assert float(u.max()) < 2.0 + 2e-3 and float(u.min()) > -2e-3


@pytest.mark.parametrize("kind", ["dirichlet", "neumann"])
@pytest.mark.parametrize("speed", [1.0, -1.0])
def test_linearised_scheme_is_stable_with_inflow_and_outflow(kind, speed):
    """No eigenvalue of the linearised semi-discrete operator grows, and SSP-RK3 at the largest
    Courant number keeps every mode bounded."""
    n = 48
    grid = Grid((n, 4))
    bc = BoundarySpec.from_types([kind, kind, "periodic", "periodic"], 0.0, batch_size=1, dtype=F64)
    velocity = torch.stack([torch.full((n, 4), speed, dtype=F64), torch.zeros(n, 4, dtype=F64)])[None]
    fvel = face_velocities(velocity, bc.kind[:, 0::2] == 0)
    ghosts = GhostCells(grid, bc, fvel)
    data = torch.zeros(1, 4, 1, dtype=F64)

    def rhs(u):
        return -transport(u, [ghosts.pad(u, a, data) for a in range(2)], fvel, grid.spacing, "weno5")

    state = torch.sin(3 * grid.coordinates(F64)[0])[None, None]  # smooth: WENO near its linear weights
    jac = torch.autograd.functional.jacobian(rhs, state).reshape(4 * n, 4 * n)
    eig = torch.linalg.eigvals(jac)
    assert float(eig.real.max()) < 1e-9 * n
    z = eig / n  # dt = h / |v|: Courant number 1, the solver's largest
    assert float((1 + z + z ** 2 / 2 + z ** 3 / 6).abs().max()) <= 1 + 1e-9


def test_too_few_cells_on_a_bounded_axis():
    grid = Grid((3, 16))
    bc = BoundarySpec.from_types(["dirichlet"] * 4, 0.0, batch_size=1, dtype=F64)
    velocity = torch.ones(1, 2, 3, 16, dtype=F64)
    with pytest.raises(ValueError, match="a bounded axis needs at least 4 cells .* axis 0 has 3"):
        solve_advection(torch.zeros(1, 1, 3, 16, dtype=F64), velocity, bc, [0.1], grid=grid)


def test_bad_closure_arguments():
    with pytest.raises(ValueError, match="kind: expected one of"):
        closure_weights("robin", 0.1)
    with pytest.raises(ValueError, match="degree: must be at least 1"):
        closure_weights("dirichlet", 0.1, degree=0)
