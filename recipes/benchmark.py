"""The accuracy tables: plan, run (resumably, as a Hydra multirun) and render.

    python recipes/benchmark.py plan   --table param
    python recipes/benchmark.py run    --table param --seeds 0 1 [--launcher joblib] [-- trainer.compile=true]
    python recipes/benchmark.py render [--out docs/results.md]

A table (``benchmarks/tables.yaml``) is a set of recipes (its columns) times rows (models, with
optional overrides) times seeds, with a budget: the dataset size of each column (``size=bench``
unless the paper's own size is affordable) and the training overrides (epochs, batch size) that
every run of the table shares. ``--size`` and overrides after ``--`` replace those of the budget
(e.g. ``--size smoke`` for a quick check); the result files record what was used.

Each run trains with ``recipes/train.py`` and leaves one JSON file,
``benchmarks/results/<table>/<recipe>/<row>-seed<N>.json``; a run whose file exists is skipped,
so the same command resumes a table across days and machines (commit the files).

``run`` prepares the datasets once, then starts ``recipes/sweep.py -m`` — Hydra's multirun —
over the table's grid. With Hydra's default launcher the runs go one after another; with
``--launcher joblib`` (``pip install hydra-joblib-launcher``) one per GPU of the host at once;
on a cluster any Hydra launcher takes them (``hydra/launcher=submitit_slurm`` with
``hydra-submitit-launcher``), each job on its own GPU. ``--processes N`` trains each run over N
GPUs (DDP at the same global batch) where one GPU would take too long. Every run of a table
gets the same data, epochs, batch size, optimizer settings and seeds: the budget (size and
overrides) is recorded in every result and stated next to every rendered table.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "benchmarks" / "tables.yaml"
RESULTS = ROOT / "benchmarks" / "results"
REQUIRED = ("table", "recipe", "model", "seed", "size", "epochs", "batch_size", "n_params", "gpu", "wall_s", "commit",
            "nmse_mean", "nmse_std", "nmse_worst_group", "rel_l2_mean", "per_step_nmse", "paper_nmse")
# what a table's cells show (its `metric`): the rollout's normalised MSE, or its plain MSE in the
# data's units where the paper reports that (The Well's turbulent radiative layer)
METRICS = {"nmse": "nMSE", "mse": "MSE"}


def load_tables(path: str | Path = TABLES) -> dict[str, Any]:
    """The tables of ``path``, each row completed with its model name and overrides, and each
    table with its budget (``{"size": ..., "sizes": {recipe: size}, "overrides": [...]}``,
    from the file's default ``budget`` and the table's own), its ``metric`` (`METRICS`, default
    ``nmse``) and ``needs`` (what a table of downloaded data needs before it can run, or None)."""
    path = Path(path)
    data = yaml.safe_load(path.read_text())
    tables = data["tables"]
    for name, table in tables.items():
        budget = {"size": "bench", "sizes": {}, "overrides": [], **(data.get("budget") or {}), **(table.get("budget") or {})}
        unknown = sorted(set(budget["sizes"]) - set(table["recipes"]))
        if unknown:
            raise ValueError(f"{path}: table {name}: budget.sizes names {unknown}, not among its recipes {table['recipes']}")
        table["budget"] = budget
        metric = table.setdefault("metric", "nmse")
        if metric not in METRICS:
            raise ValueError(f"{path}: table {name}: metric {metric!r}, not one of {sorted(METRICS)}")
        table.setdefault("needs", None)
        for row, spec in table["rows"].items():
            spec = table["rows"][row] = dict(spec or {})
            spec.setdefault("model", row)
            spec.setdefault("overrides", [])
            paper = spec.setdefault("paper", [None] * len(table["recipes"]))
            if len(paper) != len(table["recipes"]):
                raise ValueError(f"{path}: table {name}, row {row}: {len(paper)} paper values for "
                                 f"{len(table['recipes'])} recipes {table['recipes']}")
    return tables


@dataclass(frozen=True)
class Run:
    """One cell of a table for one seed."""

    table: str
    recipe: str
    row: str
    model: str
    overrides: tuple[str, ...]
    seed: int
    paper_nmse: float | None
    size: str = "bench"
    budget: tuple[str, ...] = ()
    """The table's training overrides (epochs, batch size), the same for every run of it."""

    def path(self, results: Path = RESULTS) -> Path:
        return results / self.table / self.recipe / f"{self.row}-seed{self.seed}.json"


def plan(tables: dict[str, Any], table: str, seeds: list[int], recipes: list[str] | None = None,
         rows: list[str] | None = None, size: str | None = None) -> list[Run]:
    """Every run of ``table`` (optionally a subset of its recipes and rows), at the sizes of the
    table's budget or at ``size``."""
    if table not in tables:
        raise SystemExit(f"--table {table!r}: unknown; available: {', '.join(tables)}")
    spec = tables[table]
    for kind, chosen, known in (("recipe", recipes, spec["recipes"]), ("row", rows, list(spec["rows"]))):
        unknown = sorted(set(chosen or []) - set(known))
        if unknown:
            raise SystemExit(f"table {table}: no {kind} {unknown}; it has {known}")
    out, budget = [], spec["budget"]
    for column, recipe in enumerate(spec["recipes"]):
        if recipes and recipe not in recipes:
            continue
        for row, r in spec["rows"].items():
            if rows and row not in rows:
                continue
            for seed in seeds:
                out.append(Run(table, recipe, row, r["model"], tuple(r["overrides"]), seed, r["paper"][column],
                               size or budget["sizes"].get(recipe, budget["size"]), tuple(budget["overrides"])))
    return out


