"""The gathered-weight products (`gno_ext.layers._gathered`): the run plan on any machine, the
Triton kernels in Triton's interpreter on the CPU (when Triton is installed), and the GNO's
mixture path on a GPU (when there is one)."""

import types
from importlib.util import find_spec

import pytest
import torch

from gno_ext.layers import _gathered
from gno_ext.kernels.precision import tf32_products
from tests._kernels import kernel_module
from tests.layers import _targets
from tests.layers._interpreter import run_interpreted

needs_triton = pytest.mark.skipif(find_spec("triton") is None, reason="Triton is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or _gathered._kernels is None,
                                reason="needs a CUDA device and Triton")


@pytest.mark.parametrize("batch,n_kernels,run", [(37, 5, 4), (3, 4, 8), (16, 2, 8)])
def test_run_plan_cuts_each_kernels_samples_into_runs(batch, n_kernels, run):
    torch.manual_seed(batch)
    index = torch.randint(0, n_kernels - 1, (batch,))  # the last kernel unused
    plan = _gathered.run_plan(index, n_kernels, run)
    n_runs = batch // run + n_kernels
    assert plan.dtype == torch.int32 and plan.shape == (batch + n_kernels + 3 * n_runs,)
    counts, order = plan[:n_kernels].long(), plan[n_kernels:n_kernels + batch].long()
    kernel, start, length = plan[n_kernels + batch:].view(3, -1).long()
    assert sorted(order.tolist()) == list(range(batch))
    assert counts.tolist() == torch.bincount(index, minlength=n_kernels).tolist()
    keys = (index[order] * batch + order).tolist()  # sorted by kernel, stable within a kernel
    assert keys == sorted(keys)
    assert (length >= 0).all() and (length <= run).all()
    covered = []
    for k, s, n in zip(kernel.tolist(), start.tolist(), length.tolist()):
        members = order[s:s + n]
        assert (index[members] == k).all()
        covered += members.tolist()
    assert sorted(covered) == list(range(batch))  # every sample in exactly one run


def test_usable_only_on_cuda_with_kernels_and_without_deterministic_algorithms(monkeypatch):
    cuda_like = types.SimpleNamespace(is_cuda=True, dtype=torch.float32)
    monkeypatch.setattr(_gathered, "_kernels", None)
    assert not _gathered.usable(cuda_like)
    monkeypatch.setattr(_gathered, "_kernels", object())
    assert _gathered.usable(cuda_like) and not _gathered.usable(torch.zeros(1))
    assert _gathered.usable(types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16))
    # float64 stays exact on the PyTorch path (the kernels accumulate in float32)
    assert not _gathered.usable(types.SimpleNamespace(is_cuda=True, dtype=torch.float64))
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not _gathered.usable(cuda_like)
    finally:
        torch.use_deterministic_algorithms(previous)


