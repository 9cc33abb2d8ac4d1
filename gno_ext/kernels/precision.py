"""Which types and precisions the GPU kernels take, and how PyTorch's settings choose them.
Importable without Triton."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["KERNEL_TYPES", "operand_type", "tf32_allowed", "tf32_products"]


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
