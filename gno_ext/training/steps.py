"""One training step of the loop, as an interface with two implementations.

A step is: the forward pass and the loss (`objective`), the backward pass, the gradients
gathered into the flat buffers (averaged over processes where the loop does it), their norm
(clipped where ``trainer.clip_grad`` is set) and the optimizer's update. `EagerSteps` runs them
from Python; `gno_ext.training.captured.CapturedSteps` replays them from CUDA graphs, and
`gno_ext.training.captured.CapturingSteps` (``trainer.capture=true``) runs the eager steps until
the first update has made the optimizer's state, then the captured ones. All answer to the same
interface (`Steps`), so the loop runs them alike and never asks how they run:
`gno_ext.training.captured.training_steps` picks them from the settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from gno_ext.layers.gate import balance_losses
from gno_ext.losses import RunningGroupLosses
from gno_ext.training.flat import FlatParameters
from gno_ext.training.objective import global_objective
from gno_ext.training.problem import Batch, GridProblem, Problem

__all__ = ["EagerSteps", "Objective", "Steps", "make_objective"]

class Objective(Protocol):
    """``objective(batch, groups, dro) -> (values to log, loss to differentiate)``; the values to
    log are a detached tensor ``(3,)``: the objective, and the largest and smallest group weights
    in its gradient in units of the plain mean's (`gno_ext.losses.dro_group_weights`; 1 and 1 for
    the plain mean), read by the loop in one transfer. ``running``: the state it updates in place
    at every call (``trainer.dro.weights=running``), or None; checkpoints save it, and a CUDA
    graph's capture restores it after its warm-up runs."""

    running: RunningGroupLosses | None

    def __call__(self, batch: Batch, groups: Tensor, dro: bool) -> tuple[Tensor, Tensor]: ...


class Steps(Protocol):
    """What the epoch loop needs of a step."""

    replayed: bool  # whether the steps are CUDA graph replays

    def forward_backward(self, batch: Batch, groups: Tensor, dro: bool, last_micro: bool) -> Tensor:
        """The forward and backward passes of one micro-batch; returns the values to log (a device
        tensor ``(3,)``: the loss, the largest and the smallest group weight; see `Objective`)."""

    def gradient_norm(self, clean: bool) -> float:
        """After the last micro-batch: the gradients into the flat buffers (averaged where the
        loop averages them) and, if ``clean`` (no non-finite loss met), their norm, clipped where
        the run clips; NaN otherwise."""

    def optimizer_step(self) -> None:
        """The optimizer's update."""

    def zero_grad(self) -> None:
        """Forget the gradients before the next step."""

    def running(self) -> AbstractContextManager[Any]:
        """The context the whole loop runs in (a side stream for captured steps)."""

    def updated(self) -> None:
        """Called after each update that was made (not after a skipped one)."""


def make_objective(model: nn.Module, raw: nn.Module, autocast: Callable[[], Any], scale: Tensor, n_groups: int,
                   tau: float, world: int, balance_weight: float = 0.0, physics_weight: float = 0.0,
                   problem: Problem | None = None, temperature: str = "relative",
                   running: RunningGroupLosses | None = None) -> Objective:
    """The training objective: the per-sample MSE of the next frame on fields divided by
    ``scale``, reduced to the plain mean or the group-DRO loss over ``n_groups`` groups
    (`global_objective`, ``tau`` read as ``temperature`` says), plus the load-balance terms of the
    gates and routers that ran (`gno_ext.layers.balance_losses`) and a physics-informed model's
    residual (``raw``'s ``physics_loss``), where their weights are set. ``problem`` (default: grids) runs the model
    on a batch and reduces the error per sample (`gno_ext.training.problem`). ``running``: the
    groups' running losses, which weigh them in place of the batch's log-sum-exp
    (``trainer.dro.weights=running``), which the objective carries as its ``running``
    (`Objective`)."""
    if physics_weight and not hasattr(raw, "physics_loss"):
        raise ValueError(f"model.physics_weight={physics_weight}: {type(raw).__name__} has no physics residual "
                         "(physics_loss); set it for a physics-informed model (model=pino) only")
    physics = raw.physics_loss if physics_weight else None
    problem = problem or GridProblem()

    def objective(batch: Batch, groups: Tensor, dro: bool) -> tuple[Tensor, Tensor]:
        with balance_losses() as balance, autocast():
            pred = problem.predict(model, batch)
        per_sample = problem.mse(pred.float() / scale, problem.target(batch).float() / scale, batch)
        loss, backward_loss, weights = global_objective(per_sample, groups, n_groups, dro, tau, world,
                                                        temperature=temperature, running=running)
        if balance_weight and balance:
            backward_loss = backward_loss + balance_weight * torch.stack(balance).sum()
        if physics is not None:  # PINO's residual term
            backward_loss = backward_loss + physics_weight * physics(batch, pred)
        smallest = torch.where(weights > 0, weights, math.inf).amin()  # of the groups present
        return torch.stack([loss, weights.amax(), smallest]), backward_loss

    objective.running = running  # type: ignore[attr-defined]
    return objective


class EagerSteps:
    """The steps run from Python, through accelerate (DDP's gradient synchronisation on the
    last of ``accum`` micro-batches, loss scaling in fp16, clipping).

    Parameters
    ----------
    model : nn.Module
        What the forward pass runs (compiled, in DDP, ...).
    objective : Objective
    accelerator : accelerate.Accelerator
    optimizer : torch.optim.Optimizer
    flat : FlatParameters or None
        The flat buffers the optimizer steps, if any.
    average : bool
        Average the flat buffers' gradients over the processes (the model is outside DDP).
    clip : float or None
        Maximum gradient norm.
    accum : int
        Micro-batches per update (each loss is divided by it).
    """

    replayed = False

    def __init__(self, model: nn.Module, objective: Objective, accelerator: Any, optimizer: Any,
                 flat: FlatParameters | None, average: bool, clip: float | None, accum: int) -> None:
        self.model, self.objective, self.accelerator, self.optimizer = model, objective, accelerator, optimizer
        self.flat, self.average, self.clip, self.accum = flat, average, clip, accum

    def forward_backward(self, batch: Batch, groups: Tensor, dro: bool, last_micro: bool) -> Tensor:
        with self.accelerator.no_sync(self.model) if not last_micro else nullcontext():
            loss, backward_loss = self.objective(batch, groups, dro)
            self.accelerator.backward(backward_loss / self.accum)
        return loss

    def gradient_norm(self, clean: bool) -> float:
        if self.flat is not None:  # also when the update is skipped: it drops the parameters' own gradients
            self.flat.gather_grads()
            if self.average:
                self.flat.average_grads()
        if not clean:
            return float("nan")
        params = self.model.parameters() if self.flat is None else self.flat.parameters()
        return float(self.accelerator.clip_grad_norm_(params, self.clip if self.clip else math.inf))

    def optimizer_step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def running(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def updated(self) -> None:
        pass


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's wrapper (or ``optimizer`` itself)."""
    return getattr(optimizer, "optimizer", optimizer)
