r"""Self-attention as a kernel integral over the domain and context tokens.

$$
\int_{\Omega \cup X_{ctx}} \kappa(x, y)\, \xi(y)\, d\mu(y)
\;\approx\; \operatorname{softmax}\!\Big(\frac{q(x) \cdot k(y)}{\sqrt{d_h}}\Big) v(y),
$$

with queries on the spatial tokens only and keys/values on the spatial tokens plus the
context tokens (the embedded parameters and the latent boundary tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from gno_ext.checks import is_integer_dtype, require_at_least
from gno_ext.kernels import load
from gno_ext.kernels.precision import KERNEL_TYPES, operand_type, tf32_allowed
from gno_ext.layers import _gathered
from gno_ext.layers.routing import kernel_ranks, one_hot, segment_of

__all__ = ["AttentionKernel", "AttentionKernelBank", "SDPA_BACKENDS", "attend", "attend_tokens", "chunk_plan",
           "default_chunk", "mixed_attention", "mixture_strategy", "tokens_fusable"]

# the Triton operators (`gno_ext.kernels.attention`) where a GPU and Triton are present, else None
# (the PyTorch path runs): loaded on import, since they must exist before torch.compile traces
# a model
_kernels = load("attention") if torch.cuda.is_available() else None

# cuDNN attention builds an execution plan per input shape; the per-kernel sub-batches of a
# gated mixture change shape every step, so its plan building (tens of ms per call) would
# dominate. The memory-efficient and flash kernels have no such cost. The memory-efficient one
# comes first: at the GNO's short sequences (64 tokens, 97 with the context) and head size 32
# it made a paper-size training step 6 % faster than flash on an H100 (docs/benchmarks.md).
SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """`scaled_dot_product_attention` on the first of `SDPA_BACKENDS` (in that order) that
    takes the inputs."""
    with sdpa_kernel(SDPA_BACKENDS, set_priority=True):
        return F.scaled_dot_product_attention(q, k, v)


def tokens_fusable(q: Tensor, kv: Tensor) -> bool:
    """Whether `attend_tokens` runs its Triton kernels on these inputs: CUDA tensors of one
    floating type (half, bfloat16 or float32), the kernels loaded (Triton installed), and a
    head width they take (`gno_ext.kernels.attention.supported`: up to 128; any number
    of keys).

    Float32 inputs take the kernels only where TF32 products are allowed
    (`gno_ext.kernels.precision.tf32_allowed`: ``torch.backends.cuda.matmul.fp32_precision =
    "tf32"``, ``allow_tf32`` or `torch.set_float32_matmul_precision` ``("high")``): with exact
    float32 products Triton's ``tl.dot`` runs without tensor cores, and at the paper size their
    forward and backward passes took 16 times as long as `scaled_dot_product_attention`'s on
    an H100 (with TF32, a quarter as long; benchmarks/history.md). They also
    need twice the shared memory: float32 inputs take them at head widths up to 64 on GPUs
    that allow 227 KiB per program (H100, H200), not on an A100 or an Ada GPU
    (`gno_ext.kernels.attention.float32_fits`)."""
    return (_kernels is not None and q.is_cuda and kv.is_cuda and q.dtype == kv.dtype and q.dtype in KERNEL_TYPES
            and _kernels.supported(kv.shape[1], q.shape[-1])
            and (q.dtype != torch.float32 or tf32_allowed() and _kernels.float32_fits(q.shape[-1], q.device.index)))


def attend_tokens(q: Tensor, kv: Tensor, fused: bool = True) -> Tensor:
    """Multi-head attention in the token-major layout in which the projections write.

    ``softmax(q k^T / sqrt(d)) v`` for every sample and head, with the keys ``kv[:, :, 0]`` and
    values ``kv[:, :, 1]``. Where `tokens_fusable` holds and ``fused`` is true, it runs as
    two Triton kernels (`gno_ext.kernels.attention`; forward, and backward without
    atomics) that read and write these layouts directly, so no permuted copies are made in
    either pass; otherwise as `attend` (`scaled_dot_product_attention`) on permuted views.
    Under autocast the inputs are cast to the autocast type, as for
    `scaled_dot_product_attention`.

    Parameters
    ----------
    q : Tensor, shape (B, N, H, d)
        Queries.
    kv : Tensor, shape (B, M, 2, H, d)
        Keys and values, as one projection ``(B, M, 2 H d)`` viewed.
    fused : bool
        Use the Triton kernels where they can run (default True).

    Returns
    -------
    Tensor, shape (B, N, H, d)
    """
    if q.dim() != 4 or kv.dim() != 5 or kv.shape[2] != 2 or kv.shape[0] != q.shape[0] or kv.shape[3:] != q.shape[2:]:
        raise ValueError(f"attend_tokens: expected q (B, N, H, d) and kv (B, M, 2, H, d), got {tuple(q.shape)} and "
                         f"{tuple(kv.shape)}")
    if fused and q.is_cuda and _kernels is not None:
        device = q.device.type
        # what autocast does for scaled_dot_product_attention
        q, kv = q.to(operand_type(q.dtype, device)), kv.to(operand_type(kv.dtype, device))
        if tokens_fusable(q, kv):
            with torch.autocast(device, enabled=False):
                return _kernels.token_attention(q.contiguous(), kv.contiguous())[0]
    k, v = kv.unbind(2)
    return attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


class AttentionKernel(nn.Module):
    """Multi-head attention with queries from ``x`` and keys/values from ``x`` and a context.

    Parameters
    ----------
    dim : int
        Token width ``D``.
    heads : int
        Number of heads (``dim`` must be divisible by it).
    bias : bool
        Bias in the projections.

    Attributes
    ----------
    fused_attention : bool
        Attend through `attend_tokens`' Triton kernels where they can run (default True; set
        False for `scaled_dot_product_attention`).
    """

    fused_attention: bool = True

    def __init__(self, dim: int, heads: int = 8, bias: bool = True) -> None:
        super().__init__()
        require_at_least(1, dim=dim, heads=heads)
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}")
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=bias)
        self.out = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Attend.

        Parameters
        ----------
        x : Tensor, shape (B, N, D)
            Spatial tokens (queries, keys, values).
        context : Tensor, shape (B, M, D), optional
            Context tokens (keys and values only).

        Returns
        -------
        Tensor, shape (B, N, D)
        """
        check_tokens(x, context, self.q.in_features, x.shape[0])
        b, n, d = x.shape
        source = x if context is None else torch.cat([x, context], 1)
        q = self.q(x).view(b, n, self.heads, -1)
        kv = self.kv(source).view(b, source.shape[1], 2, self.heads, -1)
        return self.out(attend_tokens(q, kv, self.fused_attention).reshape(b, n, d))


