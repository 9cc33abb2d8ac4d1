"""The training loop's set-up: the model compiled and placed (in DDP, or outside it with the
loop averaging the gradients), the optimizer over flat buffers, the schedule, the EMA.

`set_up` does it from the checked `Settings`; the pieces are usable on their own
(`compile_model` in your own loop, `resolve_grad_sync` to see what a configuration means on
several processes).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gno_ext.layers.mixture import has_dispatch
from gno_ext.training.flat import FlatParameters
from gno_ext.training.settings import Settings

__all__ = ["Training", "choose_cpu_threads", "compile_cache_dir", "compile_counts", "compile_model", "resolve_grad_sync", "set_up",
           "use_compile_cache"]


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


def compile_cache_dir(setting: str, device: torch.device) -> Path | None:
    """Where ``torch.compile`` keeps its compiled graphs and kernels for later runs
    (``trainer.compile_cache``), or None for ``off``.

    ``auto``: ``$TORCHINDUCTOR_CACHE_DIR`` where it is set, else ``compile/torch-VERSION-DEVICE``
    under the gno_ext cache folder (``$GNO_EXT_CACHE`` or ``~/.cache/gno_ext``): kept across
    sessions, unlike inductor's default under ``/tmp``. A folder: that folder, also per torch
    version and device (a shared folder on a cluster serves every node). Inductor keys each entry
    by the graph, its shapes and the compiler settings, so a cache never stands in for another
    model or shape; the folder's name keeps torch versions and devices apart as well."""
    if setting == "off":
        return None
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", torch.cuda.get_device_name(device) if device.type == "cuda" else device.type)
    key = f"torch-{torch.__version__.split('+')[0]}-{slug}"
    if setting == "auto":
        if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
            return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        from gno_ext.data.generate import default_cache

        return default_cache() / "compile" / key
    if not isinstance(setting, str) or not setting:
        raise ValueError(f"trainer.compile_cache: expected auto, off or a folder, got {setting!r}")
    folder = Path(setting).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"trainer.compile_cache={setting}: is a file, not a folder")
    return folder / key


