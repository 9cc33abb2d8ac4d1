"""Training steps replayed from CUDA graphs (``trainer.capture=true``).

The host's work in a training step (Python, the optimizer's launches) can take longer than the
GPU's: on the paper-size GNO at batch 256 an H100 step took 13.6 ms with the model's own CUDA
graphs and the optimizer run from Python, 8.9 ms with the whole step in one graph
(benchmarks/history.md). `CapturedSteps` brings the whole-step capture to the
training loop and keeps the loop's semantics:

* one graph for the forward and backward passes, the move of the gradients into the flat
  buffers (`FlatParameters`) and the gradient clipping, per input signature (shapes, dtypes,
  grid, MSE or DRO phase): a last, shorter batch gets a graph of its own. Each batch is copied
  into the graph's static input tensors before the replay;
* one graph for the optimizer step (a capturable fused AdamW whose learning rates are
  tensors, which the scheduler fills in place), replayed only when the loss and the gradient
  norm are finite, so the non-finite guard still skips updates;
* the graphs share one memory pool (they never run at the same time), and everything (the
  first, eager step included) runs on one side stream: no gradient accumulator is bound to
  the default stream, which a capture cannot wait on. When the objective moves from its MSE
  phase to DRO (the curriculum never goes back), the MSE graphs and their pool are freed before
  the first DRO capture, whose eager warm-up needs the memory of a step beside the pool.

The flat buffers make the gradients fixed tensors that every graph writes in full, and give
the eager and captured steps the same semantics (a parameter without gradient in a step gets
a zero gradient).

On several processes the captured graph also averages the flat buffers' gradients over them
(`FlatParameters.average_grads`: one NCCL all-reduce per buffer, captured with the rest), and
the model runs outside DDP (``trainer.grad_sync=flat``, which ``auto`` chooses here): DDP's
gradient hooks are host code that a graph does not replay.

Limits: on several processes ``trainer.grad_sync=flat``, no gradient accumulation, no fp16
loss scaling, ``trainer.flat_parameters=true``, and no ``trainer.compile=reduce-overhead``
(which makes CUDA graphs of its own; ``trainer.compile=true`` is the fast choice). Before each
capture the step runs twice on the new signature (`capture_step`'s warm-up) without an
optimizer step: state that the forward pass updates (batch-norm statistics) sees those runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from gno_ext.schema import PDEBatch
from gno_ext.training.flat import FlatParameters
from gno_ext.training.steps import EagerSteps, Objective, Steps, unwrap_optimizer

__all__ = ["CapturedSteps", "CapturingSteps", "capture_step", "check_capture_settings", "side_stream", "signature",
           "training_steps"]


def capture_step(fn: Callable[[], Any], warmup: int = 3, pool: Any = None, stream: torch.cuda.Stream | None = None,
                 capture_error_mode: str = "global") -> Callable[[], None]:
    """Capture ``fn`` (a whole training step, or a forward pass) in one CUDA graph and return
    the graph's ``replay``.

    ``fn`` first runs ``warmup`` times on a side stream, as `torch.cuda.graph` requires:
    compilation, autotuning, the optimizer's lazy state and cuBLAS workspaces happen there,
    not during the capture. The capture records the work without running it, so the first
    ``replay()`` performs step ``warmup + 1``. What ``fn`` allocates during the capture
    (activations, gradients) lives in the graph's memory pool and is reused by every replay.
    Inputs, parameters and optimizer state must stay where they are: copy each new batch
    into the tensors ``fn`` reads.

    ``pool`` (from `torch.cuda.graph_pool_handle`) lets several graphs share one memory pool,
    for graphs that never run at the same time and whose outputs are read before another of
    them is replayed. ``stream``: run the warm-up and the capture on this stream (default: a
    new side stream for the warm-up, PyTorch's capture stream for the capture).
    ``capture_error_mode``: as for `torch.cuda.graph` (``"thread_local"`` lets other threads,
    such as a DataLoader's pin-memory thread, use CUDA during the capture).

    For a training step, use a capturable optimizer (``torch.optim.AdamW(...,
    capturable=True)``) and a model compiled *without* CUDA graphs of its own
    (`compile_model` with ``mode=True``). On the paper-size GNO at batch 256 this took an H100
    training step from 13.6 to 8.9 ms against ``mode="reduce-overhead"``, which leaves the
    optimizer step to Python (benchmarks/history.md).

    Two pitfalls:

    * An autograd graph made on the default stream that is still alive (a ``loss`` kept from
      an eager step, say) holds gradient accumulators bound to that stream, and the captured
      backward fails on them ("operation would make the legacy stream depend on a capturing
      blocking stream"). Let such graphs die before capturing.
    * Eager input checks that read the device are skipped during a capture (as under
      `torch.compile`); run one eager call on new kinds of input first.

    Examples
    --------
    >>> opt = torch.optim.AdamW(model.parameters(), fused=True, capturable=True)  # doctest: +SKIP
    >>> def step():  # doctest: +SKIP
    ...     loss = (net(u, theta=theta, bc=bc) - target).pow(2).mean()
    ...     opt.zero_grad(set_to_none=True)
    ...     loss.backward()
    ...     opt.step()
    >>> replay = capture_step(step)  # doctest: +SKIP
    >>> u.copy_(next_u); replay()  # doctest: +SKIP
    """
    if not torch.cuda.is_available():
        raise RuntimeError("capture_step: CUDA graphs need a CUDA device, and none is available")
    side = stream if stream is not None else torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode):
        fn()
    return graph.replay


@contextlib.contextmanager
def side_stream() -> Iterator[torch.cuda.Stream]:
    """Run the block on a new CUDA stream, after the work queued before it; the stream that was
    current waits for it at the end. Work that will be captured in a CUDA graph belongs there
    from its first eager step on: an autograd graph made on the default stream and kept alive
    binds gradient accumulators to it, which a capture cannot wait on (`capture_step`)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield stream
    torch.cuda.current_stream().wait_stream(stream)


def check_capture_settings(device: torch.device, world: int, accum: int, precision: str, compile_mode: Any,
                           flat: bool, grad_sync: str = "flat") -> None:
    """Raise a ValueError naming the setting that ``trainer.capture=true`` cannot work with
    (``grad_sync``: ``trainer.grad_sync`` as resolved, ``ddp`` or ``flat``)."""
    if device.type != "cuda":
        raise ValueError(f"trainer.capture=true: CUDA graphs need a GPU; this run is on {device.type}")
    if world != 1 and grad_sync != "flat":
        raise ValueError(f"trainer.capture=true: this run has {world} processes and trainer.grad_sync={grad_sync}, "
                         "but DDP's gradient hooks are not captured. Use trainer.grad_sync=flat (or auto)")
    if accum != 1:
        raise ValueError(f"trainer.capture=true: needs trainer.grad_accum=1, got {accum}")
    if precision == "fp16":
        raise ValueError("trainer.capture=true: fp16 loss scaling reads the gradients on the host; "
                         "use trainer.precision=bf16 or no")
    if compile_mode not in (False, None, True, "default", "max-autotune-no-cudagraphs"):
        raise ValueError(f"trainer.capture=true: trainer.compile={compile_mode!r} makes CUDA graphs of its own; "
                         f"use trainer.compile=true (inductor without CUDA graphs) or false")
    if not flat:
        raise ValueError("trainer.capture=true: needs trainer.flat_parameters=true (the captured steps keep the "
                         "gradients in the flat buffers)")


def signature(value: Any) -> Any:
    """A hashable description of what a graph's static inputs must match: shapes, dtypes and
    devices of tensors, other values as they are (``meta`` fields left out), recursively
    through dataclasses."""
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,) + tuple(
            (f.name, signature(getattr(value, f.name))) for f in dataclasses.fields(value) if f.name != "meta")
    return value


def _clone(value: Any) -> Any:
    """``value`` with every tensor cloned (the static inputs of a graph)."""
    if isinstance(value, Tensor):
        return value.clone()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _clone(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    return value


def _copy_into(static: Any, value: Any) -> None:
    """Copy every tensor of ``value`` into the matching tensor of ``static`` (same signature)."""
    if isinstance(static, Tensor):
        static.copy_(value, non_blocking=True)
    elif dataclasses.is_dataclass(static) and not isinstance(static, type):
        for f in dataclasses.fields(static):
            _copy_into(getattr(static, f.name), getattr(value, f.name))


class CapturedSteps:
    """The training loop's steps as CUDA graph replays (see the module's text); the step
    interface of `gno_ext.training.steps.Steps`.

    Parameters
    ----------
    flat : FlatParameters
        The parameters the optimizer steps, as flat buffers.
    optimizer : torch.optim.Optimizer
        Over ``flat.param_groups``, capturable (``capturable=True``), with tensor learning
        rates; its state must exist (run one eager step first).
    objective : callable
        ``objective(batch, groups, dro) -> (values to log, backward_loss)``: the forward pass
        and the loss, as the eager loop computes them (`gno_ext.training.steps.Objective`).
    clip : float or None
        Maximum gradient norm (clipped inside the graph), or None.
    stream : torch.cuda.Stream
        The stream the loop runs on (not the default stream), on which the graphs are captured.
    warmup : int
        Forward-backward runs before each capture (they change no parameter).
    average : bool
        Average the gradients over the processes in the graph (`FlatParameters.average_grads`),
        before the clipping: for runs on several processes whose model is not wrapped in DDP.
    """

    replayed = True  # (the `Steps` interface: these steps are CUDA graph replays)

    def __init__(self, flat: FlatParameters, optimizer: Any, objective: Objective,
                 clip: float | None, stream: torch.cuda.Stream, warmup: int = 2, average: bool = False) -> None:
        self.flat, self.optimizer, self.objective, self.clip = flat, optimizer, objective, clip
        self.stream, self.warmup, self.average = stream, warmup, average
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[Any, tuple[Callable[[], None], PDEBatch, Tensor, dict[str, Tensor]]] = {}
        self._step: Callable[[], None] | None = None
        self._norm: Tensor | None = None

    @property
    def captured(self) -> int:
        """The forward-backward graphs captured so far: one per input signature met."""
        return len(self.graphs)

    def _capture(self, fn: Callable[[], Any], warmup: int) -> Callable[[], None]:
        try:
            # thread_local: a DataLoader's pin-memory thread may use CUDA meanwhile
            return capture_step(fn, warmup=warmup, pool=self.pool, stream=self.stream,
                                capture_error_mode="thread_local")
        except RuntimeError as error:
            raise RuntimeError(f"trainer.capture=true: the training step could not be captured in a CUDA graph "
                               f"({error}). Set trainer.capture=false for this model") from error

    def release(self) -> None:
        """Free every graph and their memory pool; the graphs to come are captured in a new pool
        (the optimizer step's too, at its next call). `forward_backward` calls it when the
        objective changes phase (MSE to DRO), after which the old graphs are not replayed: their
        pool would otherwise stay reserved beside the new capture's eager warm-up, which needs a
        step's memory of its own (a 3-D `gno_fno_soft` step at batch 64 ran out of an 80 GB
        GPU's memory there)."""
        self.graphs.clear()
        self._step, self._norm = None, None
        self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def forward_backward(self, batch: PDEBatch, groups: Tensor, dro: bool, last_micro: bool = True) -> Tensor:
        """Replay (capturing it first for a new signature) the forward and backward passes on
        ``batch``, which leave the gradients, clipped, in the flat buffers. Returns the values to
        log (the loss first): a device tensor that the next replay overwrites, as is the
        gradient norm it keeps for `gradient_norm`. (``last_micro``: always, the captured steps accumulate no gradients.)"""
        key = (signature(batch), signature(groups), dro)
        if key not in self.graphs:
            if any(k[2] != dro for k in self.graphs):  # a new phase of the objective
                self.release()
            static, static_groups = _clone(batch), groups.clone()
            out: dict[str, Tensor] = {}

            def run() -> None:
                loss, backward_loss = self.objective(static, static_groups, dro)
                backward_loss.backward()
                self.flat.gather_grads()
                if self.average:
                    self.flat.average_grads()
                out["loss"] = loss.detach()
                params = list(self.flat.parameters())
                if self.clip:
                    out["norm"] = torch.nn.utils.clip_grad_norm_(params, self.clip, foreach=True)
                else:  # the norm all the same, for the non-finite guard
                    out["norm"] = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)

            # the warm-up runs and the capture must leave an objective's running state as it was
            running = self.objective.running.tensors() if self.objective.running is not None else []
            state = [t.clone() for t in running]
            self.graphs[key] = (self._capture(run, self.warmup), static, static_groups, out)
            for t, saved in zip(running, state):
                t.copy_(saved)
        replay, static, static_groups, out = self.graphs[key]
        _copy_into(static, batch)
        static_groups.copy_(groups, non_blocking=True)
        replay()
        self._norm = out["norm"]
        return out["loss"]

    def gradient_norm(self, clean: bool) -> float:
        """The gradient norm of the last replay (before clipping, if any), or NaN if not ``clean``:
        the replay has already gathered, averaged and clipped the gradients."""
        return float(self._norm) if clean else float("nan")

    def optimizer_step(self) -> None:
        """Replay the optimizer step (captured on the first call, after a forward-backward
        graph has given the buffers their gradients)."""
        if self._step is None:
            self._step = self._capture(self.optimizer.step, warmup=0)
        self._step()

    def zero_grad(self) -> None:
        """Nothing to do: every replay overwrites the flat buffers' gradients in full."""

    def running(self) -> contextlib.AbstractContextManager[Any]:
        """Nothing: the caller runs on ``stream`` (see `CapturingSteps.running`)."""
        return contextlib.nullcontext()

    def updated(self) -> None:
        pass


class CapturingSteps:
    """The steps of ``trainer.capture=true``: ``eager`` steps until the first update has made
    the optimizer's state, then the steps that ``captured(stream)`` makes (`CapturedSteps`
    on the loop's stream); the whole loop on one side stream (`running`). The `Steps`
    interface, so the loop runs them as it runs eager steps."""

    def __init__(self, eager: Steps, captured: Callable[[torch.cuda.Stream], Steps]) -> None:
        self.steps, self._captured = eager, captured
        self.stream: torch.cuda.Stream | None = None

    @property
    def replayed(self) -> bool:
        return self.steps.replayed

    @property
    def captured(self) -> int:
        """The forward-backward graphs captured so far (0 before the first replay)."""
        return getattr(self.steps, "captured", 0)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The loop on a side stream of its own (`side_stream`)."""
        with side_stream() as self.stream:
            yield

    def updated(self) -> None:
        if not self.steps.replayed:  # the optimizer's state exists: replay from now on
            self.steps = self._captured(self.stream)

    def forward_backward(self, batch: Any, groups: Tensor, dro: bool, last_micro: bool) -> Tensor:
        return self.steps.forward_backward(batch, groups, dro, last_micro)

    def gradient_norm(self, clean: bool) -> float:
        return self.steps.gradient_norm(clean)

    def optimizer_step(self) -> None:
        self.steps.optimizer_step()

    def zero_grad(self) -> None:
        self.steps.zero_grad()


def training_steps(training: Any, objective: Objective, clip: float | None, accum: int, capture: bool) -> Steps:
    """The loop's steps for ``training`` (`gno_ext.training.setup.Training`): `EagerSteps`,
    with ``capture`` (``trainer.capture``) inside `CapturingSteps`."""
    eager = EagerSteps(training.model, objective, training.accelerator, training.optimizer, training.flat,
                       training.average, clip, accum)
    if not capture:
        return eager
    return CapturingSteps(eager, lambda stream: CapturedSteps(training.flat, unwrap_optimizer(training.optimizer),
                                                              objective, clip, stream, average=training.average))
