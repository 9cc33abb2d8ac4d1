r"""The training loop behind ``recipes/train.py``: Accelerate, the DRO curriculum, checkpoints, evaluation.

`train` takes the resolved recipe configuration (a plain mapping, as Hydra composes it from
``recipes/conf``) and runs one job on whatever Accelerate finds: one CPU, one GPU, or DDP over
many GPUs and nodes (``accelerate launch`` or ``torchrun``).

* Objective: per-sample MSE on fields scaled by the training data's per-channel standard
  deviation; plain mean for the first ``P`` epochs, then group DRO (log-sum-exp) over
  boundary-configuration x parameter-bin groups, reduced across processes before the
  log-sum-exp (`gno_ext.training.objective.global_objective`). Batches hold one boundary
  configuration each, visited in turn (Algorithm 1 of the paper).
* Optimiser: AdamW (no weight decay on biases, norms and embeddings' 1-D parameters), cosine
  schedule with linear warm-up, gradient clipping, optional EMA of the weights. By default
  (``trainer.flat_parameters``) the optimizer steps one flat buffer per parameter group, of
  which the parameters are views (`gno_ext.training.flat.FlatParameters`): a few large
  tensors instead of hundreds of small ones.
* Speed: ``trainer.compile`` (inductor, optionally with CUDA graphs of the model), and
  ``trainer.capture`` (the whole step replayed from CUDA graphs, `gno_ext.training.captured`;
  on several processes with ``trainer.grad_sync=flat``: the model outside DDP and the flat
  buffers' gradients averaged by the loop, `resolve_grad_sync`).
* Non-finite losses or gradients: the update is skipped and counted; after
  ``trainer.max_nonfinite`` consecutive ones the run stops with an error.
* Precision: bf16 where every device supports it, else fp16 with loss scaling, else fp32.
* One run folder, chosen from the configuration (the same in every process); only the main
  process writes.
"""

from __future__ import annotations

import datetime
import json
import math
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm.auto import tqdm

from gno_ext.layers.embeddings import field_statistics
from gno_ext.layers.mixture import has_dispatch
from gno_ext.losses import mse_per_sample, nmse
from gno_ext.models.registry import get_model, model_class, save_checkpoint
from gno_ext.schema import collate
from gno_ext.training.captured import CapturedSteps, check_capture_settings
from gno_ext.training.checkpoint import (
    latest_checkpoint,
    load_training_checkpoint,
    save_training_checkpoint,
)
from gno_ext.training.data import (
    CurriculumBatchSampler,
    GroupBinner,
    batch_to,
    data_spec,
    model_kwargs_from_data,
    open_split,
    parameter_names,
    parameter_values,
    prepare_data,
    resolved_root,
    rollout_indices,
    trajectory_lengths,
    window_boundary_kinds,
)
from gno_ext.training.evaluate import evaluate_rollouts, write_report
from gno_ext.training.flat import FlatParameters
from gno_ext.training.objective import (
    NonFiniteGuard,
    choose_precision,
    global_objective,
)

__all__ = ["train", "run_dir_of", "evaluate_run", "evaluate_saved", "training_groups", "resolve_grad_sync"]

# keys that may change between a run and its resumption
RESUME_FREE = ("resume", "overwrite", "run_dir", "trainer.epochs", "trainer.max_steps", "trainer.progress",
               "trainer.num_workers", "eval", "trainer.checkpoint_every", "data.root", "trainer.capture",
               "trainer.grad_sync")


def _flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def run_dir_of(cfg: Mapping[str, Any]) -> Path:
    """The run folder: ``run_dir`` if set, else ``output_root/RECIPE/MODEL-SIZE-seedN`` (MODEL is
    ``model.label`` when set, e.g. ``vit-5``, else ``model.name``)."""
    if cfg.get("run_dir"):
        return Path(cfg["run_dir"])
    label = cfg["model"].get("label") or cfg["model"]["name"]
    return Path(cfg.get("output_root", "runs")) / cfg["recipe"]["name"] / f"{label}-{cfg['size']}-seed{cfg['seed']}"


def _check_resume_config(saved: Mapping[str, Any], cfg: Mapping[str, Any], path: Path) -> None:
    a, b = _flatten(saved), _flatten(cfg)
    free = lambda k: any(k == f or k.startswith(f + ".") for f in RESUME_FREE)
    diff = sorted(k for k in set(a) | set(b) if not free(k) and a.get(k) != b.get(k))
    if diff:
        detail = "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:8])
        raise ValueError(f"resume from {path}: the configuration differs from the checkpoint's ({detail}). "
                         f"Resume with the same settings, or start a new run (run_dir=... or overwrite=true).")