def merge_overrides(budget: tuple[str, ...] | list[str], extra: list[str]) -> list[str]:
    """The budget's overrides with those of ``extra`` replacing any of the same key, then the rest
    of ``extra``."""
    key = lambda o: o.lstrip("+~").split("=", 1)[0]
    given = {key(o) for o in extra}
    return [o for o in budget if key(o) not in given] + list(extra)


def git_commit() -> str:
    """The commit of the code that runs: ``$GNO_EXT_COMMIT`` where the checkout is a copy without
    its history (a machine that was sent the working tree), else ``git rev-parse HEAD``, with
    ``-dirty`` for uncommitted changes to tracked files."""
    if os.environ.get("GNO_EXT_COMMIT"):
        return os.environ["GNO_EXT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
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
            held = []
            for gpu in gpus:
                handle = open(lock_dir / f"gpu{gpu}{f'-{j}' if j else ''}.lock", "w")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                held.append((gpu, handle))
                if len(held) == count:
                    break
            try:
                if len(held) == count:
                    yield ",".join(gpu for gpu, _ in held)
                    return
            finally:
                for _, handle in held:
                    fcntl.flock(handle, fcntl.LOCK_UN)
                    handle.close()
        time.sleep(5)


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
        "dro": {k: cfg["trainer"]["dro"][k] for k in ("tau", "temperature")},
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
    output_root = output_root or ROOT / "runs" / "benchmark"
    run_dir = output_root / run.table / run.recipe / f"{run.row}-seed{run.seed}"
    extra = merge_overrides(run.budget, extra)
    # the row's own overrides last: they define the row (a speed override cannot undo them)
    args = [f"model={run.model}", f"size={run.size}", f"seed={run.seed}", f"run_dir={run_dir}", "resume=auto",
            *extra, *run.overrides]
    command = [sys.executable, str(ROOT / "recipes" / "train.py"), "--recipe", run.recipe, *args]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(processes), *command[1:], f"trainer.batch_size={per_process_batch(run, args, processes)}"]
    # resume=auto continues a run that an earlier job left unfinished: its wall time is then this job's part only
    resumed = any((run_dir / "checkpoints").glob("step_*")) if run_dir.is_dir() else False
    with gpu_slot(count=processes) as slot:
        env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": slot} if slot is not None else {}))
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
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
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


def same_run(run: Run, extra: list[str], results: Path = RESULTS) -> Path | None:
    """A result of another table that is this run: the same recipe, model config, row overrides,
    seed, size, computing overrides and DRO temperature, however set (the ablation's full GNO is
    the joint table's GNO; a row that sets the paper's temperature is a result that predates the
    setting), itself trained rather than taken from a third table (`budget_difference` finds
    nothing between them). None if there is none."""
    for path in sorted(results.glob(f"*/{run.recipe}/*-seed{run.seed}.json")):
        if path.parent.parent.name == run.table:
            continue
        other = json.loads(path.read_text())
        if other.get("same_run_as"):  # itself taken from another table: name the original
            continue
        if other.get("seed") == run.seed and budget_difference(run, extra, other) is None:
            return path
    return None


def budget_difference(run: Run, extra: list[str], result: dict[str, Any]) -> str | None:
    """What differs between the computation ``run`` (with the command's ``extra`` overrides)
    asks for and the one ``result`` records: the size, the model config, the row's overrides,
    the overrides that change the computation, the DRO temperature; None where they agree (the
    result is this run's)."""
    budget = merge_overrides(run.budget, extra)
    wanted = {"size": run.size, "model config": run.model, "row overrides": _without_dro(_computes(run.overrides)),
              "overrides": _without_dro(_computes(budget)),
              "DRO": _dro_key([*budget, *run.overrides], dro_of_overrides([*budget, *run.overrides]))}
    found = {"size": result.get("size"), "model config": result.get("model_config", result.get("model")),
             "row overrides": _without_dro(_computes(result.get("overrides", ()))),
             "overrides": _without_dro(_computes(result.get("extra", []))),
             "DRO": _dro_key([*result.get("extra", []), *result.get("overrides", [])], dro_of_result(result))}
    diff = [f"{k} {found[k]!r} where this run has {wanted[k]!r}" for k in wanted if found[k] != wanted[k]]
    return "; ".join(diff) or None


