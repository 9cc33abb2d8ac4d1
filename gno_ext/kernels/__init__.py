"""gno_ext's GPU kernels, written in Triton, and the one function that loads them.

The layers take their fast paths through these kernels where they can run (a CUDA device
and Triton); elsewhere the layers compute the same in PyTorch. Each module of kernels
registers its operators under ``torch.ops.gno_ext`` (``torch.library.triton_op``, so that
``torch.compile`` traces into them and CUDA graphs capture them) when it is imported, and
only `load` imports it:

* ``gathered``: products with per-sample weights selected in place (the gated mixtures'
  gathered-weight path, `gno_ext.layers._gathered`);
* ``attention``: the attention of the kernel integral over domain and context tokens
  (`gno_ext.layers.attention.attend_tokens`);
* ``boundary``: the fused boundary transfer operator (`gno_ext.layers.BoundaryTransfer`).

`gno_ext.kernels.precision` (the operand types and TF32 settings) and this module import
without Triton. How the kernels work, and their tests and speed: the contributors' page
"GPU kernels".
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["KERNELS", "load"]

KERNELS = ("gathered", "attention", "boundary")


def load(name: str) -> ModuleType | None:
    """The kernel module ``gno_ext.kernels.<name>``, imported (once: Python caches it), or None
    where Triton is not installed; the callers then take their PyTorch path."""
    if name not in KERNELS:
        raise ValueError(f"gno_ext.kernels: no kernels named {name!r}; there are {', '.join(KERNELS)}")
    if importlib.util.find_spec("triton") is None:
        return None
    return importlib.import_module(f"gno_ext.kernels.{name}")
