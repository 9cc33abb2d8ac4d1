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

__all__ = ["AttentionKernel", "SDPA_BACKENDS", "mixed_attention"]

# cuDNN attention builds an execution plan per input shape; the per-kernel sub-batches of a
# gated mixture change shape every step, so its plan building (tens of ms per call) would
# dominate. The flash and memory-efficient kernels have no such cost.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


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
    """

    def __init__(self, dim: int, heads: int = 8, bias: bool = True) -> None:
        super().__init__()
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
        b, n, d = x.shape
        source = x if context is None else torch.cat([x, context], 1)
        q = self.q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k, v = self.kv(source).view(b, source.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        with sdpa_kernel(SDPA_BACKENDS):
            y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


def _stacked(kernels: Sequence[AttentionKernel], name: str, select: Tensor) -> tuple[Tensor, Tensor | None]:
    """Per-sample weights ``(B, in, out)`` (and biases) of the selected kernels.

    The selection is a product with the one-hot matrix ``select`` (B, K): its backward pass is
    a matrix product too (no atomic scatter-add of B weight copies onto K kernels).
    """
    layers = [getattr(k, name) for k in kernels]
    weights = torch.stack([lin.weight.transpose(0, 1) for lin in layers])  # (K, in, out)
    weight = (select @ weights.flatten(1)).view(-1, *weights.shape[1:])
    if layers[0].bias is None:
        return weight, None
    return weight, (select @ torch.stack([lin.bias for lin in layers]))[:, None]


def _apply(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.bmm(x, weight) if bias is None else torch.baddbmm(bias, x, weight)


def mixed_attention(kernels: Sequence[AttentionKernel], index: Tensor, x: Tensor,
                    context: Tensor | None = None) -> Tensor:
    """Each sample's selected `AttentionKernel`, for the whole batch in one pass.

    Sample ``i`` is computed with the projection weights of ``kernels[index[i]]`` only (the
    weights are gathered per sample), so the result equals running each kernel on its own
    samples, but with static shapes and no host synchronisation: one batched product per
    projection and one attention call for the batch, which ``torch.compile`` can capture in
    a CUDA graph. Unselected kernels receive zero gradient.

    Parameters
    ----------
    kernels : sequence of AttentionKernel
        Kernels of identical shape.
    index : Tensor, shape (B,), long
        Selected kernel per sample.
    x : Tensor, shape (B, N, D)
    context : Tensor, shape (B, M, D), optional
    """
    b, n, d = x.shape
    heads = kernels[0].heads
    select = F.one_hot(index, len(kernels)).to(x.dtype)
    source = x if context is None else torch.cat([x, context], 1)
    q = _apply(x, *_stacked(kernels, "q", select)).view(b, n, heads, -1).transpose(1, 2)
    kv = _apply(source, *_stacked(kernels, "kv", select))
    k, v = kv.view(b, source.shape[1], 2, heads, -1).permute(2, 0, 3, 1, 4)
    with sdpa_kernel(SDPA_BACKENDS):
        y = F.scaled_dot_product_attention(q, k, v)
    return _apply(y.transpose(1, 2).reshape(b, n, d), *_stacked(kernels, "out", select))
