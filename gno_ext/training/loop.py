r"""The training loop behind ``recipes/train.py``: Accelerate, the DRO curriculum, checkpoints, evaluation.

`train` takes the resolved recipe configuration (a plain mapping, as Hydra composes it from
``recipes/conf``) and runs one job on whatever Accelerate finds: one CPU, one GPU, or DDP over
many GPUs and nodes (``accelerate launch`` or ``torchrun``).

The parts, in the order a run meets them:

* the settings (`gno_ext.training.settings.Settings`): every key the loop reads, with its
  default, checked before anything is generated, trained or overwritten;
* the run folder: resumed, replaced (``overwrite=true``, only a folder gno_ext made) or new;
* the data, the DRO groups (boundary configuration x parameter bins) and the curriculum's
  batch sampler (batches of one boundary configuration each, Algorithm 1 of the paper);
* the set-up (`gno_ext.training.setup.set_up`): the model compiled and placed in DDP or outside
  it, AdamW over flat buffers (`FlatParameters`) with a cosine schedule after a linear
  warm-up, the precision (bf16 where every device supports it, else fp16 with loss scaling,
  else fp32), the EMA;
* the steps (`gno_ext.training.steps`): the objective (per-sample MSE on fields scaled by the
  training data's per-channel standard deviation; the plain mean for the first ``P`` epochs,
  then group DRO, reduced across processes before the log-sum-exp), run eagerly or replayed
  from CUDA graphs (``trainer.capture=true``, `gno_ext.training.captured`);
* the epochs (`EpochLoop`): non-finite losses or gradients skip the update (after
  ``trainer.max_nonfinite`` consecutive ones the run stops with an error), logging, one-step
  validation, checkpoints;
* the final model and its evaluation (`gno_ext.training.evaluate`).

What depends on the form of the data (grids or meshes: how windows batch, how a model is run on
a batch, how errors reduce per sample) is a `gno_ext.training.problem.Problem`, picked from
``data.kind``.

Only the main process writes.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm.auto import tqdm

from gno_ext._files import Busy, held, read_yaml_mapping
from gno_ext.losses import Curriculum, RunningGroupLosses
from gno_ext.models.registry import check_model_kwargs, get_model, model_class, save_checkpoint
from gno_ext.training.captured import check_capture_settings, training_steps
from gno_ext.training.checkpoint import (
    latest_checkpoint,
    load_training_checkpoint,
    save_training_checkpoint,
)
from gno_ext.training.evaluate import evaluate_run
from gno_ext.training.objective import NonFiniteGuard, choose_precision
from gno_ext.training.problem import Problem, problem_for
from gno_ext.training.recipe_data import (
    CurriculumBatchSampler,
    GroupBinner,
    model_kwargs_from_data,
    open_split,
    prepare_data,
    resolved_root,
    spread,
    training_groups,
)
from gno_ext.training.settings import Settings
from gno_ext.training.setup import (
    Training,
    choose_cpu_threads,
    compile_cache_dir,
    compile_counts,
    fresh_accelerate_state,
    resolve_grad_sync,
    set_lr_type,
    set_up,
)
from gno_ext.training.steps import (
    Objective,
    Steps,
    make_objective,
)

__all__ = ["EpochLoop", "Progress", "run_dir_of", "test_epochs", "train"]

# keys that may change between a run and its resumption
RESUME_FREE = ("resume", "overwrite", "run_dir", "trainer.epochs", "trainer.max_steps", "trainer.progress",
               "trainer.num_workers", "eval", "trainer.checkpoint_every", "data.root", "trainer.capture",
               "trainer.grad_sync", "model.label", "trainer.compile_cache")


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
    ``model.label`` when set, e.g. ``vit-5``, or ``gno_fno_soft`` where the chosen config extends
    another, else ``model.name``)."""
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


