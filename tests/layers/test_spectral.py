import functools

import pytest
import torch

pytest.importorskip("neuralop")

from neuralop.layers.fno_block import FNOBlocks  # noqa: E402
from neuralop.layers.spectral_convolution import SpectralConv  # noqa: E402

from gno_ext.layers import (  # noqa: E402
    FullPrecisionSpectralConv,
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


def _fft_input_types(monkeypatch, module, x, **kwargs) -> set:
    """The types that reach ``torch.fft.rfftn`` when ``module(x)`` runs under bf16 autocast."""
    seen, rfftn = set(), torch.fft.rfftn

    def spy(t, *args, **kw):
        seen.add(t.dtype)
        return rfftn(t.float() if t.dtype == torch.bfloat16 else t, *args, **kw)

    monkeypatch.setattr(torch.fft, "rfftn", spy)
    with torch.autocast("cpu", torch.bfloat16):
        module(x, **kwargs)
    return seen


def test_spectral_transforms_run_in_float32_under_autocast(monkeypatch):
    """cuFFT has no bf16 transform: under autocast, where the layer before hands a spectral
    convolution bf16 activations, `FullPrecisionSpectralConv` transforms in float32 (a plain
    SpectralConv passes bf16 on), and so do the FNO-based models."""
    from gno_ext.models import get_model

    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16, dtype=torch.bfloat16)
    assert _fft_input_types(monkeypatch, SpectralConv(3, 3, (4, 4)), x) == {torch.bfloat16}
    conv = FullPrecisionSpectralConv(3, 3, (4, 4))
    assert _fft_input_types(monkeypatch, conv, x) == {torch.float32}
    with torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(conv(x), conv(x.float()))  # the same function, in float32
    u, theta = torch.randn(2, 1, 1, 16, 16), torch.rand(2, 1)
    for name in ("fno", "gated_fno", "cape_fno", "pino"):
        kwargs = {"n_modes": 4, "hidden_channels": 8, "n_layers": 1} if name != "gated_fno" else {
            "n_modes": [4, 4], "in_channels": 1, "out_channels": 1, "hidden_channels": 8, "n_layers": 1}
        model = get_model(name, **kwargs)
        convs = [m for m in model.modules() if isinstance(m, SpectralConv)]
        assert convs and all(isinstance(m, FullPrecisionSpectralConv) for m in convs), name
        assert _fft_input_types(monkeypatch, model, u, theta=theta) == {torch.float32}, name
