"""Compare evaluated runs side by side: a table of their rollout errors and one plot of their
per-step error curves.

    python recipes/compare.py runs/heat-bc/*
    python recipes/compare.py runs/heat-bc/gno-small-seed0 runs/heat-bc/fno-small-seed0 --plot heat-bc.png
    python recipes/compare.py RUN_A RUN_B --markdown table.md

Each argument is a run folder (its report is ``RUN/eval/report.json``, written at the end of
training or by ``recipes/evaluate.py``), a report folder or a ``report.json``. A folder with no
report is left out with a note. The table gives, per run: the recipe, model, dataset size, epochs
and seed from its ``config.yaml``, the rollout nMSE (mean and standard deviation over test
trajectories), the relative L2 error, the first and last steps' nMSE and the worst group. The
plot draws every run's mean per-step nMSE, with persistence (the input frame copied forward) as
a grey reference. Runs of different recipes were tested on different data: the table says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml


def find_report(path: Path) -> Path | None:
    """The ``report.json`` of a run folder, a report folder or the file itself (None: none)."""
    for candidate in (path, path / "report.json", path / "eval" / "report.json"):
        if candidate.is_file() and candidate.name == "report.json":
            return candidate
    return None


def _config_of(report: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` (empty where the report is not inside a run folder)."""
    config = _run_folder(report) / "config.yaml"
    return (yaml.safe_load(config.read_text()) or {}) if config.is_file() else {}


def load_runs(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """The reports of ``paths`` with a name and their run's settings, and a note for each path
    left out. A report that is not valid JSON, or lacks the rollout metrics, is a
    ``ValueError`` naming the file."""
    runs, notes = [], []
    for raw in paths:
        path = Path(raw)
        report = find_report(path)
        if report is None:
            why = "does not exist" if not path.exists() else "has no eval/report.json (run recipes/evaluate.py on it)"
            notes.append(f"{path}: {why}; left out")
            continue
        try:
            data = json.loads(report.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{report}: not a report (invalid JSON: {error})") from None
        missing = [k for k in ("nmse", "rel_l2", "per_step_nmse", "steps", "trajectories") if k not in data]
        if missing:
            raise ValueError(f"{report}: not a rollout report (no {', '.join(missing)})")
        runs.append({"name": _name(report), "report": data, "config": _config_of(report), "path": str(report)})
    names = [r["name"] for r in runs]
    for run in runs:  # the same run name under two recipes: name the recipe's folder too
        if names.count(run["name"]) > 1:
            run["name"] = f"{_run_folder(Path(run['path'])).parent.name}/{run['name']}"
    return runs, notes


def _run_folder(report: Path) -> Path:
    """The run folder of a report: ``RUN`` of ``RUN/eval/report.json`` or ``RUN/eval/<ckpt>/report.json``."""
    folder = report.parent
    return folder.parent if folder.name == "eval" else folder.parent.parent if folder.parent.name == "eval" else folder


def _name(report: Path) -> str:
    """The run's folder name, and the checkpoint's report folder where it is not the final model's."""
    folder, run = report.parent, _run_folder(report)
    return run.name if folder.name == "eval" or folder == run else f"{run.name} ({folder.name})"


def _setting(run: dict[str, Any], *keys: str) -> Any:
    value: Any = run["config"]
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return "—" if value is None else value


def table(runs: list[dict[str, Any]]) -> str:
    """The Markdown table of ``runs``, best rollout nMSE first."""
    lines = ["| run | recipe | model | size | epochs | seed | nMSE | ± | rel. L2 | step 1 | last step | worst group |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in sorted(runs, key=lambda r: r["report"]["nmse"]["mean"]):
        r = run["report"]
        steps = r["per_step_nmse"]
        worst = r["nmse"].get("worst_group", {})
        lines.append(
            f"| {run['name']} | {r.get('recipe') or _setting(run, 'recipe', 'name')} | {r.get('model') or _setting(run, 'model', 'name')} "
            f"| {r.get('size') or _setting(run, 'size')} | {_setting(run, 'trainer', 'epochs')} | {_setting(run, 'seed')} "
            f"| {r['nmse']['mean']:.3e} | {r['nmse']['std']:.1e} | {r['rel_l2']['mean']:.3e} "
            f"| {steps[0]:.3e} | {steps[-1]:.3e} | {worst.get('label', '—')} |")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    """Every run's mean per-step nMSE on one log-scale plot, persistence in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    drawn = set()
    for run in sorted(runs, key=lambda r: r["report"]["nmse"]["mean"]):
        curve = run["report"]["per_step_nmse"]
        ax.semilogy(range(1, len(curve) + 1), curve, marker="o", ms=3, label=run["name"])
        still = tuple(run["report"].get("per_step_nmse_persistence") or ())
        if still and still not in drawn:  # one grey line per distinct test set
            ax.semilogy(range(1, len(still) + 1), still, ls="--", color="grey", lw=1,
                        label="persistence" if not drawn else None)
            drawn.add(still)
    ax.set(xlabel="rollout step", ylabel="nMSE (mean over test trajectories)", title="error along the rollout")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders, report folders or report.json files")
    parser.add_argument("--plot", type=Path, default=Path("compare_per_step.png"),
                        help="where the per-step plot goes (default: compare_per_step.png)")
    parser.add_argument("--no-plot", action="store_true", help="print the table only")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing plot or Markdown file")
    args = parser.parse_args(argv)
    runs, notes = load_runs(args.runs)
    for note in notes:
        print(note, file=sys.stderr)
    if not runs:
        raise FileNotFoundError("no evaluated run among the arguments")
    outputs = ([] if args.no_plot else [args.plot]) + ([args.markdown] if args.markdown else [])
    for out in outputs:
        if out.exists() and not args.overwrite:
            raise FileExistsError(f"{out}: exists; choose another path or pass --overwrite")
    text = table(runs)
    recipes = {str(r["report"].get("recipe") or _setting(r, "recipe", "name")) for r in runs}
    if len(recipes) > 1:
        text += f"\n\nThe runs were evaluated on different recipes ({', '.join(sorted(recipes))}): their errors " \
                "are not measured on the same test data."
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if not args.no_plot:
        plot(runs, args.plot)
        print(f"per-step plot: {args.plot}")
    return text


if __name__ == "__main__":
    import os

    try:
        main()
    except (FileNotFoundError, FileExistsError, ValueError) as err:  # a bad path or file: one line
        if os.environ.get("GNO_EXT_DEBUG"):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