def train(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Run one recipe (training, evaluation, report) from its resolved configuration.

    In a single process (a notebook, say) it may be called again with another precision or
    device: each call starts from a fresh accelerate state.

    Returns
    -------
    dict
        ``run_dir``, ``step``, ``skipped`` and the evaluation summary (``report``).
    """
    with contextlib.ExitStack() as held_locks:  # the run folder's lock, held by the main process to the end
        accelerator, result = _run(cfg, held_locks)
    # The process group goes last, once `_run`'s frame, and with it the DDP model, is gone
    # (`free_memory` drops the accelerator's own references). Destroyed before the model, gloo's
    # group lost its last reference in DDP's reducer, whose destructor holds the GIL while it
    # joins gloo's worker thread, and that thread may need the GIL to free the tensors of the
    # last collective: a process then hung at exit (4 of 71 two-process CPU runs).
    accelerator.free_memory()
    accelerator.end_training()
    return result


def _run(cfg: Mapping[str, Any], locks: contextlib.ExitStack | None = None) -> tuple[Any, dict[str, Any]]:
    """`train` up to the destruction of the process group: the accelerator and the result. Its
    phases: the run's start (settings checked, processes, run folder, resumption), the training
    data, the model, the set-up of its training, the epochs, and the final model's evaluation."""
    start = _start(cfg, locks)
    cfg, tr, place = start.cfg, start.settings.trainer, start.place
    data, spec, values = _training_data(start)
    raw, scale = _model_and_scale(cfg, spec, values, data.loader.dataset, data.problem, tr.loss_normalization,
                                  place.device)
    if not any(p.requires_grad for p in raw.parameters()):  # a reference with nothing to learn (persistence)
        return _evaluate_only(cfg, raw, data.binner, place.run_dir, place.device, place.precision, start.use_cpu,
                              place.main, start.replace, place.say)
    training, plan, progress = _set_up_training(start, data, raw, scale)
    steps = training_steps(training, plan.objective, tr.clip_grad, tr.grad_accum, tr.capture)
    EpochLoop(cfg, start.settings, training, steps, plan, data, place).run(progress)
    return training.accelerator, _finish(cfg, training, progress, plan.guard, data.binner, place)


@dataclass
class Start:
    """A run as it starts: its configuration (a private copy, ``data.root`` resolved), its
    checked settings, this process (`Place`), whether it runs on the CPU, the checkpoint it
    resumes from (or None), whether it replaces an old run, its gradient synchronisation and
    accelerate's state of the processes (``state``)."""

    cfg: dict[str, Any]
    settings: Settings
    place: Place
    use_cpu: bool
    checkpoint: Path | None
    replace: bool
    grad_sync: str
    state: Any


def _start(cfg: Mapping[str, Any], locks: contextlib.ExitStack | None) -> Start:
    """Every setting checked before anything is generated or overwritten; the processes set up;
    the run folder locked and the resumption decided; the seed set."""
    from accelerate import PartialState
    from accelerate.utils import set_seed

    cfg = json.loads(json.dumps(cfg))  # a plain, private copy
    data_cfg = cfg["data"]
    data_cfg["root"] = resolved_root(data_cfg)
    settings = Settings.from_config(cfg)
    tr = settings.trainer
    test_epochs(cfg, tr.epochs)
    if tr.compile:  # the cache setting checked before anything is generated
        compile_cache_dir(tr.compile_cache, torch.device("cpu"))
    _check_model_and_data(cfg, problem_for(data_cfg))
    # Accelerate sets up several CPU processes (gloo) only when told cpu=True
    use_cpu = tr.device == "cpu" or not torch.cuda.is_available()
    fresh_accelerate_state()
    # the other processes wait while the main one generates data or evaluates: a long timeout
    state = PartialState(cpu=use_cpu, timeout=datetime.timedelta(minutes=tr.dist_timeout_minutes))
    precision = choose_precision(tr.precision, state.device.type, state.num_processes)
    grad_sync = resolve_grad_sync(tr.grad_sync, state.num_processes, tr.capture, tr.flat_parameters)
    if tr.capture:  # refused before any work is done, and before the run folder is touched
        check_capture_settings(state.device, state.num_processes, tr.grad_accum, precision, tr.compile,
                               tr.flat_parameters, grad_sync)
    run_dir = run_dir_of(cfg)
    if state.is_main_process and locks is not None:  # one job writes a run folder at a time
        locks.enter_context(_run_lock(run_dir))
    checkpoint, replace = _resumed_or_replaced(cfg, run_dir, say=state.print)
    _wait_for_everyone(state)
    if checkpoint is not None:
        saved = read_yaml_mapping(checkpoint / "config.yaml")
        _check_resume_config(saved, cfg, checkpoint)
    place = Place(state.is_main_process, state.process_index, state.num_processes, state.device, run_dir, precision,
                  state.print)
    if place.device.type == "cpu":  # an oversubscribed machine collapses with a thread per core
        torch.set_num_threads(choose_cpu_threads(tr.cpu_threads, place.world))
    set_seed(int(cfg["seed"]))
    return Start(cfg, settings, place, use_cpu, checkpoint, replace, grad_sync, state)


def _training_data(start: Start) -> tuple[LoopData, Any, Any]:
    """The data prepared (by the main process; the others wait), the training split and its
    groups, the curriculum's sampler and the loader; the validation split is opened later, by
    `_set_up_training`. Returns the loop's data, the data's spec and the training parameters."""
    cfg, tr, place = start.cfg, start.settings.trainer, start.place
    data_cfg = cfg["data"]
    if place.main:  # the others wait until the data exist
        prepare_data(data_cfg, progress=tr.progress)
    _wait_for_everyone(start.state)
    train_ds = open_split(data_cfg, "train", start.settings.data.n_steps_input, 1)
    spec, values, kinds, binner = training_groups(cfg, train_ds)
    configs = binner.configuration_ids(torch.as_tensor(np.ascontiguousarray(kinds))).numpy()
    seed = int(cfg["seed"])
    sampler = CurriculumBatchSampler(configs, tr.batch_size, place.rank, place.world, seed, tr.curriculum.order)
    problem = problem_for(data_cfg, tr.capture)
    loader = DataLoader(train_ds, batch_sampler=sampler, collate_fn=problem.train_collate, num_workers=tr.num_workers,
                        pin_memory=place.device.type == "cuda", persistent_workers=tr.num_workers > 0,  # no restart
                        generator=torch.Generator().manual_seed(seed))                                # per epoch
    return LoopData(sampler, loader, binner, None, problem), spec, values


def _set_up_training(start: Start, data: LoopData, raw: nn.Module, scale: torch.Tensor
                     ) -> tuple[Training, Plan, Progress]:
    """The model's training set up (optimizer, precision, DDP or flat averaging, EMA), resumed
    where a checkpoint is given; the run folder opened (an old run replaced only now); the run
    said; the validation split opened (into ``data``); the curriculum and objective."""
    cfg, settings, place = start.cfg, start.settings, start.place
    tr = settings.trainer
    steps_per_epoch = math.ceil(len(data.sampler.global_batches(0)) / tr.grad_accum)
    total_steps = tr.epochs * steps_per_epoch
    if tr.max_steps is not None:
        total_steps = min(total_steps, tr.max_steps)
    training = set_up(raw, settings, place.precision, start.use_cpu, place.run_dir, start.grad_sync, place.world,
                      place.device, total_steps)
    accelerator = training.accelerator
    guard = NonFiniteGuard(tr.max_nonfinite)
    progress, st = _resume_from(start.checkpoint, training, guard, place.device, tr.capture, place.say) \
        if start.checkpoint is not None else (Progress(), {})
    if place.main:
        _open_run_dir(place.run_dir, cfg, start.replace)
    if start.replace:
        _wait_for_everyone(accelerator)
    if tr.tensorboard:
        hp = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in _flatten(cfg).items()}
        accelerator.init_trackers("tb", config=hp)
    place.say(_run_line(place.run_dir, cfg["model"]["name"], raw, len(data.loader.dataset), data.binner, place.world,
                        place.device, start.grad_sync, place.precision, total_steps, settings))
    data.valid_ds = _valid_split(cfg["data"], settings.data.n_steps_input, place.say)
    curriculum, objective = _objective(settings, training, scale, data.binner.n_groups, place.world, data.problem,
                                       place.device, st)
    return training, Plan(curriculum, objective, guard, total_steps), progress


