"""What the Triton kernels of `gno_ext.kernels` share: the precision of their float32 products,
the device's shared memory, and a launcher that `torch.compile` traces and that runs on its
tensors' device."""

from __future__ import annotations

import contextlib
import functools

import torch
import triton
from torch import Tensor

from gno_ext.kernels.precision import tf32_allowed

__all__ = ["dot_precision", "launch", "shared_memory"]


def dot_precision() -> str:
    """How `tl.dot` multiplies float32 operands: as torch's float32 products do (TF32 only
    where PyTorch's settings permit it, `gno_ext.kernels.precision.tf32_allowed`). Other types are
    unaffected."""
    return "tf32" if tf32_allowed() else "ieee"


@functools.cache
def shared_memory(device_index: int) -> int:
    """Shared memory (bytes) that one program may use on CUDA device ``device_index``
    (the opt-in limit, as Triton reads it)."""
    return triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"]


def _on_device(t: Tensor):
    """A context that makes ``t``'s CUDA device the current one where it is not already.

    Triton launches on the current device, and a Python custom operator gets no device guard
    of its own (ATen's CUDA operators do): with a model on ``cuda:1`` and ``cuda:0`` current,
    the launch would fail ("cannot be accessed from Triton") or run on the wrong device.
    Under `torch.compile` the generated code guards the device itself."""
    if t.device.type != "cuda" or torch.compiler.is_compiling() or t.device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)


class _Launcher:
    """``launch(kernel)[grid](*args, **kwargs)``: the kernel wrapped so that `torch.compile`
    traces it, launched on the device of its first tensor argument (`_on_device`)."""

    def __init__(self, kernel) -> None:
        self.kernel = torch.library.wrap_triton(kernel)

    def __getitem__(self, grid):
        launcher = self.kernel[grid]

        def run(*args, **kwargs):
            with _on_device(next(a for a in args if isinstance(a, Tensor))):
                return launcher(*args, **kwargs)
        return run


def launch(kernel) -> _Launcher:
    """The kernel wrapped so that `torch.compile` traces it, launched on its tensors' device."""
    return _Launcher(kernel)
