"""Attention in the projections' token-major layout (`gno_ext.layers.attention.attend_tokens`):
the PyTorch path on any machine, the Triton kernels in Triton's interpreter on the CPU (when
Triton is installed), and on a GPU (when there is one)."""

import copy
from importlib.util import find_spec

import pytest
import torch

from gno_ext.layers import attention
from gno_ext.kernels.precision import tf32_products
from gno_ext.layers.attention import AttentionKernel, AttentionKernelBank, attend_tokens, tokens_fusable
from tests._kernels import kernel_module
from tests.layers import _targets
from tests.layers._interpreter import run_interpreted

needs_triton = pytest.mark.skipif(find_spec("triton") is None, reason="Triton is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or attention._kernels is None,
                                reason="needs a CUDA device and Triton")


def reference(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """The attention written out: softmax of the scaled scores over the keys, times the values."""
    k, v = kv.unbind(2)
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) / q.shape[-1] ** 0.5
    return torch.einsum("bhnm,bmhd->bnhd", scores.softmax(-1), v)


def test_attend_tokens_on_the_cpu_is_the_attention_formula():
    torch.manual_seed(0)
    q = torch.randn(3, 7, 2, 8, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(3, 11, 2, 2, 8, dtype=torch.float64, requires_grad=True)
    assert not tokens_fusable(q, kv)
    y = attend_tokens(q, kv)
    ref = reference(q, kv)
    assert y.shape == (3, 7, 2, 8) and torch.allclose(y, ref)
    probe = torch.randn_like(ref)
    for g, r in zip(torch.autograd.grad((y * probe).sum(), (q, kv)), torch.autograd.grad((ref * probe).sum(), (q, kv))):
        assert torch.allclose(g, r)


@pytest.mark.parametrize("q_shape,kv_shape", [((3, 7, 2, 8), (3, 11, 2, 8)), ((3, 7, 2, 8), (3, 11, 3, 2, 8)),
                                              ((3, 7, 2, 8), (4, 11, 2, 2, 8)), ((3, 7, 2, 8), (3, 11, 2, 4, 8))])
def test_attend_tokens_names_bad_shapes(q_shape, kv_shape):
    with pytest.raises(ValueError, match=r"q \(B, N, H, d\) and kv \(B, M, 2, H, d\)"):
        attend_tokens(torch.randn(q_shape), torch.randn(kv_shape))


def test_kernels_take_any_number_of_keys_and_tile_them_beyond_one_tile():
    """One tile holds up to 128 keys at head width 32 (64 at 64: the paper size's 97 and 65
    keys); beyond, the passes loop over tiles of keys, so any number of keys runs. Head widths
    up to 128."""
    kernels = kernel_module("attention")
    assert kernels.one_tile(97, 32) and kernels.one_tile(65, 32) and kernels.one_tile(128, 32)
    assert kernels.one_tile(64, 64) and kernels.one_tile(256, 16)
    assert not kernels.one_tile(129, 32) and not kernels.one_tile(193, 32) and not kernels.one_tile(65, 64)
    assert all(kernels.supported(m, d) for m in (1, 97, 257, 4097) for d in (16, 32, 64, 128))
    assert not kernels.supported(0, 32) and not kernels.supported(97, 129) and not kernels.supported(97, 256)


def test_backward_tiles_keys_up_to_one_tile_of_queries():
    """The backward pass loops over key tiles where one tile holds every query (the GNO's 64),
    and over query tiles beyond."""
    kernels = kernel_module("attention")
    assert kernels.key_tiled(5) and kernels.key_tiled(64)
    assert not kernels.key_tiled(65) and not kernels.key_tiled(150)


@needs_triton
@pytest.mark.slow
def test_float32_takes_the_kernels_only_where_they_fit(monkeypatch):
    """Float32 inputs take the kernels at head widths up to 64 on devices that allow an H100's
    227 KiB per program, not on an A100's 163 or an Ada GPU's 99 KiB. Under `torch.compile`
    the device's part is a constant and the head width a guard: no graph break
    (``fullgraph=True``), symbolic sizes (``dynamic=True``) included."""
    kernels = kernel_module("attention")
    for arch, limit in _targets.LIMITS.items():
        monkeypatch.setattr(kernels, "shared_memory", lambda index, limit=limit: limit)
        assert [kernels.float32_fits(d, 0) for d in (16, 32, 33, 64, 65, 128)] == (
            [True, True, True, True, False, False] if arch == 90 else [False] * 6)

    def scale(x):  # the head width as the last size, symbolic under dynamic=True
        return x * (2.0 if kernels.float32_fits(x.shape[-1], 0) else 3.0)

    for limit, factor in [(232448, 2.0), (166912, 3.0)]:
        monkeypatch.setattr(kernels, "shared_memory", lambda index, limit=limit: limit)
        torch._dynamo.reset()
        compiled = torch.compile(scale, fullgraph=True, dynamic=True)
        assert compiled(torch.ones(2, 32)).unique().tolist() == [factor]
        assert compiled(torch.ones(3, 16)).unique().tolist() == [factor]
        assert compiled(torch.ones(3, 128)).unique().tolist() == [3.0]
    torch._dynamo.reset()


def test_float32_takes_the_kernels_only_with_tf32_products(monkeypatch):
    """Float32 inputs on a GPU take the kernels only where TF32 products are allowed (exact
    float32 products in Triton run without tensor cores, far slower than SDPA); 16-bit inputs
    take them either way. Mixed types and CPU tensors never do."""
    kernels = kernel_module("attention")
    monkeypatch.setattr(attention, "_kernels", kernels)
    monkeypatch.setattr(kernels, "shared_memory", lambda index: _targets.LIMITS[90])

    class OnGPU(torch.Tensor):  # CPU tensors that say they are on a GPU: only the rule runs
        is_cuda = True

    def fusable(dtype, kv_dtype=None):
        q, kv = torch.zeros(2, 64, 8, 32, dtype=dtype), torch.zeros(2, 97, 2, 8, 32, dtype=kv_dtype or dtype)
        return tokens_fusable(q.as_subclass(OnGPU), kv.as_subclass(OnGPU))

    for tf32 in (False, True):
        with tf32_products(tf32):
            assert fusable(torch.float32) == tf32
            assert fusable(torch.bfloat16) and fusable(torch.float16)
            assert not fusable(torch.float32, torch.bfloat16)
            assert not tokens_fusable(torch.zeros(2, 64, 8, 32), torch.zeros(2, 97, 2, 8, 32))


# (head width, queries, keys) at which the passes use their largest tiles: the query-tiled
# backward pass over one tile of 256 keys (width 16) or 128 (32); key tiles of 64 with every
# query (64) in one tile; query and key tiles (several key tiles, more than 64 queries).
LARGEST_TILES = [(16, 192, 193), (32, 192, 97), (64, 64, 97), (64, 192, 257), (128, 64, 97), (128, 192, 257)]


@needs_triton
@pytest.mark.parametrize("arch", sorted(_targets.LIMITS))
def test_kernels_compiled_for_a100_ada_and_h100_fit_their_shared_memory(monkeypatch, arch):
    """Every launch of the forward and backward passes at the sizes of their largest tiles,
    compiled by Triton for an A100 (sm80), an Ada GPU (sm89) and an H100 (sm90), needs no more
    shared memory than the device allows: in bf16 at every head width, in float32 where
    `float32_fits` admits it on that device (no ``OutOfResources`` when the kernels load
    there)."""
    kernels = kernel_module("attention")
    limit = _targets.LIMITS[arch]
    monkeypatch.setattr(kernels, "shared_memory", lambda index: limit)
    seen = set()
    for dtype in (torch.bfloat16, torch.float32):
        for d, n, m in LARGEST_TILES:
            if dtype == torch.float32 and not kernels.float32_fits(d, 0):
                continue
            q, kv = torch.zeros(1, n, 1, d, dtype=dtype), torch.zeros(1, m, 2, 1, d, dtype=dtype)
            with _targets.recording(kernels) as launches:
                kernels.token_attention(q, kv)
                kernels.token_attention_backward(q, kv, q, torch.zeros(1, 1, n), q)
            assert len(launches) >= 2
            _targets.assert_fit(launches, arch, seen)


def test_flop_formulas_are_those_of_scaled_dot_product_attention():
    """The kernels count what `torch.utils.flop_counter` counts for
    `scaled_dot_product_attention` on the same shapes, so TFLOP/s figures of both paths compare."""
    kernels = kernel_module("attention")
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    b, n, m, h, d = 5, 64, 97, 8, 32
    head_major = (b, h, n, d), (b, h, m, d), (b, h, m, d)
    assert kernels._forward_flops((b, n, h, d), (b, m, 2, h, d)) == sdpa_flop_count(*head_major)
    assert kernels._backward_flops((b, n, h, d), (b, m, 2, h, d)) == sdpa_backward_flop_count((b, h, n, d), *head_major)


def test_attention_kernel_switches_between_paths_alike():
    """`fused_attention` only picks the path: on the CPU both settings give the same result, and
    a bank's standalone kernel keeps the setting."""
    torch.manual_seed(1)
    bank = AttentionKernelBank(3, 32, 4)
    x, ctx, index = torch.randn(5, 6, 32), torch.randn(5, 2, 32), torch.tensor([0, 2, 2, 1, 0])
    y = bank(x, index, ctx)
    bank.fused_attention = False
    assert torch.equal(bank(x, index, ctx), y)
    assert bank.kernel(1).fused_attention is False and AttentionKernel(32, 4).fused_attention is True


INTERPRETED = """
import os
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode
from gno_ext.kernels import load
from gno_ext.layers import attention

assert os.environ["TRITON_INTERPRET"] == "1"
attention._kernels = load("attention")  # (a layer loads its kernels on import only where CUDA is)
assert attention._kernels is not None
torch.manual_seed(0)


def reference(q, kv):
    k, v = kv.unbind(2)
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


# (batch, queries, keys, heads, head width): sizes under one tile (padded keys, queries and
# head width), several query tiles (70 and 130 > 64), keys up to the tile (200 of 256), a
# head width of 64; and more keys than one tile holds (the `trl` grid's 257 at head width 32,
# 300), where the forward pass loops over key tiles. The backward pass: key tiles
# for 5, 64 and 40 queries (200 keys: four tiles, the last partly empty), query tiles for 70
# and 130 with one tile of keys, and the split pair (key tiles, then query tiles) for 130
# queries and 257 keys.
kernels = attention._kernels
sizes = [(3, 5, 7, 2, 8), (2, 70, 97, 3, 32), (2, 64, 200, 1, 16), (1, 130, 40, 2, 64), (1, 130, 257, 2, 32),
         (2, 40, 300, 1, 32)]
assert [kernels.key_tiled(n) for _, n, *_ in sizes] == [True, False, True, False, False, True]
assert [kernels.one_tile(m, d) for *_, m, _, d in sizes] == [True, True, True, True, False, False]
for b, n, m, h, d in sizes:
    q = torch.randn(b, n, h, d, requires_grad=True)
    kv = torch.randn(b, m, 2, h, d, requires_grad=True)
    probe = torch.randn(b, n, h, d)
    assert not attention.tokens_fusable(q, kv)  # CPU tensors: the callers take SDPA
    with FlopCounterMode(display=False) as counter:
        o, lse = kernels.token_attention(q, kv)
        got = torch.autograd.grad((o * probe).sum(), (q, kv))
    assert counter.get_total_flops() == 14 * b * h * n * m * d, counter.get_total_flops()
    ref = reference(q, kv)
    want = torch.autograd.grad((ref * probe).sum(), (q, kv))
    assert torch.allclose(o, ref, atol=1e-5), (o - ref).abs().max()
    k = kv[:, :, 0].detach()
    scores = torch.einsum("bnhd,bmhd->bhnm", q.detach(), k) / d ** 0.5
    assert torch.allclose(lse, torch.logsumexp(scores, -1) / torch.log(torch.tensor(2.0)), atol=1e-5)
    for g, r in zip(got, want):
        assert g.shape == r.shape and torch.allclose(g, r, atol=1e-5), (g - r).abs().max()
    # float16 operands (Triton 3.9's interpreter computes bf16 products wrongly; bf16 runs on
    # the GPU tests)
    o16, _ = kernels.token_attention(q.half(), kv.half())
    got16 = torch.autograd.grad((o16.float() * probe).sum(), (q, kv))
    assert o16.dtype == torch.float16
    for a, r in zip((o16,) + got16, (ref,) + want):
        assert ((a.float() - r).norm() / r.norm()) < 3e-3, ((a.float() - r).norm() / r.norm())
print("interpreted attention agrees")
"""


@needs_triton
@pytest.mark.slow
def test_kernels_match_the_reference_in_tritons_interpreter():
    """Output, log-sum-exp and the gradients of queries, keys and values of the Triton kernels
    (Triton's CPU interpreter, a process of its own) equal `scaled_dot_product_attention` in
    float32 and to half precision in float16; FLOPs are counted for both passes."""
    run_interpreted(INTERPRETED, "interpreted attention agrees")


def _paths(fn, q, kv, probe):
    """Output and gradients of ``fn(q, kv)`` for the loss ``sum(out * probe)``."""
    q, kv = q.detach().requires_grad_(), kv.detach().requires_grad_()
    y = fn(q, kv)
    return [y.detach().float(), *torch.autograd.grad((y.float() * probe).sum(), (q, kv))]


def _kernel_attention(q, kv):
    """The Triton operator itself, whatever `tokens_fusable` would choose."""
    return attention._kernels.token_attention(q.contiguous(), kv.contiguous())[0]


@needs_cuda
def test_gpu_kernels_equal_sdpa_eager_and_compiled():
    """Float32 (TF32 off): the kernels equal `scaled_dot_product_attention`, eager and compiled
    with ``fullgraph=True``, at the GNO's sizes (64 queries, 97 keys, head width 32; the
    stand-in's 65 keys), whose backward pass tiles the keys, at a size with several query
    tiles, and at sizes with more keys than one tile holds (the `trl` grid's 192 queries and
    257 keys; 64 queries and 300 keys). `attend_tokens` itself sends such inputs to SDPA (exact
    float32 products in Triton are slow)."""
    torch.manual_seed(2)
    assert not torch.backends.cuda.matmul.allow_tf32
    for b, n, m, h, d in [(16, 64, 97, 8, 32), (16, 64, 65, 8, 32), (4, 150, 120, 2, 64), (4, 192, 257, 8, 32),
                          (4, 64, 300, 8, 32)]:
        q, kv = torch.randn(b, n, h, d, device="cuda"), torch.randn(b, m, 2, h, d, device="cuda")
        assert not tokens_fusable(q, kv)
        probe = torch.randn(b, n, h, d, device="cuda")
        want = _paths(lambda a, c: attend_tokens(a, c, fused=False), q, kv, probe)
        for fn in (_kernel_attention, torch.compile(_kernel_attention, fullgraph=True)):
            for got, ref in zip(_paths(fn, q, kv, probe), want):
                assert torch.allclose(got, ref, atol=2e-5, rtol=1e-4), (got - ref).abs().max()


@needs_cuda
def test_gpu_float32_inputs_take_the_kernels_with_tf32():
    """With TF32 products allowed, float32 inputs at the paper size take the kernels on a GPU
    where they fit (`float32_fits`: an H100 or H200), eager and compiled, and their error
    against float64 is that of TF32 rounding."""
    kernels = attention._kernels
    if not kernels.float32_fits(32, torch.cuda.current_device()):
        pytest.skip("float32 attention takes SDPA on this GPU (shared memory)")
    torch.manual_seed(5)
    b, n, m, h, d = 32, 64, 97, 8, 32
    q, kv = torch.randn(b, n, h, d, device="cuda"), torch.randn(b, m, 2, h, d, device="cuda")
    probe = torch.randn(b, n, h, d, device="cuda")
    exact = _paths(lambda a, c: attend_tokens(a, c, fused=False), q.double(), kv.double(), probe.double())
    with tf32_products(True):
        assert tokens_fusable(q, kv)
        for fn in (attend_tokens, torch.compile(attend_tokens, fullgraph=True)):
            errors = [((g.double() - r).norm() / r.norm()).item() for g, r in zip(_paths(fn, q, kv, probe), exact)]
            assert all(e < 3e-3 for e in errors), errors
            assert any(e > 1e-5 for e in errors), errors  # TF32 products, not exact float32 (SDPA)


@needs_cuda
def test_gpu_kernels_under_bf16_autocast():
    """Under bf16 autocast the kernels run in bf16 (as `scaled_dot_product_attention` does there)
    and their error against float32 is no larger than SDPA's own bf16 error (within 20 %)."""
    torch.manual_seed(3)
    b, n, m, h, d = 64, 64, 97, 8, 32
    q, kv = torch.randn(b, n, h, d, device="cuda"), torch.randn(b, m, 2, h, d, device="cuda")
    probe = torch.randn(b, n, h, d, device="cuda")
    exact = _paths(lambda a, c: attend_tokens(a, c, fused=False), q.double(), kv.double(), probe.double())
    errors = {}
    for fused in (True, False):
        with torch.autocast("cuda", torch.bfloat16):
            got = _paths(lambda a, c: attend_tokens(a, c, fused=fused), q, kv, probe)
        assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32  # (of the float32 leaves)
        errors[fused] = [((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, exact)]
    assert all(e < 1e-2 for e in errors[True]), errors
    assert all(f <= 1.2 * s + 1e-4 for f, s in zip(errors[True], errors[False])), errors


@needs_cuda
@pytest.mark.parametrize("b,n,m,h,d", [(16, 16, 33, 2, 16), (16, 64, 161, 8, 32), (8, 192, 257, 2, 16),
                                       (8, 192, 257, 8, 32), (8, 150, 120, 2, 64)])
def test_gpu_kernels_under_bf16_autocast_over_sizes(b, n, m, h, d):
    """The sizes of the shipped recipes besides the paper's 128^2 (smoke grids; 3-D advection at
    64^3 with 161 keys; the 128 x 384 `trl` grid with 192 queries at smoke width and at the
    paper's, whose 257 keys at head width 32 take the key-tiled forward pass and the split
    backward pass) and one with several query tiles at head width 64: in bf16 the output and
    both gradients are within
    bf16 rounding (1e-2 relative) of float64. Triton compiled the boundary kernels wrong in bf16
    at some sizes only (`gno_ext.kernels.boundary.WIDE`)."""
    torch.manual_seed(n + m)
    q, kv = torch.randn(b, n, h, d, device="cuda"), torch.randn(b, m, 2, h, d, device="cuda")
    assert tokens_fusable(q.bfloat16(), kv.bfloat16())
    probe = torch.randn(b, n, h, d, device="cuda")
    exact = _paths(lambda a, c: attend_tokens(a, c, fused=False), q.double(), kv.double(), probe.double())
    with torch.autocast("cuda", torch.bfloat16):
        got = _paths(attend_tokens, q, kv, probe)
    errors = [((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, exact)]
    assert all(e < 1e-2 for e in errors), errors


@needs_cuda
def test_gpu_bank_fused_attention_equals_sdpa():
    """A kernel bank with the fused attention (bf16 autocast, as the GNO trains) computes what
    it computes with SDPA: against the bank in float64, its output and the gradients of the
    input and of every parameter are within bf16 rounding, and no further off than SDPA's."""
    torch.manual_seed(4)
    bank = AttentionKernelBank(4, 64, 4).cuda()
    x, ctx = torch.randn(24, 64, 64, device="cuda"), torch.randn(24, 33, 64, device="cuda")
    index = torch.randint(0, 4, (24,), device="cuda")

    def run(module, x, ctx, fused, autocast):
        module.fused_attention = fused
        x = x.detach().requires_grad_()
        module.zero_grad()
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            y = module(x, index, ctx)
        y.double().square().sum().backward()
        return [y.double(), x.grad.double()] + [p.grad.double() for p in module.parameters()]

    exact = run(copy.deepcopy(bank).double(), x.double(), ctx.double(), False, False)
    errors = {fused: [((g - r).norm() / r.norm()).item() for g, r in zip(run(bank, x, ctx, fused, True), exact)]
              for fused in (True, False)}
    assert all(e < 2e-2 for e in errors[True]), errors
    assert all(f <= 1.2 * s + 1e-4 for f, s in zip(errors[True], errors[False])), errors
