import math

import pytest
import torch

from gno_ext.schema import BoundarySpec, Grid
from gno_ext.solvers import solve_heat
from gno_ext.solvers.verification import observed_orders as orders
from gno_ext.solvers.verification import rms

from .conftest import F64

PI = math.pi


def spec(types, values=0.0, batch=1, coeffs=None, dtype=F64):
    return BoundarySpec.from_types(types, values, batch_size=batch, coeffs=coeffs, dtype=dtype)


@pytest.mark.parametrize("shape", [(24, 16), (12, 10, 8)])
def test_periodic_fourier_modes_are_exact(shape, device):
    grid = Grid(shape, (1.0, 2.0, 0.5)[: len(shape)])
    x = grid.coordinates(F64, device)
    ks = [2 * PI * m / length for m, length in zip((1, 3, 2), grid.extent)]
    u0 = math.prod(torch.cos(k * xi + 0.3) for k, xi in zip(ks, x))[None, None]
    alpha, t = 0.07, 0.4
    u = solve_heat(u0, alpha, BoundarySpec.periodic(len(shape), 1, F64), [0.1, t], grid=grid)
    exact = u0 * math.exp(-alpha * sum(k * k for k in ks) * t)
    assert (u[:, 1] - exact).abs().max() < 1e-12


def test_nonzero_dirichlet_relaxes_to_exact_linear_profile():
    grid = Grid((20, 8), (2.0, 1.0))
    u0 = torch.randn(1, 1, 20, 8, dtype=F64, generator=torch.Generator().manual_seed(0))
    bc = spec(["dirichlet", "dirichlet", "periodic", "periodic"], [1.0, 5.0, 0, 0])
    u = solve_heat(u0, 1.0, bc, [50.0], grid=grid)
    x = grid.coordinates(F64)[0]
    assert (u[0, 0, 0] - (1.0 + 2.0 * x)).abs().max() < 1e-10


def test_robin_steady_state_is_exact_linear_profile():
    # u = c0 + c1 x with  a u - b u_x = g at x=0  and  a u + b u_x = g at x=L.
    a_lo, b_lo, a_hi, b_hi, c0, c1, length = 2.0, 0.5, 1.0, 3.0, 1.5, -0.75, 2.0
    g_lo = a_lo * c0 - b_lo * c1
    g_hi = a_hi * (c0 + c1 * length) + b_hi * c1
    grid = Grid((16, 6), (length, 1.0))
    bc = spec(["robin", "robin", "neumann", "neumann"], [g_lo, g_hi, 0, 0],
              coeffs=[[a_lo, b_lo], [a_hi, b_hi], [0, 1], [0, 1]])
    u = solve_heat(torch.zeros(1, 1, 16, 6, dtype=F64), 0.5, bc, [200.0], grid=grid)
    x = grid.coordinates(F64)[0]
    assert (u[0, 0, 0] - (c0 + c1 * x)).abs().max() < 1e-9


def test_neumann_flux_changes_the_mean_at_the_exact_rate_and_zero_flux_conserves_it():
    grid = Grid((16, 12), (1.0, 1.5))
    u0 = torch.rand(2, 1, 16, 12, dtype=F64, generator=torch.Generator().manual_seed(1))
    fluxes = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, -0.5, 2.0, 0.25]], dtype=F64)
    bc = BoundarySpec(torch.full((2, 4), 2), fluxes[:, :, None, None])
    alpha, t = 0.3, 0.7
    u = solve_heat(u0, alpha, bc, [t], grid=grid)
    # d/dt mean(u) = alpha / |Omega| * sum_faces q |face|
    face_len = torch.tensor([1.5, 1.5, 1.0, 1.0], dtype=F64)
    rate = alpha * (fluxes * face_len).sum(1) / 1.5
    drift = u[:, 0, 0].mean((-1, -2)) - u0[:, 0].mean((-1, -2))
    assert torch.allclose(drift, rate * t, atol=1e-12, rtol=1e-10)
    assert abs(float(drift[0])) < 1e-13


def test_ftcs_agrees_with_exact_path_and_rejects_unstable_steps():
    grid = Grid((16, 16))
    x, y = grid.coordinates(F64)
    u0 = (torch.sin(PI * x) * torch.cos(PI * y))[None, None]
    bc = BoundarySpec(torch.tensor([[1, 1, 2, 2]]),
                      torch.tensor([[1.0, -1.0, 0.5, 0.0]], dtype=F64)[:, :, None, None])
    exact = solve_heat(u0, 0.1, bc, [0.05], grid=grid)
    # Same finite-difference operator on bounded axes: only FTCS's first-order time error remains.
    limit = 0.5 / (0.1 * 2 * 16 ** 2)
    errs = [rms(exact, solve_heat(u0, 0.1, bc, [0.05], grid=grid, method="ftcs", dt=limit / k))
            for k in (4, 8, 16)]
    assert errs[0] < 1e-2 and all(0.9 < p < 1.1 for p in orders(errs, [4, 8, 16])), errs
    with pytest.raises(ValueError, match="violates the stability limit"):
        solve_heat(u0, 0.1, bc, [0.05], grid=grid, method="ftcs", dt=0.01)


