"""Running the cells of a table: each a training of ``recipes/train.py`` in a child process on a
GPU of its own, resumable, leaving one result file written whole."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


from gno_ext._files import Busy, held, read_yaml_mapping

from .tables import REPO, RESULTS, Run, budget_difference, merge_overrides, write_result


def git_commit(repo: Path = REPO, results: Path = RESULTS) -> str:
    """The commit of the code that runs: ``$GNO_EXT_COMMIT`` where the checkout is a copy without
    its history (a machine that was sent the working tree), else ``git rev-parse HEAD``, with
    ``-dirty`` for uncommitted changes to tracked files. The result files under ``results`` are
    the runs' output, not their code: a refresh that moves a stale file aside, or a table whose
    first runs have written theirs, leaves the code clean."""
    if os.environ.get("GNO_EXT_COMMIT"):
        return os.environ["GNO_EXT_COMMIT"]
    repo, results = repo.resolve(), results.resolve()
    outputs = [f":(exclude){results.relative_to(repo)}"] if results.is_relative_to(repo) else []
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *outputs],
                               cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty else "")


def _n_params(model_dir: Path) -> int:
    """Entries of the saved model's tensors: its parameters and its few buffers (normalisation
    statistics)."""
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def _model_extra(model_dir: Path) -> dict[str, Any]:
    """What the training loop recorded beside the saved model (step, EMA, training seconds)."""
    return json.loads((model_dir / "config.json").read_text()).get("extra", {})


def _steps(model_dir: Path) -> int:
    """Optimizer steps the saved model was trained for (0: a reference such as persistence)."""
    return int(_model_extra(model_dir).get("step", 0))


def _visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs);
    every GPU of the host, by index, where it is unset."""
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = torch.cuda.device_count()
    if visible is None:
        return [str(k) for k in range(count)]
    return [v.strip() for v in visible.split(",") if v.strip()][:count]


@contextlib.contextmanager
def gpu_slot(lock_dir: Path | None = None, per_gpu: int | None = None, count: int = 1) -> Iterator[str | None]:
    """Hold one of the GPUs this process may use for the duration: the first whose lock file is
    free (waiting while all are held). Yields its name as ``CUDA_VISIBLE_DEVICES`` gives it (with
    ``CUDA_VISIBLE_DEVICES=2,3`` the slots are ``"2"`` and ``"3"``), to set for the run's child
    process, or None on a host without GPUs. Parallel jobs of a local launcher thereby use every
    GPU once; the locks are named after the GPUs themselves, so jobs started with different
    ``CUDA_VISIBLE_DEVICES`` share them correctly.

    ``per_gpu`` (default ``$GNO_EXT_RUNS_PER_GPU``, else 1) runs that many jobs on each GPU at
    once: for short runs, one compiles on the CPU while the other trains. It changes the
    runs' wall times, never their results.

    ``count`` GPUs for one job of several processes: all of them or none are held (a job never
    waits holding some), and the slot lists them as ``CUDA_VISIBLE_DEVICES`` takes them
    (``"2,3"``)."""
    gpus = _visible_gpus()
    if not gpus:
        yield None
        return
    if count > len(gpus):
        raise SystemExit(f"{count} GPUs asked for one run, but this process sees {len(gpus)} ({','.join(gpus)})")
    per_gpu = per_gpu or int(os.environ.get("GNO_EXT_RUNS_PER_GPU", "1"))
    lock_dir = lock_dir or Path(tempfile.gettempdir()) / "gno_ext_gpu_locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for j in range(per_gpu):
            with contextlib.ExitStack() as taken:  # the locks of one try, all released unless the job runs
                gpus_taken = []
                for gpu in gpus:
                    try:
                        taken.enter_context(held(lock_dir / f"gpu{gpu}{f'-{j}' if j else ''}.lock"))
                    except Busy:
                        continue
                    gpus_taken.append(gpu)
                    if len(gpus_taken) == count:
                        yield ",".join(gpus_taken)
                        return
        time.sleep(5)


