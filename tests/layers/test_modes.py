"""`gno_ext.layers.modes`: the retained modes by matrix products against ``torch.fft``."""

import pytest
import torch

from gno_ext.layers.modes import contract_modes, from_modes, kept_frequencies, to_modes

CASES = [((16, 12), (6, 4)), ((15, 9), (7, 5)), ((8,), (5,)), ((9,), (5,)), ((10, 8, 6), (4, 5, 3)),
         ((16, 16), (16, 9)), ((6, 7, 8), (6, 4, 5))]


def _kept(full: torch.Tensor, sizes, kept) -> tuple[torch.Tensor, tuple]:
    """The kept frequencies of an ``rfftn`` spectrum, and their index."""
    index = [torch.tensor([f % n for f in kept_frequencies(m, False)]) for n, m in zip(sizes[:-1], kept[:-1])]
    index.append(torch.arange(kept[-1]))
    grid = torch.meshgrid(*index, indexing="ij")
    return full[(slice(None), slice(None), *grid)], grid


@pytest.mark.parametrize("sizes,kept", CASES)
@pytest.mark.parametrize("norm", ["forward", "backward", "ortho"])
def test_the_kept_modes_and_their_field_are_what_the_fft_gives(sizes, kept, norm):
    """`to_modes` is ``rfftn`` at the kept frequencies, `from_modes` the ``irfftn`` of the
    zero-filled half-spectrum (the Nyquist frequency counted once), in float64 to 1e-12 and in
    float32 to 1e-6 of the largest value, for even and odd sizes, 1-, 2- and 3-D."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, *sizes, dtype=torch.float64)
    dims = list(range(-len(sizes), 0))
    full = torch.fft.rfftn(x, norm=norm, dim=dims)
    want, grid = _kept(full, sizes, kept)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        got = torch.view_as_complex(to_modes(x.to(dtype), kept, norm).double().contiguous())
        assert float((got - want).abs().max() / want.abs().max()) < tol
    zero_filled = torch.zeros_like(full)
    zero_filled[(slice(None), slice(None), *grid)] = want
    field = torch.fft.irfftn(zero_filled, s=sizes, norm=norm, dim=dims)
    got = from_modes(torch.view_as_real(want).contiguous(), sizes, norm)
    assert float((got - field).abs().max() / field.abs().max()) < 1e-12


def test_gradients_flow_through_the_transforms():
    x = torch.randn(2, 3, 8, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: from_modes(to_modes(t, (4, 3)) * 2.0, (8, 6)), (x,))


def test_contraction_is_the_complex_einsum_per_mode():
    torch.manual_seed(0)
    modes, weights = torch.randn(3, 4, 5, 2, 2, dtype=torch.float64), torch.randn(2, 4, 6, 5, 2, 2, dtype=torch.float64)
    got = torch.view_as_complex(contract_modes(modes, weights).contiguous())
    want = torch.einsum("bixy,kioxy->bkoxy", torch.view_as_complex(modes), torch.view_as_complex(weights))
    torch.testing.assert_close(got, want)


def test_bad_kept_counts_and_norms_are_named():
    x = torch.randn(1, 1, 8, 6)
    with pytest.raises(ValueError, match="kept modes of axis 1: 5, but a field of size 6 has at most 4"):
        to_modes(x, (4, 5))
    with pytest.raises(ValueError, match="kept modes: 1 axes for a field of 2"):
        to_modes(x, (4,))
    with pytest.raises(ValueError, match="norm: expected one of forward, backward, ortho, got 'unit'"):
        to_modes(x, (4, 3), "unit")
