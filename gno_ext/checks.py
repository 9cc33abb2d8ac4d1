"""Checks of arguments and values shared by the package: integers, minimums, the first bad entry of
a tensor for an error message, and whether a check may read a device tensor on the host."""

from __future__ import annotations

import numbers
import operator

import torch
from torch import Tensor

__all__ = ["first_entry", "is_integer", "is_integer_dtype", "may_read_device", "require_at_least"]


def may_read_device() -> bool:
    """Whether a value check that reads a device tensor on the host may run: not while
    `torch.compile` traces, nor while a CUDA graph is being captured (a device-to-host
    synchronisation there would break the capture). Eager calls check; compiled or captured
    ones rely on the eager check having run on the same kind of input."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def first_entry(name: str, t: Tensor, bad: Tensor) -> str:
    """``name[i, j, ...] = value``: the first entry of ``t`` where the mask ``bad`` (of ``t``'s
    shape, true somewhere) holds, for error messages. Reads ``t`` on the host."""
    index = tuple(bad.nonzero()[0].tolist())
    return f"{name}{list(index)} = {t[index].item()}"


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """Whether tensors of ``dtype`` hold integers (not floating, complex or bool values)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def is_integer(value: object) -> bool:
    """Whether ``value`` is an integer (Python's, NumPy's or a 0-d integer tensor), not a bool."""
    try:
        operator.index(value)
    except TypeError:
        return False
    return not isinstance(value, bool)


def require_at_least(minimum: float, **values: float) -> None:
    """Raise a `ValueError` naming the first of ``values`` (constructor arguments, by name)
    that is not a number or is below ``minimum``."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name}: expected a number >= {minimum}, got {value!r}")
        if value < minimum:
            raise ValueError(f"{name}: must be >= {minimum}, got {value}")