def load_results(results: Path, name: str, table: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The result files of table ``name`` that hold what their place says (a recipe and a row of
    the table, the table, recipe, row and seed of their path), and a line for each file left out,
    naming it and why (a file of another table or seed copied here, a file that is not a result,
    JSON that does not parse)."""
    found, left_out = [], []
    for path in sorted((results / name).glob("*/*.json")):
        shown = path.relative_to(results.parent) if results.parent in path.parents else path
        try:
            result = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            left_out.append(f"`{shown}` (not JSON: {error})")
            continue
        missing = [k for k in ("table", "recipe", "model", "seed", "nmse_mean") if not isinstance(result, dict) or k not in result]
        why = (f"not a result file: no {', '.join(missing)}" if missing else
               misplaced(path, result) or
               (f"recipe {path.parent.name!r} is not a column of the table" if path.parent.name not in table["recipes"]
                else f"row {result['model']!r} is not a row of the table" if result["model"] not in table["rows"]
                else None))
        if why:
            left_out.append(f"`{shown}` ({why})")
        else:
            found.append(result)
    return found, left_out


def misplaced(path: Path, result: dict[str, Any]) -> str | None:
    """Why the result file ``path`` (under ``results/TABLE/RECIPE/ROW-seedN.json``) does not hold
    what its place says, or None: its table, recipe, row or seed differ from the path's."""
    table, recipe = path.parent.parent.name, path.parent.name
    row, _, seed = path.stem.rpartition("-seed")
    said = {"table": table, "recipe": recipe, "model": row, "seed": seed}
    held = {k: str(result.get(k)) for k in said}
    diff = [f"{k} {held[k]!r}" for k in said if held[k] != said[k]]
    return f"it holds {', '.join(diff)}" if diff else None


def _without_dro(overrides: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(o for o in overrides if not o.lstrip("+").startswith("trainer.dro."))


def _dro_key(overrides: list[str], dro: tuple[float, str]) -> tuple[float, str] | None:
    """``dro``, or None where the curriculum never reaches DRO (its MSE phase takes every epoch:
    the temperature changes nothing)."""
    fractions = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("trainer.curriculum.warmup_fraction=")]
    return None if fractions and float(fractions[-1]) >= 1 else dro


PAPER_DRO = (1.0, "absolute")
"""The DRO temperature of results that record none: the paper's formula with tau = 1, the
training default until the relative temperature replaced it."""


def dro_of_result(result: dict[str, Any]) -> tuple[float, str]:
    """The DRO temperature a result was trained with: ``(tau, temperature)``."""
    dro = result.get("dro")
    return (float(dro["tau"]), dro["temperature"]) if dro else PAPER_DRO


def dro_of_overrides(overrides: list[str] | tuple[str, ...]) -> tuple[float, str]:
    """The DRO temperature a run with ``overrides`` trains with (the last override of a key wins;
    the training defaults otherwise)."""
    from gno_ext.training.settings import DROSettings

    given = dict(o.lstrip("+").split("=", 1) for o in overrides if o.lstrip("+").startswith("trainer.dro."))
    default = DROSettings()
    return (float(given.get("trainer.dro.tau", default.tau)), given.get("trainer.dro.temperature", default.temperature))


def adopt(run: Run, source: Path, results: Path = RESULTS) -> Path:
    """Write ``source`` (`same_run`) as ``run``'s result: the same figures, this table's name, row
    and paper value, and ``same_run_as`` naming the file it came from."""
    result = json.loads(source.read_text())
    result.update(table=run.table, model=run.row, paper_nmse=run.paper_nmse,
                  same_run_as=str(source.relative_to(results)))
    return write_result(run.path(results), result)


def write_result(target: Path, result: dict[str, Any]) -> Path:
    """Write a result file whole or not at all (a temporary name, then renamed)."""
    from gno_ext._files import written_whole

    with written_whole(target) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    return target


def prepare(runs: list[Run], extra: list[str]) -> None:
    """Generate every dataset the runs need, once, before parallel jobs open them."""
    from train import compose  # recipes/ is the script folder

    from gno_ext.training.recipe_data import prepare_data

    for recipe, size in sorted({(r.recipe, r.size) for r in runs}):
        cfg = compose(recipe, [f"size={size}", *[o for o in extra if o.startswith("data.")]])
        if cfg["data"]["kind"] in ("the_well", "pdebench"):  # downloaded data: stop before any run if it is absent
            from gno_ext.training.recipe_data import open_split
            try:
                open_split(cfg["data"], "test", int(cfg["data"].get("n_steps_input", 1)), 1, metadata_only=True)
            except FileNotFoundError as e:
                raise SystemExit(f"recipe {recipe}: {e}") from None
        prepare_data(cfg["data"])


def sweep_command(runs: list[Run], size: str | None, extra: list[str], launcher: str | None,
                  jobs: int | None, processes: int = 1) -> list[str]:
    """The Hydra multirun over the runs' grid (``recipes/sweep.py -m ...``)."""
    table = {r.table for r in runs}.pop()
    join = lambda values: ",".join(sorted({str(v) for v in values}))
    command = [sys.executable, str(ROOT / "recipes" / "sweep.py"), "-m", f"table={table}",
               f"recipe={join(r.recipe for r in runs)}", f"row={join(r.row for r in runs)}",
               f"seed={join(r.seed for r in runs)}", *([f"size={size}"] if size else [])]
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


# Overrides that change how fast a run goes or what it prints, never what it computes: left out
# of the budget that a table states (a row may need capture off where its step cannot be captured).
NOT_BUDGET = ("trainer.compile", "trainer.capture", "trainer.progress", "trainer.num_workers", "trainer.tensorboard",
              "trainer.grad_sync", "trainer.compile_options", "data.in_memory", "data.root", "eval.figures",
              "eval.batch_size")


def _computes(overrides: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The overrides that change what a run computes (those not in `NOT_BUDGET`)."""
    return tuple(o for o in overrides if not o.lstrip("+~").startswith(NOT_BUDGET))


def budget_of(result: dict[str, Any]) -> tuple | None:
    """What every run of a table must share: size, epochs, batch size, learning rate, the
    overrides that change the computation (the DRO temperature aside: a table states its own
    objective, and rows may set theirs), and the precision (None for an untrained reference,
    which has no budget)."""
    if result.get("steps", 1) == 0:
        return None
    return (result["size"], result["epochs"], result["batch_size"], result.get("lr"),
            _without_dro(_computes(result.get("extra", []))), result.get("precision"))


def objective_text(table: dict[str, Any]) -> str:
    """The objective a table's budget trains with, in words."""
    tau, temperature = dro_of_overrides(table["budget"]["overrides"])
    if temperature == "absolute":
        return (f"the curriculum's group DRO as the paper writes it, tau = {tau:g} on the loss (at these losses "
                "the plain mean: in effect MSE throughout)")
    return f"the curriculum's group DRO at tau = {tau:g} relative to the mean group loss"


def _cell(values: list[float]) -> str:
    if not values:
        return "—"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.2e}"
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:.2e} ± {std:.1e}"