def compile_model(model: nn.Module, mode: bool | str = True, options: Mapping[str, Any] | None = None) -> nn.Module:
    """`torch.compile` with a mode *and* extra inductor options.

    `torch.compile` takes either ``mode`` or ``options``; this merges the mode's own options
    (``torch._inductor.list_mode_options``, e.g. CUDA graphs for ``"reduce-overhead"``) with
    ``options``, which win.

    Parameters
    ----------
    model : nn.Module
    mode : bool or str
        True (the default mode), or a mode name: ``"reduce-overhead"``, ``"max-autotune"``, ...
    options : mapping, optional
        Inductor options, e.g. ``{"combo_kernels": True}`` (which runs independent small
        kernels together; a paper-size GNO training step 6 to 7 % faster on an H100, see the
        benchmarks page).

    Examples
    --------
    >>> net = compile_model(nn.Linear(4, 4), "reduce-overhead", {"combo_kernels": True})
    """
    name = "default" if mode is True else str(mode)
    if not options:
        return torch.compile(model, mode=None if mode is True else name)
    from torch._inductor import config, list_mode_options

    modes = list_mode_options(None)
    if name not in modes:
        raise ValueError(f"compile mode {name!r}: unknown; one of true, {', '.join(sorted(modes))}")
    unknown = sorted(set(options) - set(config.get_config_copy()))
    if unknown:
        raise ValueError(f"compile options: {unknown} are not inductor options (torch._inductor.config)")
    return torch.compile(model, options={**list_mode_options(name), **dict(options)})


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
    optimizer step to Python (benchmarks/history.md, sixth round).

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


def _set_lr_type(groups: list[dict[str, Any]], device: torch.device, capture: bool) -> None:
    """Each parameter group's learning rate as a tensor on ``device`` for a captured optimizer
    step (the scheduler fills it in place), else as a float. ``initial_lr``, from which the
    scheduler computes, stays a float."""
    for g in groups:
        value = float(g["lr"])
        g["initial_lr"] = float(g.get("initial_lr", value))
        g["lr"] = torch.tensor(value, device=device) if capture else value


GRAD_SYNC = ("auto", "ddp", "flat")


