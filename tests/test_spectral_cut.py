"""`recipes/spectral_cut.py`: the modes it keeps are the ones neuraloperator's SpectralConv keeps,
and its three errors on a translating sine, whose values are known."""

import math

import pytest
import torch
from neuralop.layers.spectral_convolution import SpectralConv

from tests._recipes import load_recipe

cut = load_recipe("spectral_cut")


@pytest.mark.parametrize("n_modes", [4, 7, 12])
def test_kept_modes_are_those_that_spectral_conv_acts_on(n_modes):
    torch.manual_seed(0)
    conv = SpectralConv(1, 1, n_modes=(n_modes, n_modes), bias=False).double()
    x = torch.randn(3, 1, 32, 24, dtype=torch.float64)
    kept = cut.project(x, n_modes)
    with torch.no_grad():  # the layer computes in float32: agreement to its rounding
        assert conv(x - kept).abs().max() < 1e-6  # nothing beyond the cut reaches the output
        assert torch.allclose(conv(kept), conv(x), atol=1e-6)
        out = conv(x)
    assert torch.allclose(cut.project(out, n_modes), out, atol=1e-6)  # and the output lies within it
    # the half spectrum's kept block, and for an even count the pair of -n_modes / 2 at last frequency 0
    assert cut.kept_modes_mask((32, 24), n_modes).sum() == n_modes * (n_modes // 2 + 1) + (n_modes % 2 == 0)
    wider = cut.project(x, n_modes + 2)
    with torch.no_grad():
        assert conv(x - wider).abs().max() < 1e-6
    assert (wider - kept).abs().max() > 1e-3  # a wider cut keeps more of a random field


def translating_sine(k: int, shift: float, steps: int = 3, n: int = 32) -> torch.Tensor:
    """sin(2 pi k (y - shift t)) on an n x n periodic grid, varying along the last axis,
    as (1, steps + 1, 1, n, n)."""
    y = torch.arange(n, dtype=torch.float64) / n
    frames = [torch.sin(2 * math.pi * k * (y - shift * t)).expand(n, n) for t in range(steps + 1)]
    return torch.stack(frames)[None, :, None]


def test_a_sine_within_the_cut_moves_exactly_and_one_beyond_it_not_at_all():
    shift = 0.01
    persistence = 2 - 2 * math.cos(2 * math.pi * 2 * shift)  # |u(t-1) - u(t)|^2 / |u(t)|^2
    low = cut.cut_errors(translating_sine(2, shift), n_modes=12)
    assert low["above cut"] == pytest.approx([0.0] * 3, abs=1e-12)
    assert low["cut step"] == pytest.approx([0.0] * 3, abs=1e-12)
    assert low["persistence"] == pytest.approx([persistence] * 3, rel=1e-9)
    high = cut.cut_errors(translating_sine(8, shift), n_modes=12)  # frequency 8 > 12 // 2
    assert high["above cut"] == pytest.approx([1.0] * 3, rel=1e-9)
    assert high["cut step"] == pytest.approx(high["persistence"], rel=1e-12)
    assert high["persistence"][0] == pytest.approx(2 - 2 * math.cos(2 * math.pi * 8 * shift), rel=1e-9)


def test_cut_errors_names_a_wrong_shape():
    with pytest.raises(ValueError, match=r"expected \(B, T, C, H, W\), got shape \(4, 32, 32\)"):
        cut.cut_errors(torch.zeros(4, 32, 32), 12)
    with pytest.raises(ValueError, match="n_modes=0"):
        cut.kept_modes_mask((8, 8), 0)
