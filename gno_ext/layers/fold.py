r"""Context keys and values from a narrow state: a projection and a layer norm folded into each
kernel's key/value weights.

A GNO block's boundary tokens reach its attention kernels through three affine-or-normalising
steps: the boundary operator's output projection (from its inner width $w$ to the model
width $D$), the block's context `LayerNorm`, and each kernel's key/value product. With
$s \in \mathbb{R}^{w}$ a token's state before the projection $h = s W^\top + b$, and the
projection centred over its $D$ outputs ($W_c = W - \bar W$, $b_c = b - \bar b$), the layer
norm only subtracts the mean (which $W_c, b_c$ already did) and divides by the scale
$\sigma(s) = \sqrt{\lVert s W_c^\top + b_c \rVert^2 / D + \epsilon}$, so

$$
\mathrm{LN}(s W^\top + b)\, W_k + c_k
= \frac{[s, 1]}{\sigma(s)} \underbrace{\begin{bmatrix} W_c^\top \\ b_c^\top \end{bmatrix}
  \operatorname{diag}(\gamma)\, W_k}_{A_k \,\in\, \mathbb{R}^{(w + 1) \times 2D}}
  + \underbrace{\beta W_k + c_k}_{d_k},
$$

with the norm's gain $\gamma$ and bias $\beta$. $A_k$ and $d_k$ depend on the weights only
(formed once per step), and $\sigma(s)^2 = [s, 1]\, G\, [s, 1]^\top / D + \epsilon$ with the
$(w + 1) \times (w + 1)$ matrix $G = [W_c^\top; b_c^\top][W_c^\top; b_c^\top]^\top$. Per
token the key/value product then runs at width $w + 1$ instead of $D$, and neither $h$ nor its
normalised copy is formed: at the paper size ($w = 64$, $D = 256$, 32 boundary tokens) that is
a quarter of the multiply-adds of the boundary tokens' keys and values, and the projection's
own product disappears. The result is the same function; only the rounding differs.

`fold_projection` returns the rows $[s, 1] / \sigma(s)$ and the weights $A_k, d_k$ as a
`ContextRows`, which `gno_ext.layers.AttentionKernelBank` and
`gno_ext.layers.AttentionKernel` take as ``context_rows=``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["ContextRows", "context_rows_kv", "fold_projection", "fold_saves"]

ALIGN = 8  # the rows' width is padded with zeros to a multiple of this (aligned loads)


class ContextRows(NamedTuple):
    """Context tokens given by the rows that each kernel's key/value weights multiply: the
    keys and values of sample ``b`` are ``rows[b] @ weight[k] + bias[k]`` with ``k`` its
    kernel, appended after those of the other context tokens.

    Attributes
    ----------
    rows : Tensor, shape (B, M, r)
    weight : Tensor, shape (K, r, 2 D)
        Per kernel, in place of the key/value weight (``(K, D, 2 D)``).
    bias : Tensor, shape (K, 2 D)
    """

    rows: Tensor
    weight: Tensor
    bias: Tensor


def fold_saves(batch: int, tokens: int, width: int, dim: int, n_kernels: int, kv_width: int | None = None) -> bool:
    r"""Whether `fold_projection` takes fewer multiply-adds than forming the tokens and their
    norm, for ``batch`` samples of ``tokens`` tokens, a projection ``width -> dim``, ``n_kernels``
    kernels and key/value width ``kv_width`` (default ``2 dim``).

    Per sample the fold saves the projection and most of the key/value product, but forming
    the folded weights costs ``K (w + 1) D E`` per call whatever the batch: at the paper size
    ($w = 64$, $D = 256$, $K = 4$, 32 boundary tokens) it pays from about 11 samples on. The
    counts are of the forward pass; the backward pass scales both sides alike.
    """
    kv_width = kv_width or 2 * dim
    r = width + 1 + (-(width + 1) % ALIGN)
    unfolded = batch * tokens * (width * dim + dim * kv_width)
    folded = batch * tokens * (r * kv_width + (width + 1) ** 2) + n_kernels * (width + 1) * dim * kv_width
    return folded + (width + 1) ** 2 * dim < unfolded


def fold_projection(state: Tensor, projection: nn.Linear, norm: nn.LayerNorm, weight: Tensor,
                    bias: Tensor | None) -> ContextRows:
    r"""The keys and values of the context tokens ``norm(projection(state))`` under each
    kernel's key/value weights, as `ContextRows` over the narrow ``state`` (see the module's
    text for the identity).

    ``context_rows_kv(fold_projection(s, out, norm, W, c), index)`` equals
    ``norm(out(s)) @ W[index] + c[index]`` up to rounding.

    Parameters
    ----------
    state : Tensor, shape (B, M, w)
        The tokens before the projection.
    projection : nn.Linear
        ``w -> D``, with or without bias.
    norm : nn.LayerNorm
        Over ``D``, with or without its affine parameters.
    weight : Tensor, shape (K, D, E)
        The kernels' key/value weights (``x @ weight[k]`` layout, as
        `gno_ext.layers.AttentionKernelBank` stores them).
    bias : Tensor, shape (K, E), optional

    Returns
    -------
    ContextRows
        ``rows`` (B, M, r) in ``state``'s type, ``r = w + 1`` padded with zeros to a multiple of
        8; ``weight`` (K, r, E); ``bias`` (K, E).
    """
    dim, width = projection.weight.shape
    if state.shape[-1] != width:
        raise ValueError(f"state: expected width {width} (the projection's input), got shape {tuple(state.shape)}")
    if norm.normalized_shape != (dim,) or weight.ndim != 3 or weight.shape[1] != dim:
        raise ValueError(f"norm and weight: expected a norm over {dim} features and weights (K, {dim}, E), got "
                         f"{tuple(norm.normalized_shape)} and {tuple(weight.shape)}")
    w_proj = projection.weight
    b_proj = projection.bias if projection.bias is not None else w_proj.new_zeros(dim)
    # [W_c^T; b_c^T]: the projection centred over its D outputs, (w + 1, D)
    centred = torch.cat([w_proj.t(), b_proj[None]]) - torch.cat([w_proj.t(), b_proj[None]]).mean(1, keepdim=True)
    scaled = weight if norm.weight is None else norm.weight[:, None] * weight  # diag(gamma) W_k
    pad = -(width + 1) % ALIGN
    folded = torch.nn.functional.pad(centred @ scaled, (0, 0, 0, pad))  # (K, r, E)
    offset = weight.new_zeros(weight.shape[0], weight.shape[2]) if norm.bias is None else norm.bias @ weight
    if bias is not None:
        offset = offset + bias
    exact = torch.promote_types(state.dtype, torch.float32)  # the scale in float32 at least, whatever the operands
    with torch.autocast(state.device.type, enabled=False):
        aug = torch.cat([state.to(exact), state.new_ones(*state.shape[:-1], 1, dtype=exact)], -1)  # [s, 1]
        gram = centred.to(exact) @ centred.to(exact).t()
        var = ((aug @ gram) * aug).sum(-1, keepdim=True).clamp_min(0) / dim
        rows = aug * torch.rsqrt(var + norm.eps)
        rows = torch.nn.functional.pad(rows, (0, pad)).to(state.dtype)
    return ContextRows(rows, folded, offset)


def context_rows_kv(context: ContextRows, index: Tensor | None = None) -> Tensor:
    """The keys and values of `ContextRows` in plain products: ``rows[b] @ weight[index[b]] +
    bias[index[b]]`` (``index`` None: the single kernel's), ``(B, M, E)``. The reference for
    the kernels' paths, and the path of a single kernel."""
    rows, weight, bias = context
    if index is None:
        if weight.shape[0] != 1:
            raise ValueError(f"index: needed for {weight.shape[0]} kernels' weights")
        return rows @ weight[0] + bias[0]
    return torch.bmm(rows, weight[index]) + bias[index][:, None]