def resolve_grad_sync(requested: Any, world: int, capture: bool, flat: bool) -> str:
    """``trainer.grad_sync`` as the run uses it: ``ddp`` (the model wrapped in DDP, whose hooks
    all-reduce the gradients in buckets during the backward pass) or ``flat`` (the model
    outside DDP; after the backward pass the loop averages the flat buffers' gradients, one
    all-reduce per buffer: `FlatParameters.average_grads`). ``auto`` is ``flat`` for a captured
    step on several processes (a CUDA graph does not replay DDP's hooks), else ``ddp``."""
    if requested not in GRAD_SYNC:
        raise ValueError(f"trainer.grad_sync: expected one of {', '.join(GRAD_SYNC)}, got {requested!r}")
    if requested == "auto":
        return "flat" if capture and world > 1 else "ddp"
    if requested == "flat" and not flat:
        raise ValueError("trainer.grad_sync=flat: needs trainer.flat_parameters=true (the gradients are averaged "
                         "in the flat buffers)")
    return requested


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on the weights only: not on 1-D parameters (norms, embeddings' vectors) nor
    on biases, stacked ones included (``AttentionKernelBank.q_bias``, shape (K, out))."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        leaf = name.rsplit(".", 1)[-1]
        (no_decay if p.ndim < 2 or leaf == "bias" or leaf.endswith("_bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _schedule(kind: str, warmup_fraction: float, floor: float, total_steps: int):
    warmup = int(round(warmup_fraction * total_steps))
    if kind not in ("cosine", "constant"):
        raise ValueError(f"optimizer.schedule: expected cosine or constant, got {kind!r}")

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def _fetch(ds: Dataset, indices: list[int]):
    """A batch of windows, through the dataset's batched reader when it has one."""
    return collate(ds.__getitems__(indices) if hasattr(ds, "__getitems__") else [ds[i] for i in indices])


def _spread(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)`` (all when ``k >= n``)."""
    return list(range(n)) if k >= n else [int(i) for i in np.linspace(0, n - 1, k).round()]


def _check_finite_windows(fields: torch.Tensor, windows: list[int], root: Any) -> None:
    """Raise a `ValueError` naming the first training window (of those read to set the
    normalisation) whose fields are not all finite: with it the statistics, and so every
    prediction, would be NaN."""
    bad = ~torch.isfinite(fields).flatten(1).all(1)
    if bad.any():
        first = int(bad.nonzero()[0])
        raise ValueError(f"data under {root}: training window {windows[first]} holds non-finite field values "
                         f"({int(bad.sum())} of the {len(windows)} windows read to set the normalisation do)")


@torch.no_grad()
def _validate(model: nn.Module, ds: Dataset, scale: torch.Tensor, device: torch.device, batch_size: int,
              n_batches: int, rank: int, world: int, autocast: Any) -> float:
    """Mean one-step nMSE over up to ``n_batches`` batches of ``ds`` (spread over the split),
    sharded over processes."""
    idx = _spread(len(ds), n_batches * batch_size)
    loader = DataLoader(Subset(ds, idx[rank::world]), batch_size=batch_size, collate_fn=collate)
    total = torch.zeros(2, dtype=torch.float64, device=device)
    model.eval()
    for batch in loader:
        batch = batch_to(batch, device)
        with autocast():
            pred = model(batch.u_in, theta=batch.theta, theta_field=batch.theta_field, bc=batch.bc, grid=batch.grid)
        e = nmse(pred.float(), batch.u_out[:, :1].float())
        total += torch.stack([e.sum().double(), torch.tensor(float(len(e)), device=device, dtype=torch.float64)])
    model.train()
    if world > 1:
        dist.all_reduce(total)
    return float(total[0] / total[1].clamp_min(1))


def _fresh_accelerate_state() -> None:
    """Forget the accelerate state that an earlier `train` call left in this process, so that a
    later call may run in another precision or on another device (accelerate refuses to change
    them once set: on a GPU, a bf16 run followed by ``trainer.precision=no`` in one notebook
    failed). Only in a single process: a distributed job keeps its process group."""
    from accelerate.state import AcceleratorState, PartialState

    if PartialState._shared_state and PartialState().num_processes == 1:
        AcceleratorState._reset_state(reset_partial_state=True)


def _fused_adamw(groups: list[dict[str, Any]], device: torch.device) -> bool:
    """Whether AdamW runs fused (one kernel for all parameters): on GPUs, where every parameter
    is real. Fused AdamW refuses complex parameters, such as the spectral weights of
    neuraloperator's FNO; those models take the multi-tensor (foreach) AdamW instead."""
    return device.type == "cuda" and all(p.is_floating_point() for g in groups for p in g["params"])


def _wait_for_everyone(state) -> None:
    """All processes meet here (``state``: accelerate's `PartialState` or `Accelerator`).

    Accelerate's own ``wait_for_everyone`` passes each process's local index to the barrier as
    a device id, also for CPU processes (gloo), and torch then places the barrier's tensor on
    that GPU wherever CUDA is present: CPU processes on a machine with fewer GPUs than
    processes failed with "invalid device ordinal" (accelerate 1.15, torch 2.11). CPU processes
    therefore meet in a barrier without a device, which gloo holds on the CPU."""
    from accelerate.utils import DistributedType

    if state.distributed_type == DistributedType.MULTI_CPU:
        torch.distributed.barrier()
    else:
        state.wait_for_everyone()


# Numeric settings checked when a run starts, before anything is generated, trained or
# overwritten (many would otherwise fail late, or train wrongly without a word):
# key, default, lowest, highest, integer, null allowed; "> 0": above zero.
SETTINGS = (
    ("trainer.epochs", None, 1, math.inf, True, False),
    ("trainer.batch_size", None, 1, math.inf, True, False),
    ("trainer.grad_accum", 1, 1, math.inf, True, False),
    ("trainer.log_every", 10, 1, math.inf, True, False),
    ("trainer.val_every", 1, 1, math.inf, True, False),
    ("trainer.val_batches", 4, 0, math.inf, True, False),
    ("trainer.checkpoint_every", 0, 0, math.inf, True, True),
    ("trainer.keep_checkpoints", 3, 0, math.inf, True, False),
    ("trainer.max_steps", None, 1, math.inf, True, True),
    ("trainer.clip_grad", None, "> 0", math.inf, False, True),  # (a negative norm reversed the gradients)
    ("trainer.ema.decay", 0.999, 0, 1, False, False),
    ("trainer.curriculum.warmup_fraction", 0.7, 0, 1, False, False),
    ("trainer.curriculum.warmup_epochs", None, 0, math.inf, True, True),
    ("optimizer.lr", None, 0, math.inf, False, False),
    ("optimizer.weight_decay", 0.0, 0, math.inf, False, False),
    ("optimizer.warmup_fraction", 0.05, 0, 1, False, False),
    ("optimizer.min_lr_ratio", 0.0, 0, 1, False, False),
    ("trainer.dro.tau", 1.0, "> 0", math.inf, False, False),  # (infinity gave a NaN loss)
    ("trainer.dro.bins", 8, 1, math.inf, True, False),
    ("trainer.max_nonfinite", 5, 1, math.inf, True, False),
    ("trainer.num_workers", 0, 0, math.inf, True, False),
    ("trainer.dist_timeout_minutes", 120, "> 0", math.inf, False, False),
)


def _setting(flat: Mapping[str, Any], key: str, default: Any, low: float | str, high: float, integer: bool,
             nullable: bool) -> Any:
    """The value of the dotted ``key`` of the flattened configuration ``flat`` (``default`` where
    it is absent), checked."""
    value = flat.get(key, default)
    if value is None and nullable:
        return None
    wanted = "an integer" if integer else "a number"
    bounds = "above 0" if low == "> 0" else f"in [{low}, {high}]" if high < math.inf else f">= {low}"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or (integer and value != int(value)) or value > high \
            or (value <= 0 if low == "> 0" else value < low):
        raise ValueError(f"{key}: expected {wanted} {bounds}{' or null' if nullable else ''}, got {value!r}")
    return int(value) if integer else float(value)


def _check_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The values of `SETTINGS`, checked, by key (the training loop reads them from here, so
    their defaults are written once); ``trainer.curriculum.warmup_epochs`` is resolved from
    ``warmup_fraction`` where it is null."""
    flat = _flatten(cfg)
    values = {key: _setting(flat, key, *rule) for key, *rule in SETTINGS}
    if values["trainer.curriculum.warmup_epochs"] is None:
        values["trainer.curriculum.warmup_epochs"] = int(round(values["trainer.curriculum.warmup_fraction"]
                                                               * values["trainer.epochs"]))
    return values


def train(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Run one recipe (training, evaluation, report) from its resolved configuration.

    In a single process (a notebook, say) it may be called again with another precision or
    device: each call starts from a fresh accelerate state.

    Returns
    -------
    dict
        ``run_dir``, ``step``, ``skipped`` and the evaluation summary (``report``).
    """
    accelerator, result = _run(cfg)
    # The process group goes last, once `_run`'s frame, and with it the DDP model, is gone
    # (`free_memory` drops the accelerator's own references). Destroyed before the model, gloo's
    # group lost its last reference in DDP's reducer, whose destructor holds the GIL while it
    # joins gloo's worker thread, and that thread may need the GIL to free the tensors of the
    # last collective: a process then hung at exit (4 of 71 two-process CPU runs).
    accelerator.free_memory()
    accelerator.end_training()
    return result


def _run(cfg: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`train` up to the destruction of the process group: the accelerator and the result."""
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DistributedDataParallelKwargs, set_seed

    cfg = json.loads(json.dumps(cfg))  # a plain, private copy
    tr, opt_cfg, data_cfg = cfg["trainer"], cfg["optimizer"], cfg["data"]
    data_cfg["root"] = resolved_root(data_cfg)
    device_req = tr.get("device", "auto")
    if device_req not in ("auto", "cpu"):
        raise ValueError(f"trainer.device: expected auto or cpu, got {device_req!r} (GPUs are chosen by the launcher)")
    settings = _check_settings(cfg)
    warmup_epochs, tau = settings["trainer.curriculum.warmup_epochs"], settings["trainer.dro.tau"]
    # Accelerate sets up several CPU processes (gloo) only when told cpu=True
    use_cpu = device_req == "cpu" or not torch.cuda.is_available()
    _fresh_accelerate_state()
    # the other processes wait while the main one generates data or evaluates: a long timeout
    timeout = datetime.timedelta(minutes=settings["trainer.dist_timeout_minutes"])
    state = PartialState(cpu=use_cpu, timeout=timeout)
    precision = choose_precision(tr.get("precision", "auto"), state.device.type, state.num_processes)
    run_dir = run_dir_of(cfg)
    resume = cfg.get("resume", False)
    resume = "false" if resume in (False, None, "false", "False") else str(resume)
    checkpoint, replace = None, False
    _check_run_dir(run_dir, resume, bool(cfg.get("overwrite", False)))
    if resume == "auto":
        checkpoint = latest_checkpoint(run_dir)
    elif resume != "false":
        checkpoint = Path(resume)
        if not (checkpoint / "trainer_state.json").is_file():
            raise FileNotFoundError(f"resume={resume}: not a complete training checkpoint folder")
    elif run_dir.exists() and any(run_dir.iterdir()):
        if not cfg.get("overwrite", False):
            raise FileExistsError(f"{run_dir} already holds a run. Continue it with resume=auto, start afresh with "
                                  f"overwrite=true, or choose another folder with run_dir=...")
        replace = True  # the old run is deleted when this one first writes (below): an error before then loses nothing
    _wait_for_everyone(state)
    if checkpoint is not None:
        saved = yaml.safe_load((checkpoint / "config.yaml").read_text())
        _check_resume_config(saved, cfg, checkpoint)

    main, rank, world, device = state.is_main_process, state.process_index, state.num_processes, state.device
    capture, use_flat = bool(tr.get("capture", False)), bool(tr.get("flat_parameters", True))
    grad_sync = resolve_grad_sync(tr.get("grad_sync", "auto"), world, capture, use_flat)
    average = grad_sync == "flat" and world > 1  # the loop averages the gradients itself, without DDP
    if capture:  # refused before any work is done
        check_capture_settings(device, world, settings["trainer.grad_accum"], precision, tr.get("compile", False),
                               use_flat, grad_sync)
    set_seed(int(cfg["seed"]))
    say = state.print

    # ---- data
    if main:  # the others wait until the data exist
        prepare_data(data_cfg, progress=bool(tr.get("progress", True)))
    _wait_for_everyone(state)
    t_in = int(data_cfg.get("n_steps_input", 1))
    train_ds = open_split(data_cfg, "train", t_in, 1)
    spec, values, kinds, binner = training_groups(cfg, train_ds)
    configs = binner.configuration_ids(torch.as_tensor(np.ascontiguousarray(kinds))).numpy()
    sampler = CurriculumBatchSampler(configs, settings["trainer.batch_size"], rank, world, int(cfg["seed"]),
                                     tr["curriculum"].get("order", "interleave"))
    workers = settings["trainer.num_workers"]
    loader = DataLoader(train_ds, batch_sampler=sampler, collate_fn=collate, num_workers=workers,
                        pin_memory=device.type == "cuda", persistent_workers=workers > 0,  # no restart per epoch
                        generator=torch.Generator().manual_seed(int(cfg["seed"])))

    # ---- model
    name = cfg["model"]["name"]
    kwargs = model_kwargs_from_data(model_class(name), spec, cfg["model"].get("kwargs") or {})
    model = get_model(name, **kwargs)
    fit_windows = _spread(len(train_ds), 256)
    fit_batch = _fetch(train_ds, fit_windows)
    fields = torch.cat([fit_batch.u_in, fit_batch.u_out], 1)
    _check_finite_windows(fields, fit_windows, data_cfg["root"])
    if hasattr(model, "fit_normalization"):
        model.fit_normalization(fields, values)
    scale = field_statistics(fields.float(), spec.channels, spec.ndim)[1] if tr.get("loss_normalization", True) \
        else torch.ones(spec.channels)
    scale = scale.view(1, 1, -1, *([1] * spec.ndim)).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    if not any(p.requires_grad for p in model.parameters()):  # a reference with nothing to learn (persistence)
        return _evaluate_only(cfg, model, binner, run_dir, device, precision, use_cpu, main, replace, say)

    epochs, accum = settings["trainer.epochs"], settings["trainer.grad_accum"]
    steps_per_epoch = math.ceil(len(sampler.global_batches(0)) / accum)
    total_steps = epochs * steps_per_epoch
    if settings["trainer.max_steps"] is not None:
        total_steps = min(total_steps, settings["trainer.max_steps"])
    raw = model
    compile_mode = tr.get("compile", False)
    if compile_mode:  # compiled forward (and backward); the weights stay those of `raw`
        model = compile_model(model, compile_mode, tr.get("compile_options"))
    find_unused = tr.get("find_unused_parameters", "auto")
    if find_unused == "auto":  # DDP must look for unused parameters only where samples are dispatched
        find_unused = has_dispatch(raw)
    accelerator = Accelerator(
        cpu=use_cpu, mixed_precision=precision, log_with="tensorboard" if tr.get("tensorboard", True) else None,
        project_dir=str(run_dir),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=bool(find_unused))])
    # grad_sync=flat: the model stays outside DDP, whose hooks a CUDA graph would not replay
    model = model.to(device) if grad_sync == "flat" else accelerator.prepare(model)
    groups = _param_groups(raw, settings["optimizer.weight_decay"])
    flat = None
    if use_flat:
        # the parameters as views of one buffer per group (FlatParameters): made once the model
        # is on its device and, under DDP, synchronised (the other processes' copies get new storage)
        flat = FlatParameters(groups)
        groups = flat.param_groups
    if average:  # what DDP does when it wraps a model: every process starts from process 0's state
        flat.broadcast(0)
        with torch.no_grad():
            for buffer in raw.buffers():
                dist.broadcast(buffer, 0)
    optimizer = torch.optim.AdamW(groups, lr=settings["optimizer.lr"],
                                  betas=tuple(opt_cfg.get("betas", (0.9, 0.999))),
                                  fused=_fused_adamw(groups, device),
                                  capturable=capture)
    _set_lr_type(optimizer.param_groups, device, capture)
    schedule = _schedule(opt_cfg.get("schedule", "cosine"), settings["optimizer.warmup_fraction"],
                         settings["optimizer.min_lr_ratio"], total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    optimizer = accelerator.prepare(optimizer)
    ema = None
    if tr.get("ema", {}).get("enabled", False):
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(raw, multi_avg_fn=get_ema_multi_avg_fn(settings["trainer.ema.decay"]), use_buffers=True)

    guard = NonFiniteGuard(settings["trainer.max_nonfinite"])
    step, epoch0, batch0, seen = 0, 0, 0, 0
    if checkpoint is not None:
        st = load_training_checkpoint(checkpoint, raw, optimizer, scheduler, ema)
        _set_lr_type(optimizer.param_groups, device, capture)  # as this run needs them, whatever was saved
        step, epoch0, batch0, seen = st["step"], st["epoch"], st["batch"], st.get("samples", 0)
        guard.skipped = st.get("skipped", 0)
        say(f"resumed from {checkpoint} (step {step}, epoch {epoch0}, batch {batch0})")

    if main:
        _open_run_dir(run_dir, cfg, replace)
    if replace:
        _wait_for_everyone(accelerator)
    if tr.get("tensorboard", True):
        hp = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in _flatten(cfg).items()}
        accelerator.init_trackers("tb", config=hp)
    averaged = f" (gradients averaged by {grad_sync})" if world > 1 else ""
    say(f"run {run_dir}: {name} ({n_params / 1e6:.2f} M parameters), {len(train_ds)} training windows, "
        f"{len(binner.configurations)} boundary configuration(s), {binner.n_groups} DRO groups, {world} process(es) "
        f"on {device.type}{averaged}, precision {precision}, {total_steps} steps (MSE for {warmup_epochs} epochs, "
        f"then DRO)")

    valid_ds = None
    try:
        valid_ds = open_split(data_cfg, "valid", t_in, 1)
    except FileNotFoundError:
        say("no validation split: skipping validation")
    metrics_file = run_dir / "metrics.jsonl"
    balance_weight = float(cfg["model"].get("balance_weight", 0.0))
    physics_weight = float(cfg["model"].get("physics_weight", 0.0))
    clip = settings["trainer.clip_grad"]
    ckpt_every = settings["trainer.checkpoint_every"] or 0
    log_every = settings["trainer.log_every"]
    done = step >= total_steps

    def checkpoint_now(epoch: int, batch: int) -> None:
        if main:
            save_training_checkpoint(run_dir, step, raw, optimizer, scheduler,
                                     {"epoch": epoch, "batch": batch, "skipped": guard.skipped, "samples": seen},
                                     cfg, ema=ema, keep=settings["trainer.keep_checkpoints"])
        _wait_for_everyone(accelerator)

    def log(values: dict[str, float]) -> None:
        if tr.get("tensorboard", True):
            accelerator.log(values, step=step)
        if main:
            with open(metrics_file, "a") as f:
                f.write(json.dumps({"step": step, **values}) + "\n")

    def objective(batch: Any, groups: torch.Tensor, dro: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward pass and the loss: ``(loss to log, loss to differentiate)``."""
        with accelerator.autocast():
            pred = model(batch.u_in, theta=batch.theta, theta_field=batch.theta_field, bc=batch.bc, grid=batch.grid)
        per_sample = mse_per_sample(pred.float() / scale, batch.u_out[:, :1].float() / scale)
        loss, backward_loss = global_objective(per_sample, groups, binner.n_groups, dro, tau, world)
        if balance_weight and hasattr(raw, "balance_loss"):
            backward_loss = backward_loss + balance_weight * raw.balance_loss()
        if physics_weight and hasattr(raw, "physics_loss"):  # PINO's residual term
            backward_loss = backward_loss + physics_weight * raw.physics_loss(batch, pred)
        return loss, backward_loss

    captured, loop_stream = None, None
    if capture:  # the whole loop on one side stream (see gno_ext.training.captured)
        loop_stream = torch.cuda.Stream()
        loop_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(loop_stream) if capture else nullcontext():
        model.train()
        t0, window_seen, data_wait = time.perf_counter(), 0, [0.0]  # data_wait[0]: seconds waited for the loader
        for epoch in range(epoch0, epochs):
            if done:
                break
            dro = epoch >= warmup_epochs
            sampler.set_epoch(epoch, batch0 if epoch == epoch0 else 0)
            n_batches = len(sampler)
            bar = tqdm(total=n_batches, desc=f"epoch {epoch + 1}/{epochs} ({'DRO' if dro else 'MSE'})",
                       disable=not (main and tr.get("progress", True)), leave=False)
            batch_index = sampler.start
            for micro, batch in enumerate(_timed(loader, data_wait)):
                # the groups from the batch still on the host: on the device their computation would
                # copy the boundary types back, and wait for all the work queued before
                groups = binner(batch.theta, batch.bc.kind).to(device, non_blocking=True)
                batch = batch_to(batch, device)
                last_micro = (micro + 1) % accum == 0 or micro == n_batches - 1
                replayed = captured is not None
                if replayed:  # forward, backward, gradients into the flat buffers, clipping: one replay
                    loss, captured_norm = captured.forward_backward(batch, groups, dro)
                else:
                    with accelerator.no_sync(model) if not last_micro else nullcontext():
                        loss, backward_loss = objective(batch, groups, dro)
                        accelerator.backward(backward_loss / accum)
                # checked once the backward pass is queued (the check waits for the GPU): a non-finite
                # loss in any micro-batch skips the whole update, whose gradients it has reached
                loss_value = float(loss)  # the one wait for the device per micro-batch (the gradient norm's aside)
                guard.check(loss_value, "loss")
                batch_index += 1
                seen += len(batch.theta) * world
                window_seen += len(batch.theta) * world
                bar.update(1)
                if not last_micro:
                    continue
                grad_norm = float("nan")
                if flat is not None and not replayed:  # also when the update is skipped: it drops
                    flat.gather_grads()                    # the parameters' own gradients
                    if average:
                        flat.average_grads()
                if guard.clean:  # the gradient norm (clipped where trainer.clip_grad is set), checked like the loss
                    if replayed:
                        grad_norm = float(captured_norm)
                    else:
                        params = model.parameters() if flat is None else flat.parameters()
                        grad_norm = float(accelerator.clip_grad_norm_(params, float(clip) if clip else math.inf))
                    if precision != "fp16":  # fp16: the loss scaler skips steps with inf gradients itself
                        guard.check(grad_norm, "gradient norm")
                finite = guard.update(step)  # a non-finite loss of any micro-batch, or gradient, skips the update
                if finite:
                    captured.optimizer_step() if replayed else optimizer.step()
                    scheduler.step()
                    if ema is not None:
                        ema.update_parameters(raw)
                    step += 1
                    if capture and captured is None:  # the optimizer's state exists: the next steps are replayed
                        captured = CapturedSteps(flat, getattr(optimizer, "optimizer", optimizer), objective,
                                                 float(clip) if clip else None, loop_stream, average=average)
                if not replayed:  # (the captured steps overwrite the flat buffers' gradients in full)
                    optimizer.zero_grad(set_to_none=True)
                bar.set_postfix(loss=f"{loss_value:.3e}")
                if finite and (step % log_every == 0 or step == total_steps):
                    elapsed = time.perf_counter() - t0
                    log({"train/loss": loss_value, "train/lr": float(scheduler.get_last_lr()[0]),
                         "train/grad_norm": grad_norm, "train/dro": float(dro), "train/skipped": guard.skipped,
                         "train/samples_per_s": window_seen / max(elapsed, 1e-9),
                         "train/data_wait": data_wait[0] / max(elapsed, 1e-9)})
                    t0, window_seen, data_wait[0] = time.perf_counter(), 0, 0.0
                if finite and ckpt_every and step % ckpt_every == 0:
                    checkpoint_now(epoch, batch_index)
                if step >= total_steps:
                    done = True
                    break
            bar.close()
            if valid_ds is not None and (epoch + 1) % settings["trainer.val_every"] == 0:
                v = _validate(model, valid_ds, scale, device, settings["trainer.batch_size"], settings["trainer.val_batches"],
                              rank, world, accelerator.autocast)
                log({"valid/nmse_one_step": v})
                say(f"epoch {epoch + 1}: loss {loss_value:.4e}, one-step validation nMSE {v:.4e}")
            finished_epoch = batch_index >= len(sampler.global_batches(epoch))
            checkpoint_now(epoch + 1 if finished_epoch else epoch, 0 if finished_epoch else batch_index)

    if capture:
        torch.cuda.current_stream().wait_stream(loop_stream)

    # ---- final model and evaluation
    final = ema.module if ema is not None else raw
    if main:
        save_checkpoint(final, run_dir / "model", extra={"step": step, "ema": ema is not None})
    _wait_for_everyone(accelerator)
    report = _final_evaluation(cfg, final, binner, run_dir, device, precision, say) if main else None
    _wait_for_everyone(accelerator)
    return accelerator, {"run_dir": str(run_dir), "step": step, "skipped": guard.skipped, "report": report}


def _evaluate_only(cfg: dict[str, Any], model: nn.Module, binner: GroupBinner, run_dir: Path, device: torch.device,
                   precision: str, use_cpu: bool, main: bool, replace: bool,
                   say: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """`_run` for a model without trainable parameters: the run folder, the model and its
    evaluation, no training."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=use_cpu, mixed_precision=precision)
    model = model.to(device)
    say(f"run {run_dir}: {cfg['model']['name']} has no trainable parameters: evaluated, not trained")
    report = None
    if main:
        _open_run_dir(run_dir, cfg, replace)
        save_checkpoint(model, run_dir / "model", extra={"step": 0, "ema": False})
        report = _final_evaluation(cfg, model, binner, run_dir, device, precision, say)
    _wait_for_everyone(accelerator)
    return accelerator, {"run_dir": str(run_dir), "step": 0, "skipped": 0, "report": report}


RUN_MARKER = ".gno_ext_run"
"""The file that marks a folder as a run that gno_ext made: only such a folder is ever deleted
(``overwrite=true``), resumed or trained into once it holds anything."""


def _check_run_dir(run_dir: Path, resume: str, overwrite: bool) -> None:
    """Refuse a ``run_dir`` that holds anything but a run: nothing there is deleted, resumed or
    mixed with a new run. A run written before the marker existed (``config.yaml`` beside a
    ``model/`` or ``checkpoints/``) may be resumed, never deleted."""
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"run_dir={run_dir}: is a file, not a run folder; choose another folder with run_dir=...")
    if not run_dir.exists() or (run_dir / RUN_MARKER).is_file() or not any(run_dir.iterdir()):
        return
    legacy = (run_dir / "config.yaml").is_file() and ((run_dir / "model").is_dir() or (run_dir / "checkpoints").is_dir())
    if legacy and resume != "false" and not overwrite:
        return
    held = sorted(p.name for p in run_dir.iterdir())
    what = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
    if legacy:
        raise FileExistsError(f"run_dir={run_dir}: a run made before gno_ext marked its runs ({RUN_MARKER}), so "
                              "overwrite=true does not delete it: continue it with resume=auto, delete it yourself, "
                              "or choose another folder with run_dir=...")
    raise FileExistsError(f"run_dir={run_dir}: not a gno_ext run folder (it holds {what}; no {RUN_MARKER}); nothing "
                          "in it is deleted, resumed or written. Choose another folder with run_dir=...")


def _open_run_dir(run_dir: Path, cfg: dict[str, Any], replace: bool) -> None:
    """Create the run folder (replacing the old run where ``overwrite`` asked for it) with its
    marker and its resolved configuration (main process only)."""
    if replace:
        if not (run_dir / RUN_MARKER).is_file():  # checked again at the moment of deleting
            raise FileExistsError(f"run_dir={run_dir}: not a gno_ext run folder (no {RUN_MARKER}); not deleted")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_MARKER).write_text(json.dumps({"made_by": "gno_ext", "purpose": "marks a training run folder; "
                                                  "overwrite=true may delete this folder"}) + "\n")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _final_evaluation(cfg: dict[str, Any], model: nn.Module, binner: GroupBinner, run_dir: Path,
                      device: torch.device, precision: str, say: Callable[[str], None]) -> dict[str, Any] | None:
    """The test rollouts of the final model and their report, unless ``eval.enabled`` is false
    (main process only)."""
    if not cfg.get("eval", {}).get("enabled", True):
        return None
    report = evaluate_run(cfg, model, binner, run_dir / "eval", device, precision, metrics=run_dir / "metrics.jsonl")
    worst = report["nmse"]["worst_group"]
    say(f"test rollout ({report['steps']} steps, {report['trajectories']} trajectories): nMSE "
        f"{report['nmse']['mean']:.4e} +- {report['nmse']['std']:.4e}, worst group {worst['label']} "
        f"{worst['nmse_mean']:.4e}; relative L2 {report['rel_l2']['mean']:.4e}. Report: {run_dir / 'eval' / 'report.md'}")
    return report


def _timed(batches: Iterable[Any], waited: list[float]) -> Iterator[Any]:
    """Yield from ``batches``, adding the seconds spent waiting for each item to ``waited[0]``."""
    it = iter(batches)
    while True:
        start = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        waited[0] += time.perf_counter() - start
        yield item


def training_groups(cfg: Mapping[str, Any], train_ds: Dataset) -> tuple[Any, Any, Any, GroupBinner]:
    """From the training split's metadata, read once: the model sizes (`DataSpec`), the parameter
    values, the boundary types of every window, and the run's DRO groups (boundary
    configurations x parameter bins)."""
    values, kinds = parameter_values(train_ds), window_boundary_kinds(train_ds)
    spec = data_spec(train_ds, cfg["data"].get("log_params"), values)
    names = parameter_names(train_ds, values.shape[1], cfg.get("recipe", {}).get("parameter"))
    return spec, values, kinds, GroupBinner(values, kinds, int(cfg["trainer"]["dro"]["bins"]), spec.log_params, names)


def evaluate_saved(run_dir: str | Path, checkpoint: str | Path | None = None, out_dir: str | Path | None = None,
                   overrides: Mapping[str, Any] | None = None, device: str | None = None,
                   precision: str | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Evaluate a finished or running run from its folder (what ``recipes/evaluate.py`` does).

    Parameters
    ----------
    run_dir : str or Path
        The run folder (it holds ``config.yaml``).
    checkpoint : str or Path, optional
        A checkpoint folder (default: the run's final ``model/``, else its newest checkpoint).
    out_dir : str or Path, optional
        Where the report goes (default: ``RUN/eval`` for the run's final model, else
        ``RUN/eval/<checkpoint>``, named by the checkpoint's path: the report of any checkpoint,
        of this run or another, stays with the run whose data it used).
    overrides : mapping, optional
        Changes to the ``eval`` section (``steps``, ``split``, ``max_trajectories``, ...).
    device : str, optional
        Default: cuda when available.
    precision : {"auto", "bf16", "fp16", "no"}, optional
        Mixed precision of the rollouts (``"no"``: float32). Default: on a GPU, the run's
        ``trainer.precision``, resolved as training resolves it (`choose_precision`); float32
        elsewhere. So the report reproduces the one that training wrote at its end on the same
        kind of device.
    overwrite : bool
        Replace a report already in the output folder (default: refuse, naming it).
    """
    from gno_ext.models.registry import from_checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir}: not a run folder (no config.yaml)")
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["eval"] = {**cfg.get("eval", {}), **(overrides or {})}
    if checkpoint is None:
        checkpoint = run_dir / "model" if (run_dir / "model").is_dir() else latest_checkpoint(run_dir)
        if checkpoint is None:
            raise FileNotFoundError(f"{run_dir}: no final model and no checkpoint to evaluate")
    checkpoint = Path(checkpoint)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    device_type = torch.device(device).type
    if precision is None:
        precision = cfg.get("trainer", {}).get("precision", "auto") if device_type == "cuda" else "no"
    try:
        precision = choose_precision(precision, device_type)
    except ValueError as error:
        raise ValueError(f"evaluation on {device}, precision {precision!r}: {error}") from None
    model = from_checkpoint(checkpoint, device=device)
    cfg["model"] = {**cfg.get("model", {}), "name": model.model_config["name"]}  # the model evaluated, not the run's
    train_ds = open_split(cfg["data"], "train", int(cfg["data"].get("n_steps_input", 1)), 1, metadata_only=True)
    if out_dir is None:
        own = checkpoint.resolve() == (run_dir / "model").resolve()
        out_dir = run_dir / "eval" if own else run_dir / "eval" / _checkpoint_label(run_dir, checkpoint)
    if (Path(out_dir) / "report.json").exists() and not overwrite:
        raise FileExistsError(f"{Path(out_dir) / 'report.json'}: an earlier report is there; write this one elsewhere "
                              "(--out DIR) or replace it (--overwrite)")
    return evaluate_run(cfg, model, training_groups(cfg, train_ds)[3], Path(out_dir), device, precision,
                        checkpoint=str(checkpoint), metrics=run_dir / "metrics.jsonl")


def _checkpoint_label(run_dir: Path, checkpoint: Path) -> str:
    """A folder name for a checkpoint's report: its path inside the run (``checkpoints-step_00000040``),
    or its last three path parts for a checkpoint of another folder (``other-run-model``)."""
    path = checkpoint.resolve()
    try:
        parts = path.relative_to(run_dir.resolve()).parts
    except ValueError:
        parts = path.parts[-3:]
    return "-".join(p for p in parts if p not in ("", "/"))


def evaluate_run(cfg: Mapping[str, Any], model: nn.Module, binner: GroupBinner, out_dir: Path,
                 device: torch.device | str = "cpu", precision: str = "no", checkpoint: str | None = None,
                 metrics: Path | None = None) -> dict[str, Any]:
    """Roll out ``model`` on the test split of ``cfg``'s data and write the report into ``out_dir``
    (``precision``: ``"bf16"`` or ``"fp16"`` for autocast, ``"no"`` for float32; the report
    records it, and ``checkpoint``, the folder the model came from, where given; ``metrics``,
    the run's ``metrics.jsonl``, gives the report its training curve)."""
    ev, data_cfg = cfg.get("eval", {}), cfg["data"]
    t_in = int(data_cfg.get("n_steps_input", 1))
    steps = int(ev.get("steps", 10))
    split = ev.get("split", "test")
    longest = max(trajectory_lengths(open_split(data_cfg, split, t_in, 1, metadata_only=True)))
    if steps > longest - t_in:
        print(f"eval.steps={steps} but the {split} trajectories have {longest} frames: rolling out {longest - t_in}")
        steps = longest - t_in
    ds = open_split(data_cfg, split, t_in, steps)
    indices = rollout_indices(ds)
    if ev.get("max_trajectories"):
        indices = [indices[i] for i in _spread(len(indices), int(ev["max_trajectories"]))]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    result = evaluate_rollouts(model, ds, indices, steps, binner, device, int(ev.get("batch_size", 16)), dtype,
                               keep_examples=int(ev.get("figures", 3)))
    info = {"recipe": cfg["recipe"]["name"], "model": cfg["model"]["name"], "size": cfg.get("size"), "split": split,
            "precision": precision, **({"checkpoint": checkpoint} if checkpoint else {})}
    log_theta = bool(binner.log and binner.log[0])
    return write_report(result, binner, out_dir, info, log_theta=log_theta, figures=int(ev.get("figures", 3)) > 0,
                        metrics=metrics)