PAGE_HEAD = """# Results

How the GNO compares with the baselines, table by table as in the paper: the normalised MSE of
the 10-step autoregressive rollout (50 for Navier-Stokes) on the test split, $\\|\\hat u - u\\|^2 /
\\|u - \\bar u\\|^2$ per trajectory, averaged over trajectories (± the standard deviation over
seeds where there are several), beside the paper's value for the same cell (the `trl` table, as
the paper, reports the plain MSE in the data's units). The paper does not say how it pools the
variance; result files written since the other readings were recorded also keep the pooled nMSE
(summed errors over summed variances of the split), the per-step one (each frame's own
variance) and the per-channel one (`nmse_readings`), and each trajectory's value with its
parameters and boundary configuration (`per_trajectory`), so a cell can be re-read. Every model of a
table is trained on the same data with the same epochs, batch size, optimizer settings and
seeds; the budget is stated under each table. The rows `fno` (neuraloperator's FNO with the
same inputs as channels), `gated_fno`, `gno_fno` (the GNO's gate and boundary operator on that
FNO, [Layers and models](models/index.md#the-gno-on-neuraloperators-fno-gno_fno)), `gno_conv`
(the GNO with a convolutional decoder) and `persistence` (the last frame copied forward: what a
model that has learnt nothing scores) are not in the paper.

The budget of every table is 10 epochs at batch 64 (the paper: 100 epochs). Its columns use the
`bench` size of the datasets: the paper's resolution and protocol with fewer trajectories (see
[the `bench` size](datasets/index.md#presets)); the table `heat-paper` repeats heat at the
paper's own counts. Our datasets follow the paper's protocols but are generated by our own
solvers (see [the differences](datasets/index.md#differences-from-the-paper)). Compare the rows
of one table with each other first, and with the paper's column only as a reference.

This page is written by `python recipes/benchmark.py render --out docs/results.md` from the
result files under `benchmarks/results/` (one JSON file per run, with its commit and GPU).
Reproduce a table, or resume it where it stopped, with the command under it: a run whose
result file exists is skipped. `--launcher joblib` runs one training per local GPU at once;
on a cluster any Hydra launcher takes the sweep (`recipes/sweep.py`, see
[Running on a cluster](recipes/cluster.md)).

**Why a rollout's first step is harder than the one-step validation error.** A rollout starts
at a trajectory's initial condition, so its first step is the one-step prediction from frame 0
(a test checks that they are equal). Training and validation draw windows from every start
frame. For heat, frame 0 is a rough random field whose fine scales decay within one frame, and
the steps after it are far easier. For the GNO of the README's main job (`heat-param`,
`size=small`, on a CPU), the one-step test error is 0.24 from frame 0, 0.025 from frame 1 and
0.004 from frame 5: 0.048 averaged over all start frames, against 0.24 for the rollout's first
step. This is not a defect of the rollout, and it is the same for every model.

"""


def _budget_text(budget: tuple) -> str:
    size, epochs, batch, lr, extra, precision = budget
    return f"size={size}, {epochs} epochs, batch {batch}, lr {lr}, precision {precision}" + \
        (f", {' '.join(o for o in extra if not o.startswith(('trainer.epochs=', 'trainer.batch_size=')))}"
         if any(not o.startswith(('trainer.epochs=', 'trainer.batch_size=')) for o in extra) else "")


FIGURES = "results"  # the figures' folder, beside the page (docs/results/)
SUMMARY = "summary"  # notes/summary.md: the page's overview, under its head
RUNTIME = "runtime"  # results/runtime/*.json: benchmarks/bench_runtime.py's files (trained runs against solvers)


def _runtime_results(results: Path) -> tuple[Any, list[dict[str, Any]]] | None:
    """benchmarks/bench_runtime.py, which renders them, and the runtime results in ``results``
    (`RUNTIME`), or None where there are none."""
    files = sorted((results / RUNTIME).glob("*.json"))
    if not files:
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_runtime", ROOT / "benchmarks" / "bench_runtime.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, [{**json.loads(p.read_text()), "file": p.name} for p in files]


def _runtime_commands(found: list[dict[str, Any]], tables: dict[str, Any]) -> list[str]:
    """The commands that reproduce runtime results: train the table's run again (where the run
    folder is a benchmark run, ``<table>/<recipe>/<row>-seed<N>``; its result goes beside the
    run, since the committed one would skip it), then time it."""
    commands = []
    for r in found:
        for run in r["runs"]:
            table, recipe, name = Path(run["run"]).parts[-3:]
            row, _, seed = name.rpartition("-seed")
            trajectories = sum(c["trajectories"] for c in run["classes"].values())
            resolutions = sorted({p["res"] for c in run["classes"].values() for curve in c["solvers"].values()
                                  for p in curve})
            if table in tables and seed.isdigit():
                commands.append(f"python recipes/benchmark.py run --table {table} --recipes {recipe} --rows {row} "
                                f"--seeds {seed} --output-root runs --results runs/results")
            commands.append(f"python benchmarks/bench_runtime.py run runs/{table}/{recipe}/{name} --out "
                            f"runs/{RUNTIME}/{r['file']} --trajectories {trajectories} --resolutions "
                            f"{' '.join(map(str, resolutions))} --repeats {r['repeats']}")
    return commands


