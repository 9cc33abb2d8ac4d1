"""Index arithmetic of the routing, on the device and without reading it on the host: one-hot
vectors of the selected kernels, each sample's rank among its kernel's samples, segments of a
cumulative count."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["kernel_ranks", "one_hot", "segment_of"]


def one_hot(index: Tensor, n: int, dtype: torch.dtype = torch.long) -> Tensor:
    """``index`` (any shape, values in ``[0, n)``) as one-hot vectors along a new last axis.

    Unlike `torch.nn.functional.one_hot`, it does not check the range of ``index`` on the
    host (two device-to-host synchronisations per call on a GPU, in eager mode); callers pass
    indices that are in range by construction (arg-max results, validated type codes). An
    index out of range gives a zero row.
    """
    return (index[..., None] == torch.arange(n, device=index.device)).to(dtype)


def kernel_ranks(index: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """How many samples chose each of ``n`` kernels (n,), and each sample's rank among the
    samples of its kernel, in batch order (B,): a stable sort by kernel, on the device."""
    onehot = one_hot(index, n)
    return onehot.sum(0), (onehot.cumsum(0) * onehot).sum(1) - 1


def segment_of(positions: Tensor, ends: Tensor) -> Tensor:
    """For each position, the segment it falls in, given the segments' cumulative ``ends``
    (positions past the last end count in the last segment)."""
    return (positions[:, None] >= ends[None]).sum(1).clamp_max(len(ends) - 1)