PROJECTIONS = ("q", "kv", "out")


def check_tokens(x: Tensor, context: Tensor | None, dim: int, batch: int) -> None:
    """Raise a `ValueError` naming ``x`` or ``context`` where it is not ``(batch, N, dim)`` and
    ``(batch, M, dim)`` (shapes only)."""
    if x.ndim != 3 or x.shape[0] != batch or x.shape[2] != dim:
        raise ValueError(f"x: expected shape ({batch}, N, {dim}), got {tuple(x.shape)}")
    if context is not None and (context.ndim != 3 or context.shape[0] != batch or context.shape[2] != dim):
        raise ValueError(f"context: expected shape ({batch}, M, {dim}) like x, got {tuple(context.shape)}")


def check_index(index: Tensor, batch: int) -> None:
    """Raise a `ValueError` naming ``index`` where it is not an integer tensor of shape
    ``(batch,)`` (dtype and shape only: the ids' range is not read, which would make the host
    wait for the device; the gate's arg-max is always in range)."""
    if index.ndim != 1 or index.shape[0] != batch or not is_integer_dtype(index.dtype):
        raise ValueError(f"index: expected integer kernel ids of shape ({batch},), one per sample of x, got "
                         f"{index.dtype} of shape {tuple(index.shape)}")


def _select(stacks: dict[str, tuple[Tensor, Tensor | None]], select: Tensor) -> dict[str, tuple[Tensor, Tensor | None]]:
    """Weights ``(G, in, out)`` and biases ``(G, 1, out)`` of the kernel chosen for each of
    ``G`` groups, for every projection, from the stacked ``stacks[name] = (weight (K, in, out),
    bias (K, out))``.

    The selection is one product of the one-hot matrix ``select`` (G, K) with all the
    projections' weights and biases side by side (K, total): its backward pass is one matrix
    product too (no atomic scatter-add of G weight copies onto K kernels), and the pieces are
    views of its output.
    """
    parts = [t.flatten(1) for pair in stacks.values() for t in pair if t is not None]
    groups, k = select.shape
    # zero padding of G and K to multiples of 8: aligned GEMM kernels in both passes (the
    # unpadded products ran on misaligned kernels, about 3x slower than their memory traffic
    # alone would take on an H100)
    flat = F.pad(torch.cat(parts, 1), (0, 0, 0, -k % 8))
    chosen = F.pad(select, (0, -k % 8, 0, -groups % 8)) @ flat
    pieces = iter(chosen[:groups].split([t.shape[1] for t in parts], 1))
    return {name: (next(pieces).view(-1, *weight.shape[1:]), None if bias is None else next(pieces)[:, None])
            for name, (weight, bias) in stacks.items()}


