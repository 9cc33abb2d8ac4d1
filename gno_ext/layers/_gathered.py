r"""Per-sample weight selection inside the matrix product (Triton kernels, CUDA).

``gathered_linear(x, index, weight, bias)`` computes, for every sample ``b``,

$$
y_b = x_b\, W_{k_b} + c_{k_b}, \qquad x_b \in \mathbb{R}^{T \times D_{in}},\;
W \in \mathbb{R}^{K \times D_{in} \times D_{out}},\; k_b = \text{index}[b],
$$

in one kernel launch that reads each tile's weights from ``W[k_b]`` in place (no copies of the
selected weights). The batch is listed by kernel (`run_plan`, on the device), and each
program computes a tile of ``BM`` rows of one kernel's samples, a tile spanning several
samples: only each kernel's last tile is partly empty, however many rows ``T`` a sample has
(tiles of one sample each would pad 97 rows to 128). The rows are read and written in place,
so the batch keeps its order. The backward pass is two more launches:

* the input gradient, ``dx_b = dy_b W_{k_b}^T``, is the same kernel on the transposed weights;
* the weight gradient, ``dW_k = \sum_{b : k_b = k} x_b^T dy_b`` (and the bias gradient, the
  column sums of ``dy_b``), is a grouped reduction: each program accumulates the products of
  a *run* of at most 8 samples of one kernel in registers (4 in small batches,
  `run_length`) and adds its tile to ``dW_k`` with one atomic addition (float32). Where that
  gives too few programs to fill the GPU (many rows per sample, a small batch), each program
  takes a part of the run's rows instead (`gno_ext.kernels.gathered.wgrad_splits`).

The atomic additions make the weight gradient's rounding depend on the order in which the
programs finish; under `torch.use_deterministic_algorithms` the callers use their
deterministic path instead (`usable`).

The operators (`gno_ext.kernels.gathered`) are `torch.library.triton_op`s, so
``torch.compile`` traces into the kernels (and CUDA graphs capture them), and
`torch.utils.flop_counter` counts their products. They are loaded only where a CUDA device
and Triton are present; elsewhere `usable` is false and the callers take their pure PyTorch
path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gno_ext.kernels import load
from gno_ext.kernels.precision import KERNEL_TYPES, operand_type
from gno_ext.layers.routing import kernel_ranks, segment_of

__all__ = ["MIN_RUNS", "RUN", "SHORT_RUN", "gathered_linear", "run_length", "run_plan", "usable"]

# samples per run of the weight-gradient kernel (see `run_length`): RUN where that still gives
# MIN_RUNS runs, SHORT_RUN otherwise
RUN = 8
SHORT_RUN = 4
MIN_RUNS = 32

# the Triton operators (`gno_ext.kernels.gathered`) where a GPU and Triton are present, else None
# (the PyTorch path runs): loaded on import, since they must exist before torch.compile traces
# a model
_kernels = load("gathered") if torch.cuda.is_available() else None


def usable(x: Tensor) -> bool:
    """Whether `gathered_linear` can run on ``x``: a CUDA tensor whose products run in half,
    bfloat16 or float32 (float64 stays exact on the callers' PyTorch path; under autocast the
    autocast type counts), the Triton operators loaded, and deterministic algorithms not
    requested (the weight gradient is summed atomically)."""
    return (x.is_cuda and _kernels is not None and not torch.are_deterministic_algorithms_enabled()
            and operand_type(x.dtype, "cuda") in KERNEL_TYPES)


def run_length(batch: int, n_kernels: int) -> int:
    """Samples per run of the weight-gradient kernel for a batch of ``batch`` samples and
    ``n_kernels`` kernels: `RUN` (8) where the batch still gives at least `MIN_RUNS` (32) runs
    (``batch // RUN + n_kernels`` of them, the bound of `run_plan`), else `SHORT_RUN` (4).

    Longer runs add fewer tiles atomically; shorter runs give more programs where a small batch
    would leave the GPU idle. Measured on an H100 (docs/benchmarks.md, twenty-first round), the
    weight gradients of a GNO block's three products: at the paper's $128^2$ grid at batch 256
    (36 runs of 8) 82.8 us with runs of 8 and 84.0 with runs of 4; at the `trl` recipe's grid
    at batch 32 (8 runs of 8) 63.1 us with runs of 8 and 48.4 with runs of 4, where the whole
    training step took 2.4 % less time.
    """
    return RUN if batch // RUN + n_kernels >= MIN_RUNS else SHORT_RUN


def run_plan(index: Tensor, n_kernels: int, run: int | None = None) -> Tensor:
    """The batch listed by kernel and cut into runs of at most ``run`` samples of one kernel
    (default: `run_length`): what the weight-gradient kernel reads.

    Returns one int32 tensor, the concatenation of ``counts`` (K,), the number of samples of
    each kernel, ``order`` (B,), the sample indices sorted by kernel (stable), and, for each of
    the ``R = B // run + K`` runs (a static bound; the unused ones have length 0), its kernel,
    its first position in ``order`` and its length (R each). Computed on the device with static
    shapes (no host synchronisation). ``counts`` comes first so that its start is aligned as
    the tensor's is: the forward kernel reads it as one vector.
    """
    b = index.shape[0]
    run = run or run_length(b, n_kernels)
    counts, rank = kernel_ranks(index, n_kernels)
    starts = counts.cumsum(0) - counts
    order = torch.empty_like(index).index_copy_(0, starts[index] + rank, torch.arange(b, device=index.device))
    runs = (counts + run - 1) // run
    run_end = runs.cumsum(0)
    r = torch.arange(b // run + n_kernels, device=index.device)
    kernel = segment_of(r, run_end)
    within = r - (run_end - runs)[kernel]
    length = (counts[kernel] - within * run).clamp(0, run)
    return torch.cat([counts, order, kernel, starts[kernel] + within * run, length]).int()


def gathered_linear(x: Tensor, index: Tensor, weight: Tensor, bias: Tensor | None = None,
                    plan: Tensor | None = None) -> Tensor:
    """``x[b] @ weight[index[b]] + bias[index[b]]`` for every sample ``b``, differentiable.

    Parameters
    ----------
    x : Tensor, shape (B, T, in)
        CUDA tensor (see `usable`).
    index : Tensor, shape (B,), long
        Selected weight per sample, in ``[0, K)``.
    weight : Tensor, shape (K, in, out)
    bias : Tensor, shape (K, out), optional
    plan : Tensor, optional
        ``run_plan(index, K)`` (with its default runs, `run_length`); pass it to share one
        plan between several products with the same ``index``. Computed here if not given.

    The product runs in ``x``'s type (under autocast, the autocast type), with float32
    accumulation. The weight and bias are cast to that type inside the operator, once per call,
    and their gradients come back in their own type (float32 for float32 parameters), summed in
    float32 and never rounded to the product's type.
    """
    if _kernels is None:
        raise RuntimeError("gathered_linear: the Triton operators are not loaded (they need Triton and a CUDA "
                           "device, or Triton's interpreter); check `usable(x)` first")
    x = x.to(operand_type(x.dtype, x.device.type))
    run = run_length(x.shape[0], weight.shape[0])
    if plan is None:
        plan = run_plan(index, weight.shape[0], run)
    with torch.autocast(x.device.type, enabled=False):
        return _kernels.gathered_mm(x.contiguous(), index, weight, bias, plan, run)