def _values(found: list[dict[str, Any]], metric: str, recipe: str, row: str) -> list[float]:
    """The ``metric`` of every seed of one cell (a result without it, as one written before the
    metric was recorded, is left out)."""
    return [r[f"{metric}_mean"] for r in found if r["recipe"] == recipe and r["model"] == row
            and r.get(f"{metric}_mean") is not None]


def _ranked(found: list[dict[str, Any]], recipe: str, metric: str = "nmse") -> list[tuple[str, list[dict[str, Any]]]]:
    """The column's rows as (row, its results), best mean of ``metric`` first; `persistence`
    apart (last)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for r in found:
        if r["recipe"] == recipe:
            rows.setdefault(r["model"], []).append(r)

    def mean(rs: list[dict[str, Any]]) -> float:
        values = _values(rs, metric, recipe, rs[0]["model"])
        return sum(values) / len(values) if values else math.inf

    trained = sorted(((m, rs) for m, rs in rows.items() if m != "persistence"), key=lambda x: mean(x[1]))
    return trained + [(m, rs) for m, rs in rows.items() if m == "persistence"]


def _shown(found: list[dict[str, Any]], recipe: str, metric: str = "nmse") -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows a column's figures show: the GNO, the two best other trained rows, persistence."""
    ranked = _ranked(found, recipe, metric)
    others = [x for x in ranked if x[0] not in ("gno", "persistence")][:2]
    return [x for x in ranked if x[0] == "gno"] + others + [x for x in ranked if x[0] == "persistence"]


MODEL_COLOURS = {"gno": "#d62728", "gno_fno": "#ff7f0e", "gno_fno_soft": "#2ca02c", "gno_conv": "#9467bd",
                 "fno": "#1f77b4", "gated_fno": "#17becf", "unisolver": "#8c564b", "moe_pot": "#e377c2",
                 "vit-2": "#bcbd22", "vit-5": "#aec7e8", "vit-10": "#ffbb78", "concat": "#98df8a",
                 "pino": "#c5b0d5", "persistence": "#7f7f7f"}
"""The colour of each row on every figure of the site; other rows take one from a fixed cycle
by their name."""
_OTHER_COLOURS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
                  "#756bb1", "#636363", "#9c9ede", "#cedb9c", "#e7ba52", "#e7969c", "#de9ed6")