INTERPRETED = """
import os
import torch
from torch.utils.flop_counter import FlopCounterMode
from gno_ext.kernels import load
from gno_ext.layers import _gathered

assert os.environ["TRITON_INTERPRET"] == "1"
_gathered._kernels = load("gathered")  # (a layer loads its kernels on import only where CUDA is)
assert _gathered._kernels is not None
torch.manual_seed(0)
kernels = _gathered._kernels
# (batch, tokens, in, out, kernels, samples per run, bias, unused kernel, programs): row counts
# that are not a multiple of the tiles (tiles spanning several samples, samples cut between two
# tiles), several row and column tiles, a batch shorter than a run, an unused kernel first, in
# the middle or last; the weight gradient with each sample's rows whole, split in two parts of
# one chunk (70 rows), in five (300 rows) and in three parts of two, two and one chunk (300
# rows, `programs` 18)
cases = [(5, 13, 24, 40, 3, 2, True, 2, 256), (9, 70, 16, 136, 4, 4, False, 1, 256), (3, 5, 8, 8, 4, 8, True, 0, 256),
         (40, 33, 32, 24, 3, 8, True, 1, 256), (6, 300, 16, 24, 3, 2, True, 1, 256),
         (6, 300, 16, 24, 3, 2, False, 0, 18)]
c = kernels.WGRAD
assert [kernels.wgrad_splits(-(-dout // c["BN"]) * -(-din // c["BD"]), b // run + k, -(-t // c["BT"]), programs)
        for b, t, din, dout, k, run, _, _, programs in cases[1:]] == [(2, 1), (1, 1), (1, 1), (5, 1), (3, 2)]
for b, t, din, dout, k, run, bias, unused, programs in cases:
    _gathered.RUN = _gathered.SHORT_RUN = run
    kernels.WGRAD["programs"] = programs
    x = torch.randn(b, t, din, requires_grad=True)
    index = torch.randint(0, k - 1, (b,))
    index[index >= unused] += 1
    w = torch.randn(k, din, dout, requires_grad=True)
    c = torch.randn(k, dout, requires_grad=True) if bias else None
    leaves = (x, w) if c is None else (x, w, c)
    probe = torch.randn(b, t, dout)
    with FlopCounterMode(display=False) as counter:
        y = _gathered.gathered_linear(x, index, w, c)
        got = torch.autograd.grad((y * probe).sum(), leaves)
    assert counter.get_total_flops() == 3 * 2 * b * t * din * dout, counter.get_total_flops()
    ref = torch.einsum("btd,bde->bte", x, w[index]) + (0 if c is None else c[index][:, None])
    want = torch.autograd.grad((ref * probe).sum(), leaves)
    assert torch.allclose(y, ref, atol=1e-4), (y - ref).abs().max()
    for g, r in zip(got, want):
        assert g.shape == r.shape and torch.allclose(g, r, atol=1e-4), (g - r).abs().max()
    # the unused kernel: exactly 0
    assert not got[1][unused].any() and (c is None or not got[2][unused].any())
    assert got[1].abs().sum((1, 2)).count_nonzero() == index.unique().numel()
    # under autocast: the result has the autocast type, the weight and bias gradients float32
    # (float16 here: Triton 3.9's interpreter computes bf16 products wrongly; bf16 is tested
    # on the GPU)
    with torch.autocast("cpu", torch.float16):
        y16 = _gathered.gathered_linear(x, index, w, c)
    got16 = torch.autograd.grad((y16.float() * probe).sum(), leaves)
    assert y16.dtype == torch.float16 and all(g.dtype == torch.float32 for g in got16)
    for a, r in zip((y16,) + got16, (ref,) + want):
        assert ((a.float() - r).norm() / r.norm()) < 2e-3, ((a.float() - r).norm() / r.norm())
# runs of the default length (`run_length`): short runs in a small batch, long in a large one
_gathered.RUN, _gathered.SHORT_RUN = 8, 4
kernels.WGRAD["programs"] = 256
for b, k, run in [(40, 3, 4), (232, 3, 8)]:
    assert _gathered.run_length(b, k) == run
    x = torch.randn(b, 5, 16, requires_grad=True)
    index = torch.randint(0, k, (b,))
    w = torch.randn(k, 16, 24, requires_grad=True)
    probe = torch.randn(b, 5, 24)
    got = torch.autograd.grad((_gathered.gathered_linear(x, index, w) * probe).sum(), (x, w))
    want = torch.autograd.grad((torch.einsum("btd,bde->bte", x, w[index]) * probe).sum(), (x, w))
    for g, r in zip(got, want):
        assert torch.allclose(g, r, atol=1e-4), (g - r).abs().max()
print("interpreted kernels agree")
"""


def test_runs_are_long_where_the_batch_gives_enough_of_them():
    """Runs of 8 samples where they still make `MIN_RUNS` (32) runs (the paper's 128^2 grid at
    batch 256: 36), of 4 below (the `trl` recipe's batch 32), and `run_plan` cuts by that rule
    unless told otherwise."""
    assert (_gathered.RUN, _gathered.SHORT_RUN, _gathered.MIN_RUNS) == (8, 4, 32)
    assert _gathered.run_length(256, 4) == 8 and _gathered.run_length(32, 4) == 4
    assert _gathered.run_length(224, 4) == 8 and _gathered.run_length(216, 4) == 4  # 32 and 31 runs of 8
    assert _gathered.run_length(1, 1) == 4
    for batch, run in [(256, 8), (32, 4)]:
        index = torch.arange(batch) % 4
        lengths = _gathered.run_plan(index, 4)[4 + batch:].view(3, -1)[2]
        assert lengths.max() == run and lengths.shape[0] == batch // run + 4


