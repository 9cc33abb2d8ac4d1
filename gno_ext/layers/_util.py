"""Small tensor helpers shared by the layers."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import numbers
import operator
from collections.abc import Iterator
from types import ModuleType

import torch
from torch import Tensor


def may_read_device() -> bool:
    """Whether a value check that reads a device tensor on the host may run: not while
    `torch.compile` traces, nor while a CUDA graph is being captured (a device-to-host
    synchronisation there would break the capture). Eager calls check; compiled or captured
    ones rely on the eager check having run on the same kind of input."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


@torch.compiler.assume_constant_result
def tf32_allowed() -> bool:
    """Whether float32 products on CUDA may round their operands to TF32, as PyTorch's settings
    say: ``torch.backends.cuda.matmul.allow_tf32`` (which `torch.set_float32_matmul_precision`
    sets too) or, once the newer settings have been used (``torch.backends.fp32_precision``,
    ``torch.backends.cuda.matmul.fp32_precision``), which PyTorch then refuses to mix with
    the older flag, ``torch.backends.cuda.matmul.fp32_precision == "tf32"``. `torch.compile`
    cannot trace the newer one; to it the answer is a constant, and its guard on PyTorch's
    global state recompiles a model when either setting changes."""
    matmul = torch.backends.cuda.matmul
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:  # the newer settings were used
        return matmul.fp32_precision == "tf32"


@contextlib.contextmanager
def tf32_products(allowed: bool) -> Iterator[None]:
    """Within the block, float32 products on CUDA may use TF32 (``allowed``) or not, whichever
    of PyTorch's two settings is in use (see `tf32_allowed`); the precision in effect before
    is restored after the block, also where it raises. For benchmarks and tests that compare
    the two."""
    matmul = torch.backends.cuda.matmul
    try:
        setting, saved, value = "allow_tf32", matmul.allow_tf32, allowed
    except RuntimeError:  # the newer settings were used: the older flag may not be touched
        setting, saved, value = "fp32_precision", matmul.fp32_precision, "tf32" if allowed else "ieee"
    setattr(matmul, setting, value)
    try:
        yield
    finally:
        setattr(matmul, setting, saved)


# the operand types of the Triton kernels (products accumulate in float32)
KERNEL_TYPES = (torch.float16, torch.bfloat16, torch.float32)


def operand_type(dtype: torch.dtype, device_type: str) -> torch.dtype:
    """The type in which a product on ``device_type`` takes operands of type ``dtype``: the
    autocast type where autocast is on there, else ``dtype``. As autocast itself does, it
    leaves float64 (and non-floating types) alone."""
    if dtype.is_floating_point and dtype != torch.float64 and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


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


def triton_module(name: str) -> ModuleType | None:
    """The module of Triton kernels ``gno_ext.layers.<name>``, imported, or None where Triton is
    not installed (the callers then take their PyTorch path)."""
    if importlib.util.find_spec("triton") is None:
        return None
    return importlib.import_module(f"gno_ext.layers.{name}")
