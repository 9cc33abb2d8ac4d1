r"""Fused Triton kernels of `gno_ext.layers.boundary.BoundaryTransfer` (imported only where
they can run: a CUDA device, or Triton's interpreter in the tests).

The operator works on a few dozen boundary tokens per sample at a small width, so in PyTorch
its forward and backward passes are about forty kernels per block, each of a few microseconds,
that do almost no work. Here the whole forward pass is one kernel, and the backward pass is
one kernel for the input gradients and one for the six weight gradients:

* **forward** (`_boundary_forward_kernel`): each program takes ``G`` samples (``G * MP`` rows, ``MP``
  the boundary token count rounded up to a power of two) and computes, in registers,

  $$
  x = d + S W_s + b_s,\quad q, k, v = \mathrm{LN}_1(x) W_{qkv} + b_{qkv},\quad
  x_1 = x + \mathrm{softmax}\big(q k^\top / \sqrt{w}\big) v\, W_o + b_o,
  $$
  $$
  x_2 = x_1 + \mathrm{GELU}\big(\mathrm{LN}_2(x_1) W_1 + b_1\big) W_2 + b_2,\quad
  y = x_2 W_{out} + b_{out},
  $$

  the attention masked to each sample's own tokens. It writes ``y`` and the activations that
  the backward pass reads (one ``(B, M, 9 w + 2 h)`` buffer);
* **backward** (`_boundary_backward_kernel`): the same programs run the chain backwards, write the
  input gradients (of the state ``S`` and of the description ``d``) and the gradients at each
  product's output, and sum the bias and norm-parameter gradients over their rows (one row of
  partial sums per program, added up afterwards: no atomics, so the result is reproducible);
* **weight gradients** (`_boundary_wgrad_kernel`): the six products ``dW = dY^\top X`` over
  all ``B M`` rows in one launch, each program summing one output tile over a split of the
  rows; the splits' partial sums are then added (no atomics).

Under autocast the matrix operands are in the autocast type (float32 accumulation); norms,
softmax and GELU are computed in float32. Every activation that the backward pass reads is
rounded to the operand type before the forward pass uses it, so that both passes see the same
values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from gno_ext.kernels.launch import dot_precision, launch
from gno_ext.kernels.precision import KERNEL_TYPES

__all__ = ["FLOAT32_MAX_WIDTH", "MAX_TOKENS", "ROWS", "WIDE", "boundary_transfer", "boundary_transfer_backward",
           "boundary_transfer_wgrad", "max_tokens", "sums_layout", "supported", "wgrad_shapes"]

# Rows per program: G = ROWS // MP samples of MP (padded) boundary tokens each. Measured on an
# H100 at the paper size (32 tokens, width 64, bf16; docs/benchmarks.md): 32 rows with 4 warps
# keep every value in registers; 64 rows spill (forward 34 to 37 against 25 us). This and the
# WGRAD_* settings are read when a model is compiled: after a change, start from a fresh
# compile cache (see `gno_ext.kernels.attention.CONFIG`).
ROWS = 32
# Boundary tokens per sample the kernels take: programs of 32 rows (one sample of 17 to 32
# tokens, or several of fewer), 4 warps. Larger programs (64 or 128 rows) went wrong on an
# H100 (Triton 3.6) in bf16 at some widths, while float32 was right: relative errors of 0.2
# to 7, or infinite, against float32, where bf16 rounding gives 1e-2. Programs of 64 rows at
# inner widths 16 and 32 were not even deterministic: two identical calls gave different
# results (a race in the compiled programs), wrong in some calls and right in others.
# At inner width 64 with MLP width 128 they were right in every run (33 to 64 tokens, 4 and
# 8 warps, 48 runs) and bitwise repeatable in the 40 that checked it (docs/benchmarks.md,
# thirteenth and sixteenth rounds). Width 128 did not compile within 150 s. So the kernels take up to 64 tokens at
# exactly the (inner width, MLP width) pairs of `WIDE` (64 tokens: the default operator of a
# 256-wide model on The Well's 128 x 384 `trl` grid, patch 16), up to `MAX_TOKENS` at the
# others; larger boundaries take the PyTorch path.
MAX_TOKENS = 32
WIDE = {(64, 128): 64}
# Float32 operands take twice the shared memory of 16-bit ones. Compiled by Triton 3.9 for an
# A100 (sm80), an Ada GPU (sm89: L40S, RTX 4090) and an H100 (sm90), the kernels need at most
# 80 KiB per program at inner width 128 in bf16 and at 64 in float32 (64 KiB at 16 and 32),
# but 160 KiB at width 128 in float32: more than an Ada GPU allows (99 KiB;
# tests/layers/test_boundary_kernels.py). So float32 operands take the kernels up to inner
# width FLOAT32_MAX_WIDTH.
FLOAT32_MAX_WIDTH = 64


def _warps(rows: int) -> int:
    """Warps per program: 4 up to 32 rows; 8 above (fewer registers per thread, fewer spills)."""
    return 4 if rows <= 32 else 8


def sums_layout(width: int, hidden: int, dim: int) -> dict[str, tuple[int, int]]:
    """Column ranges of the backward kernel's partial sums (bias and norm-parameter gradients)."""
    return _ranges({"state.bias": width, "norm.weight": width, "norm.bias": width, "qkv.bias": 3 * width,
                    "attn_out.bias": width, "mlp.0.weight": width, "mlp.0.bias": width, "mlp.1.bias": hidden,
                    "mlp.3.bias": width, "out.bias": dim})