def test_weight_gradient_splits_rows_only_where_whole_samples_leave_the_gpu_idle():
    """At the paper's 128^2 grid at batch 256 (64 and 97 rows, 36 runs) the weight-gradient
    kernel keeps each sample's rows in one program; at the `trl` grid at batch 32 (192 and 257
    rows, 12 runs of 4 or, before `run_length`, 8 runs of 8) it cuts them into equal parts, at
    most one per chunk of rows."""
    kernels = kernel_module("gathered")
    assert kernels.wgrad_splits(4, 36, 1, 256) == (1, 1) and kernels.wgrad_splits(8, 36, 2, 256) == (1, 2)
    assert kernels.wgrad_splits(4, 12, 3, 256) == (3, 1) and kernels.wgrad_splits(8, 12, 5, 256) == (3, 2)
    assert kernels.wgrad_splits(4, 8, 3, 256) == (3, 1) and kernels.wgrad_splits(8, 8, 5, 256) == (3, 2)
    for tiles, runs, chunks, programs in [(1, 1, 7, 4), (2, 3, 9, 100), (8, 8, 5, 0), (1, 1, 1, 500)]:
        parts, per = kernels.wgrad_splits(tiles, runs, chunks, programs)
        assert 1 <= parts <= chunks and (parts - 1) * per < chunks <= parts * per  # every part has rows


@needs_triton
def test_tiles_fit_the_devices_shared_memory(monkeypatch):
    """The reduction tile of each kernel (the product's ``BK``, the weight gradient's ``BD``)
    is halved until its pipelined operand tiles fit the device's shared memory, and no further:
    the configured tiles in bf16 on an H100 (227 KiB), smaller ones where they would not fit
    (float32; GPUs of about 99 KiB such as the L40S). Off CUDA (the interpreter) there is no
    limit; tiles never exceed the problem's size."""
    kernels = kernel_module("gathered")
    fwd, wgrad = kernels.FORWARD, kernels.WGRAD

    def operands(itemsize):
        return types.SimpleNamespace(element_size=lambda: itemsize)

    def forward_need(tiles, itemsize):
        bm, bn, bk = tiles
        return fwd["num_stages"] * bk * (bm + bn) * itemsize

    def wgrad_need(tiles, itemsize):
        bd, bn, bt = tiles
        return wgrad["num_stages"] * bt * (bd + bn) * itemsize

    for limit in _targets.LIMITS.values():
        monkeypatch.setattr(kernels, "shared_memory_limit", lambda x, limit=limit: limit)
        for itemsize in (2, 4):
            f = kernels._forward_tiles(operands(itemsize), 256, 512)
            w = kernels._wgrad_tiles(operands(itemsize), 256, 512, 97)
            assert f[:2] == (fwd["BM"], fwd["BN"]) and w[1:] == (wgrad["BN"], wgrad["BT"])
            assert forward_need(f, itemsize) <= limit and wgrad_need(w, itemsize) <= limit
            # halved no further than needed
            assert f[2] == fwd["BK"] or forward_need(f[:2] + (2 * f[2],), itemsize) > limit
            assert w[0] == wgrad["BD"] or wgrad_need((2 * w[0],) + w[1:], itemsize) > limit
        assert kernels._wgrad_tiles(operands(4), 24, 40, 13)[1:] == (64, 16)  # the problem's size
        assert kernels._forward_tiles(operands(4), 24, 40)[1] == 64
    monkeypatch.setattr(kernels, "shared_memory_limit", lambda x: 232448)  # an H100
    assert kernels._forward_tiles(operands(2), 256, 512) == (128, 128, 64)
    assert kernels._wgrad_tiles(operands(2), 256, 512, 97) == (256, 64, 64)
    assert kernels._wgrad_tiles(operands(4), 256, 512, 97)[0] == 128
    monkeypatch.undo()
    assert kernels.shared_memory_limit(torch.zeros(1)) is None  # the interpreter: no limit
    assert kernels._wgrad_tiles(torch.zeros(1), 256, 512, 97) == (256, 64, 64)


@needs_triton
@pytest.mark.parametrize("arch", sorted(_targets.LIMITS))
def test_kernels_compiled_for_a100_ada_and_h100_fit_their_shared_memory(monkeypatch, arch):
    """The launches that the operators make at the paper's sizes (64 rows, 256 -> 256; 97
    rows, 256 -> 512), in bf16 and in float32, compiled by Triton for an A100 (sm80), an Ada
    GPU (sm89) and an H100 (sm90) with that device's shared-memory limit, need no more shared
    memory than the limit: no ``OutOfResources`` when the kernels load there."""
    kernels = kernel_module("gathered")
    limit = _targets.LIMITS[arch]
    monkeypatch.setattr(kernels, "shared_memory_limit", lambda x: limit)
    plan = _gathered.run_plan(torch.tensor([0, 2, 2, 1]), 4)
    seen = set()
    for dtype in (torch.bfloat16, torch.float32):
        for t, din, dout in [(64, 256, 256), (97, 256, 512)]:
            x, dy = torch.zeros(4, t, din, dtype=dtype), torch.zeros(4, t, dout, dtype=dtype)
            with _targets.recording(kernels) as launches:
                kernels._gathered_mm(x, torch.zeros(4, din, dout, dtype=dtype), torch.zeros(4, dout, dtype=dtype), plan)
                kernels._grouped_wgrad(x, dy, plan, 4, True, 8)
            assert [k.fn.__name__ for k, _, _ in launches] == ["_gathered_mm_kernel", "_grouped_wgrad_kernel"]
            _targets.assert_fit(launches, arch, seen)


