"""Parameters kept as views of one flat buffer, so that the optimizer steps a few large tensors.

PyTorch's multi-tensor optimizers (``foreach`` and ``fused``) split their work into launches of
a bounded number of tensors; each launch waits for the one before, and a launch of many small
tensors leaves most of a GPU idle. The paper-size GNO has 378 parameter tensors: on an H100
(torch 2.11) its fused AdamW step took 11 launches and 0.74 ms of GPU time in a profiled
training step, where one flat tensor of the same size takes about 0.16 ms (benchmarks/history.md).

`FlatParameters` moves the parameters of each optimizer group into one contiguous buffer (one
per data type and device), leaves every parameter in its module as a view of that buffer, and
gives the optimizer the buffers instead. Before each optimizer step, `gather_grads` copies the
parameters' gradients into the buffers' gradients (one multi-tensor copy,
`torch._foreach_copy_`, into views of each buffer's gradient) and drops the parameters' own;
the optimizer's in-place update of a buffer is then the update of every parameter in it.

The modules keep their own `torch.nn.Parameter` objects, so hooks, state dicts, DDP and
`torch.compile` see the same parameters as before. Build it once the model is on its device and
in its final data type: `nn.Module.to` to another device or type gives each parameter new
storage, outside the buffer (`gather_grads` checks this and raises).

Two differences from an optimizer over the parameters themselves:

* a parameter with no gradient in a step (``grad`` is None) gets a zero gradient in the buffer,
  so AdamW still applies its momentum and weight decay to it, where PyTorch's optimizers skip a
  parameter without a gradient;
* the optimizer's state dict holds one entry per buffer, not per parameter: a checkpoint of one
  layout does not load into the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["FlatParameters"]


class FlatParameters:
    """The parameters of optimizer groups moved into flat buffers (see the module's text).

    Parameters
    ----------
    param_groups : iterable of dict or of Tensor
        As for a `torch.optim.Optimizer`: parameter groups (dicts with ``"params"`` and the
        group's options) or the parameters themselves (one group). Every parameter must require
        gradients and appear once.

    Attributes
    ----------
    param_groups : list of dict
        The groups to build the optimizer from: each group's options, with ``"params"`` the
        group's flat buffers (one per data type and device of its parameters).

    Examples
    --------
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))  # on its device
    >>> flat = FlatParameters(model.parameters())
    >>> opt = torch.optim.AdamW(flat.param_groups, lr=1e-3)
    >>> model(torch.randn(3, 4)).square().mean().backward()
    >>> flat.gather_grads()
    >>> opt.step()
    """

    def __init__(self, param_groups: Iterable[dict[str, Any]] | Iterable[Tensor]) -> None:
        groups = list(param_groups)
        if not groups:
            raise ValueError("FlatParameters: no parameters given")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups: list[dict[str, Any]] = []
        # each buffer, its gradient, its parameters (in the buffer's order) and their places in
        # the gradient (views)
        self._buffers: list[tuple[nn.Parameter, Tensor, list[nn.Parameter], list[Tensor]]] = []
        seen: set[int] = set()
        for g, group in enumerate(groups):
            params = [group["params"]] if torch.is_tensor(group["params"]) else list(group["params"])
            by_kind: dict[tuple[torch.dtype, torch.device], list[nn.Parameter]] = {}
            for i, p in enumerate(params):
                if not isinstance(p, nn.Parameter) or not p.requires_grad:
                    raise ValueError(f"FlatParameters: parameter {i} of group {g} is not a torch.nn.Parameter "
                                     f"that requires gradients (got {type(p).__name__}, shape {tuple(p.shape)})")
                if id(p) in seen:
                    raise ValueError(f"FlatParameters: parameter {i} of group {g} (shape {tuple(p.shape)}) "
                                     "appears more than once")
                seen.add(id(p))
                by_kind.setdefault((p.dtype, p.device), []).append(p)
            self.param_groups.append({**group, "params": [self._flatten(ps) for ps in by_kind.values()]})
        self._ptrs = self._data_ptrs()

    def _flatten(self, params: list[nn.Parameter]) -> nn.Parameter:
        """One buffer holding ``params`` one after the other; each parameter becomes a view, and
        so does its place in the buffer's gradient."""
        buffer = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        grad = torch.zeros_like(buffer)
        views, offset = [], 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                buffer[offset:offset + n].copy_(p.reshape(-1))
                p.data = buffer[offset:offset + n].view_as(p)
                views.append(grad[offset:offset + n].view_as(p))
                offset += n
        flat = nn.Parameter(buffer)
        flat.grad = grad
        self._buffers.append((flat, grad, params, views))
        return flat

    def _data_ptrs(self) -> list[int]:
        return [p.data_ptr() for _, _, params, _ in self._buffers for p in params]

    def parameters(self) -> Iterator[nn.Parameter]:
        """The flat buffers, as parameters (for gradient clipping, for instance)."""
        return (flat for flat, _, _, _ in self._buffers)

    @torch.no_grad()
    def gather_grads(self) -> None:
        """Move the parameters' gradients into the buffers' gradients (zeros where a
        parameter's ``grad`` is None), and set the parameters' ``grad`` to None: the next
        backward pass starts afresh, whichever ``zero_grad`` the caller uses. Call it after the
        backward pass (after the last one when gradients accumulate) and before clipping,
        unscaling or the optimizer step.

        Each buffer keeps one gradient tensor, given back to it here if the optimizer's
        ``zero_grad`` dropped it: the step reads and writes the same memory every time (what a
        CUDA graph capture of the step needs)."""
        ptrs = self._data_ptrs()
        if ptrs != self._ptrs:
            moved = next(i for i, (now, then) in enumerate(zip(ptrs, self._ptrs)) if now != then)
            p = [p for _, _, params, _ in self._buffers for p in params][moved]
            raise RuntimeError(f"FlatParameters: a parameter (shape {tuple(p.shape)}, {p.dtype}, {p.device}) no "
                               "longer lies in its flat buffer: the model was moved or cast (.to, .cuda, .half, "
                               "load_state_dict(assign=True)) after FlatParameters was built. Build it once the "
                               "model is on its device and in its final type.")
        for flat, grad, params, views in self._buffers:
            # one multi-tensor copy into the gradient's views. For the paper-size GNO's 378
            # gradients on an H100 it took 120 us against 237 us for a `torch.cat` into the
            # buffer (benchmarks/history.md, tenth round).
            targets, grads, missing = [], [], []
            for p, view in zip(params, views):  # one pass: sort the views, release the grads
                if p.grad is None:
                    missing.append(view)
                else:
                    targets.append(view)
                    grads.append(p.grad)
                    p.grad = None
            if grads:
                torch._foreach_copy_(targets, grads)
            if missing:
                torch._foreach_zero_(missing)
            flat.grad = grad

    @torch.no_grad()
    def average_grads(self, group: Any = None) -> None:
        """All-reduce the buffers' gradients to their mean over the processes of ``group``
        (default: all): one collective per buffer, in place. With `gather_grads` before it,
        this is the gradient synchronisation of data-parallel training without DDP's hooks
        (``trainer.grad_sync=flat``), and a CUDA graph can capture it (NCCL)."""
        world = dist.get_world_size(group)
        for _, grad, _, _ in self._buffers:
            dist.all_reduce(grad, group=group)
            grad.div_(world)

    @torch.no_grad()
    def broadcast(self, src: int = 0, group: Any = None) -> None:
        """Give every process the parameters of process ``src`` (one broadcast per buffer), as
        DDP does when it wraps a model."""
        for flat, _, _, _ in self._buffers:
            dist.broadcast(flat.data, src, group=group)
