"""The Triton kernel modules for tests: skipped only where Triton is not installed, so that a
renamed, moved or broken kernel module fails its tests instead of skipping them."""

import importlib
from types import ModuleType

import pytest


def kernel_module(name: str) -> ModuleType:
    """``gno_ext.kernels.<name>`` (``attention``, ``boundary``, ``gathered``)."""
    pytest.importorskip("triton")
    return importlib.import_module(f"gno_ext.kernels.{name}")