def _apply(x: Tensor, chunk: int, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x`` (G * chunk, N, in) through group ``g``'s weight for its ``chunk`` samples.

    The bias is added after the product, not by ``baddbmm``: with a broadcast bias,
    ``baddbmm`` first copies the bias into the whole output (a full-size write per call),
    whereas a separate addition fuses with the next element-wise operation under
    ``torch.compile``.
    """
    g, (_, n, d) = weight.shape[0], x.shape
    y = torch.bmm(x.reshape(g, chunk * n, d), weight)
    return (y if bias is None else y + bias).view(g * chunk, n, -1)


def _gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """``x[index]`` along the first axis, with a zero row where ``index == len(x)``."""
    return torch.cat([x, x.new_zeros(1, *x.shape[1:])]).index_select(0, index)


class _MoveRows(torch.autograd.Function):
    """Rows moved by a one-to-one map, with a gather in both passes.

    ``forward(x, index, back)`` gives ``x[index]`` (zero rows where ``index == len(x)``);
    ``back`` is the inverse map (``back[index[r]] == r`` for every row ``r`` that reads
    ``x``, ``len(grad)`` for rows of ``x`` that no row reads). The gradient is then
    ``grad[back]``, a gather like the forward pass, instead of the scatter-add
    (``index_add``, atomic) that ``index_select``'s own backward pass runs.
    """

    @staticmethod
    def forward(x: Tensor, index: Tensor, back: Tensor) -> Tensor:
        return _gather_rows(x, index)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[2])

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (back,) = ctx.saved_tensors
        return _gather_rows(grad, back), None, None


def default_chunk(batch: int, n_kernels: int) -> int:
    """Samples per weight group in `mixed_attention`: a power of two, about ``batch / (16 K)``,
    so that padding the ``K`` kernels' groups to whole chunks adds at most about 6 % rows."""
    per = batch // (16 * n_kernels)
    return 1 << (per.bit_length() - 1) if per > 1 else 1


def chunk_plan(index: Tensor, n_kernels: int, chunk: int) -> tuple[Tensor, Tensor]:
    """Where each sample goes when the batch is sorted by kernel, each kernel's samples padded
    to whole chunks: ``(slot, chunk_kernel)``.

    ``slot`` (B,) is the sample's row among ``G * chunk`` rows, ``chunk_kernel`` (G,) the kernel
    of each chunk, with the static bound ``G = (B + K (chunk - 1)) // chunk`` (unused chunks
    at the end are padding). Computed on the device with static shapes: no host synchronisation.
    """
    b = index.shape[0]
    groups = (b + n_kernels * (chunk - 1)) // chunk
    counts, rank = kernel_ranks(index, n_kernels)
    padded = (counts + chunk - 1) // chunk * chunk  # rows of each kernel, whole chunks
    ends = padded.cumsum(0)
    slot = (ends - padded)[index] + rank
    chunk_kernel = segment_of(torch.arange(groups, device=index.device) * chunk, ends)
    return slot, chunk_kernel


def mixed_attention(kernels: Sequence[AttentionKernel], index: Tensor, x: Tensor,
                    context: Tensor | None = None, chunk: int | None = None) -> Tensor:
    """Each sample's selected `AttentionKernel`, for the whole batch in one pass.

    Sample ``i`` gets exactly ``kernels[index[i]](x[i], context[i])``, with one product per
    projection and one attention call for the whole batch, static shapes and no host
    synchronisation (so ``torch.compile`` can capture it in a CUDA graph). Unselected kernels
    receive zero gradient. The products run one of three ways:

    * on a CUDA device with Triton, by default (``chunk=None``): the gathered-weight kernels
      of `gno_ext.layers._gathered`, which read each sample's weights in place (no sorting,
      padding or weight copies). Their weight gradients are summed with atomic additions, so
      their rounding can differ between runs; under `torch.use_deterministic_algorithms`
      the chunked products below are used instead;
    * otherwise (or with an explicit ``chunk``): the batch is grouped by selected kernel into
      chunks of ``chunk`` samples (each kernel's samples padded with zero rows to whole
      chunks), and each chunk is one batched product with its kernel's weights, read once per
      chunk instead of once per sample;
    * with a single kernel, plain products.

    The kernels' weights are stacked on every call; an `AttentionKernelBank` stores them
    stacked.

    Parameters
    ----------
    kernels : sequence of AttentionKernel
        Kernels of identical shape.
    index : Tensor, shape (B,), long
        Selected kernel per sample, in ``[0, K)`` (the range is not checked: a check would wait
        for the device; the gate's arg-max is always in range).
    x : Tensor, shape (B, N, D)
    context : Tensor, shape (B, M, D), optional
    chunk : int, optional
        Samples per weight group of the chunked products (default: the gathered kernels where
        they can run, else `default_chunk`: 1, i.e. weights per sample, for batches under
        ``32 K``).
    """
    stacks = {}
    for name in PROJECTIONS:
        layers = [getattr(k, name) for k in kernels]
        stacks[name] = (torch.stack([lin.weight.transpose(0, 1) for lin in layers]),
                        None if layers[0].bias is None else torch.stack([lin.bias for lin in layers]))
    return _mixed(stacks, kernels[0].heads, index, x, context, chunk, kernels[0].fused_attention)


STRATEGIES = ("single", "gathered", "per-sample", "chunked")


def mixture_strategy(n_kernels: int, x: Tensor, chunk: int | None = None) -> tuple[str, int]:
    """How `mixed_attention` computes its products for ``n_kernels`` kernels and the input ``x``
    (B, N, D): ``(strategy, samples per weight group)``. The strategies, which all compute the
    same (tested against `gno_ext.layers.mixture.reference_mixture`):

    * ``"single"``: one kernel for every sample, plain products;
    * ``"gathered"``: each sample's weights read inside the products (`gno_ext.layers._gathered`:
      the Triton kernels, on a CUDA device), unless a ``chunk`` is asked for;
    * ``"per-sample"``: each sample's weights selected by a one-hot product (``chunk`` 1, the
      default for batches under ``32 K`` where the gathered kernels do not run);
    * ``"chunked"``: the samples sorted by kernel into groups of ``chunk``, one weight
      selection per group (`default_chunk`)."""
    if n_kernels == 1:
        return "single", 0
    if chunk is None and _gathered.usable(x):
        return "gathered", 0
    chunk = chunk or default_chunk(x.shape[0], n_kernels)
    return ("per-sample", 1) if chunk == 1 else ("chunked", chunk)


def _mixed(stacks: dict[str, tuple[Tensor, Tensor | None]], heads: int, index: Tensor, x: Tensor,
           context: Tensor | None, chunk: int | None, fused: bool = True) -> Tensor:
    """`mixed_attention` on stacked weights: ``stacks[name] = (weight (K, in, out), bias (K, out))``;
    ``fused``: the attention itself through `attend_tokens`' Triton kernels where they run."""
    check_index(index, x.shape[0])
    strategy, chunk = mixture_strategy(stacks["q"][0].shape[0], x, chunk)
    if strategy == "single":
        def project(t, weight, bias):
            return F.linear(t, weight[0].t(), None if bias is None else bias[0])
        return _attention_with(project, stacks, heads, x, context, fused)
    if strategy == "gathered":
        plan = _gathered.run_plan(index, stacks["q"][0].shape[0])

        def project(t, weight, bias):
            return _gathered.gathered_linear(t, index, weight, bias, plan)
        return _attention_with(project, stacks, heads, x, context, fused)
    return _grouped(stacks, heads, index, x, context, chunk, fused)


def _attention_with(project, stacks: dict[str, tuple[Tensor, Tensor | None]], heads: int, x: Tensor,
                    context: Tensor | None, fused: bool) -> Tensor:
    """The attention kernel with its three projections done by ``project(t, weight, bias)``."""
    b, n, d = x.shape
    source = x if context is None else torch.cat([x, context], 1)
    q = project(x, *stacks["q"]).view(b, n, heads, -1)
    kv = project(source, *stacks["kv"]).view(b, source.shape[1], 2, heads, -1)
    return project(attend_tokens(q, kv, fused).reshape(b, n, d), *stacks["out"])


def _grouped(stacks: dict[str, tuple[Tensor, Tensor | None]], heads: int, index: Tensor, x: Tensor,
             context: Tensor | None, chunk: int, fused: bool) -> Tensor:
    """The ``"per-sample"`` (``chunk`` 1) and ``"chunked"`` strategies: each group of ``chunk``
    samples of one kernel gets its weights by a one-hot product over the stacked weights."""
    b, n, d = x.shape
    n_kernels = stacks["q"][0].shape[0]
    source = x if context is None else torch.cat([x, context], 1)
    if chunk == 1:
        slot, select = None, one_hot(index, n_kernels, x.dtype)
    else:
        slot, chunk_kernel = chunk_plan(index, n_kernels, chunk)
        select = one_hot(chunk_kernel, n_kernels, x.dtype)
        # the sample of each of the G * chunk rows (b: a padding row)
        sample_of = slot.new_full((select.shape[0] * chunk,), b).index_copy(0, slot, torch.arange(b, device=slot.device))
        x = _MoveRows.apply(x, sample_of, slot)
        source = x if context is None else _MoveRows.apply(source, sample_of, slot)
    rows, chosen = x.shape[0], _select(stacks, select)
    q = _apply(x, chunk, *chosen["q"]).view(rows, n, heads, -1)
    kv = _apply(source, chunk, *chosen["kv"]).view(rows, source.shape[1], 2, heads, -1)
    y = _apply(attend_tokens(q, kv, fused).reshape(rows, n, d), chunk, *chosen["out"])
    return y if slot is None else _MoveRows.apply(y, slot, sample_of)


class AttentionKernelBank(nn.Module):
    """``K`` attention kernels of one shape with their weights stored stacked.

    Computes what a list of ``K`` `AttentionKernel` modules gives through `mixed_attention`
    (each sample through its selected kernel), but keeps each projection's weights as one
    ``(K, in, out)`` parameter (and biases as ``(K, out)``): no stacking copies in the forward
    pass, no splitting of gradients in the backward pass, and six parameter tensors instead of
    ``6 K`` for the optimizer. Initialised exactly as ``K`` `AttentionKernel` modules created
    in turn, and loads their state dict (``"{k}.q.weight"``, ...) as well as its own.

    Parameters
    ----------
    n_kernels : int
        Number of kernels ``K``.
    dim, heads, bias : int, int, bool
        As for `AttentionKernel`.

    Attributes
    ----------
    fused_attention : bool
        As for `AttentionKernel` (default True).

    Examples
    --------
    >>> bank = AttentionKernelBank(4, dim=32, heads=4)
    >>> bank(torch.randn(6, 10, 32), torch.tensor([0, 3, 3, 1, 0, 2]), context=torch.randn(6, 2, 32)).shape
    torch.Size([6, 10, 32])
    """

    fused_attention: bool = True

    def __init__(self, n_kernels: int, dim: int, heads: int = 8, bias: bool = True) -> None:
        super().__init__()
        require_at_least(1, n_kernels=n_kernels)
        kernels = [AttentionKernel(dim, heads, bias) for _ in range(n_kernels)]
        self.n_kernels, self.dim, self.heads = n_kernels, dim, heads
        for name in PROJECTIONS:
            layers = [getattr(k, name) for k in kernels]
            weight = torch.stack([lin.weight.detach().t() for lin in layers]).contiguous()
            self.register_parameter(f"{name}_weight", nn.Parameter(weight))
            self.register_parameter(f"{name}_bias", nn.Parameter(torch.stack([lin.bias.detach() for lin in layers]))
                                    if bias else None)

    def __len__(self) -> int:
        return self.n_kernels

    def kernel(self, k: int) -> AttentionKernel:
        """A standalone `AttentionKernel` with a copy of kernel ``k``'s weights."""
        out = AttentionKernel(self.dim, self.heads, self.q_bias is not None).to(self.q_weight)
        out.fused_attention = self.fused_attention
        with torch.no_grad():
            for name in PROJECTIONS:
                getattr(out, name).weight.copy_(getattr(self, f"{name}_weight")[k].t())
                if self.q_bias is not None:
                    getattr(out, name).bias.copy_(getattr(self, f"{name}_bias")[k])
        return out

    def forward(self, x: Tensor, index: Tensor, context: Tensor | None = None, chunk: int | None = None) -> Tensor:
        """Sample ``i`` through kernel ``index[i]`` (see `mixed_attention`).

        Parameters
        ----------
        x : Tensor, shape (B, N, D)
        index : Tensor, shape (B,), long
        context : Tensor, shape (B, M, D), optional
        chunk : int, optional
            Samples per weight group of the chunked products (see `mixed_attention`).
        """
        check_tokens(x, context, self.dim, x.shape[0] if x.ndim == 3 else index.shape[0])
        stacks = {name: (getattr(self, f"{name}_weight"), getattr(self, f"{name}_bias")) for name in PROJECTIONS}
        return _mixed(stacks, self.heads, index, x, context, chunk, self.fused_attention)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        if f"{prefix}0.q.weight" in state_dict:  # the layout of K separate AttentionKernels
            for name in PROJECTIONS:
                for part in ("weight", "bias"):
                    keys = [f"{prefix}{k}.{name}.{part}" for k in range(self.n_kernels)]
                    if all(key in state_dict for key in keys):
                        parts = [state_dict.pop(key) for key in keys]
                        state_dict[f"{prefix}{name}_{part}"] = torch.stack(
                            [t.t() for t in parts] if part == "weight" else parts)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
