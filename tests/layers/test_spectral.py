import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

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
from gno_ext.layers.spectral import takes_dft  # noqa: E402


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
    conv = FullPrecisionSpectralConv(3, 3, (4, 4), fourier="fft")
    assert _fft_input_types(monkeypatch, conv, x) == {torch.float32}
    with torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(conv(x), conv(x.float()))  # the same function, in float32
    u, theta = torch.randn(2, 1, 1, 16, 16), torch.rand(2, 1)
    for name in ("fno", "gated_fno", "cape_fno", "pino"):
        kwargs = {"n_modes": 4, "hidden_channels": 8, "n_layers": 1} if name != "gated_fno" else {
            "n_modes": [4, 4], "in_channels": 1, "out_channels": 1, "hidden_channels": 8, "n_layers": 1}
        model = get_model(name, **kwargs)
        convs = [m for m in model.modules() if isinstance(m, SpectralConv)]
        assert convs and all(isinstance(m, FullPrecisionSpectralConv) and m.fourier == "dft" for m in convs), name
        # the kept-mode transforms (matrix products) by default: no bf16 FFT (cape_fno has its own)
        assert _fft_input_types(monkeypatch, model, u, theta=theta) <= {torch.float32}, name
        for m in convs:
            m.fourier = "fft"
        assert _fft_input_types(monkeypatch, model, u, theta=theta) == {torch.float32}, name


@pytest.mark.parametrize("modes,shape,n_modes_now", [
    ((6, 6), (16, 16), None),
    ((5, 7), (16, 18), None),          # odd mode counts
    ((12, 12), (32, 32), None),
    ((8, 8), (20, 20), (5, 6)),        # fewer modes than the weights hold, an odd number on the first axis
    ((16, 16), (16, 30), None),        # every frequency of the first axis
    ((6, 14), (12, 12), None),         # the last axis's Nyquist frequency kept
    ((6,), (21,), None),               # 1-D (odd size: the last axis may have one)
    ((4, 5, 4), (10, 8, 9), None),     # 3-D
])
def test_kept_mode_transforms_compute_what_spectral_conv_computes(modes, shape, n_modes_now):
    """`FullPrecisionSpectralConv` with its default kept-mode transforms (``fourier="dft"``) is
    neuraloperator's ``SpectralConv`` with the same weights: the same output and gradients in
    float32 (to 1e-5), odd and even mode counts, 1-, 2- and 3-D; under bf16 autocast (the
    transforms on bf16 matrix products, the contraction in float32) within 2e-2 of the
    float32 output, relative to its largest value."""
    torch.manual_seed(0)
    reference = SpectralConv(3, 4, modes)
    conv = FullPrecisionSpectralConv(3, 4, modes)
    with torch.no_grad():
        reference.weight.tensor.normal_(0, 0.3), reference.bias.normal_()
    conv.load_state_dict(reference.state_dict())
    if n_modes_now:
        conv.n_modes = reference.n_modes = n_modes_now
    x = torch.randn(2, 3, *shape, requires_grad=True)
    assert takes_dft(conv, x)
    y, want = conv(x), reference(x)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    probe = torch.randn_like(y)
    params = [x, conv.weight.tensor, conv.bias]
    got = torch.autograd.grad((y * probe).sum(), params)
    expected = torch.autograd.grad((want * probe).sum(), [x, reference.weight.tensor, reference.bias])
    for g, w in zip(got, expected):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        low = conv(x.detach().bfloat16())
    assert float((low.float() - want.detach()).abs().max() / want.detach().abs().max()) < 2e-2


