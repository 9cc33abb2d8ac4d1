r"""A parameter-gated mixture of kernels that runs only the selected kernel per sample.

$$
y(x) = \sum_{k=1}^K g_k(\theta)\, \kappa_k[x], \qquad g \in \{0, 1\}^K \text{ one-hot},
$$

evaluated by dispatch: the batch is split by selected kernel, each kernel runs once on its
own samples, and the outputs are put back in batch order. Unselected kernels do not run (their
parameters get no gradient in that step).

For a mixture of `AttentionKernel`s of one shape (the GNO's case) the same result is computed
in one static-shape pass, `mixed_attention`: every sample uses its selected kernel's weights
only (gathered per sample), with no host synchronisation, so the model compiles into CUDA
graphs; unselected kernels then receive zero (not missing) gradients.

`reference_mixture` is the definition, sample by sample, in a few lines: every strategy
(dispatch, the chunked and gathered-weight products of `mixed_attention`, the gated spectral
convolutions) is tested against it, outputs and gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gno_ext.layers.attention import AttentionKernel, AttentionKernelBank, mixed_attention
from gno_ext.layers.gate import ParameterGate, Routing

__all__ = ["GatedKernelMixture", "dispatch", "has_dispatch", "reference_mixture"]


def reference_mixture(kernels: Sequence[nn.Module] | AttentionKernelBank, index: Tensor, x: Tensor,
                      weight: Tensor | None = None, **kernel_kwargs: Any) -> Tensor:
    r"""The mixture's definition, one sample at a time: $y_b = w_b\, \kappa_{k_b}[x_b]$.

    Slow and plain on purpose: the fast strategies must equal it. ``index`` holds each sample's
    kernel $k_b$, ``weight`` the gate's straight-through value $w_b$ (1 in the forward pass;
    default 1). Tensor keyword arguments with the batch's length are split with ``x``."""
    rows = []
    for b in range(x.shape[0]):
        k = int(index[b])
        kernel = kernels.kernel(k) if isinstance(kernels, AttentionKernelBank) else kernels[k]
        kwargs = {n: v[b:b + 1] if torch.is_tensor(v) and v.ndim and v.shape[0] == x.shape[0] else v
                  for n, v in kernel_kwargs.items()}
        rows.append(kernel(x[b:b + 1], **kwargs))
    y = torch.cat(rows)
    return y if weight is None else y * weight.to(y.dtype).view(-1, *([1] * (y.ndim - 1)))


def dispatch(kernels: Sequence[nn.Module], routing: Routing, x: Tensor, **kernel_kwargs: Any) -> Tensor:
    """Run kernel ``routing.index[i]`` on sample ``i`` of ``x``, once per kernel.

    Tensor keyword arguments whose first axis has the batch size are split with ``x``; all
    other arguments are passed unchanged. Each output is scaled by the straight-through gate
    value (exactly 1 in the forward pass).

    Parameters
    ----------
    kernels : sequence of nn.Module
        ``K`` modules with the same output shape per sample.
    routing : Routing
        From `ParameterGate`.
    x : Tensor, shape (B, ...)
        Input of the kernels.
    """
    batch = x.shape[0]
    perm, counts, inverse = routing.make_plan()
    is_batch = lambda v: torch.is_tensor(v) and v.ndim > 0 and v.shape[0] == batch
    scale = lambda y, w: y * w.to(y.dtype).view(-1, *([1] * (y.ndim - 1)))
    if max(counts) == batch:  # one kernel for the whole batch: no reordering
        return scale(kernels[counts.index(batch)](x, **kernel_kwargs), routing.weight)
    split = lambda t: t.index_select(0, perm).split(counts)
    xs, ws = split(x), split(routing.weight)
    kws = {name: split(v) if is_batch(v) else v for name, v in kernel_kwargs.items()}
    outputs = []
    for k, kernel in enumerate(kernels):
        if counts[k] == 0:
            continue
        kw = {name: v[k] if isinstance(v, tuple) else v for name, v in kws.items()}
        outputs.append((k, scale(kernel(xs[k], **kw), ws[k])))
    if any(y.shape[1:] != outputs[0][1].shape[1:] for _, y in outputs[1:]):
        shapes = {k: tuple(y.shape[1:]) for k, y in outputs}
        raise ValueError(f"kernels: their outputs must have one shape per sample, got {shapes} (kernel: shape)")
    return torch.cat([y for _, y in outputs]).index_select(0, inverse)