def _finish(cfg: dict[str, Any], training: Training, progress: Progress, guard: NonFiniteGuard, binner: GroupBinner,
            place: Place) -> dict[str, Any]:
    """The final model (the EMA's where on) saved and evaluated by the main process; the run's
    result."""
    final = training.ema.module if training.ema is not None else training.raw
    if place.main:
        save_checkpoint(final, place.run_dir / "model", extra={"step": progress.step, "ema": training.ema is not None,
                                                               "train_s": round(progress.train_s, 3)})
    _wait_for_everyone(training.accelerator)
    report = _final_evaluation(cfg, final, binner, place.run_dir, place.device, place.precision, place.say) \
        if place.main else None
    _wait_for_everyone(training.accelerator)
    return {"run_dir": str(place.run_dir), "step": progress.step, "skipped": guard.skipped, "report": report}


def _objective(settings: Settings, training: Training, scale: torch.Tensor, n_groups: int, world: int,
               problem: Problem, device: torch.device, state: Mapping[str, Any]) -> tuple[Curriculum, Objective]:
    """The curriculum and the training objective of the run; with ``trainer.dro.weights=running``
    the groups' running losses, continued from a resumed checkpoint's ``state`` where it holds
    them."""
    dro = settings.trainer.dro
    curriculum = Curriculum(settings.warmup_epochs, dro.tau, dro.temperature)
    running = RunningGroupLosses(n_groups, dro.rate, device) if dro.weights == "running" else None
    if running is not None and "dro_running" in state:
        running.load_state_dict(state["dro_running"])
    objective = make_objective(training.model, training.raw, training.accelerator.autocast, scale, n_groups,
                               curriculum.tau, world, settings.balance_weight, settings.physics_weight, problem,
                               curriculum.temperature, running)
    return curriculum, objective