def test_kept_mode_transforms_leave_the_cases_they_do_not_cover_to_the_fft():
    """Another output grid, resolution scaling and an odd size on an axis but the last (where
    ``SpectralConv`` shifts its spectrum back by ``fftshift``, not its inverse) take the FFT
    path, and so compute what ``SpectralConv`` computes; ``fourier`` is checked."""
    torch.manual_seed(0)
    reference = SpectralConv(3, 4, (6, 6))
    conv = FullPrecisionSpectralConv(3, 4, (6, 6))
    conv.load_state_dict(reference.state_dict())
    for shape, output_shape in (((16, 16), (24, 20)), ((15, 16), None)):
        x = torch.randn(2, 3, *shape)
        assert not takes_dft(conv, x, output_shape)
        torch.testing.assert_close(conv(x, output_shape=output_shape), reference(x, output_shape=output_shape))
    with pytest.raises(ValueError, match="fourier: expected one of dft, fft, got 'fast'"):
        FullPrecisionSpectralConv(3, 4, (6, 6), fourier="fast")



@pytest.mark.parametrize("modes,shape,n_modes_now,output_shape", [
    ((6, 6), (16, 16), None, None),
    ((5, 7), (15, 18), None, None),          # odd modes and sizes
    ((8, 8), (20, 20), (4, 6), None),        # fewer modes than the weights hold (n_modes set lower)
    ((8, 8), (20, 20), (5, 6), None),        # ... by an odd number on the first axis
    ((6, 6), (16, 16), None, (24, 20)),      # another output grid
    ((6,), (21,), None, None),               # 1-D
    ((4, 4, 4), (10, 9, 10), None, None),    # 3-D
])
def test_gathered_path_equals_each_samples_own_kernel(modes, shape, n_modes_now, output_shape):
    """The static path (one transform for the batch, the contraction with each sample's own
    kernel's weights) gives what each sample's SpectralConv gives, gradients included, and the
    kernels a sample did not select get no gradient from it."""
    torch.manual_seed(0)
    conv = GatedSpectralConv(3, 4, modes, n_kernels=3, n_params=1)
    for kernel in conv.kernels:
        torch.nn.init.normal_(kernel.bias)
    with torch.no_grad():  # a gate that sends theta < 0 to kernel 0 and theta > 0.5 to kernel 2
        first, last = conv.gate.score[0], conv.gate.score[2]
        first.weight.fill_(1.0), first.bias.zero_()
        last.weight.copy_(torch.tensor([0.0, 1.0, 2.0])[:, None].expand_as(last.weight) / last.weight.shape[1])
        last.bias.copy_(torch.tensor([0.5, 0.0, 0.0]))
    if n_modes_now:
        conv.n_modes = n_modes_now
    x = torch.randn(6, 3, *shape, requires_grad=True)
    theta = torch.linspace(-3, 3, 6)[:, None]
    params = [p for k in conv.kernels for p in k.parameters()]
    with condition_on(conv, theta):
        y = conv(x, output_shape=output_shape)
    index = conv.last_routing.index
    assert conv.static and index.tolist() == [0, 0, 0, 2, 2, 2]
    expected = torch.cat([conv.kernels[int(k)](x[b:b + 1], output_shape=output_shape) for b, k in enumerate(index)])
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    probe = torch.randn_like(y)
    got = torch.autograd.grad((y * probe).sum(), [x, *params], allow_unused=True)
    want = torch.autograd.grad((expected * probe).sum(), [x, *params], allow_unused=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w, rtol=1e-5, atol=1e-5)
    # one sample: only its kernel's weights get a gradient
    with condition_on(conv, theta[:1]):
        grads = torch.autograd.grad(conv(x[:1]).sum(), [k.weight.tensor for k in conv.kernels])
    chosen = int(conv.last_routing.index[0])
    assert chosen == 0 and [bool(g.abs().sum() > 0) for g in grads] == [True, False, False]