class GatedKernelMixture(nn.Module):
    r"""``K`` kernels behind a `ParameterGate`; only each sample's selected kernel runs.

    Parameters
    ----------
    kernels : sequence of nn.Module, or AttentionKernelBank
        Any modules with a common output shape: `AttentionKernel`, neuraloperator's
        ``SpectralConv``, or your own; or an `AttentionKernelBank` (attention kernels with
        their weights stored stacked, the GNO's choice).
    gate : ParameterGate
        Its ``n_kernels`` must equal ``len(kernels)``.

    Attributes
    ----------
    kernels : nn.ModuleList or AttentionKernelBank
    last_routing : Routing or None
        Routing of the latest forward pass, for inspection (the load-balance term reaches the
        loss through `gno_ext.layers.balance_losses`).
    chunk : int or None
        Samples per weight group of the attention path's chunked products (`mixed_attention`);
        None: the gathered-weight kernels on a CUDA device, else chosen by batch size
        (`gno_ext.layers.attention.default_chunk`); 0: the chunked products at that size on
        every device.

    Examples
    --------
    >>> mix = GatedKernelMixture([nn.Linear(4, 4) for _ in range(3)], ParameterGate(2, 3))
    >>> mix(torch.randn(5, 4), torch.randn(5, 2)).shape
    torch.Size([5, 4])
    """

    def __init__(self, kernels: Sequence[nn.Module] | AttentionKernelBank, gate: ParameterGate) -> None:
        super().__init__()
        if len(kernels) != gate.n_kernels:
            raise ValueError(f"kernels: the gate chooses among {gate.n_kernels} kernels, got {len(kernels)}")
        bank = isinstance(kernels, AttentionKernelBank)
        self.kernels = kernels if bank else nn.ModuleList(kernels)
        self.gate = gate
        self.last_routing: Routing | None = None
        self.chunk: int | None = None
        # Attention kernels of one shape run in one static-shape pass (`mixed_attention`).
        self.stacked = bank or all(isinstance(k, AttentionKernel) for k in kernels) and len(
            {(k.heads, k.q.weight.shape, k.q.bias is None) for k in kernels}) == 1
        # dispatch leaves the kernels no sample selected out of the graph (DDP must be told)
        self.dispatches = not self.stacked

    def forward(self, x: Tensor, theta: Tensor | None, routing: Routing | None = None, **kernel_kwargs: Any) -> Tensor:
        """Apply the mixture.

        Parameters
        ----------
        x : Tensor, shape (B, ...)
            Kernel input.
        theta : Tensor, shape (B, n_params), or None
            Gate input (ignored, and may be None, if ``routing`` is given). Its batch size must
            be ``x``'s (a `ValueError` otherwise: a smaller one used to cut the batch).
        routing : Routing, optional
            A precomputed routing to reuse.
        **kernel_kwargs
            Passed to the kernels (batch tensors are split per kernel).
        """
        given = "theta" if routing is None else "routing"
        if routing is None:
            if theta is None:
                raise ValueError(f"theta: the gate needs the parameters, shape (B, {self.gate.n_params}), "
                                 "or pass routing=")
            routing = self.gate(theta)
        if routing.index.shape[0] != x.shape[0]:
            raise ValueError(f"{given}: batch size {routing.index.shape[0]} does not match x's {x.shape[0]}")
        self.last_routing = routing
        if self.stacked:
            if isinstance(self.kernels, AttentionKernelBank):
                y = self.kernels(x, routing.index, chunk=self.chunk, **kernel_kwargs)
            else:
                y = mixed_attention(self.kernels, routing.index, x, chunk=self.chunk, **kernel_kwargs)
            return y * routing.weight.to(y.dtype).view(-1, *([1] * (y.ndim - 1)))
        return dispatch(self.kernels, routing, x, **kernel_kwargs)


def has_dispatch(model: nn.Module) -> bool:
    """Whether a step can leave some parameters of ``model`` without a gradient: a kernel
    mixture that runs only the selected kernels (dispatch by groups) does, when a batch selects
    no sample for a kernel. DDP then needs ``find_unused_parameters=True``; the static-shape
    attention path (`mixed_attention`) keeps every kernel in the graph and does not."""
    return any(getattr(m, "dispatches", False) for m in model.modules())
