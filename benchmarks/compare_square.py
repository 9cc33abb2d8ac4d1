r"""The mesh models against the grid models on the unit square, the domain both represent.

The square's trajectories (`gno_ext.data.mesh`, domain ``square``: the sides are Dirichlet or
Neumann in all 16 combinations, each with a constant datum) are generated once as a mesh
dataset; `gno_ext.data.mesh.grid_form` writes the same trajectories as a grid file (the
square's ``(n + 1)^2`` nodes as grid cells, its sides as the grid's faces). The mesh models
(``gno_mesh``, ``mesh_gnn``) train on the mesh files through ``heat-mesh`` / ``advection-mesh``
with ``data.domains=[square]``, the grid models (``gno_fno_soft``, ``gno_fno``, ``fno``) on the grid
file through the ``custom`` recipe, with the same splits, epochs, batch size, optimizer, seed and
DRO groups, and each is evaluated on the same test trajectories (10-step rollout nMSE).

    python benchmarks/compare_square.py run [--pde heat advection] [--size small] [--jobs 2] [-- trainer.epochs=30]
    python benchmarks/compare_square.py render [--results benchmarks/results/square]

``run`` writes one JSON file per PDE and model, ``benchmarks/results/square/<pde>-<model>.json``
(skipped where it exists), with every reading of the nMSE (``nmse_readings``, as the tables' result
files) and each test trajectory's value with its parameters (``per_trajectory``); ``render``
prints the Markdown table the irregular-domains page shows. ``run --refresh-readings`` with a
file's own settings makes again the files written before those readings were recorded.

``--domains curved`` compares them where the domain is not a square: the mesh models train on the
annulus, star-shaped ring and L-shape trajectories of ``heat-mesh`` / ``advection-mesh`` (the
recipes' default domains), the grid models on the same trajectories carried to a masked grid
(`gno_ext.data.mesh.masked_grid_form`: zero outside the domain, the inside mask and each
boundary cell's condition as field parameters). A grid model's test rollout is carried back to
the nodes (`gno_ext.data.mesh.nodes_from_grid`) and scored there against the mesh's own values,
with the same metric as the mesh models; the error of that carrying alone (the true frames to
the grid and back) is stated beside it. Results go to ``benchmarks/results/curved/``:

    python benchmarks/compare_square.py run --domains curved [--pde heat] [--size small]
    python benchmarks/compare_square.py render --results benchmarks/results/curved

A variant of a model (Hydra overrides after ``--``, a seed) is run into a folder of its own under
``benchmarks/results/square/variants/``; ``render --variants`` prints their table, one row per
file, with the settings each ran with:

    python benchmarks/compare_square.py run --pde heat --models gno_mesh \
        --results benchmarks/results/square/variants/soft-seed0 -- model.kwargs.soft_routing=true
    python benchmarks/compare_square.py render --variants
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from gno_ext import _children as children
from gno_ext.benchmark.run import git_commit
from gno_ext.benchmark.tables import aside, computing_overrides, has_readings, read_result, write_result

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "benchmarks" / "results" / "square"
VARIANTS = RESULTS / "variants"
CURVED = ("annulus", "star", "l-shape")  # the mesh recipes' default domains
# the domains a comparison takes (--domains) and where its results go by default
DOMAINS = {"square": (("square",), RESULTS), "curved": (CURVED, ROOT / "benchmarks" / "results" / "curved")}
MESH_MODELS = ("gno_mesh", "mesh_gnn")
GRID_MODELS = ("gno_fno_soft", "gno_fno", "fno")
MODELS = MESH_MODELS + GRID_MODELS
# The grid models' settings on the square's small grids: one boundary segment per face (the
# data is constant along a side, as the mesh GNO's one token per side).
GRID_OVERRIDES = {"gno_fno_soft": ["model.kwargs.boundary_patch={side}"],
                  "gno_fno": ["model.kwargs.boundary_patch={side}"], "fno": []}
# advection's two parameters get 4 bins each, as in the advection-mesh recipe
PDE_OVERRIDES = {"heat": [], "advection": ["trainer.dro.bins=4"]}


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({os.cpu_count()} cores, {platform.machine()})"


def prepare(pde: str, size: str, data_root: Path, domains: tuple[str, ...] = ("square",)) -> tuple[Path, list[int], int]:
    """The mesh files of ``pde`` on ``domains`` at ``size`` under ``data_root/mesh`` and their
    grid form (the square's own grid, or the masked grid of other domains); returns the grid
    file, the split counts and the grid's side. A grid file written from the same mesh folders
    after their files' last change is kept (`_current_grid`), so runs of another seed or model
    do not write it again."""
    import h5py

    from gno_ext.data.mesh import grid_form, masked_grid_form, prepare_mesh

    prepare_mesh(data_root / "mesh", pde, list(domains), size)
    folders = [data_root / "mesh" / f"{pde}-{d}" for d in domains]
    square = tuple(domains) == ("square",)
    grid = data_root / (f"{pde}-square-grid.h5" if square else f"{pde}-{'-'.join(domains)}-masked-grid.h5")
    counts = _current_grid(grid, folders)
    if counts is None:
        counts = grid_form(folders[0], grid) if square else masked_grid_form(folders, grid)
    with h5py.File(grid, "r") as f:
        side = int(f["u"].shape[-1])
    return grid, counts, side


def _current_grid(grid: Path, folders: list[Path]) -> list[int] | None:
    """The split counts of the grid file ``grid`` where it was written in today's layout
    (`GRID_FORM_VERSION`) from the mesh folders ``folders`` (its ``source``) after the last change
    of their split files; None where it must be written (missing, of another layout, from other
    folders, or older than one of them)."""
    import h5py

    from gno_ext.data.mesh import GRID_FORM_VERSION, SPLITS

    if not grid.is_file():
        return None
    written = grid.stat().st_mtime
    files = [folder / f"{split}.h5" for folder in folders for split in SPLITS]
    if any(not p.is_file() or p.stat().st_mtime > written for p in files):
        return None
    with h5py.File(grid, "r") as f:
        source, counts, version = (f.attrs.get(k) for k in ("source", "split_counts", "grid_form_version"))
    if source is None or counts is None or version != GRID_FORM_VERSION:
        return None
    if [str(s) for s in ([source] if isinstance(source, str) else source)] != [str(f) for f in folders]:
        return None
    return [int(c) for c in counts]


def evaluate_on_nodes(run_dir: Path, grid: Path, counts: list[int], mesh_tests: list[Path], steps: int,
                      max_trajectories: int | None = None) -> dict:
    """A grid model's test rollout on the masked grid ``grid``, carried to the nodes and scored
    against the mesh files ``mesh_tests`` (the test trajectories in the grid file's order): the
    nMSE per trajectory and per step, persistence's per step, and the carrying's own error (the
    true frames to the grid and back). ``max_trajectories`` picks the test trajectories as the
    recipes' evaluation does (``eval.max_trajectories``, `spread`)."""
    import h5py
    import numpy as np
    import torch

    from gno_ext.adapters import open_dataset
    from gno_ext.data.mesh import nodes_from_grid
    from gno_ext.losses import nmse
    from gno_ext.models.registry import from_checkpoint
    from gno_ext.models.rollout import rollout
    from gno_ext.schema import collate
    from gno_ext.training.evaluate import reading_sums, readings
    from gno_ext.training.recipe_data import rollout_indices, spread

    model = from_checkpoint(run_dir / "model", device="cpu").eval()
    first = counts[0] + counts[1]
    chosen = list(range(counts[2]))
    if max_trajectories:
        chosen = [chosen[i] for i in spread(len(chosen), max_trajectories)]
    ds = open_dataset("custom", grid, model.t_in, steps, trajectories=[first + i for i in chosen])
    batch = collate([ds[i] for i in rollout_indices(ds)])
    pred = rollout(model, batch, steps)[:, :, 0]  # (B, steps, side, side)
    with h5py.File(grid, "r") as f:
        test = [first + i for i in chosen]
        cells, weights, n_nodes = f["node_cells"][test], f["node_weights"][test], f["node_count"][test]
        on_grid = torch.from_numpy(f["u"][test][:, model.t_in:model.t_in + steps, 0])
    truth = []
    for path in mesh_tests:
        with h5py.File(path, "r") as f:
            truth += list(torch.from_numpy(f["u"][:, :model.t_in + steps, :, 0]))
    if len(truth) != counts[2]:
        raise ValueError(f"{grid}: {counts[2]} test trajectories, the mesh files {len(truth)}")
    truth = [truth[i] for i in chosen]
    at_nodes, carried = nodes_from_grid(pred, cells, weights), nodes_from_grid(on_grid, cells, weights)
    out: dict = {"nmse": [], "per_step": [], "persistence": [], "carried": [], "error_sum": [], "variance_sum": [],
                 "nmse_per_channel": []}
    for k, u in enumerate(truth):
        target, n = u[model.t_in:][None], int(n_nodes[k])
        still = u[model.t_in - 1:model.t_in][None].expand_as(target)
        mine = at_nodes[k:k + 1, :, :n].to(target.dtype)
        out["nmse"].append(float(nmse(mine, target)))
        out["per_step"].append([float(nmse(mine[:, s], target[:, s])) for s in range(steps)])
        out["persistence"].append([float(nmse(still[:, s], target[:, s])) for s in range(steps)])
        out["carried"].append(float(nmse(carried[k:k + 1, :, :n].to(target.dtype), target)))
        for key, value in reading_sums(mine[:, :, None], target[:, :, None]).items():  # (1, steps, 1 channel, n)
            out[key].append(float(value[0]))
    mean = lambda rows: [sum(col) / len(col) for col in zip(*rows)]  # noqa: E731
    read = readings({key: np.asarray(out[key]) for key in ("nmse", "error_sum", "variance_sum", "nmse_per_channel",
                                                           "per_step")})
    return {"nmse_mean": sum(out["nmse"]) / len(out["nmse"]), "per_step_nmse": mean(out["per_step"]),
            "per_trajectory_nmse": out["nmse"], "persistence_per_step_nmse": mean(out["persistence"]),
            "carried_nmse_mean": sum(out["carried"]) / len(out["carried"]), "nmse_readings": read}


def command(pde: str, model: str, size: str, data_root: Path, grid: Path, counts: list[int], side: int,
            run_dir: Path, extra: list[str], domains: tuple[str, ...] = ("square",)) -> list[str]:
    """The ``recipes/train.py`` command of one run."""
    common = [f"size={size}", f"run_dir={run_dir}", "overwrite=true", "trainer.progress=false", "eval.figures=0",
              *PDE_OVERRIDES[pde], *extra]
    if model in MESH_MODELS:
        return [sys.executable, str(ROOT / "recipes" / "train.py"), "--recipe", f"{pde}-mesh", f"model={model}",
                f"data.domains=[{','.join(domains)}]", f"data.root={data_root}", *common]
    return [sys.executable, str(ROOT / "recipes" / "train.py"), "--recipe", "custom", f"model={model}",
            f"data.root={grid}", f"data.split_fractions=[{','.join(map(str, counts))}]",
            *[o.format(side=side) for o in GRID_OVERRIDES[model]], *common]


def run_one(pde: str, model: str, size: str, data_root: Path, grid: Path, counts: list[int], side: int,
            runs: Path, results: Path, extra: list[str], domains: tuple[str, ...] = ("square",),
            refresh: bool = False) -> Path | None:
    """Train and evaluate one model on one PDE's data and write its result file; None where it
    was skipped (its file exists) or failed. ``refresh``: a file without every reading of the
    nMSE (`has_readings`: written before they were recorded) is made again by the same run; it
    waits beside the new one as ``<file>.stale`` and comes back if the run fails."""
    target = results / f"{pde}-{model}.json"
    old = aside(target)
    if old.exists() and not target.exists():  # left aside by a refresh killed before it could tidy up
        old.rename(target)
    if target.exists():
        if not refresh or has_readings(json.loads(target.read_text())):
            print(f"{target}: exists, skipped", flush=True)
            return None
        target.rename(old)  # out of the new run's way
    try:
        return _train_and_write(pde, model, size, data_root, grid, counts, side, runs, target, extra, domains)
    finally:
        if old.exists():  # superseded by the new file, or back in place where the run made none
            old.unlink() if target.exists() else old.rename(target)


def refresh_differs(target: Path, size: str, extra: list[str], domains: tuple[str, ...]) -> str | None:
    """Why ``run --refresh-readings`` with these settings may not make ``target`` again (it was
    run with another size, other domains or other overrides that change what is computed), or
    None where it may (or the file does not need it: absent, or with every reading)."""
    kept = read_result(target)  # (or as a killed refresh left it aside)
    if kept is None or has_readings(kept):
        return None
    computed = lambda overrides: sorted(computing_overrides(overrides))  # noqa: E731
    wanted = {"size": (kept.get("size"), size), "domains": (kept.get("domains", ["square"]), list(domains)),
              "overrides": (computed(kept.get("extra", [])), computed(extra))}
    differ = [f"{key} {was!r} (this command: {now!r})" for key, (was, now) in wanted.items() if was != now]
    return f"{target}: it was run with {'; '.join(differ)}" if differ else None


def _complete(target: Path, refresh: bool) -> bool:
    """Whether ``target`` is there (with every reading of the nMSE, where ``refresh``)."""
    return target.exists() and (not refresh or has_readings(json.loads(target.read_text())))


def _train_and_write(pde: str, model: str, size: str, data_root: Path, grid: Path, counts: list[int], side: int,
                     runs: Path, target: Path, extra: list[str], domains: tuple[str, ...]) -> Path | None:
    run_dir = runs / f"{pde}-{model}"
    cmd = command(pde, model, size, data_root, grid, counts, side, run_dir, extra, domains)
    start = time.perf_counter()
    with open(runs / f"{pde}-{model}.log", "w") as log:
        failed = children.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    if failed:
        print(f"{pde}/{model}: FAILED (exit {failed}), see {runs / f'{pde}-{model}.log'}", file=sys.stderr, flush=True)
        return None
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    result = {"pde": pde, "model": model, "form": "mesh" if model in MESH_MODELS else "grid", "size": size,
              "epochs": cfg["trainer"]["epochs"], "batch_size": cfg["trainer"]["batch_size"],
              "lr": cfg["optimizer"]["lr"], "seed": cfg["seed"], "extra": extra, "grid_side": side,
              "splits": counts, "model_kwargs": cfg["model"].get("kwargs", {}), "device": _device(),
              "commit": git_commit(), "wall_s": round(wall, 1),
              "test_trajectories": report["trajectories"], "rollout_steps": report["steps"],
              "nmse_mean": report["nmse"]["mean"], "nmse_std": report["nmse"]["std"],
              "rel_l2_mean": report["rel_l2"]["mean"], "per_step_nmse": report["per_step_nmse"],
              "per_trajectory_nmse": report["per_trajectory"]["nmse"],
              "persistence_per_step_nmse": report.get("per_step_nmse_persistence"), "domains": list(domains),
              # the other readings of the nMSE, and each test trajectory's value with its parameters
              "nmse_readings": report["readings"], "per_trajectory": report["per_trajectory"]}
    if model not in MESH_MODELS and tuple(domains) != ("square",):  # scored at the nodes, as the mesh models
        # the recipe's own figures, over every cell of the grid
        result["grid_nmse_mean"], result["grid_nmse_readings"] = result["nmse_mean"], result["nmse_readings"]
        result.update(evaluate_on_nodes(run_dir, grid, counts, [data_root / "mesh" / f"{pde}-{d}" / "test.h5"
                                                                for d in domains], result["rollout_steps"],
                                        cfg.get("eval", {}).get("max_trajectories")))
        result["per_trajectory"] = {**result["per_trajectory"], "nmse": result["per_trajectory_nmse"]}
    write_result(target, result)
    print(f"{target}: nMSE {result['nmse_mean']:.3e}", flush=True)
    return target


def _short(commit: str) -> str:
    """A commit as the tables name it: 10 digits, and ``-dirty`` where the tree had changes."""
    return commit[:10] + ("-dirty" if commit.endswith("-dirty") else "")


def render(results: Path | Sequence[Path] = RESULTS) -> str:
    """The Markdown table of every result file of ``results`` (a folder, or several: one per seed):
    one row per model, one column per PDE; with several seeds a cell is their mean ± the
    standard deviation over the seeds (`_cell`)."""
    folders = [results] if isinstance(results, Path) else list(results)
    paths = [p for folder in folders for p in sorted(folder.glob("*.json"))]
    found = [json.loads(p.read_text()) for p in paths]
    if not found:
        raise SystemExit(f"{', '.join(map(str, folders))}: no results; run `python benchmarks/compare_square.py run` "
                         "first")
    pdes = [p for p in ("heat", "advection") if any(r["pde"] == p for r in found)]
    last, seeds = found[0]["rollout_steps"], sorted({r["seed"] for r in found})
    lines = ["| model | input | " + " | ".join(f"{p}: rollout nMSE | {p}: step 1 | {p}: step {last}" for p in pdes) + " |",
             "| --- | --- |" + " --- | --- | --- |" * len(pdes)]
    for model in MODELS:
        rows = [r for r in found if r["model"] == model]
        if not rows:
            continue
        form = "masked grid" if rows[0]["form"] == "grid" and rows[0].get("domains", ["square"]) != ["square"] \
            else rows[0]["form"]
        cells = []
        for p in pdes:
            runs = [r for r in rows if r["pde"] == p]
            own = sorted(r["seed"] for r in runs)  # a cell with fewer seeds than the table names its own
            label = f" (seed{'s' * (len(own) > 1)} {', '.join(map(str, own))})" if len(seeds) > 1 and own != seeds else ""
            cells += ["—"] * 3 if not runs else [_cell([value(r) for r in runs]) + label for value in (
                lambda r: r["nmse_mean"], lambda r: r["per_step_nmse"][0], lambda r: r["per_step_nmse"][-1])]
        lines.append(f"| `{model}` | {form} | " + " | ".join(cells) + " |")
    persistence = {r["pde"]: r["persistence_per_step_nmse"] for r in found if r.get("persistence_per_step_nmse")}
    for path, r in zip(paths, found):  # the same test trajectories and metric on both forms: one persistence
        if r.get("persistence_per_step_nmse") and max(abs(a - b) for a, b in zip(
                r["persistence_per_step_nmse"], persistence[r["pde"]])) > 1e-4 * max(persistence[r["pde"]]):
            raise ValueError(f"{path}'s persistence error differs from the other runs': they were not evaluated on "
                             f"the same test trajectories")
    if persistence:
        cells = []
        for p in pdes:
            steps = persistence.get(p)
            cells += ["—"] * 3 if not steps else [f"{sum(steps) / len(steps):.3f}", f"{steps[0]:.3f}", f"{steps[-1]:.3f}"]
        lines.append("| persistence (first cell: the mean of its per-step nMSE) | — | " + " | ".join(cells) + " |")
    carried = {r["pde"]: r["carried_nmse_mean"] for r in found if "carried_nmse_mean" in r}
    if carried:  # what a grid model loses to the grid alone
        cells = []
        for p in pdes:
            cells += ["—"] * 3 if p not in carried else [f"{carried[p]:.3f}", "—", "—"]
        lines.append("| the true frames carried to the grid and back (the grid's own error) | — | "
                     + " | ".join(cells) + " |")
    first = found[0]
    said = f"seed {seeds[0]}" if len(seeds) == 1 else \
        f"seeds {', '.join(map(str, seeds))} (a cell: the mean ± the standard deviation over the seeds)"
    lines.append("")
    lines.append(f"Budget: size={first['size']} ({first['splits'][0]} training, {first['splits'][2]} test trajectories, "
                 f"a {first['grid_side']} x {first['grid_side']} grid), {first['epochs']} epochs, batch "
                 f"{first['batch_size']}, lr {first['lr']}, {said}"
                 + _provenance(found, ("size", "epochs", "batch_size", "lr", "extra")
                               + (("seed",) if len(folders) == 1 else ())))
    return "\n".join(lines)


def _cell(values: list[float]) -> str:
    """One cell: the value, or the mean ± the (sample) standard deviation of several seeds'."""
    return f"{values[0]:.3f}" if len(values) == 1 else f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _provenance(found: list[dict], budget: tuple[str, ...]) -> str:
    """What follows a table's budget line: a warning where the files differ in the ``budget``
    keys (of ``extra``, the overrides that change what a run computes, the seed apart), then the
    devices and the commits that made them."""
    def key(r: dict) -> str:
        return json.dumps([[o for o in computing_overrides(r[k]) if not o.startswith("seed=")] if k == "extra" else r[k]
                           for k in budget])
    mixed = len({key(r) for r in found}) > 1
    return (" (MIXED: the files differ in their budget)" * mixed
            + f". Device: {', '.join(sorted({r['device'] for r in found}))}. Commits: "
            f"{', '.join(sorted({_short(r['commit']) for r in found}))}.")


# the mesh GNO's settings that the variants vary, as the variants' table shows them
VARIANT_SETTINGS = {"n_kernels": "kernels", "soft_routing": "mixed", "boundary_nodes": "boundary nodes",
                    "relative_positions": "offsets", "local": "local path"}


def render_variants(folder: Path = VARIANTS) -> str:
    """The Markdown table of the variants' result files (``folder/<variant>/<pde>-<model>.json``),
    from the largest rollout error to the smallest: the settings each ran with (from the run's
    configuration, `VARIANT_SETTINGS`), its seed and errors."""
    found = [json.loads(p.read_text()) for p in sorted(folder.glob("*/*.json"))]
    if not found:
        raise SystemExit(f"{folder}: no variants; see `python benchmarks/compare_square.py --help`")
    last = found[0]["rollout_steps"]
    lines = ["| PDE | model | " + " | ".join(VARIANT_SETTINGS.values()) + f" | seed | rollout nMSE | step 1 | "
             f"step {last} | wall time (s) |",
             "| --- | --- | " + "--- | " * len(VARIANT_SETTINGS) + "---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(found, key=lambda r: (r["pde"], r["model"], -r["nmse_mean"], r["seed"])):
        kwargs = r.get("model_kwargs", {})
        settings = [("yes" if v else "no") if isinstance(v, bool) else str(v) if v is not None else "—"
                    for v in (kwargs.get(k) for k in VARIANT_SETTINGS)]
        lines.append(f"| {r['pde']} | `{r['model']}` | " + " | ".join(settings) + f" | {r['seed']} | "
                     f"{r['nmse_mean']:.3f} | {r['per_step_nmse'][0]:.3f} | {r['per_step_nmse'][-1]:.3f} | "
                     f"{r['wall_s']:.0f} |")
    first = found[0]
    lines.append("")
    lines.append(f"Budget: size={first['size']}, {first['epochs']} epochs, batch {first['batch_size']}, lr {first['lr']}"
                 + _provenance(found, ("size", "epochs", "batch_size", "lr")))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--pde", nargs="+", default=["heat", "advection"], choices=["heat", "advection"])
    run.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    run.add_argument("--size", default="small", choices=["smoke", "small", "bench", "paper"])
    run.add_argument("--jobs", type=int, default=1, help="runs at once")
    run.add_argument("--data-root", type=Path, default=None, help="default: $GNO_EXT_CACHE/data/SIZE")
    run.add_argument("--domains", default="square", choices=list(DOMAINS),
                     help="the unit square (both forms represent it) or the curved domains (a masked grid)")
    run.add_argument("--runs", type=Path, default=None, help="default: runs/square or runs/curved")
    run.add_argument("--results", type=Path, default=None, help="default: benchmarks/results/square or .../curved")
    run.add_argument("--refresh-readings", action="store_true",
                     help="run again the models whose result file lacks the other readings of the nMSE (written "
                          "before they were recorded), with the file's own settings; the old file stays until the "
                          "new one is written")
    run.add_argument("extra", nargs="*", help="Hydra overrides for every run (after --), e.g. trainer.epochs=30")
    out = sub.add_parser("render")
    out.add_argument("--results", type=Path, nargs="+", default=None,
                     help="default: the results' (or variants') folder; several: one per seed, averaged")
    out.add_argument("--variants", action="store_true", help="the variants' table")
    args = parser.parse_args(argv)
    if args.command == "render":
        if args.variants and args.results and len(args.results) > 1:
            parser.error("render --variants: one --results folder")
        print(render_variants(args.results[0] if args.results else VARIANTS) if args.variants
              else render(args.results or RESULTS))
        return
    cache = Path(os.environ.get("GNO_EXT_CACHE", Path.home() / ".cache" / "gno_ext"))
    data_root = args.data_root or cache / "data" / args.size
    domains, args.results = DOMAINS[args.domains][0], args.results or DOMAINS[args.domains][1]
    args.runs = args.runs or ROOT / "runs" / args.domains
    args.runs.mkdir(parents=True, exist_ok=True)
    if args.refresh_readings:  # every file checked before any data is made or run started
        files = [args.results / f"{pde}-{model}.json" for pde in args.pde for model in args.models]
        refused = [why for why in (refresh_differs(f, args.size, args.extra, domains) for f in files) if why]
        if refused:
            raise SystemExit("--refresh-readings makes a file again with its own settings; give the same --size, "
                             "--domains and overrides:\n" + "\n".join(refused))
    jobs = []
    for pde in args.pde:
        grid, counts, side = prepare(pde, args.size, data_root, domains)
        jobs += [(pde, model, args.size, data_root, grid, counts, side, args.runs, args.results, args.extra, domains,
                  args.refresh_readings) for model in args.models]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = list(pool.map(lambda job: run_one(*job), jobs))
    # failed: no file, or (refreshing) the old file back without the readings
    failed = [f"{j[0]}/{j[1]}" for j, d in zip(jobs, done) if d is None and not _complete(
        args.results / f"{j[0]}-{j[1]}.json", args.refresh_readings)]
    if failed:
        raise SystemExit(f"{len(failed)} of {len(jobs)} runs failed: {', '.join(failed)}")
    print(render(args.results))


if __name__ == "__main__":
    children.forward_signals()  # killed or interrupted, the runs it started stop with it
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted: the finished runs' results are kept; the same command runs the others afresh",
              file=sys.stderr)
        sys.exit(130)
