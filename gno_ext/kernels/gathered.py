"""Triton kernels and operators of `gno_ext.layers._gathered` (imported only where they can
run: a CUDA device, or Triton's interpreter in the tests)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from gno_ext.kernels.launch import dot_precision, launch, shared_memory

__all__ = ["FORWARD", "WGRAD", "gathered_mm", "grouped_wgrad", "wgrad_splits"]

# Launch configurations, chosen by sweeps on an H100 (docs/benchmarks.md). FORWARD: the
# product and the input gradient (BM: rows of one kernel's samples per tile; BN, BK: upper
# bounds, reduced to the problem's size, BK also to fit the device's shared memory, see
# `_forward_tiles`); WGRAD: the weight gradient (tile sizes are upper bounds, BD also reduced
# to fit the shared memory, see `_wgrad_tiles`; its runs of
# samples: `gno_ext.layers._gathered.run_length`; "programs": below this many programs of whole
# samples, each sample's rows are split between programs, see `wgrad_splits`). Read when a
# model is compiled: after a change, start from a fresh compile cache (see
# `gno_ext.kernels.attention.CONFIG`).
FORWARD = {"BM": 128, "BN": 128, "BK": 64, "num_warps": 8, "num_stages": 3}
WGRAD = {"BD": 256, "BN": 64, "BT": 64, "num_warps": 4, "num_stages": 3, "programs": 256}


@triton.jit
def _group_rows(pid, counts, T, K, KP: tl.constexpr, BM: tl.constexpr):
    """Program ``pid``'s tile of rows: ``BM`` consecutive rows of one kernel's samples, given
    each kernel's sample count ``counts`` (``KP`` entries, zero past ``K``). Each kernel ``k``'s
    ``counts[k]`` samples make ``counts[k] * T`` rows (``T`` per sample), cut into
    ``cdiv(counts[k] * T, BM)`` tiles, the kernels' tiles one after the other. Returns the
    kernel (``K`` or more for a program past the last tile, which has nothing to do), the
    position of its first sample in the samples listed by kernel, the tile's rows counted from
    there, and whether each row exists.

    It takes no pointer: torch's analysis of which arguments a kernel writes
    (tests/layers/test_kernel_mutation_analysis.py) counts every pointer given to a helper as
    written when the helper's result becomes part of a store's address."""
    kk = tl.arange(0, KP)
    tiles = (counts * T + BM - 1) // BM
    tile_end = tl.cumsum(tiles, 0)
    k = tl.sum((tile_end <= pid).to(tl.int32), 0)
    first_tile = tl.sum(tl.where(kk == k, tile_end - tiles, 0), 0)
    first_sample = tl.sum(tl.where(kk < k, counts, 0), 0)
    rows = (pid - first_tile) * BM + tl.arange(0, BM)
    return k, first_sample, rows, rows < tl.sum(tl.where(kk == k, counts, 0), 0) * T


@triton.jit
def _gathered_mm_kernel(x_ptr, w_ptr, bias_ptr, plan_ptr, y_ptr, T, DIN, DOUT, K,
                        sxb, sxt, sxd, swk, swi, swo, sbk, syb, syt, syd,
                        HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        KP: tl.constexpr, PRECISION: tl.constexpr):
    # program (row tile of one kernel's samples, `_group_rows`) x (column tile n); ``plan``
    # holds each kernel's sample count and then the samples listed by kernel (`run_plan`)
    kk = tl.arange(0, KP)
    counts = tl.load(plan_ptr + kk, mask=kk < K, other=0)
    k, first_sample, rows, live = _group_rows(tl.program_id(0), counts, T, K, KP, BM)
    sample = tl.load(plan_ptr + K + first_sample + rows // T, mask=live, other=0).to(tl.int64)
    token = rows % T
    if k < K:
        kernel = k.to(tl.int64)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        inner = tl.arange(0, BK)
        x_rows = x_ptr + (sample * sxb + token * sxt)[:, None]
        w_cols = w_ptr + kernel * swk + cols[None, :] * swo
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for i0 in range(0, DIN, BK):
            i = i0 + inner
            xt = tl.load(x_rows + i[None, :] * sxd, mask=live[:, None] & (i[None, :] < DIN), other=0.0)
            wt = tl.load(w_cols + i[:, None] * swi, mask=(i[:, None] < DIN) & (cols[None, :] < DOUT), other=0.0)
            acc = tl.dot(xt, wt, acc, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + kernel * sbk + cols, mask=cols < DOUT, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + (sample * syb + token * syt)[:, None] + cols[None, :] * syd, acc.to(y_ptr.dtype.element_ty),
                 mask=live[:, None] & (cols[None, :] < DOUT))


@triton.jit
def _grouped_wgrad_kernel(x_ptr, dy_ptr, order_ptr, run_kernel_ptr, run_start_ptr, run_len_ptr,
                          dw_ptr, dbias_ptr, T, DIN, DOUT, PART,
                          sxb, sxt, sxd, syb, syt, syd, swk, swi, swo, sbk,
                          HAS_BIAS: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr,
                          RUN: tl.constexpr, PRECISION: tl.constexpr):
    # program (weight tile) x (run) x (part of the rows: chunks of BT rows [c0, c1), PART
    # chunks per part): dW[k] tile += sum over the run's samples of x_b^T dy_b over those rows
    tiles_n = tl.cdiv(DOUT, BN)
    td = tl.program_id(0) // tiles_n
    dd = td * BD + tl.arange(0, BD)
    nn = (tl.program_id(0) % tiles_n) * BN + tl.arange(0, BN)
    r = tl.program_id(1)
    c0 = tl.program_id(2) * PART
    chunks = tl.minimum(tl.cdiv(T, BT) - c0, PART)
    length = tl.load(run_len_ptr + r)
    if length > 0:
        k = tl.load(run_kernel_ptr + r).to(tl.int64)
        first = tl.load(run_start_ptr + r)
        tt0 = tl.arange(0, BT)
        acc = tl.zeros((BD, BN), dtype=tl.float32)
        acc_bias = tl.zeros((BN,), dtype=tl.float32)
        # The run's sample indices are loaded once, so that the tile addresses in the loop
        # depend on registers only, and the loop is one flat loop over (sample, row chunk):
        # both let the compiler pipeline the tile loads across samples.
        lanes = tl.arange(0, RUN)
        samples = tl.load(order_ptr + first + lanes, mask=lanes < length, other=0).to(tl.int64)
        for i in range(length * chunks):
            b = tl.sum(tl.where(lanes == i // chunks, samples, 0))
            tt = (c0 + i % chunks) * BT + tt0
            xt = tl.load(x_ptr + b * sxb + dd[:, None] * sxd + tt[None, :] * sxt,
                         mask=(dd[:, None] < DIN) & (tt[None, :] < T), other=0.0)
            dy = tl.load(dy_ptr + b * syb + tt[:, None] * syt + nn[None, :] * syd,
                         mask=(tt[:, None] < T) & (nn[None, :] < DOUT), other=0.0)
            acc = tl.dot(xt, dy, acc, input_precision=PRECISION)
            if HAS_BIAS:
                acc_bias += tl.sum(dy.to(tl.float32), 0)
        # relaxed: only the sums matter, no ordering with other memory operations
        tl.atomic_add(dw_ptr + k * swk + dd[:, None] * swi + nn[None, :] * swo, acc,
                      mask=(dd[:, None] < DIN) & (nn[None, :] < DOUT), sem="relaxed")
        if HAS_BIAS:
            if td == 0:
                tl.atomic_add(dbias_ptr + k * sbk + nn, acc_bias, mask=nn < DOUT, sem="relaxed")


# Float settings of the kernels (scales, norm epsilons) are compile-time constants, not
# arguments: Triton's JIT types a Python float argument float32 (eager mode), but the launchers
# that inductor generates for `torch.compile` type it float64 (torch 2.11), and every value
# multiplied by it became float64. The attention kernels ran 5 times slower compiled than eager
# (docs/benchmarks.md, ninth round); the boundary kernels computed their norms and softmax in
# float64 under `torch.compile`.


def _tile(n: int, largest: int) -> int:
    """The smallest power of two >= min(n, largest), at least 16 (`tl.dot`'s minimum). ``int``
    makes a symbolic size (``torch.compile`` with dynamic shapes) concrete: tile sizes are
    compile-time constants of the kernel."""
    return max(16, min(largest, triton.next_power_of_2(int(n))))


def _gathered_mm(x: Tensor, weight: Tensor, bias: Tensor | None, plan: Tensor) -> Tensor:
    """Launch of the forward kernel (also the input gradient, on transposed weights)."""
    b, t, din = x.shape
    n_kernels, _, dout = weight.shape
    y = x.new_empty(b, t, dout)
    c = FORWARD
    bm, bn, bk = _forward_tiles(x, din, dout)
    # every kernel's rows fill whole tiles but its last: at most B * T / BM + K tiles
    grid = (triton.cdiv(b * t, bm) + n_kernels, triton.cdiv(dout, bn))
    bias_arg = weight if bias is None else bias  # unused pointer when there is no bias
    launch(_gathered_mm_kernel)[grid](
        x, weight, bias_arg, plan, y, t, din, dout, n_kernels, *x.stride(),
        *weight.stride(), 0 if bias is None else bias.stride(0), *y.stride(),
        HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk, KP=triton.next_power_of_2(n_kernels),
        PRECISION=dot_precision(), num_warps=c["num_warps"], num_stages=c["num_stages"])
    return y


def wgrad_splits(tiles: int, runs: int, chunks: int, programs: int | None = None) -> tuple[int, int]:
    """How the weight-gradient kernel splits each sample's ``chunks`` chunks of rows: returns
    ``(parts, chunks per part)``. With ``tiles`` weight tiles and ``runs`` runs of samples,
    whole samples give ``tiles * runs`` programs; below ``programs`` (default
    ``WGRAD["programs"]``, about two per streaming multiprocessor of an H100) the rows are cut
    into as many equal parts as bring the count up to it, at most one per chunk. Many rows per
    sample and a small batch (the `trl` recipe's 128 x 384 grid: 192 and 257 rows, batch 32)
    would otherwise leave most of the GPU idle; at the paper's 128^2 grid at batch 256 the
    kernel does not split."""
    programs = WGRAD["programs"] if programs is None else programs
    want = min(chunks, max(1, -(-programs // (tiles * runs))))
    per = -(-chunks // want)
    return -(-chunks // per), per


def shared_memory_limit(x: Tensor) -> int | None:
    """Shared memory (bytes) that one program may use on ``x``'s device; None off CUDA
    (Triton's interpreter), where there is no limit."""
    if not x.is_cuda:
        return None
    return shared_memory(x.device.index if x.device.index is not None else torch.cuda.current_device())


def _fit(tile: int, need, limit: int | None) -> int:
    """``tile`` halved (not below 16, `tl.dot`'s minimum) until ``need(tile)`` bytes fit
    ``limit`` (None: no limit)."""
    while limit is not None and tile > 16 and need(tile) > limit:
        tile //= 2
    return tile


# Both kernels pipeline their two operand tiles: ``num_stages`` copies of them bound what
# Triton allocates in shared memory (Triton 3.6 and 3.9 allocate ``num_stages - 1`` copies in
# float32 and less in bf16; compiled for sm80, sm89 and sm90, tests/layers/test_gathered.py). The
# launch settings above fit an H100 or A100 in bf16; in float32, or on GPUs of about 99 KiB
# per program (Ada: L40S, RTX 4090), the reduction tile is halved until they fit.
def _forward_tiles(x: Tensor, din: int, dout: int) -> tuple[int, int, int]:
    """``(BM, BN, BK)`` of the product kernel: `FORWARD`'s tiles reduced to the problem's size,
    and ``BK`` (the reduction tile) halved until the pipelined tiles fit the device's shared
    memory."""
    c = FORWARD
    bm, bn = c["BM"], _tile(dout, c["BN"])  # BM: rows of several samples
    bk = _fit(_tile(din, c["BK"]), lambda k: c["num_stages"] * k * (bm + bn) * x.element_size(),
              shared_memory_limit(x))
    return bm, bn, bk


def _wgrad_tiles(x: Tensor, din: int, dout: int, t: int) -> tuple[int, int, int]:
    """``(BD, BN, BT)`` of the weight-gradient kernel: `WGRAD`'s tiles reduced to the
    problem's size, and ``BD`` halved until the pipelined tiles (a ``BD x BT`` and a
    ``BT x BN`` tile) fit the device's shared memory."""
    c = WGRAD
    bn, bt = _tile(dout, c["BN"]), _tile(t, c["BT"])
    bd = _fit(_tile(din, c["BD"]), lambda d: c["num_stages"] * bt * (d + bn) * x.element_size(),
              shared_memory_limit(x))
    return bd, bn, bt


def _grouped_wgrad(x: Tensor, dy: Tensor, plan: Tensor, n_kernels: int, has_bias: bool,
                   run: int) -> tuple[Tensor, Tensor]:
    """Launch of the weight-gradient kernel: ``(dW (K, in, out), dbias (K, out))`` in float32
    (``dbias`` empty without a bias). ``plan``: from `gno_ext.layers._gathered.run_plan` with
    runs of at most ``run`` samples."""
    b, t, din = x.shape
    dout = dy.shape[2]
    dw = x.new_zeros(n_kernels, din, dout, dtype=torch.float32)
    dbias = x.new_zeros(n_kernels, dout if has_bias else 0, dtype=torch.float32)
    order, (run_kernel, run_start, run_len) = plan[n_kernels:n_kernels + b], plan[n_kernels + b:].view(3, -1)
    c = WGRAD
    bd, bn, bt = _wgrad_tiles(x, din, dout, t)
    tiles, runs = triton.cdiv(din, bd) * triton.cdiv(dout, bn), run_len.shape[0]
    parts, per = wgrad_splits(tiles, runs, triton.cdiv(int(t), bt))
    launch(_grouped_wgrad_kernel)[(tiles, runs, parts)](
        x, dy, order, run_kernel, run_start, run_len, dw, dbias, t, din, dout, per,
        *x.stride(), *dy.stride(), *dw.stride(), dbias.stride(0) if has_bias else 0,
        HAS_BIAS=has_bias, BD=bd, BN=bn, BT=bt, RUN=triton.next_power_of_2(run), PRECISION=dot_precision(),
        num_warps=c["num_warps"], num_stages=c["num_stages"])
    return dw, dbias


@torch.library.triton_op("gno_ext::gathered_mm", mutates_args={})
def gathered_mm(x: Tensor, index: Tensor, weight: Tensor, bias: Tensor | None, plan: Tensor, run: int) -> Tensor:
    """``x[b] @ weight[index[b]] + bias[index[b]]`` in ``x``'s type (the weight and bias cast to
    it here), given ``plan = run_plan(index, K, run)`` (`gno_ext.layers._gathered.run_plan`),
    which lists the samples by kernel; ``run`` is kept for the weight gradient."""
    return _gathered_mm(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype), plan)


@torch.library.triton_op("gno_ext::grouped_wgrad", mutates_args={})
def grouped_wgrad(x: Tensor, dy: Tensor, plan: Tensor, n_kernels: int, has_bias: bool,
                  run: int) -> tuple[Tensor, Tensor]:
    """The weight and bias gradients of `gathered_mm` (float32)."""
    return _grouped_wgrad(x, dy, plan, n_kernels, has_bias, run)


def _setup_context(ctx, inputs, output) -> None:
    x, index, weight, bias, plan, run = inputs
    ctx.save_for_backward(x, index, weight, plan)
    ctx.has_bias, ctx.run = bias is not None, run


def _backward(ctx, grad: Tensor):
    # the weight as the forward pass got it (float32 parameters under autocast): the input
    # gradient casts it again, and its gradient is returned in its type without rounding
    x, index, weight, plan = ctx.saved_tensors
    grad = grad.contiguous()
    dx = gathered_mm(grad, index, weight.transpose(1, 2), None, plan, ctx.run) if ctx.needs_input_grad[0] else None
    dw = dbias = None
    if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
        dw, dbias = grouped_wgrad(x, grad, plan, weight.shape[0], ctx.has_bias, ctx.run)
        dw = dw.to(weight.dtype)
        dbias = dbias.to(weight.dtype) if ctx.has_bias else None
    return dx, None, dw, dbias, None, None

gathered_mm.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.gno_ext.gathered_mm)
def _gathered_mm_flops(x_shape, index_shape, weight_shape, *args, out_shape=None, **kwargs) -> int:
    b, t, din = x_shape
    return 2 * b * t * din * weight_shape[2]


@register_flop_formula(torch.ops.gno_ext.grouped_wgrad)
def _grouped_wgrad_flops(x_shape, dy_shape, *args, out_shape=None, **kwargs) -> int:
    b, t, din = x_shape
    return 2 * b * t * din * dy_shape[2]
