"""Small tensor helpers shared by the layers."""

from __future__ import annotations

import torch
from torch import Tensor


def one_hot(index: Tensor, n: int, dtype: torch.dtype = torch.long) -> Tensor:
    """``index`` (any shape, values in ``[0, n)``) as one-hot vectors along a new last axis.

    Unlike `torch.nn.functional.one_hot`, it does not check the range of ``index`` on the
    host (two device-to-host synchronisations per call on a GPU, in eager mode); callers pass
    indices that are in range by construction (arg-max results, validated type codes). An
    index out of range gives a zero row.
    """
    return (index[..., None] == torch.arange(n, device=index.device)).to(dtype)