def _model_and_scale(cfg: Mapping[str, Any], spec: Any, values: Any, train_ds: Dataset, problem: Problem,
                     normalise: bool, device: torch.device) -> tuple[nn.Module, torch.Tensor]:
    """The recipe's model built on its data, its normalisation fitted on up to 256 training
    windows (refused where their fields are not finite), and the per-channel scale the loss
    divides the fields by (ones without ``trainer.loss_normalization``)."""
    name = cfg["model"]["name"]
    raw = get_model(name, **model_kwargs_from_data(model_class(name), spec, cfg["model"].get("kwargs") or {}))
    fit_windows = spread(len(train_ds), 256)
    fit_batch = _fetch(train_ds, fit_windows, problem)
    fields = problem.fields(fit_batch)
    _check_finite_windows(problem.finite(fit_batch), fit_windows, cfg["data"]["root"])
    if hasattr(raw, "fit_normalization"):
        raw.fit_normalization(fields, values)
    scale = problem.scale(fields, spec.channels, spec.ndim)  # per channel, shaped to divide a prediction
    return raw, (scale if normalise else torch.ones_like(scale)).to(device)


def _valid_split(data_cfg: Mapping[str, Any], t_in: int, say: Callable[[str], None]) -> Dataset | None:
    """The validation split, or None (said) where the data have none."""
    try:
        return open_split(data_cfg, "valid", t_in, 1)
    except FileNotFoundError:
        say("no validation split: skipping validation")
        return None


def _check_model_and_data(cfg: Mapping[str, Any], problem: Problem) -> None:
    """Refuse a model that takes another kind of data than the recipe gives (grids or meshes) and
    a model keyword it does not take, before any work is done. (Every kind of batch can be
    captured: mesh batches are then padded, `problem_for`.)"""
    data_cfg = cfg["data"]
    takes = getattr(model_class(cfg["model"]["name"]), "data_kind", "grid")
    if takes != problem.name:
        hint = "model=gno_mesh" if problem.name == "mesh" else "a grid model (gno, gno_fno, fno, ...)"
        raise ValueError(f"model={cfg['model']['name']} takes {takes} data, but data.kind={data_cfg['kind']} gives "
                         f"{problem.name} batches: use {hint}")
    check_model_kwargs(cfg["model"]["name"], cfg["model"].get("kwargs") or {}, prefix="model.kwargs.")


def _run_line(run_dir: Path, name: str, raw: nn.Module, n_windows: int, binner: GroupBinner, world: int,
              device: torch.device, grad_sync: str, precision: str, total_steps: int, settings: Settings) -> str:
    """The line that opens a run's log: what trains on what, where, for how long, with which objective."""
    tr = settings.trainer
    averaged = f" (gradients averaged by {grad_sync})" if world > 1 else ""
    threads = f" ({torch.get_num_threads()} thread(s) each)" if device.type == "cpu" else ""
    weights = "running group losses" if tr.dro.weights == "running" else "batch"
    return (f"run {run_dir}: {name} ({sum(p.numel() for p in raw.parameters()) / 1e6:.2f} M parameters), "
            f"{n_windows} training windows, {len(binner.configurations)} boundary configuration(s), "
            f"{binner.n_groups} DRO groups, {world} process(es) on {device.type}{averaged}{threads}, precision "
            f"{precision}, {total_steps} steps (MSE for {settings.warmup_epochs} epochs, then DRO with tau = "
            f"{tr.dro.tau}, {tr.dro.temperature}, weights from the {weights})")


def _resume_from(checkpoint: Path, training: Training, guard: NonFiniteGuard, device: torch.device, capture: bool,
                 say: Callable[[str], None]) -> tuple[Progress, dict[str, Any]]:
    """The progress and trainer state of ``checkpoint``, its weights, optimizer, schedule and
    EMA restored into ``training`` and its skipped updates into ``guard``."""
    st = load_training_checkpoint(checkpoint, training.raw, training.optimizer, training.scheduler, training.ema)
    set_lr_type(training.optimizer.param_groups, device, capture)  # as this run needs them, whatever was saved
    progress = Progress(st["step"], st["epoch"], st["batch"], st.get("samples", 0), st.get("train_s", 0.0))
    guard.skipped = st.get("skipped", 0)
    say(f"resumed from {checkpoint} (step {progress.step}, epoch {progress.epoch}, batch {progress.batch})")
    return progress, st


