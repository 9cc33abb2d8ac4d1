import pytest
import torch

from gno_ext.schema import Grid
from gno_ext.solvers import gaussian_random_field, random_velocity
from gno_ext.solvers.spectral import wavenumbers

from .conftest import F64


def test_same_seed_same_field_in_any_batch():
    grid = Grid((32, 24))
    a = gaussian_random_field(grid, [7, 8, 9])
    b = gaussian_random_field(grid, [9])
    assert torch.equal(a[2], b[0])
    assert not torch.allclose(a[0], a[1])


@pytest.mark.parametrize("periodic", [True, False])
def test_statistics(periodic):
    grid = Grid((64, 64))
    f = gaussian_random_field(grid, range(4), sigma=2.5, periodic=periodic, dtype=F64)
    assert torch.allclose(f.flatten(1).std(-1), torch.full((4,), 2.5, dtype=F64))
    assert f.mean((-1, -2)).abs().max() < 1e-12


def test_non_periodic_fields_do_not_join_across_opposite_faces():
    grid = Grid((64, 64))
    seeds = range(64)
    per = gaussian_random_field(grid, seeds, length_scale=0.3, dtype=F64)
    non = gaussian_random_field(grid, seeds, length_scale=0.3, periodic=False, dtype=F64)
    jump = lambda f: (f[..., 0, :] - f[..., -1, :]).abs().mean()
    step = lambda f: (f[..., 0, :] - f[..., 1, :]).abs().mean()
    assert jump(per) < 2 * step(per)       # the torus is continuous across x = 0 / x = 1
    assert jump(non) > 5 * step(non)       # a bounded box is not


def test_random_velocity_is_divergence_free_with_requested_rms():
    grid = Grid((48, 48))
    v = random_velocity(grid, [1, 2], speed=1.7, dtype=F64)
    kx, ky = wavenumbers(grid, F64)
    vh = torch.fft.rfft2(v)
    div = torch.fft.irfft2(1j * kx * vh[:, 0] + 1j * ky * vh[:, 1], s=grid.shape)
    assert div.abs().max() < 1e-10
    assert torch.allclose(v.pow(2).sum(1).mean((-1, -2)).sqrt(), torch.full((2,), 1.7, dtype=F64))
    v3 = random_velocity(Grid((12, 12, 12)), [3], dtype=F64)
    assert v3.shape == (1, 3, 12, 12, 12)


def test_bad_input():
    with pytest.raises(ValueError, match="gamma: must exceed ndim/2"):
        gaussian_random_field(Grid((8, 8)), [0], gamma=0.5)
    with pytest.raises(ValueError, match="length_scale"):
        gaussian_random_field(Grid((8, 8)), [0], length_scale=0)
