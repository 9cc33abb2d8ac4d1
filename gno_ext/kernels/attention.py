r"""Triton kernels of `gno_ext.layers.attention.attend_tokens`: multi-head attention over
short sequences, in the token-major layout of the projections (imported only where they can
run: a CUDA device, or Triton's interpreter in the tests).

The GNO attends over few keys per sample (64 spatial tokens and 33 context tokens at the
paper size) with narrow heads (32). At these sizes the library kernels behind
`torch.nn.functional.scaled_dot_product_attention` are far from the memory traffic they need
(the memory-efficient kernel's backward pass took 0.86 ms of a 6.4 ms training step on an
H100), and they work in the ``(B, H, N, d)`` layout, so the projections' outputs are permuted
and their gradients copied back. Two regimes:

* **every key of a sample in one tile** (`one_tile`: ``pow2(M) * pow2(d) <= MAX_TILE``, up to
  128 keys at head width 32; the paper size):

  - forward (`_token_attention_forward` with ``ONE_TILE``): a program per (sample, head, tile
    of ``BQ`` queries) computes ``S = q k^T / sqrt(d)`` over all ``M`` keys in registers, its
    softmax (no running maximum: one tile holds every key) and ``o = P v``, and writes ``o``
    and the row's log-sum-exp (float32) for the backward pass;
  - backward, with ``dS = P (dP - \mathrm{rowsum}(do\, o))``, ``dP = do\, v^T`` and ``P``
    recomputed from the log-sum-exp, a program per (sample, head) in one of two ways. Up to
    `KEY_TILED_QUERIES` queries (`_token_attention_backward_keys`, the GNO's case): one tile
    holds every query, and the program loops over tiles of ``BK`` keys, writing each tile's
    ``dk = dS^T q / sqrt(d)`` and ``dv = P^T do`` and accumulating ``dq = dS k / sqrt(d)`` in
    registers. A step holds ``BK`` keys' scores instead of all keys', and the tiles are
    software-pipelined (the next keys load while the current ones are used): at the GNO's
    sizes (64 queries, 65 or 97 keys) 26 to 28 % faster on an H100 than the query-tiled kernel
    (benchmarks/history.md, eleventh round). More queries (`_token_attention_backward`): the
    program loops over the query tiles, writing ``dq`` for each and accumulating ``dk`` and
    ``dv`` for all keys in registers;

* **more keys** (the `trl` recipe's 128 x 384 grid: 192 queries, 257 keys, and the stand-in's
  193 there):

  - forward (the same kernel without ``ONE_TILE``): the program loops over tiles of ``BK`` keys
    with a running maximum and sum (the online softmax of flash attention), so no tile holds
    more than ``BQ x BK`` scores;
  - backward: up to `KEY_TILED_QUERIES` queries as above (that kernel takes any number of
    keys); beyond, two launches over the same two kernels, each given a second grid axis:
    `_token_attention_backward` with a program per (sample, head, tile of ``BK`` keys) writes
    ``dk`` and ``dv`` of its keys, and `_token_attention_backward_keys` with a program per
    (sample, head, tile of ``BQ`` queries) writes ``dq`` of its queries. The scores are
    recomputed in both; in exchange every sum stays inside one program.

No atomics: the result is reproducible.

Queries are read from ``q`` (B, N, H, d) and keys and values from one ``kv`` (B, M, 2, H, d), the
layouts in which the projections write them; ``o`` and the gradients are written in the same
layouts. The products run in the inputs' type with float32 accumulation; the softmax is in
float32, and ``P`` is rounded to the inputs' type for the products with ``v`` and ``do`` (as
flash attention does).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from gno_ext.kernels.launch import dot_precision, launch, shared_memory

__all__ = ["CONFIG", "FLOAT32_MAX_HEAD_DIM", "FLOAT32_SHARED_MEMORY", "KEY_TILED_QUERIES", "MAX_TILE", "float32_fits",
           "key_tiled", "one_tile", "supported", "token_attention",
           "token_attention_backward"]

# Launch configuration of each pass (chosen by sweeps on an H100, benchmarks/history.md): BQ
# queries per tile (an upper bound, reduced to the query count), BK keys per tile, warps per
# program, pipelining stages. "backward_keys": the key-tiled backward pass (up to
# KEY_TILED_QUERIES queries); "backward": the query-tiled one (more queries). "forward_tiles" and
# "backward_split": the passes for more keys than one tile holds (`one_tile`). These settings
# are read when a model is compiled. torch.compile's caches (AOTAutograd's, keyed on the traced
# graph and the kernels' source code, and inductor's FX graph cache) do not see them, so after
# a change a compiled model needs a fresh cache (TORCHINDUCTOR_FX_GRAPH_CACHE=0, which turns
# both off, or another TORCHINDUCTOR_CACHE_DIR) or it may run the kernel chosen before.
CONFIG = {"forward": {"BQ": 64, "num_warps": 4}, "backward": {"BQ": 64, "num_warps": 4},
          "backward_keys": {"BK": 64, "num_warps": 4, "num_stages": 3},
          "forward_tiles": {"BQ": 64, "BK": 64, "num_warps": 4, "num_stages": 3},
          "backward_split": {"BQ": 64, "BK": 64, "num_warps": 4, "num_stages": 3}}
KEY_TILED_QUERIES = 64  # queries (padded to a power of two) up to which the backward pass tiles the keys
# Keys (padded to a power of two) x head width (padded) that one tile may hold. Beyond, the
# passes loop over key tiles. At 64 queries and 97 keys (head width 32, padded to 128) one
# tile's forward pass is faster (51.9 against 55.4 us at batch 256); at 192 queries and 193
# keys (padded to 256) the tiled passes are (forward 19.9 against 22.0 us, forward + backward
# 72.8 against 107.1 us at batch 32; H100, compiled, bf16; benchmarks/history.md, fifteenth round).
MAX_TILE = 4096
MAX_HEAD_DIM = 128  # head width (padded to a power of two) that the kernels take
# Float32 operands take twice the shared memory of 16-bit ones. Compiled by Triton 3.9 for an
# A100 (sm80), an Ada GPU (sm89: L40S, RTX 4090) and an H100 (sm90), the passes in float32 need
# up to 168 KiB at head width 16 (the query-tiled backward pass over one tile of 256 keys),
# 129 KiB at widths 32 and 64 and 240 KiB at 128: more than an A100 (163 KiB) or an Ada GPU
# (99 KiB) lets a program use, and at width 128 more than an H100 (227 KiB); in 16-bit types
# at most 81 KiB (benchmarks/history.md, seventeenth round; tests/layers/test_token_attention.py).
# So float32 inputs take the kernels only on devices that allow FLOAT32_SHARED_MEMORY bytes per
# program, at head widths up to FLOAT32_MAX_HEAD_DIM (`float32_fits`); elsewhere
# `gno_ext.layers.attention.attend_tokens` runs scaled_dot_product_attention.
FLOAT32_SHARED_MEMORY = 232448  # an H100's opt-in limit per program (227 KiB)
FLOAT32_MAX_HEAD_DIM = 64
LOG2E = 1.4426950408889634


def _pow2(n: int) -> int:
    """The smallest power of two >= ``n``, at least 16 (`tl.dot`'s minimum)."""
    return max(16, triton.next_power_of_2(int(n)))


def key_tiled(queries: int) -> bool:
    """Whether the backward pass for ``queries`` queries per sample is the key-tiled kernel
    (`_token_attention_backward_keys`): one tile holds every query."""
    return _pow2(queries) <= KEY_TILED_QUERIES


def one_tile(keys: int, head_dim: int) -> bool:
    """Whether one tile holds all ``keys`` keys of a sample at head width ``head_dim``
    (``pow2(keys) * pow2(head_dim) <= MAX_TILE``): the forward pass and the query-tiled backward
    pass then keep every key's scores in registers; otherwise they loop over tiles of keys."""
    return _pow2(keys) * _pow2(head_dim) <= MAX_TILE


@torch.compiler.assume_constant_result  # a constant of the device: no graph break under torch.compile
def _float32_device(device_index: int) -> bool:
    """Whether CUDA device ``device_index`` allows `FLOAT32_SHARED_MEMORY` bytes of shared
    memory per program."""
    return shared_memory(device_index) >= FLOAT32_SHARED_MEMORY


def float32_fits(head_dim: int, device_index: int) -> bool:
    """Whether the kernels take float32 operands at head width ``head_dim`` on CUDA device
    ``device_index``: head widths up to `FLOAT32_MAX_HEAD_DIM` on devices that allow
    `FLOAT32_SHARED_MEMORY` bytes of shared memory per program (Hopper and later data-centre
    GPUs); 16-bit types run everywhere. Under `torch.compile` the device's part is a constant
    and the head width's a guard, as in `supported` (symbolic sizes included)."""
    return _pow2(head_dim) <= FLOAT32_MAX_HEAD_DIM and _float32_device(device_index)


def supported(keys: int, head_dim: int) -> bool:
    """Whether the kernels take ``keys`` keys per sample (at least one) at head width
    ``head_dim`` (up to `MAX_HEAD_DIM`). Any number of keys: beyond one tile (`one_tile`) the
    passes loop over tiles of keys."""
    return keys >= 1 and _pow2(head_dim) <= MAX_HEAD_DIM


@triton.jit
def _scores(q, k, keys, M, SCALE2: tl.constexpr, PRECISION: tl.constexpr):
    """``q k^T`` scaled to base-2 logits, the padded keys at minus infinity."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * SCALE2
    return tl.where(keys[None, :] < M, s, float("-inf"))


@triton.jit
def _offsets(b, h, idx, dd, n, DH, sb, sn, sh):
    """Offsets and mask of the tile (tokens ``idx``, head width ``dd``) of sample ``b`` and
    head ``h`` in a layout with strides ``sb`` (sample), ``sn`` (token) and ``sh`` (head)."""
    return b * sb + h * sh + idx[:, None] * sn + dd[None, :], (idx[:, None] < n) & (dd[None, :] < DH)


@triton.jit
def _key_tile(kv_ptr, offsets, mask, sks):
    """Keys and values of a tile of ``kv`` (B, M, 2, H, d) at the keys' ``offsets`` and
    ``mask`` (`_offsets`; the values lie ``sks`` further).

    The helpers that take pointers return loaded values only, never offsets: torch's analysis
    of which arguments a kernel writes counts every pointer given to a helper as written when
    the helper's result becomes part of a store's address, and the compiled model then copies
    those inputs before each launch (tests/layers/test_kernel_mutation_analysis.py)."""
    return tl.load(kv_ptr + offsets, mask=mask, other=0.0), tl.load(kv_ptr + offsets + sks, mask=mask, other=0.0)


@triton.jit
def _query_tile(q_ptr, o_ptr, do_ptr, lse_ptr, q_offsets, row_mask, bh, b, h, rows, dd, N, DH,
                sob, son, soh, sdob, sdon, sdoh):
    """What the backward pass reads for the tile of queries ``rows`` (``q_offsets`` and
    ``row_mask`` from `_offsets`): ``q``, ``do``, the log-sum-exp and ``delta = rowsum(do o)``."""
    q = tl.load(q_ptr + q_offsets, mask=row_mask, other=0.0)
    o_offsets, _ = _offsets(b, h, rows, dd, N, DH, sob, son, soh)
    o = tl.load(o_ptr + o_offsets, mask=row_mask, other=0.0)
    do_offsets, _ = _offsets(b, h, rows, dd, N, DH, sdob, sdon, sdoh)
    do = tl.load(do_ptr + do_offsets, mask=row_mask, other=0.0)
    lse = tl.load(lse_ptr + bh * N + rows, mask=rows < N, other=0.0)
    return q, do, lse, tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)


@triton.jit
def _score_grads(q, k, v, do, lse, delta, rows, keys, N, M, SCALE2: tl.constexpr, PRECISION: tl.constexpr):
    """For one tile of queries and one of keys: the probabilities ``P`` recomputed from the
    log-sum-exp (zero in padded rows and keys) and ``dS = P (do v^T - delta)``, in the
    operand type."""
    p = tl.exp2(_scores(q, k, keys, M, SCALE2, PRECISION) - lse[:, None])
    p = tl.where(rows[:, None] < N, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    return p.to(do.dtype), (p * (dp - delta[:, None])).to(q.dtype)


@triton.jit
def _store_key_grads(dkv_ptr, offsets, mask, sks, dk, dv, SCALE: tl.constexpr):
    """Writes a tile's key gradients ``dk * SCALE`` and value gradients ``dv`` into ``dkv``
    (B, M, 2, H, d) at the keys' ``offsets`` and ``mask`` (`_offsets`; the values lie ``sks``
    further). A helper may take the pointer it stores through: torch's write analysis follows
    it to the kernel's argument."""
    tl.store(dkv_ptr + offsets, (dk * SCALE).to(dkv_ptr.dtype.element_ty), mask=mask)
    tl.store(dkv_ptr + offsets + sks, dv.to(dkv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _token_attention_forward(q_ptr, kv_ptr, o_ptr, lse_ptr, N, M, H, DH,
                             sqb, sqn, sqh, skb, skm, sks, skh, sob, son, soh, SCALE2: tl.constexpr,
                             BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr,
                             ONE_TILE: tl.constexpr):
    # program (sample, head, tile of BQ queries). ONE_TILE: every key in one tile of BK >= M
    # keys, the softmax's maximum and sum taken at once; else a loop over tiles of BK keys
    # with a running maximum ``top`` and sum ``total`` of the exponentials (base 2), the output
    # accumulated unnormalised and rescaled as ``top`` grows
    bh = tl.program_id(0)
    b, h = (bh // H).to(tl.int64), bh % H
    rows = tl.program_id(1) * BQ + tl.arange(0, BQ)
    dd = tl.arange(0, BD)
    q_offsets, row_mask = _offsets(b, h, rows, dd, N, DH, sqb, sqn, sqh)
    q = tl.load(q_ptr + q_offsets, mask=row_mask, other=0.0)
    if ONE_TILE:
        keys = tl.arange(0, BK)
        k_offsets, key_mask = _offsets(b, h, keys, dd, M, DH, skb, skm, skh)
        k, v = _key_tile(kv_ptr, k_offsets, key_mask, sks)
        s = _scores(q, k, keys, M, SCALE2, PRECISION)
        top = tl.max(s, 1)
        p = tl.exp2(s - top[:, None])
        total = tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    else:
        top = tl.full((BQ,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((BQ,), dtype=tl.float32)
        acc = tl.zeros((BQ, BD), dtype=tl.float32)
        for k0 in range(0, M, BK):  # every tile holds at least one key, so ``top`` is finite after the first
            keys = k0 + tl.arange(0, BK)
            k_offsets, key_mask = _offsets(b, h, keys, dd, M, DH, skb, skm, skh)
            k, v = _key_tile(kv_ptr, k_offsets, key_mask, sks)
            s = _scores(q, k, keys, M, SCALE2, PRECISION)
            new_top = tl.maximum(top, tl.max(s, 1))
            shrink = tl.exp2(top - new_top)
            p = tl.exp2(s - new_top[:, None])
            total = total * shrink + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc * shrink[:, None], input_precision=PRECISION)
            top = new_top
    o_offsets, _ = _offsets(b, h, rows, dd, N, DH, sob, son, soh)
    tl.store(o_ptr + o_offsets, (acc / total[:, None]).to(o_ptr.dtype.element_ty), mask=row_mask)
    tl.store(lse_ptr + bh * N + rows, top + tl.log2(total), mask=rows < N)


@triton.jit
def _token_attention_backward(q_ptr, kv_ptr, o_ptr, do_ptr, lse_ptr, dq_ptr, dkv_ptr, N, M, H, DH,
                              sqb, sqn, sqh, skb, skm, sks, skh, sob, son, soh, sdob, sdon, sdoh,
                              SCALE2: tl.constexpr, SCALE: tl.constexpr,
                              BQ: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr,
                              WRITE_DQ: tl.constexpr):
    # program (sample, head) x (tile of BM keys; one tile of all keys where WRITE_DQ, which
    # then also writes dq); dq has q's strides and dkv has kv's (both made contiguous by the caller)
    bh = tl.program_id(0)
    b, h = (bh // H).to(tl.int64), bh % H
    keys = tl.program_id(1) * BM + tl.arange(0, BM)
    dd = tl.arange(0, BD)
    k_offsets, key_mask = _offsets(b, h, keys, dd, M, DH, skb, skm, skh)
    k, v = _key_tile(kv_ptr, k_offsets, key_mask, sks)
    dk = tl.zeros((BM, BD), dtype=tl.float32)
    dv = tl.zeros((BM, BD), dtype=tl.float32)
    for q0 in range(0, N, BQ):
        rows = q0 + tl.arange(0, BQ)
        q_offsets, row_mask = _offsets(b, h, rows, dd, N, DH, sqb, sqn, sqh)
        q, do, lse, delta = _query_tile(q_ptr, o_ptr, do_ptr, lse_ptr, q_offsets, row_mask, bh, b, h, rows, dd, N, DH,
                                        sob, son, soh, sdob, sdon, sdoh)
        p, ds = _score_grads(q, k, v, do, lse, delta, rows, keys, N, M, SCALE2, PRECISION)
        dv = tl.dot(tl.trans(p), do, dv, input_precision=PRECISION)
        if WRITE_DQ:
            dq = tl.dot(ds, k, input_precision=PRECISION) * SCALE
            tl.store(dq_ptr + q_offsets, dq.to(dq_ptr.dtype.element_ty), mask=row_mask)
        dk = tl.dot(tl.trans(ds), q, dk, input_precision=PRECISION)
    _store_key_grads(dkv_ptr, k_offsets, key_mask, sks, dk, dv, SCALE)


@triton.jit
def _token_attention_backward_keys(q_ptr, kv_ptr, o_ptr, do_ptr, lse_ptr, dq_ptr, dkv_ptr, N, M, H, DH,
                                   sqb, sqn, sqh, skb, skm, sks, skh, sob, son, soh, sdob, sdon, sdoh,
                                   SCALE2: tl.constexpr, SCALE: tl.constexpr,
                                   BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr,
                                   WRITE_KV: tl.constexpr):
    # program (sample, head) x (tile of BQ queries; one tile of all queries where WRITE_KV,
    # which then also writes dk and dv); dq has q's strides and dkv has kv's (both made
    # contiguous by the caller)
    bh = tl.program_id(0)
    b, h = (bh // H).to(tl.int64), bh % H
    rows = tl.program_id(1) * BQ + tl.arange(0, BQ)
    dd = tl.arange(0, BD)
    q_offsets, row_mask = _offsets(b, h, rows, dd, N, DH, sqb, sqn, sqh)
    q, do, lse, delta = _query_tile(q_ptr, o_ptr, do_ptr, lse_ptr, q_offsets, row_mask, bh, b, h, rows, dd, N, DH,
                                    sob, son, soh, sdob, sdon, sdoh)
    dq = tl.zeros((BQ, BD), dtype=tl.float32)
    for k0 in range(0, M, BK):
        keys = k0 + tl.arange(0, BK)
        k_offsets, key_mask = _offsets(b, h, keys, dd, M, DH, skb, skm, skh)
        k, v = _key_tile(kv_ptr, k_offsets, key_mask, sks)
        p, ds = _score_grads(q, k, v, do, lse, delta, rows, keys, N, M, SCALE2, PRECISION)
        dq = tl.dot(ds, k, dq, input_precision=PRECISION)
        if WRITE_KV:
            dv = tl.dot(tl.trans(p), do, input_precision=PRECISION)
            dk = tl.dot(tl.trans(ds), q, input_precision=PRECISION)
            _store_key_grads(dkv_ptr, k_offsets, key_mask, sks, dk, dv, SCALE)
    tl.store(dq_ptr + q_offsets, (dq * SCALE).to(dq_ptr.dtype.element_ty), mask=row_mask)


def _strides(q: Tensor, kv: Tensor) -> list[int]:
    return [*q.stride()[:3], kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3)]


def _tiles(n: int, m: int, dh: int, bq: int) -> tuple[int, int, int]:
    return min(bq, _pow2(n)), _pow2(m), _pow2(dh)


@torch.library.triton_op("gno_ext::token_attention", mutates_args={})
def token_attention(q: Tensor, kv: Tensor) -> tuple[Tensor, Tensor]:
    """``softmax(q k^T / sqrt(d)) v`` per sample and head for ``q`` (B, N, H, d) and ``kv``
    (B, M, 2, H, d) (keys ``kv[:, :, 0]``, values ``kv[:, :, 1]``), both contiguous and of one
    type. Returns the output (B, N, H, d) and the base-2 log-sum-exp of each query's scores
    (B, H, N), float32, which the backward pass reads."""
    b, n, h, dh = q.shape
    m = kv.shape[1]
    o = torch.empty_like(q)
    lse = q.new_empty(b, h, n, dtype=torch.float32)
    one = one_tile(m, dh)
    c = CONFIG["forward" if one else "forward_tiles"]
    bq = min(c["BQ"], _pow2(n))
    launch_options = {name: c[name] for name in ("num_warps", "num_stages") if name in c}
    launch(_token_attention_forward)[(b * h, triton.cdiv(n, bq))](
        q, kv, o, lse, n, m, h, dh, *_strides(q, kv), *o.stride()[:3], SCALE2=LOG2E / math.sqrt(dh), BQ=bq,
        BK=_pow2(m) if one else c["BK"], BD=_pow2(dh), PRECISION=dot_precision(), ONE_TILE=one, **launch_options)
    return o, lse


@torch.library.triton_op("gno_ext::token_attention_backward", mutates_args={})
def token_attention_backward(q: Tensor, kv: Tensor, o: Tensor, lse: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients ``(dq, dkv)`` of `token_attention` for the output gradient ``grad``
    (contiguous, in ``o``'s layout)."""
    b, n, h, dh = q.shape
    m = kv.shape[1]
    dq, dkv = torch.empty_like(q), torch.empty_like(kv)
    args = (q, kv, o, grad, lse, dq, dkv, n, m, h, dh, *_strides(q, kv), *o.stride()[:3], *grad.stride()[:3])
    scales = {"SCALE2": LOG2E / math.sqrt(dh), "SCALE": 1 / math.sqrt(dh), "PRECISION": dot_precision()}
    bd = _pow2(dh)
    if key_tiled(n):  # one tile of every query, looping over the keys (any number)
        c = CONFIG["backward_keys"]
        launch(_token_attention_backward_keys)[(b * h, 1)](
            *args, **scales, BQ=_pow2(n), BK=c["BK"], BD=bd, WRITE_KV=True, num_warps=c["num_warps"],
            num_stages=c["num_stages"])
    elif one_tile(m, dh):  # one tile of every key, looping over the queries
        c = CONFIG["backward"]
        bq, bm, bd = _tiles(n, m, dh, c["BQ"])
        launch(_token_attention_backward)[(b * h, 1)](*args, **scales, BQ=bq, BM=bm, BD=bd, WRITE_DQ=True,
                                                       num_warps=c["num_warps"])
    else:  # dk and dv per tile of keys, then dq per tile of queries
        c = CONFIG["backward_split"]
        bq, bk = c["BQ"], c["BK"]
        launch(_token_attention_backward)[(b * h, triton.cdiv(m, bk))](
            *args, **scales, BQ=bq, BM=bk, BD=bd, WRITE_DQ=False, num_warps=c["num_warps"],
            num_stages=c["num_stages"])
        launch(_token_attention_backward_keys)[(b * h, triton.cdiv(n, bq))](
            *args, **scales, BQ=bq, BK=bk, BD=bd, WRITE_KV=False, num_warps=c["num_warps"],
            num_stages=c["num_stages"])
    return dq, dkv


def _setup_context(ctx, inputs, output) -> None:
    q, kv = inputs
    o, lse = output
    ctx.save_for_backward(q, kv, o, lse)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad: Tensor, _lse_grad: Tensor | None):
    q, kv, o, lse = ctx.saved_tensors
    return token_attention_backward(q, kv, o, lse, grad.contiguous())


token_attention.register_autograd(_backward, setup_context=_setup_context)


# The FLOPs that torch.utils.flop_counter counts for scaled_dot_product_attention on the same
# shapes (two products forward; five backward, the scores recomputed), so that counts and
# TFLOP/s figures compare with the SDPA path.
@register_flop_formula(torch.ops.gno_ext.token_attention)
def _forward_flops(q_shape, kv_shape, *args, out_shape=None, **kwargs) -> int:
    b, n, h, dh = q_shape
    return 4 * b * h * n * kv_shape[1] * dh


@register_flop_formula(torch.ops.gno_ext.token_attention_backward)
def _backward_flops(q_shape, kv_shape, *args, out_shape=None, **kwargs) -> int:
    b, n, h, dh = q_shape
    return 10 * b * h * n * kv_shape[1] * dh
