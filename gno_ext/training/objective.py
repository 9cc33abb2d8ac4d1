r"""The training objective across processes, the non-finite guard and the choice of precision.

Group DRO is not a mean over samples, so data-parallel training cannot simply average each
process's own DRO loss. `global_objective` all-reduces the per-group loss sums and counts
*before* the log-sum-exp, so every process computes the objective of the global batch; the
local sums stay in the autograd graph, and the loss handed to ``backward`` is scaled by the
number of processes to undo DDP's gradient averaging. The gradients are then those of one
process holding the whole global batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from gno_ext.losses import RunningGroupLosses, dro_from_group_sums, dro_group_weights, group_sums

__all__ = ["global_objective", "GlobalObjective", "NonFiniteGuard", "NonFiniteLossError", "choose_precision"]


def _all_reduce_sum(t: Tensor) -> Tensor:
    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


class GlobalObjective(NamedTuple):
    """What `global_objective` gives: the objective for logging, what to call ``backward`` on,
    and the groups' weights in its gradient."""

    loss: Tensor
    """The global objective (equal on every process), detached."""
    backward_loss: Tensor
    """What to call ``backward`` on under DDP (gradient averaging included)."""
    weights: Tensor
    """Shape ``(n_groups,)``: each group's weight in the gradient in units of the plain mean's
    (`gno_ext.losses.dro_group_weights`), 0 for groups without a sample; with ``dro=False``
    all ones (the plain mean of samples: no group favoured), detached."""


def global_objective(per_sample_loss: Tensor, groups: Tensor, n_groups: int, dro: bool, tau: float,
                     world_size: int | None = None,
                     all_reduce: Callable[[Tensor], Tensor] | None = None,
                     temperature: str = "absolute", running: RunningGroupLosses | None = None) -> GlobalObjective:
    """The objective of the global batch, from this process's samples.

    Parameters
    ----------
    per_sample_loss : Tensor, shape (B,)
        This process's per-sample losses.
    groups : Tensor, shape (B,), long
        Their DRO groups (ignored for the plain mean).
    n_groups : int
        Number of groups (the same on every process).
    dro : bool
        Group DRO with temperature ``tau``; otherwise the mean over the global batch.
    tau : float
    world_size : int, optional
        Number of processes (default: from ``torch.distributed`` when initialised, else 1).
    all_reduce : callable, optional
        Sum over processes (default: ``torch.distributed.all_reduce``).
    temperature : {"absolute", "relative"}
        How ``tau`` is read (`gno_ext.losses.TEMPERATURES`); with ``"relative"`` the mean group
        loss it is divided by is the global batch's, so N processes still optimise the
        objective of one.
    running : RunningGroupLosses, optional
        Every group's running loss across batches (``trainer.dro.weights=running``): updated
        with the global batch's group losses in every phase, and, with ``dro``, the source of
        the weights, ``sum_g w_g sums_g / B`` (the plain mean where all weights are 1), in
        place of the batch's log-sum-exp.

    Returns
    -------
    GlobalObjective
        ``(loss, backward_loss, weights)``.
    """
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    all_reduce = all_reduce or _all_reduce_sum
    n = n_groups if dro or running is not None else 1
    sums, counts = group_sums(per_sample_loss.float(), groups if n > 1 else torch.zeros_like(groups), n)
    if world_size > 1:
        sums = sums + (all_reduce(sums) - sums.detach())  # value: global sums; gradient: local part
        counts = all_reduce(counts)
    if running is not None:
        running.update(sums.detach(), counts)
    if not dro:
        loss = sums.sum() / counts.sum()
        return GlobalObjective(loss.detach(), loss * world_size, torch.ones(n_groups, device=sums.device))
    if running is not None:
        weights = running.weights(tau, temperature)
        loss = (weights * sums).sum() / counts.sum()
        return GlobalObjective(loss.detach(), loss * world_size, weights)
    loss = dro_from_group_sums(sums, counts, tau, temperature)
    weights = dro_group_weights(sums.detach(), counts, tau, temperature)
    return GlobalObjective(loss.detach(), loss * world_size, weights)


class NonFiniteLossError(RuntimeError):
    """Training met too many consecutive non-finite losses or gradients."""


@dataclass
class NonFiniteGuard:
    """Skip updates whose loss or gradient norm is NaN or Inf, and stop after ``patience``
    consecutive such updates with an error that says what to check.

    Per update: `check` each value (every micro-batch's loss, then the gradient norm), then
    `update` once, which counts the update as non-finite if any checked value was. The checked
    values are global (equal on every process), so all processes skip together.
    """

    patience: int = 5
    skipped: int = 0
    consecutive: int = 0
    _bad: tuple[str, float] | None = None

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"trainer.max_nonfinite: must be >= 1, got {self.patience}")

    @property
    def clean(self) -> bool:
        """No non-finite value checked since the last `update`."""
        return self._bad is None

    def check(self, value: Tensor | float, what: str) -> bool:
        """True when ``value`` is finite; otherwise remember it for this update's `update`."""
        v = float(value)
        if math.isfinite(v):
            return True
        if self._bad is None:
            self._bad = (what, v)
        return False

    def update(self, step: int) -> bool:
        """End of an update: True when every value checked for it was finite. Otherwise count it
        as skipped, and raise `NonFiniteLossError` after ``patience`` consecutive ones."""
        bad, self._bad = self._bad, None
        if bad is None:
            self.consecutive = 0
            return True
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive >= self.patience:
            what, v = bad
            raise NonFiniteLossError(
                f"training stopped at step {step}: {self.consecutive} consecutive updates with a non-finite loss or "
                f"gradient (this one: {what} {v}); {self.skipped} skipped in all. Check the learning rate "
                f"(optimizer.lr), the precision (trainer.precision: fp16 overflows more easily than bf16) and the "
                f"data (NaN in the inputs).")
        return False

    def ok(self, value: Tensor | float, what: str, step: int) -> bool:
        """An update with one checked value: `check` then `update`."""
        self.check(value, what)
        return self.update(step)


def choose_precision(requested: str, device_type: str, world_size: int = 1) -> str:
    """Mixed precision for the cluster: ``"bf16"`` where every device supports it, else
    ``"fp16"`` (with loss scaling) on GPUs, else ``"no"`` (fp32).

    With several processes the decision is all-reduced (a minimum over processes), so a job
    spread over mixed GPU types agrees on one precision.

    Parameters
    ----------
    requested : {"auto", "bf16", "fp16", "no"}
    device_type : str
        ``"cuda"``, ``"cpu"``, ...
    world_size : int
    """
    if requested not in ("auto", "bf16", "fp16", "no"):
        raise ValueError(f"trainer.precision: expected auto, bf16, fp16 or no, got {requested!r}")
    if device_type != "cuda":
        if requested in ("fp16", "bf16"):
            raise ValueError(f"trainer.precision={requested}: mixed precision is for GPUs; this run is on "
                             f"{device_type} (use auto or no)")
        return "no"
    local = 2 if torch.cuda.is_bf16_supported() else 1  # 2: bf16, 1: fp16
    if world_size > 1:
        flag = torch.tensor([local], device="cuda")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        local = int(flag)
    if requested == "auto":
        return "bf16" if local == 2 else "fp16"
    if requested == "bf16" and local < 2:
        raise ValueError("trainer.precision=bf16: a device of this job does not support bf16; use auto or fp16")
    return requested