@needs_triton
@pytest.mark.slow
def test_kernels_match_the_reference_in_tritons_interpreter():
    """Forward, input, weight and bias gradients of the Triton kernels (run by Triton's CPU
    interpreter, in a process of its own: the interpreter is chosen when the kernels are
    defined) equal the per-sample products, in float32 and under float16 autocast, with the
    weight gradient's rows whole and split; FLOPs are counted for all three products."""
    run_interpreted(INTERPRETED, "interpreted kernels agree")


@needs_cuda
def test_gpu_kernel_bank_gathered_equals_chunked_with_gradients():
    """On a GPU the bank takes the gathered path by default; it equals the chunked path
    (float32, TF32 off), eager and compiled with ``fullgraph=True``, gradients included."""
    from gno_ext.layers import AttentionKernelBank

    torch.manual_seed(14)
    assert not torch.backends.cuda.matmul.allow_tf32  # torch's default: the kernels follow it
    bank = AttentionKernelBank(4, 64, 4).cuda()
    x, ctx = torch.randn(40, 70, 64, device="cuda", requires_grad=True), torch.randn(40, 9, 64, device="cuda")
    index = torch.randint(0, 3, (40,), device="cuda")  # kernel 3 unused
    probe = torch.randn(40, 70, 64, device="cuda")
    results = []
    for fn, chunk in [(bank, 1), (bank, None), (torch.compile(bank, fullgraph=True), None)]:
        x.grad = None
        bank.zero_grad()
        y = fn(x, index, ctx, chunk=chunk)
        (y * probe).sum().backward()
        results.append([y.detach(), x.grad.clone()] + [p.grad.clone() for p in bank.parameters()])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()
    assert all(not p.grad[3].any() for p in bank.parameters())


@needs_cuda
def test_gpu_gathered_path_compiles_with_a_dynamic_batch():
    """A symbolic batch size (a last, shorter batch under ``torch.compile``) traces through the
    kernels' launchers, and every batch size matches eager mode, gradients included."""
    from gno_ext.layers import AttentionKernelBank

    torch.manual_seed(16)
    bank = AttentionKernelBank(3, 64, 4).cuda()
    compiled = torch.compile(bank, dynamic=True, fullgraph=True)
    for batch in (24, 17, 9):
        x = torch.randn(batch, 70, 64, device="cuda", requires_grad=True)
        ctx = torch.randn(batch, 9, 64, device="cuda")
        index = torch.randint(0, 3, (batch,), device="cuda")
        got = []
        for fn in (bank, compiled):
            x.grad = None
            bank.zero_grad()
            y = fn(x, index, ctx)
            y.square().sum().backward()
            got.append((y.detach(), x.grad.clone(), bank.kv_weight.grad.clone()))
        for a, b in zip(*got):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (batch, (a - b).abs().max())


@needs_cuda
def test_gpu_gathered_path_under_bf16_autocast():
    """Under bf16 autocast the gathered path agrees with the float32 products to bf16
    precision, and so does the chunked path in bf16; the weight gradients stay float32."""
    from gno_ext.layers import AttentionKernelBank

    torch.manual_seed(17)
    bank = AttentionKernelBank(4, 64, 4).cuda()
    x, ctx = torch.randn(48, 64, 64, device="cuda", requires_grad=True), torch.randn(48, 33, 64, device="cuda")
    index = torch.randint(0, 3, (48,), device="cuda")
    probe = torch.randn(48, 64, 64, device="cuda")
    results = []
    for chunk, autocast in [(1, False), (None, True), (1, True)]:
        x.grad = None
        bank.zero_grad()
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            y = bank(x, index, ctx, chunk=chunk)
        (y.float() * probe).sum().backward()
        results.append([y.detach().float(), x.grad.clone()] + [p.grad.clone() for p in bank.parameters()])
    assert all(p.grad.dtype == torch.float32 for p in bank.parameters())
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert (a - b).norm() <= 1e-2 * a.norm(), ((a - b).norm() / a.norm()).item()