@contextlib.contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the lock of ``run_dir`` (the hidden file ``.NAME.lock`` beside it, so that replacing
    the folder leaves it in place): a second job on the same folder stops with a message that
    names the job that holds it."""
    try:
        with held(run_dir.parent / f".{run_dir.name}.lock"):
            yield
    except Busy as busy:
        raise FileExistsError(f"{run_dir}: another training job ({busy.holder or 'unknown'}) is writing this run; "
                              "wait for it to end, or train into another folder (run_dir=...)") from None


def _resumed_or_replaced(cfg: Mapping[str, Any], run_dir: Path,
                         say: Callable[[str], None] = print) -> tuple[Path | None, bool]:
    """The checkpoint this run resumes from (``resume=auto`` or a path), if any, and whether it
    replaces an earlier run in its folder (``overwrite=true``; the old run is deleted when this
    one first writes, so an error before then loses nothing).

    ``resume=auto`` without a complete checkpoint says that it starts afresh, and moves the
    abandoned run's logged rows aside (``metrics.abandoned-TIME.jsonl``). ``resume=PATH`` to a
    checkpoint of this folder older than its newest is refused: training on from it would replace
    the newer checkpoints and the final model (branch into another folder instead)."""
    resume = cfg.get("resume", False)
    resume = "false" if resume in (False, None, "false", "False") else str(resume)
    overwrite = bool(cfg.get("overwrite", False))
    _check_run_dir(run_dir, resume, overwrite)
    if resume == "auto":
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None and (run_dir / "metrics.jsonl").is_file():
            moved = run_dir / f"metrics.abandoned-{datetime.datetime.now():%Y%m%d-%H%M%S}.jsonl"
            (run_dir / "metrics.jsonl").rename(moved)
            say(f"resume=auto: {run_dir} holds no complete checkpoint; starting afresh (the earlier rows moved to "
                f"{moved.name})")
        elif checkpoint is None:
            say(f"resume=auto: no checkpoint in {run_dir} yet; starting afresh")
        return checkpoint, False
    if resume != "false":
        checkpoint = Path(resume)
        if not (checkpoint / "trainer_state.json").is_file():
            raise FileNotFoundError(f"resume={resume}: not a complete training checkpoint folder")
        newest = latest_checkpoint(run_dir)
        if newest is not None and checkpoint.resolve().parent == (run_dir / "checkpoints").resolve() \
                and checkpoint.resolve() != newest.resolve():
            raise FileExistsError(f"resume={resume}: {run_dir} holds a newer checkpoint ({newest.name}), which "
                                  "training on from this one would replace with the final model and report. Continue "
                                  f"the newest with resume=auto, or branch into another folder: run_dir=NEW "
                                  f"resume={resume}")
        return checkpoint, False
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{run_dir} already holds a run. Continue it with resume=auto, start afresh with "
                                  f"overwrite=true, or choose another folder with run_dir=...")
        return None, True
    return None, False


@dataclass
class Progress:
    """Where training stands: optimizer steps taken, the epoch and the batch within it to
    continue from, the training samples seen (over all processes) and the seconds spent
    training (compilation, capture and one-step validation included; the data's preparation,
    the checkpoints' writing and the test rollouts of ``eval.at_epochs`` not), summed over the
    run's resumptions."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    seen: int = 0
    train_s: float = 0.0


@dataclass
class Plan:
    """What the epochs follow: the curriculum (MSE, then group DRO), the objective, the guard
    against non-finite losses and gradients, and the optimizer steps to take."""

    curriculum: Curriculum
    objective: Objective
    guard: NonFiniteGuard
    total_steps: int


@dataclass
class LoopData:
    """The data of the epochs: the curriculum's batch sampler and the loader over it, the group
    binner, the validation split (or None) and the problem (grid or mesh batches)."""

    sampler: CurriculumBatchSampler
    loader: DataLoader
    binner: GroupBinner
    valid_ds: Dataset | None
    problem: Problem


@dataclass
class Place:
    """This process in the run: main or not, its rank among ``world`` processes, its device,
    the run folder, the precision and how it prints (``say``)."""

    main: bool
    rank: int
    world: int
    device: torch.device
    run_dir: Path
    precision: str
    say: Callable[[str], None]


class EpochLoop:
    """The epochs of a run: the curriculum's batches (``data.sampler``) through the ``steps``,
    each epoch's objective (``plan.curriculum``: MSE, then group DRO), the non-finite guard, the
    schedule and the EMA, logging, one-step validation and checkpoints.

    The steps (`gno_ext.training.steps.Steps`) may be eager or replayed from CUDA graphs: the
    loop runs inside their ``running()`` context and tells them of every update
    (``updated()``), and does not ask which they are.
    """

    def __init__(self, cfg: dict[str, Any], settings: Settings, training: Training, steps: Steps, plan: Plan,
                 data: LoopData, place: Place) -> None:
        self.cfg, self.settings, self.tr, self.training, self.steps = cfg, settings, settings.trainer, training, steps
        self.curriculum, self.objective, self.guard, self.total_steps = (plan.curriculum, plan.objective, plan.guard,
                                                                         plan.total_steps)
        self.sampler, self.loader, self.binner, self.valid_ds, self.problem = (data.sampler, data.loader, data.binner,
                                                                               data.valid_ds, data.problem)
        self.main, self.rank, self.world, self.device = place.main, place.rank, place.world, place.device
        self.run_dir, self.precision, self.say = place.run_dir, place.precision, place.say
        self.at_epochs = test_epochs(cfg, settings.trainer.epochs)

    def run(self, progress: Progress) -> None:
        """Train from ``progress`` (updated in place) to the last epoch or ``trainer.max_steps``."""
        self.progress = progress
        with self.steps.running():
            self.training.model.train()
            self._since_log, self._window_seen, self._data_wait = time.perf_counter(), 0, [0.0]
            self._clock = self._started = time.perf_counter()
            self._startup: set[str] = set()  # the startup times logged so far (`_log_startup`)
            first = progress.epoch
            for epoch in range(first, self.tr.epochs):
                if progress.step >= self.total_steps:
                    break
                self._epoch(epoch, progress.batch if epoch == first else 0)

    def _epoch(self, epoch: int, start: int) -> None:
        tr, progress = self.tr, self.progress
        dro = self.curriculum.uses_dro(epoch)
        self.sampler.set_epoch(epoch, start)
        n_batches = len(self.sampler)
        bar = tqdm(total=n_batches, desc=f"epoch {epoch + 1}/{tr.epochs} ({'DRO' if dro else 'MSE'})",  # (None: off
                   disable=True if not (self.main and tr.progress) else None, leave=False)  # when not a terminal)
        batch_index = self.sampler.start
        loss_value = float("nan")
        weights = [0.0, 0.0, 0]  # the DRO group weights of the epoch's batches: largest, smallest summed; batches
        for micro, batch in enumerate(_timed(self.loader, self._data_wait)):
            # the groups from the batch still on the host: on the device their computation would
            # copy the boundary types back, and wait for all the work queued before
            groups = self.problem.groups(self.binner, batch).to(self.device, non_blocking=True)
            batch = self.problem.to(batch, self.device)
            last_micro = (micro + 1) % tr.grad_accum == 0 or micro == n_batches - 1
            logged = self.steps.forward_backward(batch, groups, dro, last_micro)
            # checked once the backward pass is queued (the check waits for the GPU): a non-finite
            # loss in any micro-batch skips the whole update, whose gradients it has reached
            loss_value, largest, smallest = logged.tolist()  # the one wait for the device per micro-batch
            if self.guard.check(loss_value, "loss") and dro:
                weights = [weights[0] + largest, weights[1] + smallest, weights[2] + 1]
            batch_index += 1
            progress.seen += self.problem.size(batch) * self.world
            self._window_seen += self.problem.size(batch) * self.world
            bar.update(1)
            if not last_micro:
                continue
            finite, grad_norm = self._update()
            bar.set_postfix(loss=f"{loss_value:.3e}")
            if finite and (progress.step % tr.log_every == 0 or progress.step == self.total_steps):
                self._log_training(loss_value, grad_norm, dro)
            if finite and tr.checkpoint_every and progress.step % tr.checkpoint_every == 0:
                self._checkpoint(epoch, batch_index)
            if progress.step >= self.total_steps:
                break
        bar.close()
        values, said = {}, f"epoch {epoch + 1}: loss {loss_value:.4e}"
        if weights[2]:  # DRO acting: how far the groups' weights in the gradient spread (1 = the plain mean)
            values = {"epoch": epoch + 1, "train/dro_weight_max": weights[0] / weights[2],
                      "train/dro_weight_min": weights[1] / weights[2]}
            said += (f", DRO group weights {values['train/dro_weight_min']:.3g} to "
                     f"{values['train/dro_weight_max']:.3g} of the mean's (batch average)")
        if self.valid_ds is not None and (epoch + 1) % tr.val_every == 0:
            v = _validate(self.training.model, self.valid_ds, self.problem, self.device, tr.batch_size,
                          tr.val_batches, self.rank, self.world, self.training.accelerator.autocast,
                          tr.val_batch_size)
            values["valid/nmse_one_step"] = v
            said += f", one-step validation nMSE {v:.4e}"
        if values:
            self._log(values)
            self.say(said)
        finished = batch_index >= len(self.sampler.global_batches(epoch))
        if finished and epoch + 1 in self.at_epochs:  # before the checkpoint: a resumption never skips it
            self._test(epoch + 1)
        self._checkpoint(epoch + 1 if finished else epoch, 0 if finished else batch_index)

    def _update(self) -> tuple[bool, float]:
        """After the last micro-batch of a step: the gradient norm, checked like the loss, and the
        update unless a loss or the gradients were non-finite. Returns (updated, gradient norm)."""
        t = self.training
        grad_norm = self.steps.gradient_norm(self.guard.clean)
        if self.guard.clean and self.precision != "fp16":  # fp16: the loss scaler skips steps with inf gradients itself
            self.guard.check(grad_norm, "gradient norm")
        finite = self.guard.update(self.progress.step)  # a non-finite loss of any micro-batch, or gradient, skips it
        if finite:
            self.steps.optimizer_step()
            t.scheduler.step()
            if t.ema is not None:
                t.ema.update_parameters(t.raw)
            self.progress.step += 1
        self.steps.zero_grad()
        if finite:
            self._log_startup("first_step_s" if not self.steps.replayed else "first_captured_step_s")
            self.steps.updated()
        return finite, grad_norm

    def _log_startup(self, name: str) -> None:
        """Log, once per process, the seconds from the loop's start to the end of its first
        optimizer step (``startup/first_step_s``: compilation included) and of its first step
        replayed from CUDA graphs (``startup/first_captured_step_s``: the capture included), with
        the count of graphs compiled and of graphs loaded from the compile cache so far
        (``startup/graphs_compiled``, ``startup/graphs_loaded``: whether a warm start found them)."""
        if name in self._startup:
            return
        self._startup.add(name)
        seconds = time.perf_counter() - self._started
        self._log({f"startup/{name}": seconds, **compile_counts("startup/")})
        self.say(f"{name.removesuffix('_s').replace('_', ' ')} done {seconds:.1f} s after the loop started")

    def _log_training(self, loss_value: float, grad_norm: float, dro: bool) -> None:
        elapsed = max(time.perf_counter() - self._since_log, 1e-9)
        captured = getattr(self.steps, "captured", None)  # CUDA graphs so far (trainer.capture=true)
        self._log({"train/loss": loss_value, "train/lr": float(self.training.scheduler.get_last_lr()[0]),
                   "train/grad_norm": grad_norm, "train/dro": float(dro), "train/skipped": self.guard.skipped,
                   "train/samples_per_s": self._window_seen / elapsed, "train/data_wait": self._data_wait[0] / elapsed,
                   **({} if captured is None else {"train/captured_graphs": captured})})
        self._since_log, self._window_seen, self._data_wait[0] = time.perf_counter(), 0, 0.0

    def _log(self, values: dict[str, float]) -> None:
        """Into TensorBoard (where on) and the run's ``metrics.jsonl`` (main process)."""
        if self.tr.tensorboard:
            self.training.accelerator.log(values, step=self.progress.step)
        if self.main:
            with open(self.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": self.progress.step, **values}) + "\n")

    def _tick(self) -> None:
        """Add the time since the clock was last read to the training time."""
        now = time.perf_counter()
        self.progress.train_s += now - self._clock
        self._clock = now

    def _test(self, epoch: int) -> None:
        """The test rollouts of the model as it stands after ``epoch`` (``eval.at_epochs``), into
        ``eval/epoch_NNN/`` without figures, logged with the training time so far (main process
        evaluates; all meet). Its own time is not training time."""
        self._tick()
        t = self.training
        if self.main:
            model = t.ema.module if t.ema is not None else t.raw
            cfg = {**self.cfg, "eval": {**self.cfg.get("eval", {}), "figures": 0}}
            report = evaluate_run(cfg, model, self.binner, self.run_dir / "eval" / f"epoch_{epoch:03d}", self.device,
                                  self.precision)
            worst = report["nmse"]["worst_group"]["nmse_mean"]
            self._log({"epoch": epoch, "test/nmse_mean": report["nmse"]["mean"], "test/nmse_worst_group": worst,
                       "test/rel_l2_mean": report["rel_l2"]["mean"], "train_s": round(self.progress.train_s, 3)})
            self.say(f"epoch {epoch}: test rollout nMSE {report['nmse']['mean']:.4e} (worst group {worst:.4e}) "
                     f"after {self.progress.train_s:.0f} s of training")
        t.model.train()
        _wait_for_everyone(t.accelerator)
        self._clock = time.perf_counter()

    def _checkpoint(self, epoch: int, batch: int) -> None:
        """A training checkpoint to resume from at ``batch`` of ``epoch`` (main process; all meet).
        Its writing is not training time."""
        t, p = self.training, self.progress
        self._tick()
        if self.main:
            running = self.objective.running
            save_training_checkpoint(self.run_dir, p.step, t.raw, t.optimizer, t.scheduler,
                                     {"epoch": epoch, "batch": batch, "skipped": self.guard.skipped, "samples": p.seen,
                                      "train_s": round(p.train_s, 3),
                                      **({"dro_running": running.state_dict()} if running is not None else {})},
                                     self.cfg, ema=t.ema, keep=self.tr.keep_checkpoints)
        _wait_for_everyone(t.accelerator)
        self._clock = time.perf_counter()


def test_epochs(cfg: Mapping[str, Any], epochs: int) -> frozenset[int]:
    """``eval.at_epochs``: the epochs (counted from 1) after which the test rollouts run during
    training, checked: integers from 1 to ``trainer.epochs``."""
    given = (cfg.get("eval") or {}).get("at_epochs") or []
    if isinstance(given, (str, bytes)) or not isinstance(given, (list, tuple)):
        raise ValueError(f"eval.at_epochs: expected a list of epochs, e.g. [10,30,100], got {given!r}")
    for e in given:
        if isinstance(e, bool) or not isinstance(e, int) or not 1 <= e <= epochs:
            raise ValueError(f"eval.at_epochs: expected epochs from 1 to trainer.epochs = {epochs}, got {e!r}")
    return frozenset(given)


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


def _fetch(ds: Dataset, indices: list[int], problem: Problem):
    """A batch of windows, through the dataset's batched reader when it has one."""
    return problem.collate(ds.__getitems__(indices) if hasattr(ds, "__getitems__") else [ds[i] for i in indices])


def _check_finite_windows(finite: torch.Tensor, windows: list[int], root: Any) -> None:
    """Raise a `ValueError` naming the first training window (of those read to set the
    normalisation, ``finite`` telling for each whether its fields are all finite) whose fields
    are not all finite: with it the statistics, and so every prediction, would be NaN."""
    bad = ~finite
    if bad.any():
        first = int(bad.nonzero()[0])
        raise ValueError(f"data under {root}: training window {windows[first]} holds non-finite field values "
                         f"({int(bad.sum())} of the {len(windows)} windows read to set the normalisation do)")


@torch.no_grad()
def _validate(model: nn.Module, ds: Dataset, problem: Problem, device: torch.device, batch_size: int,
              n_batches: int, rank: int, world: int, autocast: Any, chunk: int | None = None) -> float:
    """Mean one-step nMSE over up to ``n_batches`` batches of ``batch_size`` windows of ``ds``
    (spread over the split), sharded over processes. The windows go through the model ``chunk``
    at a time (default ``batch_size``; ``trainer.val_batch_size``): the same windows and the same
    mean, in less memory beside a captured training step's."""
    idx = spread(len(ds), n_batches * batch_size)
    loader = DataLoader(Subset(ds, idx[rank::world]), batch_size=chunk or batch_size, collate_fn=problem.collate)
    total = torch.zeros(2, dtype=torch.float64, device=device)
    model.eval()
    for batch in loader:
        batch = problem.to(batch, device)
        with autocast():
            pred = problem.predict(model, batch)
        e = problem.nmse(pred.float(), problem.target(batch).float(), batch)
        total += torch.stack([e.sum().double(), torch.tensor(float(len(e)), device=device, dtype=torch.float64)])
    model.train()
    if world > 1:
        dist.all_reduce(total)
    return float(total[0] / total[1].clamp_min(1))


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