@pytest.mark.parametrize("static", [True, False])
def test_shared_kernel_is_the_shared_weights_plus_each_samples_residual(static):
    """With ``shared_kernel`` kernel k is W_0 + W_k: at first the residuals are zero and the layer
    is one SpectralConv for every sample; with residuals, each sample gets the SpectralConv of
    its own summed weights and bias (both paths, gradients included), W_0 a gradient from every
    sample and a residual only from the samples routed to it."""
    torch.manual_seed(1)
    conv = GatedSpectralConv(3, 4, (6, 6), n_kernels=3, n_params=1, shared_kernel=True)
    conv.static = static
    x, theta = torch.randn(6, 3, 16, 16), torch.linspace(-3, 3, 6)[:, None]
    assert all(torch.count_nonzero(k.weight.tensor) == 0 and torch.count_nonzero(k.bias) == 0 for k in conv.kernels)
    with condition_on(conv, theta):
        torch.testing.assert_close(conv(x), conv.shared(x), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        for kernel in conv.kernels:
            kernel.weight.tensor.normal_(0, 0.3), kernel.bias.normal_()
        first, last = conv.gate.score[0], conv.gate.score[2]  # theta < 0 to kernel 0, > 0.5 to kernel 2
        first.weight.fill_(1.0), first.bias.zero_()
        last.weight.copy_(torch.tensor([0.0, 1.0, 2.0])[:, None].expand_as(last.weight) / last.weight.shape[1])
        last.bias.copy_(torch.tensor([0.5, 0.0, 0.0]))
    with condition_on(conv, theta):
        y = conv(x)
    assert conv.last_routing.index.tolist() == [0, 0, 0, 2, 2, 2]
    expected = []
    for b, k in enumerate(conv.last_routing.index.tolist()):
        summed = SpectralConv(3, 4, (6, 6))
        with torch.no_grad():
            summed.weight.tensor.copy_(conv.shared.weight.tensor + conv.kernels[k].weight.tensor)
            summed.bias.copy_(conv.shared.bias + conv.kernels[k].bias)
        expected.append(summed(x[b:b + 1]))
    torch.testing.assert_close(y, torch.cat(expected), rtol=1e-5, atol=1e-5)
    weights = [conv.shared.weight.tensor, *(k.weight.tensor for k in conv.kernels)]
    grads = torch.autograd.grad((y * torch.randn_like(y)).sum(), weights, allow_unused=True)
    used = [g is not None and bool(g.abs().sum() > 0) for g in grads]
    assert used == [True, True, False, True]  # shared, kernel 0, kernel 1 (no sample), kernel 2
    with pytest.raises(ValueError, match="shared_kernel: needs dense kernels, got factorization='cp'"):
        GatedSpectralConv(3, 4, (6, 6), n_kernels=2, shared_kernel=True, factorization="cp")


def test_gathered_path_reads_nothing_on_the_host():
    """The forward and backward passes of the static path read no value on the host, so a step
    with it can be captured in a CUDA graph: they run on PyTorch's meta device, which holds no
    values. The per-kernel dispatch counts each kernel's samples on the host (the reason
    `GatedFNO` could not be captured before) and fails there."""
    conv = GatedSpectralConv(3, 3, (6, 6), n_kernels=4, n_params=2).to("meta")
    x = torch.empty(5, 3, 16, 16, device="meta", requires_grad=True)
    theta = torch.empty(5, 2, device="meta")
    with condition_on(conv, theta):
        conv(x).square().sum().backward()
    assert x.grad.shape == x.shape
    conv.static = False
    with pytest.raises(NotImplementedError, match="bincount"), condition_on(conv, theta):
        conv(x)


class _ComplexOperators(TorchDispatchMode):
    """Records the operators that take or return a complex tensor."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.is_complex() for t in tree_leaves((args, kwargs, out))):
            self.names.add(func.overloadpacket.__name__)
        return out


def test_gathered_path_moves_no_complex_data_that_plain_spectral_conv_does_not():
    """Inductor generates no GPU code for complex tensors: a gather of the complex weights
    (``index_select``, its backward ``index_add``, the ``stack`` of the kernels) failed to
    compile on a GPU (``KeyError: 'complex64'``). The static path moves its data on real views,
    so in its forward and backward passes complex tensors meet only the operators that
    neuraloperator's own ``SpectralConv`` (which compiles) uses, and the views between real and
    complex."""
    torch.manual_seed(0)
    x = torch.randn(5, 3, 16, 16, requires_grad=True)
    gated, plain = GatedSpectralConv(3, 3, (6, 6), n_kernels=4, n_params=2), FullPrecisionSpectralConv(3, 3, (6, 6))
    with _ComplexOperators() as seen_gated, condition_on(gated, torch.randn(5, 2)):
        gated(x).square().sum().backward()
    with _ComplexOperators() as seen_plain:
        plain(x).square().sum().backward()
    assert not seen_gated.names & {"index_select", "index_add", "index", "index_put", "stack", "cat", "gather"}
    assert seen_gated.names - seen_plain.names <= {"view_as_complex", "detach"}


@pytest.mark.parametrize("static,shared", [(True, False), (False, False), (True, True), (False, True)])
def test_soft_routing_convolves_each_sample_with_the_probability_weighted_kernels(static, shared):
    """With ``soft_routing`` sample b's output is sum_k p_k(theta_b) kernel_k(x_b) (plus the shared
    kernel's, which the mixture does not weight): on the gathered path and kernel by kernel, with
    the same gradients; every kernel and the gate's score MLP get a gradient from every sample."""
    torch.manual_seed(2)
    conv = GatedSpectralConv(3, 4, (6, 6), n_kernels=3, n_params=1, shared_kernel=shared, soft_routing=True)
    conv.static = static
    assert not conv.dispatches  # no kernel is left without a gradient (DDP needs no unused-parameter search)
    with torch.no_grad():
        for kernel in conv.kernels:
            kernel.weight.tensor.normal_(0, 0.3), kernel.bias.normal_()
    x = torch.randn(5, 3, 16, 12, requires_grad=True)
    theta = torch.linspace(-2, 2, 5)[:, None]
    with condition_on(conv, theta):
        y = conv(x)
    probs = conv.last_routing.probs
    assert probs.shape == (5, 3) and bool((probs > 0.01).all())  # a mixture, not a choice
    expected = sum(k(x) * probs[:, i, None, None, None] for i, k in enumerate(conv.kernels))
    if shared:
        expected = expected + conv.shared(x)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    params = [x, *conv.parameters()]
    probe = torch.randn_like(y)
    got = torch.autograd.grad((y * probe).sum(), params, allow_unused=True, retain_graph=True)  # the gate's graph
    want = torch.autograd.grad((expected * probe).sum(), params, allow_unused=True)  # is shared with expected's
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    # one sample: every kernel's weights and the gate get a gradient from it
    with condition_on(conv, theta[:1]):
        out = conv(x[:1]).square().sum()
    grads = torch.autograd.grad(out, [*(k.weight.tensor for k in conv.kernels), *conv.gate.parameters()])
    assert all(bool(g.abs().sum() > 0) for g in grads)
    # under bf16 autocast the mixed weights stay float32, as the gathered ones do (the gate's
    # scores are bf16 there: the reference takes the probabilities of that pass); with the FFT's
    # float32 transforms the paths agree to float32 precision
    for kernel in [*conv.kernels, *([conv.shared] if shared else [])]:
        kernel.fourier = "fft"
    with condition_on(conv, theta), torch.no_grad():
        with torch.autocast("cpu", torch.bfloat16):
            y_bf16 = conv(x.bfloat16())
        p, xf = conv.last_routing.probs.float(), x.bfloat16().float()
        expected = sum(k(xf) * p[:, i, None, None, None] for i, k in enumerate(conv.kernels))
        expected = expected if conv.shared is None else expected + conv.shared(xf)
        torch.testing.assert_close(y_bf16, expected, rtol=1e-5, atol=1e-5)
    for kernel in [*conv.kernels, *([conv.shared] if shared else [])]:
        kernel.fourier = "dft"
    # the hard choice of the same layer is another function
    conv.soft_routing = False
    with condition_on(conv, theta), torch.no_grad():
        assert not torch.allclose(conv(x), y, atol=1e-3)
