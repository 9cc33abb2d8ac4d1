"""A solver refuses a time-step plan beyond ``max_steps`` and names the count and its cause.
(Before, a velocity of 1e8 or a diffusivity of 1e6 silently planned about a billion steps.)"""

import pytest
import torch

from gno_ext.schema import BoundarySpec, Grid
from gno_ext.solvers import solve_advection, solve_burgers, solve_heat, solve_navier_stokes

GRID = Grid((16, 16))
TIMES = [0.0, 0.1]


def _bc(kind, batch=2):
    return BoundarySpec.from_types([kind] * 4, batch_size=batch)


@pytest.mark.slow
def test_advection_names_the_velocity():
    velocity = torch.ones(2, 2, 16, 16)
    velocity[1] *= 1e8
    with pytest.raises(ValueError, match=r"needs [\d,]+ steps to reach t=0.1, more than max_steps=1,000,000: the step "
                                         r"of sample 1 is .* set by its velocity \(largest face speed 1e\+08\)"):
        solve_advection(torch.zeros(2, 1, 16, 16), velocity, _bc("periodic"), TIMES, grid=GRID)
    # a plan over the ceiling, allowed on request
    with pytest.raises(ValueError, match="more than max_steps=100"):
        solve_advection(torch.zeros(1, 1, 16, 16), velocity[:1] * 100, _bc("periodic", 1), TIMES, grid=GRID,
                        max_steps=100)
    out = solve_advection(torch.zeros(1, 1, 16, 16), velocity[:1] * 100, _bc("periodic", 1), TIMES, grid=GRID,
                          max_steps=10**4)
    assert out.shape == (1, 2, 1, 16, 16)


def test_heat_names_the_diffusivity():
    alpha = torch.tensor([0.1, 1e6])
    with pytest.raises(ValueError, match=r"sample 1 .* set by its diffusivity alpha=1e\+06"):
        solve_heat(torch.zeros(2, 1, 16, 16), alpha, _bc("dirichlet"), TIMES, grid=GRID, method="ftcs")
    with pytest.raises(ValueError, match=r"needs [\d,]+ steps .* the step is dt=1e-12"):
        solve_heat(torch.zeros(2, 1, 16, 16), alpha, _bc("dirichlet"), TIMES, grid=GRID, dt=1e-12,
                   boundary_fn=lambda t: torch.zeros(2, 4, 16))


def test_burgers_and_navier_stokes_name_the_velocity():
    u0 = torch.zeros(2, 2, 16, 16)
    u0[1] = 1e8
    with pytest.raises(ValueError, match=r"sample 1 .* set by its velocity \(largest \|u\| 1e\+08\)"):
        solve_burgers(u0, 0.01, TIMES, grid=GRID)
    w0 = torch.zeros(2, 1, 16, 16)
    w0[1] = 1e8 * torch.sin(torch.arange(16) * 6.283185307 / 16)[None, :]
    with pytest.raises(ValueError, match=r"sample 1 .* set by its velocity \(largest \|u\| "):
        solve_navier_stokes(w0, 0.01, TIMES, grid=GRID)