def use_compile_cache(setting: str, device: torch.device) -> Path | None:
    """Point ``torch.compile``'s caches (inductor's compiled graphs, AOT autograd's and Triton's
    kernels) at `compile_cache_dir` before the first compilation, and turn them on; ``off``
    turns them off for this process. Returns the folder."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    folder = compile_cache_dir(setting, device)
    inductor_config.fx_graph_cache = functorch_config.enable_autograd_cache = folder is not None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)  # read at every use; Triton's cache goes below it
    return folder


def compile_counts(prefix: str = "") -> dict[str, int]:
    """How many graphs ``torch.compile`` has compiled in this process (``graphs_compiled``: inductor's
    graph-cache misses) and loaded from the compile cache (``graphs_loaded``: AOT autograd's and
    inductor's cache hits); both 0 before any compilation or with the caches off."""
    from torch._dynamo.utils import counters

    return {f"{prefix}graphs_compiled": int(counters["inductor"]["fxgraph_cache_miss"]),
            f"{prefix}graphs_loaded": int(counters["aot_autograd"]["autograd_cache_hit"]
                                          + counters["inductor"]["fxgraph_cache_hit"])}


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


@dataclass
class Training:
    """What `set_up` makes.

    Attributes
    ----------
    model : nn.Module
        What the steps run: the model compiled, placed on its device and, with ``grad_sync=ddp``,
        wrapped in DDP.
    raw : nn.Module
        The model itself, whose weights are saved.
    accelerator : accelerate.Accelerator
    optimizer : torch.optim.Optimizer
        AdamW (as accelerate wraps it) over the flat buffers, or over the parameters.
    scheduler : torch.optim.lr_scheduler.LambdaLR
    flat : FlatParameters or None
    ema : torch.optim.swa_utils.AveragedModel or None
    average : bool
        Whether the loop averages the gradients itself (``grad_sync=flat`` on several processes).
    """

    model: nn.Module
    raw: nn.Module
    accelerator: Any
    optimizer: Any
    scheduler: Any
    flat: FlatParameters | None
    ema: Any
    average: bool


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, where the platform tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose_cpu_threads(setting: int | None, world: int = 1, cores: int | None = None,
                       load: float | None = None) -> int:
    """Torch's intra-op threads for a CPU run: ``setting`` (``trainer.cpu_threads``) where given,
    else the cores this process may use that are not already busy (the 1-minute load average),
    shared among the ``world`` processes of the job, and at least 1. On a machine that other jobs
    keep busy, a thread beyond the free cores does not add compute: it waits its turn, and torch's
    threads, which meet at every operation, then wait for the slowest. ``OMP_NUM_THREADS`` set by
    you wins over the automatic choice, as for torch itself."""
    if setting is not None:
        return int(setting)
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    cores = cores if cores is not None else usable_cores()
    load = load if load is not None else os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(cores, math.floor(cores - load + 0.5)) // world)


def set_up(raw: nn.Module, settings: Settings, precision: str, use_cpu: bool, run_dir: Path, grad_sync: str,
           world: int, device: torch.device, total_steps: int) -> Training:
    """The model, the optimizer, the precision, DDP or flat averaging, and the EMA, for a run
    of ``total_steps`` optimizer steps."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    tr, opt = settings.trainer, settings.optimizer
    if tr.compile:
        use_compile_cache(tr.compile_cache, device)
    model = compile_model(raw, tr.compile, tr.compile_options) if tr.compile else raw  # the weights stay raw's
    find_unused = has_dispatch(raw) if tr.find_unused_parameters == "auto" else tr.find_unused_parameters
    accelerator = Accelerator(
        cpu=use_cpu, mixed_precision=precision, log_with="tensorboard" if tr.tensorboard else None,
        project_dir=str(run_dir),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=bool(find_unused))])
    # grad_sync=flat: the model stays outside DDP, whose hooks a CUDA graph would not replay
    model = model.to(device) if grad_sync == "flat" else accelerator.prepare(model)
    groups = param_groups(raw, opt.weight_decay)
    flat = None
    if tr.flat_parameters:
        # the parameters as views of one buffer per group (FlatParameters): made once the model
        # is on its device and, under DDP, synchronised (the other processes' copies get new storage)
        flat = FlatParameters(groups)
        groups = flat.param_groups
    average = grad_sync == "flat" and world > 1  # the loop averages the gradients itself, without DDP
    if average:  # what DDP does when it wraps a model: every process starts from process 0's state
        flat.broadcast(0)
        with torch.no_grad():
            for buffer in raw.buffers():
                dist.broadcast(buffer, 0)
    optimizer = torch.optim.AdamW(groups, lr=opt.lr, betas=opt.betas, fused=fused_adamw(groups, device),
                                  capturable=tr.capture)
    set_lr_type(optimizer.param_groups, device, tr.capture)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, schedule(opt.schedule, opt.warmup_fraction, opt.min_lr_ratio, total_steps))
    optimizer = accelerator.prepare(optimizer)
    ema = None
    if tr.ema.enabled:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(raw, multi_avg_fn=get_ema_multi_avg_fn(tr.ema.decay), use_buffers=True)
    return Training(model, raw, accelerator, optimizer, scheduler, flat, ema, average)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on the weights only: not on 1-D parameters (norms, embeddings' vectors) nor
    on biases, stacked ones included (``AttentionKernelBank.q_bias``, shape (K, out))."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        leaf = name.rsplit(".", 1)[-1]
        (no_decay if p.ndim < 2 or leaf == "bias" or leaf.endswith("_bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def schedule(kind: str, warmup_fraction: float, floor: float, total_steps: int) -> Callable[[int], float]:
    """The learning-rate factor of each step: linear warm-up over ``warmup_fraction`` of the
    steps, then constant or cosine down to ``floor``."""
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


def fused_adamw(groups: list[dict[str, Any]], device: torch.device) -> bool:
    """Whether AdamW runs fused (one kernel for all parameters): on GPUs, where every parameter
    is real. Fused AdamW refuses complex parameters, such as the spectral weights of
    neuraloperator's FNO; those models take the multi-tensor (foreach) AdamW instead."""
    return device.type == "cuda" and all(p.is_floating_point() for g in groups for p in g["params"])


def set_lr_type(groups: list[dict[str, Any]], device: torch.device, capture: bool) -> None:
    """Each parameter group's learning rate as a tensor on ``device`` for a captured optimizer
    step (the scheduler fills it in place), else as a float. ``initial_lr``, from which the
    scheduler computes, stays a float."""
    for g in groups:
        value = float(g["lr"])
        g["initial_lr"] = float(g.get("initial_lr", value))
        g["lr"] = torch.tensor(value, device=device) if capture else value


def fresh_accelerate_state() -> None:
    """Forget the accelerate state that an earlier `train` call left in this process, so that a
    later call may run in another precision or on another device (accelerate refuses to change
    them once set: on a GPU, a bf16 run followed by ``trainer.precision=no`` in one notebook
    failed). Only in a single process: a distributed job keeps its process group."""
    from accelerate.state import AcceleratorState, PartialState

    if PartialState._shared_state and PartialState().num_processes == 1:
        AcceleratorState._reset_state(reset_partial_state=True)