def _ranges(sizes: dict[str, int]) -> dict[str, tuple[int, int]]:
    out, start = {}, 0
    for name, size in sizes.items():
        out[name] = (start, start + size)
        start += size
    return out


def max_tokens(width: int, hidden: int) -> int:
    """Boundary tokens per sample the kernels take on a GPU at inner width ``width`` and MLP
    width ``hidden``: `WIDE`'s count for its pairs, `MAX_TOKENS` otherwise."""
    return WIDE.get((width, hidden), MAX_TOKENS)


def supported(width: int, hidden: int, tokens: int, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the kernels take this size with operands of type ``dtype``: half, bfloat16 or
    float32 (not float64: the kernels accumulate in float32), widths powers of two from 16 to
    128 (hidden: to 256; float32: inner width up to `FLOAT32_MAX_WIDTH`), at most `max_tokens`
    boundary tokens per sample."""
    def pow2(n: int, largest: int) -> bool:
        return 16 <= n <= largest and n & (n - 1) == 0
    largest = FLOAT32_MAX_WIDTH if dtype == torch.float32 else 128
    return (dtype in KERNEL_TYPES and pow2(width, largest) and pow2(hidden, 256)
            and 1 <= tokens <= max_tokens(width, hidden))


@triton.jit
def _layer_norm(x, gamma_ptr, beta_ptr, cw, W: tl.constexpr, eps):
    """Row-wise layer norm of ``x`` (R, W) in float32, with gain ``gamma`` and bias ``beta``."""
    xc = x - (tl.sum(x, 1) / W)[:, None]
    xhat = xc * tl.math.rsqrt(tl.sum(xc * xc, 1) / W + eps)[:, None]
    gamma = tl.load(gamma_ptr + cw).to(tl.float32)
    beta = tl.load(beta_ptr + cw).to(tl.float32)
    return xhat * gamma[None, :] + beta[None, :]


@triton.jit
def _layer_norm_backward(dn, x, gamma_ptr, cw, W: tl.constexpr, eps):
    """Input gradient of `_layer_norm` given the output gradient ``dn``, and the row sums
    ``sum(dn * normalised)`` and ``sum(dn)`` (the gradients of gamma and beta)."""
    xc = x - (tl.sum(x, 1) / W)[:, None]
    rstd = tl.math.rsqrt(tl.sum(xc * xc, 1) / W + eps)
    xhat = xc * rstd[:, None]
    gh = dn * tl.load(gamma_ptr + cw).to(tl.float32)[None, :]
    dx = rstd[:, None] * (gh - (tl.sum(gh, 1) / W)[:, None] - xhat * (tl.sum(gh * xhat, 1) / W)[:, None])
    return dx, tl.sum(dn * xhat, 0), tl.sum(dn, 0)


@triton.jit
def _linear(x, w_ptr, b_ptr, first, IN: tl.constexpr, OUT: tl.constexpr, PRECISION: tl.constexpr):
    """``x (R, IN) @ weight[first:first + OUT].T + bias[first:first + OUT]`` in float32, for a
    ``torch.nn.Linear`` weight of shape (out, IN) (``x`` already in the operand type)."""
    i = tl.arange(0, IN)
    o = tl.arange(0, OUT)
    w = tl.load(w_ptr + (first + o[None, :]) * IN + i[:, None])
    y = tl.dot(x, w, input_precision=PRECISION)
    return y + tl.load(b_ptr + first + o).to(tl.float32)[None, :]


@triton.jit
def _linear_input_grad(dy, w_ptr, first, IN: tl.constexpr, OUT: tl.constexpr, PRECISION: tl.constexpr):
    """``dy (R, OUT) @ weight[first:first + OUT]``: the input gradient of `_linear`."""
    i = tl.arange(0, IN)
    o = tl.arange(0, OUT)
    w = tl.load(w_ptr + (first + o[:, None]) * IN + i[None, :])
    return tl.dot(dy.to(w.dtype), w, input_precision=PRECISION)


@triton.jit
def _probabilities(q, k, r, M, MP: tl.constexpr, scale, PRECISION: tl.constexpr):
    """Attention weights of rows ``r`` (R,) over the keys of their own sample (row ``r`` is
    token ``r % MP`` of sample ``r // MP``; tokens ``>= M`` are padding)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    own = ((r // MP)[:, None] == (r // MP)[None, :]) & ((r % MP) < M)[None, :]
    s = tl.where(own, s, float("-inf"))
    p = tl.exp(s - tl.max(s, 1)[:, None])
    return p / tl.sum(p, 1)[:, None]


@triton.jit
def _rows(B, M, MP: tl.constexpr, G: tl.constexpr):
    """This program's rows: local index, flat row in (B * M) and validity."""
    r = tl.arange(0, G * MP)
    sample = tl.program_id(0) * G + r // MP
    token = r % MP
    return r, sample.to(tl.int64) * M + token, (sample < B) & (token < M)


@triton.jit
def _boundary_forward_kernel(desc_ptr, state_ptr, ws_ptr, bs_ptr, g1_ptr, be1_ptr, wqkv_ptr, bqkv_ptr,
                             wo_ptr, bo_ptr,
                             g2_ptr, be2_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, wout_ptr, bout_ptr, y_ptr, saved_ptr,
                             B, M, D, EPS1: tl.constexpr, EPS2: tl.constexpr, SCALE: tl.constexpr,
                             W: tl.constexpr, HID: tl.constexpr, MP: tl.constexpr, G: tl.constexpr, BD: tl.constexpr,
                             PRECISION: tl.constexpr):
    S: tl.constexpr = 9 * W + 2 * HID  # saved columns: x n1 q k v a x1 n2 x2 (W each), hpre h (HID each)
    r, row, valid = _rows(B, M, MP, G)
    vm = valid[:, None]
    cw = tl.arange(0, W)
    ch = tl.arange(0, HID)
    cd = tl.arange(0, BD)
    dt = y_ptr.dtype.element_ty
    sv = saved_ptr + row[:, None] * S
    # x = d + S W_s + b_s
    x = tl.zeros((G * MP, W), tl.float32)
    for d0 in range(0, D, BD):
        dd = d0 + cd
        st = tl.load(state_ptr + row[:, None] * D + dd[None, :], mask=vm & (dd[None, :] < D), other=0.0)
        wt = tl.load(ws_ptr + cw[None, :] * D + dd[:, None], mask=dd[:, None] < D, other=0.0)
        x = tl.dot(st, wt, x, input_precision=PRECISION)
    x += tl.load(desc_ptr + row[:, None] * W + cw[None, :], mask=vm, other=0.0).to(tl.float32)
    x = (x + tl.load(bs_ptr + cw).to(tl.float32)[None, :]).to(dt)
    tl.store(sv + cw[None, :], x, mask=vm)
    # attention over the sample's boundary tokens
    n1 = _layer_norm(x.to(tl.float32), g1_ptr, be1_ptr, cw, W, EPS1)
    n1 = n1.to(dt)
    tl.store(sv + W + cw[None, :], n1, mask=vm)
    q = _linear(n1, wqkv_ptr, bqkv_ptr, 0, W, W, PRECISION).to(dt)
    k = _linear(n1, wqkv_ptr, bqkv_ptr, W, W, W, PRECISION).to(dt)
    v = _linear(n1, wqkv_ptr, bqkv_ptr, 2 * W, W, W, PRECISION).to(dt)
    tl.store(sv + 2 * W + cw[None, :], q, mask=vm)
    tl.store(sv + 3 * W + cw[None, :], k, mask=vm)
    tl.store(sv + 4 * W + cw[None, :], v, mask=vm)
    p = _probabilities(q, k, r, M, MP, SCALE, PRECISION)
    a = tl.dot(p.to(dt), v, input_precision=PRECISION).to(dt)
    tl.store(sv + 5 * W + cw[None, :], a, mask=vm)
    x1 = (x.to(tl.float32) + _linear(a, wo_ptr, bo_ptr, 0, W, W, PRECISION)).to(dt)
    tl.store(sv + 6 * W + cw[None, :], x1, mask=vm)
    # MLP
    n2 = _layer_norm(x1.to(tl.float32), g2_ptr, be2_ptr, cw, W, EPS2)
    n2 = n2.to(dt)
    tl.store(sv + 7 * W + cw[None, :], n2, mask=vm)
    hpre = _linear(n2, w1_ptr, b1_ptr, 0, W, HID, PRECISION).to(dt)
    tl.store(sv + 9 * W + ch[None, :], hpre, mask=vm)
    hf = hpre.to(tl.float32)
    h = (0.5 * hf * (1.0 + tl.math.erf(hf * 0.7071067811865476))).to(dt)
    tl.store(sv + 9 * W + HID + ch[None, :], h, mask=vm)
    x2 = (x1.to(tl.float32) + _linear(h, w2_ptr, b2_ptr, 0, HID, W, PRECISION)).to(dt)
    tl.store(sv + 8 * W + cw[None, :], x2, mask=vm)
    # y = x2 W_out + b_out, by column blocks
    for d0 in range(0, D, BD):
        dd = d0 + cd
        wt = tl.load(wout_ptr + dd[None, :] * W + cw[:, None], mask=dd[None, :] < D, other=0.0)
        yt = tl.dot(x2, wt, input_precision=PRECISION)
        yt += tl.load(bout_ptr + dd, mask=dd < D, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + row[:, None] * D + dd[None, :], yt.to(dt), mask=vm & (dd[None, :] < D))


@triton.jit
def _boundary_backward_kernel(dy_ptr, saved_ptr, ws_ptr, g1_ptr, wqkv_ptr, wo_ptr, g2_ptr, w1_ptr, w2_ptr, wout_ptr,
                              dstate_ptr, grads_ptr, sums_ptr, B, M, D, EPS1: tl.constexpr, EPS2: tl.constexpr,
                              SCALE: tl.constexpr,
                              W: tl.constexpr, HID: tl.constexpr, MP: tl.constexpr, G: tl.constexpr, BD: tl.constexpr,
                              PRECISION: tl.constexpr):
    S: tl.constexpr = 9 * W + 2 * HID
    GW: tl.constexpr = 6 * W + HID  # gradient columns: dx, dq dk dv, dx1, dhpre, dx2
    r, row, valid = _rows(B, M, MP, G)
    vm = valid[:, None]
    cw = tl.arange(0, W)
    ch = tl.arange(0, HID)
    cd = tl.arange(0, BD)
    dt = dy_ptr.dtype.element_ty
    sv = saved_ptr + row[:, None] * S
    gv = grads_ptr + row[:, None] * GW
    # this program's row of partial sums, laid out as `sums_layout`
    ps = sums_ptr + tl.program_id(0).to(tl.int64) * (10 * W + HID + D)
    # y = x2 W_out + b_out
    dx2 = tl.zeros((G * MP, W), tl.float32)
    for d0 in range(0, D, BD):
        dd = d0 + cd
        dyt = tl.load(dy_ptr + row[:, None] * D + dd[None, :], mask=vm & (dd[None, :] < D), other=0.0)
        wt = tl.load(wout_ptr + dd[:, None] * W + cw[None, :], mask=dd[:, None] < D, other=0.0)
        dx2 = tl.dot(dyt, wt, dx2, input_precision=PRECISION)
        tl.store(ps + 10 * W + HID + dd, tl.sum(dyt.to(tl.float32), 0), mask=dd < D)
    tl.store(gv + 5 * W + HID + cw[None, :], dx2.to(dt), mask=vm)
    tl.store(ps + 9 * W + HID + cw, tl.sum(dx2, 0))
    # x2 = x1 + GELU(n2 W_1 + b_1) W_2 + b_2
    hf = tl.load(sv + 9 * W + ch[None, :], mask=vm, other=0.0).to(tl.float32)
    gelu_grad = 0.5 * (1.0 + tl.math.erf(hf * 0.7071067811865476)) + hf * 0.3989422804014327 * tl.exp(-0.5 * hf * hf)
    dhpre = _linear_input_grad(dx2, w2_ptr, 0, HID, W, PRECISION) * gelu_grad
    tl.store(gv + 5 * W + ch[None, :], dhpre.to(dt), mask=vm)
    tl.store(ps + 9 * W + ch, tl.sum(dhpre, 0))
    dn2 = _linear_input_grad(dhpre, w1_ptr, 0, W, HID, PRECISION)
    x1 = tl.load(sv + 6 * W + cw[None, :], mask=vm, other=0.0).to(tl.float32)
    dx1, dg2, db2 = _layer_norm_backward(dn2, x1, g2_ptr, cw, W, EPS2)
    dx1 += dx2
    tl.store(ps + 7 * W + cw, dg2)
    tl.store(ps + 8 * W + cw, db2)
    tl.store(gv + 4 * W + cw[None, :], dx1.to(dt), mask=vm)
    tl.store(ps + 6 * W + cw, tl.sum(dx1, 0))
    # x1 = x + softmax(q k^T / sqrt(w)) v W_o + b_o
    da = _linear_input_grad(dx1, wo_ptr, 0, W, W, PRECISION).to(dt)
    q = tl.load(sv + 2 * W + cw[None, :], mask=vm, other=0.0)
    k = tl.load(sv + 3 * W + cw[None, :], mask=vm, other=0.0)
    v = tl.load(sv + 4 * W + cw[None, :], mask=vm, other=0.0)
    p = _probabilities(q, k, r, M, MP, SCALE, PRECISION)
    dv = tl.dot(tl.trans(p.to(dt)), da, input_precision=PRECISION)
    dp = tl.dot(da, tl.trans(v), input_precision=PRECISION)
    ds = (p * (dp - tl.sum(dp * p, 1)[:, None]) * SCALE).to(dt)
    dq = tl.dot(ds, k, input_precision=PRECISION)
    dk = tl.dot(tl.trans(ds), q, input_precision=PRECISION)
    tl.store(gv + W + cw[None, :], dq.to(dt), mask=vm)
    tl.store(gv + 2 * W + cw[None, :], dk.to(dt), mask=vm)
    tl.store(gv + 3 * W + cw[None, :], dv.to(dt), mask=vm)
    tl.store(ps + 3 * W + cw, tl.sum(dq, 0))
    tl.store(ps + 4 * W + cw, tl.sum(dk, 0))
    tl.store(ps + 5 * W + cw, tl.sum(dv, 0))
    dn1 = (_linear_input_grad(dq, wqkv_ptr, 0, W, W, PRECISION)
           + _linear_input_grad(dk, wqkv_ptr, W, W, W, PRECISION)
           + _linear_input_grad(dv, wqkv_ptr, 2 * W, W, W, PRECISION))
    x = tl.load(sv + cw[None, :], mask=vm, other=0.0).to(tl.float32)
    dx, dg1, db1 = _layer_norm_backward(dn1, x, g1_ptr, cw, W, EPS1)
    dx += dx1
    tl.store(ps + W + cw, dg1)
    tl.store(ps + 2 * W + cw, db1)
    tl.store(gv + cw[None, :], dx.to(dt), mask=vm)
    tl.store(ps + cw, tl.sum(dx, 0))
    # x = d + S W_s + b_s: the state's gradient, by column blocks
    dxt = dx.to(dt)
    for d0 in range(0, D, BD):
        dd = d0 + cd
        wt = tl.load(ws_ptr + cw[:, None] * D + dd[None, :], mask=dd[None, :] < D, other=0.0)
        tl.store(dstate_ptr + row[:, None] * D + dd[None, :], tl.dot(dxt, wt, input_precision=PRECISION).to(dt),
                 mask=vm & (dd[None, :] < D))


@triton.jit
def _boundary_wgrad_kernel(grads_ptr, dy_ptr, saved_ptr, state_ptr, out_ptr, N, D,
                           W: tl.constexpr, HID: tl.constexpr, ROWS_PER: tl.constexpr, BR: tl.constexpr,
                           BT: tl.constexpr, PRECISION: tl.constexpr):
    # program (product p, tile t of its output, rows split s): out[s] tile = sum over the split's
    # rows of A^T X, the weight gradient (torch.nn.Linear layout) of product p
    S: tl.constexpr = 9 * W + 2 * HID
    GW: tl.constexpr = 6 * W + HID
    p = tl.program_id(0)
    if p == 0:  # state: dx^T S
        a_ptr, lda, na, x_ptr, ldx, nx, offset = grads_ptr, GW, W, state_ptr, D, D, 0
    elif p == 1:  # qkv: dqkv^T n1
        a_ptr, lda, na, x_ptr, ldx, nx, offset = grads_ptr + W, GW, 3 * W, saved_ptr + W, S, W, W * D
    elif p == 2:  # attn_out: dx1^T a
        a_ptr, lda, na, x_ptr, ldx, nx, offset = grads_ptr + 4 * W, GW, W, saved_ptr + 5 * W, S, W, W * D + 3 * W * W
    elif p == 3:  # MLP in: dhpre^T n2
        a_ptr, lda, na, x_ptr, ldx, nx, offset = (grads_ptr + 5 * W, GW, HID, saved_ptr + 7 * W, S, W,
                                                  W * D + 4 * W * W)
    elif p == 4:  # MLP out: dx2^T h
        a_ptr, lda, na, x_ptr, ldx, nx, offset = (grads_ptr + 5 * W + HID, GW, W, saved_ptr + 9 * W + HID, S, HID,
                                                  W * D + 4 * W * W + HID * W)
    else:  # out: dy^T x2
        a_ptr, lda, na, x_ptr, ldx, nx, offset = (dy_ptr, D, D, saved_ptr + 8 * W, S, W,
                                                  W * D + 4 * W * W + 2 * HID * W)
    tiles_x = tl.cdiv(nx, BT)
    ia = (tl.program_id(1) // tiles_x) * BT + tl.arange(0, BT)
    ix = (tl.program_id(1) % tiles_x) * BT + tl.arange(0, BT)
    if (tl.program_id(1) // tiles_x) * BT < na:
        first = tl.program_id(2) * ROWS_PER
        acc = tl.zeros((BT, BT), tl.float32)
        for r0 in range(first, first + ROWS_PER, BR):
            r = (r0 + tl.arange(0, BR)).to(tl.int64)
            a = tl.load(a_ptr + r[:, None] * lda + ia[None, :], mask=(r[:, None] < N) & (ia[None, :] < na), other=0.0)
            x = tl.load(x_ptr + r[:, None] * ldx + ix[None, :], mask=(r[:, None] < N) & (ix[None, :] < nx), other=0.0)
            acc = tl.dot(tl.trans(a), x, acc, input_precision=PRECISION)
        total = 2 * W * D + 4 * W * W + 2 * HID * W
        tl.store(out_ptr + tl.program_id(2).to(tl.int64) * total + offset + ia[:, None] * nx + ix[None, :], acc,
                 mask=(ia[:, None] < na) & (ix[None, :] < nx))


def _geometry(state: Tensor, width: int, hidden: int) -> tuple[int, int, int, tuple[int]]:
    """``(MP, G, BD, grid)``: padded tokens, samples per program, column block of D, grid.
    More than `max_tokens` tokens on a GPU is an error (such programs compiled wrong in bf16);
    Triton's interpreter on the CPU takes any count."""
    b, m, d = (int(n) for n in state.shape)
    if state.is_cuda and m > max_tokens(width, hidden):
        raise ValueError(f"boundary_transfer: {m} boundary tokens per sample; at inner width {width} and MLP "
                         f"width {hidden} the fused kernels take at most {max_tokens(width, hidden)} on a GPU "
                         f"(BoundaryTransfer.forward runs the PyTorch path beyond)")
    mp = triton.next_power_of_2(m)
    g = max(1, ROWS // mp)
    bd = max(16, min(64, triton.next_power_of_2(d)))
    return mp, g, bd, (triton.cdiv(b, g),)


def _operands(dtype: torch.dtype, *weights: Tensor) -> list[Tensor]:
    """The weights in the operand type ``dtype``, contiguous (what the kernels read)."""
    return [w.to(dtype).contiguous() for w in weights]


@torch.library.triton_op("gno_ext::boundary_transfer", mutates_args={})
def boundary_transfer(desc: Tensor, state: Tensor, ws: Tensor, bs: Tensor, g1: Tensor, be1: Tensor,
                      wqkv: Tensor, bqkv: Tensor, wo: Tensor, bo: Tensor, g2: Tensor, be2: Tensor,
                      w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, wout: Tensor, bout: Tensor,
                      eps1: float, eps2: float) -> tuple[Tensor, Tensor]:
    """The boundary transfer operator's forward pass: ``(y (B, M, D), saved (B, M, 9 w + 2 h))``,
    ``saved`` holding the activations that the backward pass reads (columns: x, n1, q, k, v, a,
    x1, n2, x2 (w each), hpre, h (h each)).

    ``desc`` (B, M, w) is the boundary description, ``state`` (B, M, D) the near-boundary
    latent state, both in the operand type. The weights ``ws wqkv wo w1 w2 wout``
    (``torch.nn.Linear`` layout) are cast to it here, so that their gradients come back in
    their own type, unrounded; biases and norm parameters in any float type.
    """
    ws, wqkv, wo, w1, w2, wout = _operands(state.dtype, ws, wqkv, wo, w1, w2, wout)
    b, m, d = state.shape
    width, hidden = wqkv.shape[1], w1.shape[0]
    mp, g, bd, grid = _geometry(state, width, hidden)
    y = state.new_empty(b, m, d)
    saved = state.new_empty(b, m, 9 * width + 2 * hidden)
    launch(_boundary_forward_kernel)[grid](
        desc, state, ws, bs, g1, be1, wqkv, bqkv, wo, bo, g2, be2, w1, b1, w2, b2, wout, bout, y, saved,
        b, m, d, EPS1=eps1, EPS2=eps2, SCALE=width ** -0.5, W=width, HID=hidden, MP=mp, G=g, BD=bd,
        PRECISION=dot_precision(), num_warps=_warps(g * mp), num_stages=1)
    return y, saved


@torch.library.triton_op("gno_ext::boundary_transfer_backward", mutates_args={})
def boundary_transfer_backward(dy: Tensor, saved: Tensor, ws: Tensor, g1: Tensor, wqkv: Tensor, wo: Tensor,
                               g2: Tensor, w1: Tensor, w2: Tensor, wout: Tensor, eps1: float,
                               eps2: float) -> tuple[Tensor, Tensor, Tensor]:
    """Input gradients of `boundary_transfer`: ``(dstate (B, M, D), grads (B, M, 6 w + h),
    sums (programs, 10 w + h + D))``, with ``grads`` the gradients at the products' outputs
    (columns: dx, dq, dk, dv, dx1 (w each), dhpre (h), dx2 (w)) and ``sums`` each program's
    float32 row sums (`sums_layout`). The weights are cast to ``dy``'s type here."""
    ws, wqkv, wo, w1, w2, wout = _operands(dy.dtype, ws, wqkv, wo, w1, w2, wout)
    b, m, d = dy.shape
    width, hidden = wqkv.shape[1], w1.shape[0]
    mp, g, bd, grid = _geometry(dy, width, hidden)
    dstate = dy.new_empty(b, m, d)
    grads = dy.new_empty(b, m, 6 * width + hidden)
    sums = dy.new_empty(grid[0], 10 * width + hidden + d, dtype=torch.float32)
    launch(_boundary_backward_kernel)[grid](
        dy, saved, ws, g1, wqkv, wo, g2, w1, w2, wout, dstate, grads, sums, b, m, d, EPS1=eps1, EPS2=eps2,
        SCALE=width ** -0.5, W=width, HID=hidden, MP=mp, G=g, BD=bd, PRECISION=dot_precision(),
        num_warps=_warps(g * mp), num_stages=1)
    return dstate, grads, sums


WGRAD_TILE, WGRAD_ROWS = 64, 64  # output tile side; rows per loop step
WGRAD_SPLIT_ROWS = 512  # rows summed by one program (its partial sum is added up afterwards)


def wgrad_shapes(width: int, hidden: int, dim: int) -> list[tuple[int, int]]:
    """Shapes of the six weight gradients, in the order `boundary_transfer_wgrad` lays them out
    (state, qkv, attn_out, MLP in, MLP out, out; ``torch.nn.Linear`` layout (out, in))."""
    return [(width, dim), (3 * width, width), (width, width), (hidden, width), (width, hidden), (dim, width)]


@torch.library.triton_op("gno_ext::boundary_transfer_wgrad", mutates_args={})
def boundary_transfer_wgrad(grads: Tensor, dy: Tensor, saved: Tensor, state: Tensor) -> Tensor:
    """The six weight gradients of `boundary_transfer`, flat, in float32 (``torch.nn.Linear``
    layouts, in the order state, qkv, attn_out, MLP in, MLP out, out): each ``dY^T X`` summed
    over all ``B M`` rows, in splits of `WGRAD_SPLIT_ROWS` rows whose partial sums are then
    added (no atomics)."""
    b, m, d = state.shape
    width = (2 * grads.shape[2] - saved.shape[2]) // 3  # GW = 6w + h, S = 9w + 2h
    hidden = grads.shape[2] - 6 * width
    n = b * m
    shapes = wgrad_shapes(width, hidden, d)
    splits = triton.cdiv(n, WGRAD_SPLIT_ROWS)
    tiles = max(triton.cdiv(a, WGRAD_TILE) * triton.cdiv(x, WGRAD_TILE) for a, x in shapes)
    partial = grads.new_empty(splits, sum(a * x for a, x in shapes), dtype=torch.float32)
    launch(_boundary_wgrad_kernel)[(6, tiles, splits)](
        grads, dy, saved, state, partial, n, d, W=width, HID=hidden, ROWS_PER=WGRAD_SPLIT_ROWS, BR=WGRAD_ROWS,
        BT=WGRAD_TILE, PRECISION=dot_precision(), num_warps=4, num_stages=3)
    return partial.sum(0)


def _setup_context(ctx, inputs, output) -> None:
    desc, state, ws, bs, g1, be1, wqkv, bqkv, wo, bo, g2, be2, w1, b1, w2, b2, wout, bout, eps1, eps2 = inputs
    ctx.save_for_backward(state, output[1], ws, g1, wqkv, wo, g2, w1, w2, wout)
    ctx.eps = (eps1, eps2)
    ctx.small_types = [t.dtype for t in (bs, g1, be1, bqkv, bo, g2, be2, b1, b2, bout)]


def _backward(ctx, dy: Tensor, _saved_grad: Tensor | None):
    state, saved, ws, g1, wqkv, wo, g2, w1, w2, wout = ctx.saved_tensors
    width, hidden = wqkv.shape[1], w1.shape[0]
    b, m, d = state.shape
    dy = dy.contiguous()
    dstate, grads, sums = boundary_transfer_backward(dy, saved, ws, g1, wqkv, wo, g2, w1, w2, wout, *ctx.eps)
    sums = sums.sum(0)
    small = [sums[i:j].to(t) for (i, j), t in zip(sums_layout(width, hidden, d).values(), ctx.small_types)]
    flat = boundary_transfer_wgrad(grads, dy, saved, state)
    shapes = wgrad_shapes(width, hidden, d)
    # float32 sums, returned in the weights' own type (no rounding for float32 parameters)
    dws, dwqkv, dwo, dw1, dw2, dwout = (g.view(shape).to(w.dtype) for g, shape, w in
                                        zip(flat.split([a * x for a, x in shapes]), shapes,
                                            (ws, wqkv, wo, w1, w2, wout)))
    dbs, dg1, dbe1, dbqkv, dbo, dg2, dbe2, db1, db2, dbout = small
    ddesc = grads[..., :width]
    return (ddesc, dstate, dws, dbs, dg1, dbe1, dwqkv, dbqkv, dwo, dbo, dg2, dbe2, dw1, db1, dw2, db2, dwout, dbout,
            None, None)


boundary_transfer.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.gno_ext.boundary_transfer)
def _forward_flops(desc_shape, state_shape, ws_shape, bs_shape, g1_shape, be1_shape, wqkv_shape, bqkv_shape,
                   wo_shape, bo_shape, g2_shape, be2_shape, w1_shape, *args, out_shape=None, **kwargs) -> int:
    b, m, d = state_shape
    w, h = wqkv_shape[1], w1_shape[0]
    # S W_s, qkv, q k^T, p v, W_o, W_1, W_2, W_out
    return 2 * b * m * (d * w + 3 * w * w + 2 * m * w + w * w + 2 * w * h + w * d)


@register_flop_formula(torch.ops.gno_ext.boundary_transfer_backward)
def _backward_flops(dy_shape, saved_shape, ws_shape, g1_shape, wqkv_shape, wo_shape, g2_shape, w1_shape,
                    *args, out_shape=None, **kwargs) -> int:
    b, m, d = dy_shape
    w, h = wqkv_shape[1], w1_shape[0]
    # input gradients of W_out, W_2, W_1, W_o, qkv and W_s; attention: dv, dp, dq, dk
    return 2 * b * m * (d * w + 2 * w * h + w * w + 3 * w * w + d * w + 4 * m * w)


@register_flop_formula(torch.ops.gno_ext.boundary_transfer_wgrad)
def _wgrad_flops(grads_shape, dy_shape, saved_shape, state_shape, *args, out_shape=None, **kwargs) -> int:
    b, m, d = state_shape
    w = (2 * grads_shape[2] - saved_shape[2]) // 3
    h = grads_shape[2] - 6 * w
    return 2 * b * m * sum(a * x for a, x in wgrad_shapes(w, h, d))