@needs_cuda
@pytest.mark.parametrize("tokens,din,dout", [(16, 32, 32), (49, 32, 64), (65, 64, 128), (97, 256, 512),
                                             (192, 256, 256), (257, 256, 512)])
def test_gpu_gathered_linear_under_bf16_autocast_over_sizes(tokens, din, dout):
    """Smoke-size widths (32, 64), the paper's key/value product and the `trl` grid's query and
    key/value products (192 and 257 rows; at this batch of 40 the weight gradient splits the
    rows of 97 and more, `wgrad_splits`): in bf16 the output and the input, weight and bias
    gradients are within bf16 rounding (1e-2 relative) of the float64 per-sample products,
    every kernel used by some samples."""
    torch.manual_seed(tokens + din)
    x = torch.randn(40, tokens, din, device="cuda", requires_grad=True)
    w = torch.randn(3, din, dout, device="cuda", requires_grad=True)
    c = torch.randn(3, dout, device="cuda", requires_grad=True)
    index = torch.arange(40, device="cuda") % 3
    probe = torch.randn(40, tokens, dout, device="cuda")

    def grads(y):
        return [y.detach(), *torch.autograd.grad((y * probe.to(y.dtype)).sum(), (x, w, c))]

    with torch.autocast("cuda", torch.bfloat16):
        got = grads(_gathered.gathered_linear(x, index, w, c).float())
    exact = grads(torch.einsum("bti,bio->bto", x.double(), w.double()[index]) + c.double()[index][:, None])
    errors = [((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, exact)]
    assert all(e < 1e-2 for e in errors), errors


@needs_cuda
def test_gpu_gathered_linear_in_float32_at_the_paper_size():
    """In float32 (no autocast) the key/value product of the paper size runs (its weight
    gradient's tiles reduced to fit the shared memory, `_wgrad_tiles`) and equals the
    per-sample products, gradients included."""
    torch.manual_seed(23)
    x = torch.randn(24, 97, 256, device="cuda", requires_grad=True)
    w = torch.randn(4, 256, 512, device="cuda", requires_grad=True)
    c = torch.randn(4, 512, device="cuda", requires_grad=True)
    index = torch.arange(24, device="cuda") % 4
    probe = torch.randn(24, 97, 512, device="cuda")
    with tf32_products(False):
        y = _gathered.gathered_linear(x, index, w, c)
        got = [y.detach(), *torch.autograd.grad((y * probe).sum(), (x, w, c))]
    exact = torch.einsum("bti,bio->bto", x.double(), w.double()[index]) + c.double()[index][:, None]
    want = [exact.detach(), *torch.autograd.grad((exact * probe.double()).sum(), (x, w, c))]
    errors = [((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, want)]
    assert all(e < 1e-5 for e in errors), errors


@needs_cuda
def test_gpu_weight_gradients_under_autocast_are_not_rounded():
    """Under bf16 autocast the products take bf16 operands, but the float32 weight and bias get
    their gradients summed in float32 and returned unrounded: they equal a float64 sum of the
    same bf16 operands to float32 precision (a bf16 rounding would be off by about 1e-3)."""
    torch.manual_seed(19)
    x = torch.randn(64, 97, 64, device="cuda")
    w = torch.randn(4, 64, 96, device="cuda", requires_grad=True)
    c = torch.randn(4, 96, device="cuda", requires_grad=True)
    index = torch.randint(0, 4, (64,), device="cuda")
    probe = torch.randn(64, 97, 96, device="cuda")
    with torch.autocast("cuda", torch.bfloat16):
        y = _gathered.gathered_linear(x, index, w, c)
    assert y.dtype == torch.bfloat16
    dw, dc = torch.autograd.grad((y.float() * probe).sum(), (w, c))
    assert dw.dtype == dc.dtype == torch.float32
    xb, dy = x.bfloat16().double(), probe.bfloat16().double()  # the operands the kernels saw
    want_w = torch.zeros(4, 64, 96, device="cuda", dtype=torch.float64).index_add_(
        0, index, torch.einsum("btd,bte->bde", xb, dy))
    want_c = torch.zeros(4, 96, device="cuda", dtype=torch.float64).index_add_(0, index, dy.sum(1))
    assert ((dw.double() - want_w).norm() / want_w.norm()).item() < 1e-5
    assert ((dc.double() - want_c).norm() / want_c.norm()).item() < 1e-5