def run_environment(slot: str | None, environ: dict[str, str] | None = None, cores: int | None = None
                    ) -> dict[str, str]:
    """The environment of a run's child process on the GPU or GPUs of ``slot`` (`gpu_slot`; None:
    a host without GPUs, the environment unchanged): ``CUDA_VISIBLE_DEVICES`` names them, and each
    process of the run gets its share of the cores for torch's threads (``OMP_NUM_THREADS``): the
    cores over the runs that the host's slots hold at once (its GPUs times
    ``$GNO_EXT_RUNS_PER_GPU``), at least 1, as ``torchrun`` does for its processes. Torch otherwise
    starts a thread per core in every run: the runs of a host then queue for its cores while the
    GPU waits for them. ``OMP_NUM_THREADS`` set by you wins. A run of several processes holds a
    slot for each, so each of its processes gets the same share."""
    environ = dict(os.environ if environ is None else environ)
    if slot is None:
        return environ
    environ["CUDA_VISIBLE_DEVICES"] = slot
    if not environ.get("OMP_NUM_THREADS"):
        from gno_ext.training.setup import usable_cores

        cores = cores or usable_cores()
        runs = len(_visible_gpus()) * int(environ.get("GNO_EXT_RUNS_PER_GPU", "1"))
        environ["OMP_NUM_THREADS"] = str(max(1, cores // max(1, runs)))
    return environ


def _gpu_name(slot: str | None) -> str:
    """The model name of the GPU or GPUs of ``slot`` (`gpu_slot`), or ``cpu``."""
    if slot is None:
        return "cpu"
    import torch

    visible = _visible_gpus()
    names = [torch.cuda.get_device_name(visible.index(gpu)) for gpu in slot.split(",")]
    return " + ".join(dict.fromkeys(names))  # one name where all are alike


def result_from_run(run: Run, cfg: dict[str, Any], report: dict[str, Any], run_dir: Path, gpu: str,
                    wall_s: float, extra: list[str], processes: int = 1) -> dict[str, Any]:
    """The results file of a finished run (`REQUIRED` keys and a few more). ``batch_size`` is the
    global batch: the run's per-process batch times its ``processes``."""
    nmse = report["nmse"]
    return {
        "table": run.table, "recipe": run.recipe, "model": run.row, "model_config": run.model,
        "overrides": list(run.overrides), "extra": list(extra), "seed": run.seed, "size": cfg["size"],
        "epochs": cfg["trainer"]["epochs"], "batch_size": cfg["trainer"]["batch_size"] * processes,
        "processes": processes,
        "lr": cfg["optimizer"]["lr"], "precision": report.get("precision"),
        "n_params": _n_params(run_dir / "model"), "steps": _steps(run_dir / "model"), "gpu": gpu, "wall_s": round(wall_s, 1), "commit": git_commit(),
        "nmse_mean": nmse["mean"], "nmse_std": nmse["std"], "nmse_worst_group": nmse["worst_group"],
        "rel_l2_mean": report["rel_l2"]["mean"], "per_step_nmse": report["per_step_nmse"],
        "mse_mean": report["mse"]["mean"], "mse_std": report["mse"]["std"],
        "rollout_steps": report["steps"], "test_trajectories": report["trajectories"],
        "paper_nmse": run.paper_nmse, "groups": report.get("groups", []),
        "dro": {k: cfg["trainer"]["dro"][k] for k in ("tau", "temperature", "weights", "rate")},
        "train_s": _model_extra(run_dir / "model").get("train_s"),
        "nmse_readings": report.get("readings"), "per_trajectory": report.get("per_trajectory"),
        "dro_weights": dro_weights(run_dir / "metrics.jsonl"),
        "at_epochs": tested_epochs(run_dir / "metrics.jsonl"),
    }


def _per_epoch(metrics: Path, fields: dict[str, str]) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` that log ``fields``' first key, one per epoch (the
    last of an epoch that a resumption repeated), as ``{"epoch": N, name: row[key], ...}``."""
    rows: dict[int, dict[str, Any]] = {}
    marker = next(iter(fields.values()))
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            if marker in row:
                rows[int(row["epoch"])] = {"epoch": int(row["epoch"]), **{k: row[v] for k, v in fields.items()}}
    return [rows[e] for e in sorted(rows)]


def dro_weights(metrics: Path) -> list[dict[str, Any]]:
    """The group weights of a run's DRO epochs, from its ``metrics.jsonl``: per epoch the largest
    and smallest group weight in the gradient in units of the plain mean's (batch averages)."""
    return _per_epoch(metrics, {"max": "train/dro_weight_max", "min": "train/dro_weight_min"})


def tested_epochs(metrics: Path) -> list[dict[str, Any]]:
    """The test rollouts a run made during training (``eval.at_epochs``), from its
    ``metrics.jsonl``: per epoch its mean and worst-group nMSE, relative L2 and the seconds of
    training before it."""
    return _per_epoch(metrics, {"nmse_mean": "test/nmse_mean", "nmse_worst_group": "test/nmse_worst_group",
                                "rel_l2_mean": "test/rel_l2_mean", "train_s": "train_s"})


def execute(run: Run, extra: list[str], results: Path = RESULTS, output_root: Path | None = None,
            processes: int = 1) -> Path | None:
    """Train and evaluate ``run`` unless its result exists; write the result file atomically.

    The training runs in a child process (``recipes/train.py``) on a GPU of its own
    (`gpu_slot`), in ``output_root/<table>/<recipe>/<row>-seed<N>`` with ``resume=auto``, so an
    interrupted run continues from its last checkpoint.

    ``processes`` > 1 trains the run with DDP over that many GPUs (``torchrun``; CPU processes on
    a host without GPUs) at the same global batch: each process takes ``batch_size /
    processes`` samples of every global batch, which the sampler draws as for one process, and
    the gradients are averaged, so the run computes what one process would (up to the order of
    floating-point sums). For runs too long for one GPU; the result records ``processes``.
    """
    target = run.path(results)
    if target.exists():
        other = budget_difference(run, extra, json.loads(target.read_text()))
        if other:
            print(f"{target.relative_to(results)}: holds a result of another computation ({other}); not run, "
                  "not replaced: move that file aside to run this cell", file=sys.stderr, flush=True)
        else:
            print(f"{target.relative_to(results)}: exists, skipped", flush=True)
        return None
    output_root = output_root or REPO / "runs" / "benchmark"
    run_dir = output_root / run.table / run.recipe / f"{run.row}-seed{run.seed}"
    extra = merge_overrides(run.budget, extra)
    # the row's own overrides last: they define the row (a speed override cannot undo them)
    args = [f"model={run.model}", f"size={run.size}", f"seed={run.seed}", f"run_dir={run_dir}", "resume=auto",
            *extra, *run.overrides]
    command = [sys.executable, str(REPO / "recipes" / "train.py"), "--recipe", run.recipe, *args]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(processes), *command[1:], f"trainer.batch_size={per_process_batch(run, args, processes)}"]
    # resume=auto continues a run that an earlier job left unfinished: its wall time is then this job's part only
    resumed = any((run_dir / "checkpoints").glob("step_*")) if run_dir.is_dir() else False
    with gpu_slot(count=processes) as slot:
        env = run_environment(slot)
        print(f"{run.table}/{run.recipe}/{run.row}-seed{run.seed}: training on {'GPU ' + slot if slot else 'CPU'}",
              flush=True)
        start = time.perf_counter()
        failed = subprocess.run(command, env=env).returncode
        wall_s = time.perf_counter() - start
        if failed:  # no result file: the run is retried next time; the other jobs go on
            print(f"{run.table}/{run.recipe}/{run.row}-seed{run.seed}: FAILED (exit {failed}), no result written",
                  file=sys.stderr, flush=True)
            return None
        gpu = _gpu_name(slot)
    cfg = read_yaml_mapping(run_dir / "config.yaml")
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    result = result_from_run(run, cfg, report, run_dir, gpu, wall_s, extra, processes)
    result["resumed"] = resumed
    write_result(target, result)
    print(f"{target}: nMSE {result['nmse_mean']:.3e}", flush=True)
    return target


def per_process_batch(run: Run, args: list[str], processes: int) -> int:
    """The batch of each of ``processes`` processes that makes the run's global batch: its
    ``trainer.batch_size`` override (a table's budget sets one), divided by ``processes``."""
    given = [o.split("=", 1)[1] for o in args if o.lstrip("+").startswith("trainer.batch_size=")]
    name = f"{run.table}/{run.recipe}/{run.row}"
    if not given:
        raise SystemExit(f"{name}: --processes {processes} needs the global batch as trainer.batch_size=N in the "
                         "table's budget or after --")
    total = int(given[-1])
    if total % processes:
        raise SystemExit(f"{name}: a batch of {total} does not split over {processes} processes; "
                         "choose --processes dividing it")
    return total // processes


def prepare(runs: list[Run], extra: list[str], compose: Callable[[str, list[str]], dict[str, Any]]) -> None:
    """Generate every dataset the runs need, once, before parallel jobs open them (``compose``:
    the recipes' configuration of a recipe with overrides, ``recipes/train.py``'s)."""
    from gno_ext.training.recipe_data import open_split, prepare_data

    for recipe, size in sorted({(r.recipe, r.size) for r in runs}):
        cfg = compose(recipe, [f"size={size}", *[o for o in extra if o.startswith("data.")]])
        if cfg["data"]["kind"] in ("the_well", "pdebench"):  # downloaded data: stop before any run if it is absent
            try:
                open_split(cfg["data"], "test", int(cfg["data"].get("n_steps_input", 1)), 1, metadata_only=True)
            except FileNotFoundError as e:
                raise SystemExit(f"recipe {recipe}: {e}") from None
        prepare_data(cfg["data"])


def parse_cell(cell: str) -> tuple[str, str, int]:
    """``<recipe>/<row>-seed<N>`` (a sweep's ``cell``, named as the cell's result file) as
    ``(recipe, row, seed)``."""
    match = re.fullmatch(r"([^/]+)/([^/]+)-seed(\d+)", cell)
    if not match:
        raise ValueError(f"cell={cell!r}: expected <recipe>/<row>-seed<N>, e.g. heat-param/gno-seed0")
    return match[1], match[2], int(match[3])


def sweep_command(runs: list[Run], size: str | None, extra: list[str], launcher: str | None,
                  jobs: int | None, processes: int = 1) -> list[str]:
    """The Hydra multirun of exactly these runs (``recipes/sweep.py -m ...``): over their grid
    (``recipe=... row=... seed=...``) where they fill it, else over the cells themselves
    (``cell=<recipe>/<row>-seed<N>,...``), so that no other cell of the grid is run."""
    table = {r.table for r in runs}.pop()
    join = lambda values: ",".join(sorted({str(v) for v in values}))
    recipes, rows, seeds = ({getattr(r, key) for r in runs} for key in ("recipe", "row", "seed"))
    if len({(r.recipe, r.row, r.seed) for r in runs}) == len(recipes) * len(rows) * len(seeds):
        cells = [f"recipe={join(recipes)}", f"row={join(rows)}", f"seed={join(seeds)}"]
    else:
        cells = ["cell=" + ",".join(sorted({f"{r.recipe}/{r.row}-seed{r.seed}" for r in runs}))]
    command = [sys.executable, str(REPO / "recipes" / "sweep.py"), "-m", f"table={table}", *cells,
               *([f"size={size}"] if size else [])]
    if extra:
        command.append("extra=[" + ",".join(json.dumps(o) for o in extra) + "]")
    if processes > 1:
        command.append(f"processes={processes}")
    if launcher:
        command.append(f"hydra/launcher={launcher}")
        if launcher == "joblib":
            per_gpu = int(os.environ.get("GNO_EXT_RUNS_PER_GPU", "1"))
            command.append(f"hydra.launcher.n_jobs={jobs or _local_gpus() * per_gpu // processes or 1}")
    return command


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count()