def model_colour(row: str) -> str:
    """The colour of ``row`` on every figure (`MODEL_COLOURS`, else one of a fixed cycle chosen
    by a checksum of the name, so that it is the same on every page and every run)."""
    import zlib

    return MODEL_COLOURS.get(row) or _OTHER_COLOURS[zlib.crc32(row.encode()) % len(_OTHER_COLOURS)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _worst_section(name: str, table: dict[str, Any], found: list[dict[str, Any]]) -> list[str]:
    """For a table with ``worst: true``: the worst group's nMSE of every cell (mean ± std over
    seeds) and the group, beside the mean of the main table."""
    if not table.get("worst") or not found:
        return []
    out = ["The worst group's rollout nMSE of each cell (the boundary configuration and parameter bin with "
           "the highest mean error; mean ± std over seeds, the group of the first seed):\n",
           "| model | " + " | ".join(table["recipes"]) + " |", "| --- |" + " --- |" * len(table["recipes"])]
    for row in table["rows"]:
        cells = []
        for recipe in table["recipes"]:
            rs = [r for r in found if r["recipe"] == recipe and r["model"] == row and r.get("nmse_worst_group")]
            worst = [r["nmse_worst_group"]["nmse_mean"] for r in rs]
            cells.append(f"{_cell(worst)} ({rs[0]['nmse_worst_group']['label']})" if rs else "—")
        out.append(f"| `{row}` | " + " | ".join(cells) + " |")
    return ["\n".join(out) + "\n"]


def _tested(found: list[dict[str, Any]], recipe: str, row: str, epoch: int) -> list[dict[str, Any]]:
    """The test rollouts after ``epoch`` of every seed of one cell (``eval.at_epochs``)."""
    return [e for r in found if r["recipe"] == recipe and r["model"] == row for e in r.get("at_epochs") or []
            if e["epoch"] == epoch]


def _epochs_section(name: str, table: dict[str, Any], found: list[dict[str, Any]]) -> list[str]:
    """For results with test rollouts during training: their nMSE after each epoch tested and
    the GPU minutes of training to it (means over seeds), and the figures of error against
    GPU minutes."""
    epochs = sorted({e["epoch"] for r in found for e in r.get("at_epochs") or []})
    if not epochs:
        return []
    out = ["Test rollout nMSE during training (`eval.at_epochs`), after each epoch shown, with the minutes of "
           "GPU time spent training to it (compilation and capture included, the test rollouts not; means "
           "over seeds):\n",
           "| model | " + " | ".join(f"{recipe}, epoch {e}" for recipe in table["recipes"] for e in epochs) + " |",
           "| --- |" + " --- |" * (len(epochs) * len(table["recipes"]))]
    for row in table["rows"]:
        cells = []
        for recipe in table["recipes"]:
            for e in epochs:
                at = _tested(found, recipe, row, e)
                cells.append(f"{_mean([a['nmse_mean'] for a in at]):.2e} ({_mean([a['train_s'] for a in at]) / 60:.1f} "
                             "min)" if at else "—")
        if any(c != "—" for c in cells):
            out.append(f"| `{row}` | " + " | ".join(cells) + " |")
    out.append("")
    out += [f"![{name} {recipe}: test nMSE against GPU minutes]({FIGURES}/{name}-{recipe}-vs_gpu_minutes.png)"
            for recipe in table["recipes"] if any(r["recipe"] == recipe and r.get("at_epochs") for r in found)]
    return ["\n".join(out) + "\n"]


def _plot_epochs(table: dict[str, Any], found: list[dict[str, Any]], recipe: str, plt: Any):
    """Test nMSE against GPU minutes of training, one line per row (mean over seeds at each
    epoch tested), in the row's colour; None where no result of the column has such points."""
    rows = [row for row in table["rows"] if any(r["recipe"] == recipe and r["model"] == row and r.get("at_epochs")
                                                for r in found)]
    if not rows:
        return None
    epochs = sorted({e["epoch"] for r in found for e in r.get("at_epochs") or []})
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for row in rows:
        points = [(_mean([a["train_s"] for a in at]) / 60, _mean([a["nmse_mean"] for a in at]), e)
                  for e in epochs if (at := _tested(found, recipe, row, e))]
        ax.loglog([p[0] for p in points], [p[1] for p in points], marker="o", color=model_colour(row), label=row)
        for x, y, e in points:
            ax.annotate(str(e), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("GPU minutes of training (labels: epochs)")
    ax.set_ylabel("test rollout nMSE")
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def _tick_label(label: str, wrap: bool) -> str:
    """A group's label for a figure's axis: one boundary type on every face said once
    (``dirichlet/dirichlet/dirichlet/dirichlet`` as ``all dirichlet``), wrapped into lines
    where the axis has room for them."""
    faces, _, rest = label.partition(", ")
    types = faces.split("/")
    if len(set(types)) == 1 and len(types) > 1:
        faces = f"all {types[0]}"
    short = f"{faces}, {rest}" if rest else faces
    return "\n".join(textwrap.wrap(short, 24)) if wrap else short


def write_figures(tables: dict[str, Any], results: Path, folder: Path) -> list[Path]:
    """Per column of every table: the per-step error of the rollout, and the error per DRO group
    (boundary configuration x parameter bin) where the results record it, for the GNO, the two
    best other rows and persistence (mean over seeds). Returns the files written."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    folder.mkdir(parents=True, exist_ok=True)

    def save(fig, ax, title: str, stem: str) -> None:
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = folder / f"{stem}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    for name, table in tables.items():
        found, _ = load_results(results, name, table)
        for recipe in table["recipes"]:
            shown = _shown(found, recipe, table["metric"])
            if not shown:
                continue
            fig, ax = plt.subplots(figsize=(5.5, 3.6))
            for row, rs in shown:
                curve = np.mean([r["per_step_nmse"] for r in rs], axis=0)
                ax.semilogy(np.arange(1, len(curve) + 1), curve, marker="o", ms=3, color=model_colour(row),
                            ls="--" if row == "persistence" else "-", label=f"{row} ({len(rs)} seed{'s' * (len(rs) > 1)})")
            ax.set_xlabel("rollout step")
            ax.set_ylabel("nMSE of the step")
            ax.grid(True, which="both", alpha=0.3)
            save(fig, ax, f"{name}: {recipe}", f"{name}-{recipe}-per_step")
            grouped = [(row, rs) for row, rs in shown if all(r.get("groups") for r in rs)]
            if grouped:
                labels = [g["label"] for g in grouped[0][1][0]["groups"]]
                wrap = len(labels) <= 8  # few groups: labels in lines under their bars, else slanted
                fig, ax = plt.subplots(figsize=(max(5.5, (1.4 if wrap else 0.5) * len(labels) + 2), 3.8))
                width = 0.8 / len(grouped)
                for k, (row, rs) in enumerate(grouped):
                    by_label = [np.mean([next((g["nmse_mean"] for g in r["groups"] if g["label"] == lab), np.nan)
                                         for r in rs]) for lab in labels]
                    ax.bar(np.arange(len(labels)) + k * width, by_label, width, label=row, color=model_colour(row))
                ax.set_yscale("log")
                slant = {"rotation": 0, "ha": "center"} if wrap else {"rotation": 60, "ha": "right"}
                ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, [_tick_label(lab, wrap) for lab in labels],
                              fontsize=7, **slant)
                ax.set_ylabel("rollout nMSE")
                save(fig, ax, f"{name}: {recipe}, error per group", f"{name}-{recipe}-groups")
            plotted = _plot_epochs(table, found, recipe, plt)
            if plotted:
                save(*plotted, f"{name}: {recipe}, error against training time", f"{name}-{recipe}-vs_gpu_minutes")
    runtime = _runtime_results(results)
    if runtime:
        module, found = runtime
        path = folder / f"{RUNTIME}.png"
        module.plot(found, path)
        written.append(path)
    return written


def render(tables: dict[str, Any], results: Path = RESULTS) -> str:
    """The results page: every table, ours (mean ± std over seeds) beside the paper's value,
    with the budget of each column, the GPUs and commits the results came from, and the
    figures that `write_figures` draws."""
    out = [PAGE_HEAD]
    summary = results.parent / "notes" / f"{SUMMARY}.md"
    if summary.is_file():  # the answer to "does it win?" across the tables, written by hand
        out.append(f"## In short\n\n{summary.read_text()}")
    for name, table in tables.items():
        found, left_out = load_results(results, name, table)
        out.append(f"## `{name}`: {table['title']}\n")
        if left_out:  # files under the table's folder that are not its results: named, not shown
            out.append("**Left out of this table** (files under its folder that do not hold its results): "
                       + "; ".join(left_out) + ".\n")
        metric = table["metric"]
        notes = results.parent / "notes" / f"{name}.md"
        if not found:
            if table["needs"]:
                out.append(f"Not run: it needs the data. {table['needs'].strip()} The recipe is ready: "
                           f"`python recipes/benchmark.py run --table {name} -- data.root=PATH`.\n")
            else:
                out.append(f"Not run yet: `python recipes/benchmark.py run --table {name}`.\n")
            if notes.is_file():  # what stops it, where the notes say
                out.append(notes.read_text())
            continue
        if metric != "nmse":
            out.append(f"The cells of this table are the rollout's {METRICS[metric]}, as the paper reports it.\n")
        out.append("| model | " + " | ".join(f"{c} (ours) | {c} (paper)" for c in table["recipes"]) + " |")
        out.append("| --- |" + " --- | --- |" * len(table["recipes"]))
        for row, spec in table["rows"].items():
            cells = []
            for column, recipe in enumerate(table["recipes"]):
                ours = _values(found, metric, recipe, row)
                paper = spec["paper"][column]
                cells += [_cell(ours), "—" if paper is None else f"{paper:.2e}"]
            out.append(f"| `{row}` | " + " | ".join(cells) + " |")
        # every run of a column must share one budget (an untrained reference has none)
        columns: dict[tuple, list[str]] = {}
        mixed = []
        for recipe in table["recipes"]:
            budgets = sorted({budget_of(r) for r in found if r["recipe"] == recipe} - {None}, key=str)
            if len(budgets) > 1:
                mixed.append(recipe)
            for budget in budgets:
                columns.setdefault(budget, []).append(recipe)
        budget = "; ".join(f"{_budget_text(b)} ({', '.join(c)})" for b, c in columns.items()) or "no trained run yet"
        seeds = sorted({r["seed"] for r in found})
        gpus = sorted({r["gpu"] for r in found})
        commits = sorted({r["commit"][:10] for r in found})
        speed = sorted({o for r in found for o in r.get("extra", [])  # (a data folder is the machine's own)
                        if o.lstrip("+~").startswith(NOT_BUDGET) and not o.startswith("data.root=")})
        # what the results used beyond the table's budget (a size or overrides given on the command line)
        spec = table["budget"]
        other = sorted({o for b in columns for o in b[4]} - set(spec["overrides"]))
        sizes = sorted({r["size"] for r in found if r["size"] != spec["sizes"].get(r["recipe"], spec["size"])})
        flags = "".join(f" --size {s}" for s in sizes[:1]) + f" --seeds {' '.join(map(str, seeds))}"
        after = other + speed
        out.append(f"\nBudget: {budget}{f' (MIXED in {mixed}: rerun at one budget)' if mixed else ''}; "
                   f"{objective_text(table)}. "
                   f"Seeds run: {seeds} (± is the standard deviation over the seeds of a cell; a cell "
                   f"without it has one). GPU: {', '.join(gpus)}. Commits: {', '.join(commits)}. "
                   f"Reproduce: `python recipes/benchmark.py run --table {name}{flags}"
                   f"{' -- ' + ' '.join(after) if after else ''}`"
                   f"{' (the overrides after `--` change the speed only)' if speed and not other else ''}.\n")
        spread = sorted({(r["model"], r["recipe"], r["processes"]) for r in found if r.get("processes", 1) > 1})
        if spread:  # `execute`'s processes: the same computation, over several GPUs
            out.append("Trained over several GPUs (DDP at the same global batch): " + ", ".join(
                f"`{row}` on {recipe} ({n})" for row, recipe, n in spread) + ".\n")
        shared = sorted({(r["model"], r["same_run_as"].split("/")[0]) for r in found if r.get("same_run_as")})
        if shared:  # `same_run`: a cell of another table that is the same training
            out.append("Taken from another table (the same runs): " + ", ".join(
                f"`{row}` from `{other}`" for row, other in shared) + ".\n")
        figures = []
        for recipe in table["recipes"]:
            shown = _shown(found, recipe, metric)
            if shown:
                rows = ", ".join(f"`{row}`" for row, _ in shown)
                figures.append(f"![{name} {recipe}: per-step error of {rows}]({FIGURES}/{name}-{recipe}-per_step.png)")
                if all(r.get("groups") for _, rs in shown for r in rs):
                    figures.append(f"![{name} {recipe}: error per group]({FIGURES}/{name}-{recipe}-groups.png)")
        out += _worst_section(name, table, found) + _epochs_section(name, table, found)
        if figures:
            out.append("Per-step error of the rollout (mean over seeds) for the GNO, the two best other rows and "
                       "persistence" + (", and their error per group (boundary configuration and parameter bin)"
                                         if any("groups.png" in f for f in figures) else "") + ":\n")
            out.append("\n".join(figures) + "\n")
        if notes.is_file():  # the discussion of the table, written by hand next to its results
            out.append(notes.read_text())
    runtime = _runtime_results(results)
    if runtime:
        module, found = runtime
        runs = [run for r in found for run in r["runs"]]
        out.append("## Runtime against the solvers at matched accuracy\n")
        sizes = " and ".join(sorted({f"{run['resolution']}²" for run in runs}))
        out.append("Each solver at the coarsest resolution whose rollout nMSE is at most the model's (its error "
                   f"against the {sizes} ground truth; `(finest)`: none coarser is, the data's own resolution), "
                   "timed against the model on the same GPU in the same process: milliseconds per "
                   f"{runs[0]['steps']}-frame rollout at each batch size, median of repeats.\n")
        out.append(module.summary(found) + "\n")
        out.append(f"GPU: {', '.join(sorted({r['gpu'] for r in found}))}, torch "
                   f"{', '.join(sorted({r['torch'] for r in found}))}. Commits: "
                   f"{', '.join(sorted({str(r['commit'])[:10] for r in found}))}. Trained runs: "
                   + ", ".join(f"`{'/'.join(Path(run['run']).parts[-3:])}`" for run in runs)
                   + f". Files: `benchmarks/results/{RUNTIME}/`. Reproduce (on one GPU):\n")
        out.append("```bash\n" + "\n".join(_runtime_commands(found, tables)) + "\n```\n")
        out.append(f"![error against time per frame]({FIGURES}/{RUNTIME}.png)\n")
        notes = results.parent / "notes" / f"{RUNTIME}.md"
        if notes.is_file():
            out.append(notes.read_text())
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("--table", required=True)
        p.add_argument("--size", help="smoke | small | bench | paper (recipes/conf/size); default: the "
                                      "table's budget in tables.yaml")
        p.add_argument("--seeds", type=int, nargs="+", default=[0])
        p.add_argument("--recipes", nargs="+", help="a subset of the table's recipes")
        p.add_argument("--rows", nargs="+", help="a subset of the table's rows")
        p.add_argument("--tables", type=Path, default=TABLES)
        p.add_argument("--results", type=Path, default=RESULTS)
        if name == "run":
            p.add_argument("--launcher", help="a Hydra launcher (joblib: one run per local GPU at once)")
            p.add_argument("--jobs", type=int, help="parallel jobs of the joblib launcher (default: GPUs times "
                                                    "$GNO_EXT_RUNS_PER_GPU)")
            p.add_argument("--output-root", type=Path, help="where the run folders go (default: runs/benchmark)")
            p.add_argument("--processes", type=int, default=1,
                           help="GPUs per run (DDP at the same global batch) for runs too long for one GPU")
        p.add_argument("extra", nargs="*", help="Hydra overrides for every run (after --), e.g. trainer.epochs=20")
    p = sub.add_parser("render")
    p.add_argument("--tables", type=Path, default=TABLES)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, help="write the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    tables = load_tables(args.tables)
    if args.command == "render":
        text = render(tables, args.results)
        if args.out:
            args.out.write_text(text)
            write_figures(tables, args.results, args.out.parent / FIGURES)
        else:
            print(text)
        return
    runs = plan(tables, args.table, args.seeds, args.recipes, args.rows, args.size)
    todo = [r for r in runs if not r.path(args.results).exists()]
    same = {r: same_run(r, args.extra, args.results) for r in todo}
    # a result file of another computation in a run's place (a smoke run's, say) is not this run's
    other = {r: budget_difference(r, args.extra, json.loads(r.path(args.results).read_text()))
             for r in runs if r.path(args.results).exists()}
    blocked = {r: why for r, why in other.items() if why}
    if args.command == "plan":
        for r in runs:
            state = (f"blocked: its file holds another computation ({blocked[r]})" if r in blocked else
                     "done" if r.path(args.results).exists() else
                     f"the same run as {same[r].relative_to(args.results)}" if same[r] else "to run")
            print(f"{r.table}/{r.recipe}/{r.row}-seed{r.seed} (size={r.size} {' '.join(r.budget)}): {state}")
        print(f"{sum(same[r] is None for r in todo)} of {len(runs)} runs to do"
              + (f"; {len(blocked)} blocked by result files of another computation" if blocked else ""))
        return
    if blocked:
        raise SystemExit("these cells hold result files of another computation; move them aside to run the cells: "
                         + "; ".join(f"{r.path(args.results)} ({why})" for r, why in blocked.items()))
    for r in todo:
        if same[r]:
            print(f"{adopt(r, same[r], args.results).relative_to(args.results)}: the same run as "
                  f"{same[r].relative_to(args.results)}, its result taken", flush=True)
    todo = [r for r in todo if not same[r]]
    if not todo:
        print(f"table {args.table}: all {len(runs)} runs have results")
        return
    if args.processes < 1:
        raise SystemExit(f"--processes {args.processes}: must be at least 1")
    if args.processes > 1:  # every run's batch must split over the processes: refused before any data is made
        for r in todo:
            per_process_batch(r, [*merge_overrides(r.budget, args.extra), *r.overrides], args.processes)
    prepare(todo, args.extra)
    command = sweep_command(todo, args.size, args.extra, args.launcher, args.jobs, args.processes)
    if args.results != RESULTS:
        command.append(f"results={args.results.resolve()}")
    if args.tables != TABLES:
        command.append(f"tables={args.tables.resolve()}")
    if args.output_root:
        command.append(f"output_root={args.output_root.resolve()}")
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    missing = [r for r in runs if not r.path(args.results).exists()]
    if missing:
        raise SystemExit(f"table {args.table}: {len(missing)} of {len(runs)} runs have no result (failed): "
                         + ", ".join(f"{r.recipe}/{r.row}-seed{r.seed}" for r in missing))


if __name__ == "__main__":
    main()
