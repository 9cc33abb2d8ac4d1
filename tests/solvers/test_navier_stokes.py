import math

import pytest
import torch

from gno_ext.schema import Grid
from gno_ext.solvers import (
    gaussian_random_field,
    solve_navier_stokes,
    velocity_from_vorticity,
)
from gno_ext.solvers.spectral import wavenumbers

from .conftest import F64

PI = math.pi


def taylor_green(grid, k=2 * PI):
    x, y = grid.coordinates(F64)
    return (2 * k * torch.cos(k * x) * torch.cos(k * y))[None, None]


def test_velocity_is_divergence_free_and_reproduces_vorticity():
    grid = Grid((64, 64))
    w0 = gaussian_random_field(grid, [3], length_scale=0.2, dtype=F64)
    vel = solve_navier_stokes(w0, 1e-3, [0.2], grid=grid, output="velocity")[:, 0]
    w = solve_navier_stokes(w0, 1e-3, [0.2], grid=grid)[:, 0]
    kx, ky = wavenumbers(grid, F64)
    vh = torch.fft.rfft2(vel)
    div = torch.fft.irfft2(1j * kx * vh[:, 0] + 1j * ky * vh[:, 1], s=grid.shape)
    curl = torch.fft.irfft2(1j * kx * vh[:, 1] - 1j * ky * vh[:, 0], s=grid.shape)
    assert div.abs().max() < 1e-10
    assert (curl - w[:, 0]).abs().max() < 1e-9 * w.abs().max()
    assert torch.allclose(velocity_from_vorticity(w, grid), vel, atol=1e-12)


def test_unforced_flow_loses_enstrophy_faster_at_lower_reynolds_number():
    grid = Grid((64, 64))
    w0 = gaussian_random_field(grid, [5, 5], length_scale=0.2, sigma=2.0, dtype=F64)
    w = solve_navier_stokes(w0, torch.tensor([1 / 500, 1 / 1000], dtype=F64), [0.5, 1.0], grid=grid,
                            forcing=None)
    enstrophy = w.pow(2).mean((2, 3, 4))
    assert (enstrophy[:, 1] < enstrophy[:, 0]).all() and (enstrophy[:, 0] < w0.pow(2).mean()).all()
    assert enstrophy[0, 1] < enstrophy[1, 1]
    assert w.mean((3, 4)).abs().max() < 1e-12  # mean vorticity stays zero


def test_kolmogorov_forcing_injects_energy_into_a_fluid_at_rest():
    grid = Grid((32, 32))
    w = solve_navier_stokes(torch.zeros(1, 1, 32, 32, dtype=F64), 1e-3, [0.5], grid=grid)
    assert w.abs().max() > 0.04


def test_bad_input_errors():
    with pytest.raises(ValueError, match="the Navier-Stokes solver is 2-D"):
        solve_navier_stokes(torch.zeros(1, 1, 8, 8, 8), 1e-3, [0.1])
    with pytest.raises(ValueError, match="nu: must be positive"):
        solve_navier_stokes(torch.zeros(1, 1, 8, 8), -1.0, [0.1])
    with pytest.raises(ValueError, match=r"forcing: expected shape"):
        solve_navier_stokes(torch.zeros(1, 1, 8, 8), 1e-3, [0.1], forcing=torch.zeros(1, 1, 4, 4))
    with pytest.raises(ValueError, match="violates the stability limit"):
        solve_navier_stokes(taylor_green(Grid((32, 32))), 1e-2, [1.0], dt=0.05)
