"""Recording the operators a piece of code dispatches (for tests of what runs, of host reads, and of
tensors made on the host)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# operators that read a tensor value on the host (on a GPU, a wait for the device)
HOST_READS = ("_local_scalar_dense", "nonzero", "item")


class RecordOps(TorchDispatchMode):
    """Within ``with RecordOps() as ops:``, ``ops.names`` lists the operators run, in order.
    Reads inside an operator's own implementation are not seen."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))

    @property
    def host_reads(self) -> int:
        """How many of the operators read a tensor value on the host."""
        return sum(name.startswith(HOST_READS) for name in self.names)


class HostTensors(TorchDispatchMode):
    """Within ``with HostTensors() as mode:``, ``mode.ops`` lists the operators that returned a
    tensor on the host. Run on PyTorch's meta device, code that would copy a host tensor to the
    GPU (which a CUDA-graph capture does not allow) shows up here."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        if any(isinstance(o, torch.Tensor) and o.device.type == "cpu" for o in outs):
            self.ops.append(str(func))
        return out
