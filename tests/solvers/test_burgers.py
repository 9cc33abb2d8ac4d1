import math

import pytest
import torch

from gno_ext.schema import BoundarySpec, Grid
from gno_ext.solvers import gaussian_random_field, solve_burgers

from .conftest import F64

PI = math.pi


@pytest.mark.slow
def test_low_viscosity_is_stable_and_respects_the_maximum_principle():
    grid = Grid((64, 64))
    u0 = gaussian_random_field(grid, [11, 12], channels=2, length_scale=0.3, dtype=F64)
    u = solve_burgers(u0, 5e-4, [0.25, 0.5], grid=grid)
    assert torch.isfinite(u).all()
    # each component is advected and diffused by u: no new extrema (shock capturing, no ringing)
    bound = u0.abs().flatten(2).amax(-1)
    assert (u.abs().flatten(3).amax(-1) <= bound[:, None] * 1.01).all()


def test_viscosity_per_sample_and_batch_independence():
    grid = Grid((32, 32))
    u0 = gaussian_random_field(grid, [1, 2], channels=2, dtype=F64)
    nu = torch.tensor([5e-4, 5e-2], dtype=F64)
    both = solve_burgers(u0, nu, [0.1], grid=grid)
    alone = solve_burgers(u0[1:], nu[1:], [0.1], grid=grid)
    assert torch.allclose(both[1:], alone, atol=1e-13, rtol=0)
    # more viscosity dissipates more energy
    energy = both.pow(2).mean((1, 2, 3, 4))
    assert energy[1] < energy[0]


def test_bad_input_errors():
    u0 = torch.zeros(1, 2, 16, 16)
    with pytest.raises(ValueError, match="nu: must be positive"):
        solve_burgers(u0, 0.0, [0.1])
    with pytest.raises(ValueError, match=r"u0: expected shape \(B, 2, 16, 16\)"):
        solve_burgers(torch.zeros(1, 1, 16, 16), 0.01, [0.1])
    with pytest.raises(ValueError, match="does not support DIRICHLET"):
        solve_burgers(u0, 0.01, [0.1], bc=BoundarySpec.from_types(["dirichlet"] * 4, batch_size=1))
    with pytest.raises(ValueError, match="violates the stability limit"):
        solve_burgers(torch.ones(1, 2, 16, 16), 0.01, [0.5], dt=0.5)