def test_batch_of_mixed_conditions_equals_individual_solves():
    grid = Grid((12, 10))
    u0 = torch.rand(3, 1, 12, 10, dtype=F64, generator=torch.Generator().manual_seed(3))
    kinds = torch.tensor([[1, 2, 0, 0], [3, 3, 1, 1], [0, 0, 0, 0]])
    values = torch.tensor([[2.0, -1, 0, 0], [1, 1, 3, -3], [0, 0, 0, 0]], dtype=F64)[:, :, None, None]
    coeffs = torch.tensor([[[1, 0], [0, 1], [0, 0], [0, 0]], [[1, 1], [2, 0.5], [1, 0], [1, 0]],
                           [[0, 0]] * 4], dtype=F64)
    bc = BoundarySpec(kinds, values, coeffs)
    alpha = torch.tensor([0.1, 0.5, 1.0], dtype=F64)
    batch = solve_heat(u0, alpha, bc, [0.01, 0.1], grid=grid)
    for i in range(3):
        one = solve_heat(u0[i : i + 1], alpha[i], bc[i : i + 1], [0.01, 0.1], grid=grid)
        assert torch.allclose(batch[i : i + 1], one, atol=1e-12)
    assert batch.shape == (3, 2, 1, 12, 10)


def test_float32_runs_and_matches_float64():
    grid = Grid((16, 16))
    u0 = torch.rand(1, 1, 16, 16, generator=torch.Generator().manual_seed(4))
    bc = spec(["dirichlet", "neumann", "periodic", "periodic"], [1.0, 0.5, 0, 0], dtype=torch.float32)
    u32 = solve_heat(u0, 0.2, bc, [0.1], grid=grid)
    u64 = solve_heat(u0.double(), 0.2, spec(["dirichlet", "neumann", "periodic", "periodic"], [1.0, 0.5, 0, 0]),
                     [0.1], grid=grid)
    assert u32.dtype == torch.float32
    assert (u32.double() - u64).abs().max() < 1e-5


def test_bad_input_errors():
    grid = Grid((8, 8))
    u0 = torch.zeros(1, 1, 8, 8)
    bc = BoundarySpec.periodic(2, 1)
    with pytest.raises(ValueError, match="alpha: must be positive"):
        solve_heat(u0, -0.1, bc, [0.1])
    with pytest.raises(ValueError, match=r"u0: contains NaN or Inf in sample\(s\) \[0\]"):
        solve_heat(torch.full((1, 1, 8, 8), float("nan")), 0.1, bc, [0.1])
    with pytest.raises(ValueError, match=r"u0: expected shape \(B, C, 8, 8\)"):
        solve_heat(torch.zeros(1, 8, 8), 0.1, bc, [0.1], grid=grid)
    with pytest.raises(ValueError, match="does not support OPEN"):
        solve_heat(u0, 0.1, BoundarySpec.from_types(["open"] * 4, batch_size=1), [0.1])
    with pytest.raises(ValueError, match="strictly increasing"):
        solve_heat(u0, 0.1, bc, [0.2, 0.1])
    with pytest.raises(ValueError, match="batched BoundarySpec with 1 rows"):
        solve_heat(u0, 0.1, BoundarySpec.periodic(2), [0.1])
    with pytest.raises(ValueError, match="alpha: expected a scalar or 1 values"):
        solve_heat(u0, torch.tensor([0.1, 0.2]), bc, [0.1])


def test_ftcs_mixed_batch_equals_individual_solves():
    grid = Grid((12, 10))
    x, y = grid.coordinates(F64)
    u0 = torch.stack([torch.sin(PI * x) * torch.cos(2 * PI * y), torch.cos(2 * PI * x)])[:, None]
    bc = BoundarySpec(torch.tensor([[1, 2, 0, 0], [0, 0, 0, 0]]),
                      torch.tensor([[2.0, -1, 0, 0], [0, 0, 0, 0]], dtype=F64)[:, :, None, None])
    both = solve_heat(u0, 0.05, bc, [0.01, 0.02], grid=grid, method="ftcs", dt=1e-4)
    for i in range(2):
        one = solve_heat(u0[i : i + 1], 0.05, bc[i : i + 1], [0.01, 0.02], grid=grid, method="ftcs", dt=1e-4)
        assert torch.allclose(both[i : i + 1], one, atol=1e-13, rtol=0)
    # the periodic sample is a pure 2 pi mode: FTCS decays it at its discrete rate
    lam = 4 / grid.spacing[0] ** 2 * math.sin(PI / 12) ** 2
    assert torch.allclose(both[1, -1, 0], u0[1, 0] * (1 - 0.05 * 1e-4 * lam) ** 200, atol=1e-12)


@pytest.mark.parametrize("method", ["exact", "ftcs"])
def test_periodic_heat_conserves_the_mean(method):
    grid = Grid((16, 12))
    u0 = torch.rand(2, 1, 16, 12, dtype=F64, generator=torch.Generator().manual_seed(5))
    u = solve_heat(u0, torch.tensor([0.01, 0.3]), BoundarySpec.periodic(2, 2, F64), [0.05, 0.5], grid=grid,
                   method=method)
    assert torch.allclose(u.mean((-1, -2)), u0.mean((-1, -2))[:, None], atol=1e-13, rtol=0)
    assert (u[:, -1].std((-1, -2)) < u0.std((-1, -2))).all()
