"""The accuracy tables: plan, run (resumably, as a Hydra multirun) and render.

    python recipes/benchmark.py plan   --table param
    python recipes/benchmark.py run    --table param --seeds 0 1 [--launcher joblib] [-- trainer.compile=true]
    python recipes/benchmark.py render [--docs docs]

A table (``benchmarks/tables.yaml``) is a set of recipes (its columns) times rows (models, with
optional overrides) times seeds, with a budget: the dataset size of each column (``size=bench``
unless the paper's own size is affordable) and the training overrides (epochs, batch size) that
every run of the table shares. ``--size`` and overrides after ``--`` replace those of the budget
(e.g. ``--size smoke`` for a quick check); the result files record what was used.

Each run trains with ``recipes/train.py`` and leaves one JSON file,
``benchmarks/results/<table>/<recipe>/<row>-seed<N>.json``; a run whose file exists is skipped,
so the same command resumes a table across days and machines (commit the files).
``--refresh-readings`` runs again the cells whose file was written before the other readings of
the nMSE were recorded (``nmse_readings``, ``per_trajectory``), keeping the old file where the
new run fails; ``--refresh-only`` runs those cells alone, none that has no file yet. A cell
whose file was taken from another table's run (``same_run_as``) waits for that run's refresh and
then takes its file. A refresh killed outright leaves its cells' old files aside
(``.json.stale``): the next ``run`` of those cells puts them back first, so it resumes as well.

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
import json
from pathlib import Path

from gno_ext import _children as children
from gno_ext.benchmark.figures import write_figures
from gno_ext.benchmark.render import PAGES, render_pages
from gno_ext.benchmark.run import per_process_batch, prepare, sweep_command
from gno_ext.benchmark.tables import (
    RESULTS,
    TABLES,
    Run,
    adopt,
    aside,
    budget_difference,
    has_readings,
    load_tables,
    merge_overrides,
    plan,
    read_result,
    same_run,
)


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
        p.add_argument("--refresh-readings", action="store_true",
                       help="run again the cells whose result file lacks the other readings of the nMSE "
                            "(nmse_readings, per_trajectory: files written before they were recorded); a cell "
                            "whose new run fails keeps its old file")
        p.add_argument("--refresh-only", action="store_true",
                       help="--refresh-readings for those cells alone: a cell without a result file is left for "
                            "a plain run")
        p.add_argument("extra", nargs="*", help="Hydra overrides for every run (after --), e.g. trainer.epochs=20")
    p = sub.add_parser("render")
    p.add_argument("--tables", type=Path, default=TABLES)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--docs", type=Path, help="write the pages and their figures under this documentation root "
                                              "(docs): results/*.md, which-model.md (default: print the pages)")
    args = parser.parse_args(argv)
    tables = load_tables(args.tables)
    if args.command == "render":
        pages = render_pages(tables, args.results)
        if args.docs:
            for name, text in pages.items():
                (args.docs / name).parent.mkdir(parents=True, exist_ok=True)
                (args.docs / name).write_text(text)
            write_figures(tables, args.results, args.docs / PAGES)
        else:
            print("\n\n".join(f"<!-- {name} -->\n{text}" for name, text in pages.items()))
        return
    runs = plan(tables, args.table, args.seeds, args.recipes, args.rows, args.size)
    refresh = args.refresh_readings or args.refresh_only
    # a refresh cut off before it could put its old files back (killed outright, its machine taken back)
    # left them aside: each is its cell's result still, put back by `run` (and read there by `plan`)
    left = {r: old for r in runs if (old := aside(r.path(args.results))).exists()}
    if args.command == "run":
        for r, back in _put_back(left, args.results).items():
            print(f"{r.path(args.results).relative_to(args.results)}: put back in place, where a refresh cut off had "
                  "left it aside" if back else f"{left[r].relative_to(args.results)}: removed, superseded by the new "
                  "run's file (a refresh cut off)", flush=True)
    # the result file each cell has, read once
    held = {r: result for r in runs if (result := read_result(r.path(args.results))) is not None}
    stale = [r for r in runs if refresh and r in held and not has_readings(held[r])]
    todo = stale if args.refresh_only else [r for r in runs if r not in held or r in stale]
    # (a refreshed cell takes only a result of the same computation that has the readings)
    found = {r: same_run(r, args.extra, args.results) for r in todo}
    same = {r: s if s is not None and (r not in stale or _has_readings(s)) else None for r, s in found.items()}
    # a stale file taken from another table's run is refreshed with that run: while the run still
    # lacks the readings the cell waits (training it here would make two runs of one computation)
    waits = {r: s for r, s in found.items()
             if r in stale and s is not None and not same[r] and held[r].get("same_run_as")}
    todo = [r for r in todo if r not in waits]
    # a result file of another computation in a run's place (a smoke run's, say) is not this run's
    other = {r: budget_difference(r, args.extra, result) for r, result in held.items()}
    blocked = {r: why for r, why in other.items() if why}
    if args.command == "plan":
        for r in runs:
            state = (f"blocked: its file holds another computation ({blocked[r]})" if r in blocked else
                     f"waits for {waits[r].relative_to(args.results)}, the run its file was taken from, to be "
                     "run again" if r in waits else
                     f"the same run as {same[r].relative_to(args.results)}" + (", which has the readings" if r in stale
                                                                              else "") if r in todo and same[r] else
                     "to run again: its file lacks the other readings" if r in stale else
                     "done" if r in held else
                     "not run (--refresh-only)" if r not in todo else "to run")
            if r in left:
                state += (" (its old file, left aside by a refresh that was cut off, goes: the new one is in place)"
                          if r.path(args.results).exists() else
                          " (its file is aside: a refresh of it is running, or was cut off; run puts it back)")
            print(f"{r.table}/{r.recipe}/{r.row}-seed{r.seed} (size={r.size} {' '.join(r.budget)}): {state}")
        print(f"{sum(same[r] is None for r in todo)} of {len(runs)} runs to do"
              + (f"; {len(blocked)} blocked by result files of another computation" if blocked else "")
              + (f"; {len(waits)} wait for the runs their files were taken from" if waits else ""))
        return
    if blocked:
        raise SystemExit("these cells hold result files of another computation; move them aside to run the cells: "
                         + "; ".join(f"{r.path(args.results)} ({why})" for r, why in blocked.items()))
    for r in todo:
        if same[r]:
            print(f"{adopt(r, same[r], args.results).relative_to(args.results)}: the same run as "
                  f"{same[r].relative_to(args.results)}, its result taken", flush=True)
    todo = [r for r in todo if not same[r]]
    if waits:
        print(f"table {args.table}: {len(waits)} cells wait for the runs their files were taken from, which lack the "
              "other readings too: refresh those tables, then this one again to take them ("
              + ", ".join(f"{r.recipe}/{r.row}-seed{r.seed} from {waits[r].relative_to(args.results)}" for r in waits)
              + ")", flush=True)
    if not todo:
        if not waits:
            print(f"table {args.table}: " + ("its run has its result" if len(runs) == 1 else
                                             f"all {len(runs)} runs have results"))
        return
    if args.processes < 1:
        raise SystemExit(f"--processes {args.processes}: must be at least 1")
    if args.processes > 1:  # every run's batch must split over the processes: refused before any data is made
        for r in todo:
            per_process_batch(r, [*merge_overrides(r.budget, args.extra), *r.overrides], args.processes)
    from train import compose  # recipes/ is the script folder

    prepare(todo, args.extra, compose)
    command = sweep_command(todo, args.size, args.extra, args.launcher, args.jobs, args.processes)
    if args.results != RESULTS:
        command.append(f"results={args.results.resolve()}")
    if args.tables != TABLES:
        command.append(f"tables={args.tables.resolve()}")
    if args.output_root:
        command.append(f"output_root={args.output_root.resolve()}")
    print(" ".join(command), flush=True)
    set_aside = {r: aside(r.path(args.results)) for r in todo if r in stale}
    for r, old in set_aside.items():  # out of the runner's way, back in place if the new run fails
        r.path(args.results).rename(old)
    try:
        children.run(command, check=True)
    finally:
        _put_back(set_aside, args.results)
    if args.refresh_only:  # the cells without a file were not to run
        missing = [r for r in set_aside if not _has_readings(r.path(args.results))]
        what, total = "cells to refresh have no new result", len(set_aside)
    else:
        missing = [r for r in runs
                   if not r.path(args.results).exists() or r in set_aside and not _has_readings(r.path(args.results))]
        what, total = "runs have no result", len(runs)
    if missing:
        raise SystemExit(f"table {args.table}: {len(missing)} of {total} {what} (failed): "
                         + ", ".join(f"{r.recipe}/{r.row}-seed{r.seed}" for r in missing))


def _put_back(set_aside: dict[Run, Path], results: Path) -> dict[Run, bool]:
    """After a refresh, the old files it set aside: one whose cell has no new file is put back in
    place (its run failed, or was cut off), the others go, superseded by the new run's file (the
    old one is in the repository's history). Whether each was put back."""
    back = {r: not r.path(results).exists() for r in set_aside}
    for r, old in set_aside.items():
        if back[r]:
            old.rename(r.path(results))
        else:
            old.unlink()
    return back


def _has_readings(path: Path) -> bool:
    """Whether ``path`` holds every reading of the nMSE: not while another table's refresh has its
    file moved aside (`read_result`)."""
    try:
        return has_readings(json.loads(path.read_text()))
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    import os
    import sys

    from gno_ext._files import DiskFull

    children.forward_signals()  # killed or interrupted, the runs it started stop with it
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted: the finished cells' results are kept; the same command resumes the others from their "
              "last checkpoints", file=sys.stderr)
        sys.exit(130)
    except (FileNotFoundError, FileExistsError, ValueError, KeyError, DiskFull) as err:  # a bad file or value: one line
        if os.environ.get("GNO_EXT_DEBUG"):
            raise
        print(f"error: {err.args[0] if isinstance(err, KeyError) and err.args else err}", file=sys.stderr)
        sys.exit(2)
