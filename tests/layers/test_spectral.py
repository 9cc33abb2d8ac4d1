import functools

import pytest
import torch

pytest.importorskip("neuralop")

from neuralop.layers.fno_block import FNOBlocks  # noqa: E402
from neuralop.layers.spectral_convolution import SpectralConv  # noqa: E402

from gno_ext.layers import (  # noqa: E402
    GatedKernelMixture,
    GatedSpectralConv,
    ParameterGate,
    condition_on,
)


def test_mixture_accepts_spectral_conv_kernels():
    torch.manual_seed(0)
    kernels = [SpectralConv(3, 3, (6, 6)) for _ in range(2)]
    mix = GatedKernelMixture(kernels, ParameterGate(1, 2))
    x, theta = torch.randn(4, 3, 16, 16), torch.linspace(-3, 3, 4)[:, None]
    y = mix(x, theta)
    for i in range(4):
        k = int(mix.last_routing.index[i])
        assert torch.allclose(y[i], kernels[k](x[i : i + 1])[0], atol=1e-5)


def test_gated_spectral_conv_is_a_conv_module_for_fno_blocks():
    torch.manual_seed(1)
    conv = functools.partial(GatedSpectralConv, n_kernels=3, n_params=2)
    blocks = FNOBlocks(8, 8, (6, 6), n_layers=2, conv_module=conv)
    x, theta = torch.randn(5, 8, 24, 24), torch.randn(5, 2)
    with condition_on(blocks, theta):
        y = blocks(x, 0)
        z = blocks(x, 1)
    assert y.shape == z.shape == (5, 8, 24, 24)
    assert blocks.convs[0].theta is None  # the context is cleared afterwards
    with pytest.raises(RuntimeError, match="no theta set"):
        blocks(x, 0)
    # resolution change: the same weights on a finer grid
    with condition_on(blocks, theta):
        assert blocks(torch.randn(5, 8, 48, 48), 0).shape == (5, 8, 48, 48)
