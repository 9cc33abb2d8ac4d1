"""The runtime results (``benchmarks/bench_runtime.py``'s files: a trained model against the
solvers at coarser resolutions): their tables and their figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .tables import INTEGER, TEXT, list_of, record

RUN = record({"run": TEXT, "recipe": TEXT, "model": TEXT, "resolution": INTEGER,
              "steps": lambda v: None if isinstance(v, int) and not isinstance(v, bool) and v > 0 else
              f"expected a positive integer, got {v!r}"[:80], "classes": record({})},
             required=("run", "recipe", "model", "resolution", "steps", "classes"))
FILE = record({"gpu": TEXT, "torch": TEXT, "commit": TEXT, "repeats": INTEGER, "batches": list_of(INTEGER),
               "runs": lambda v: list_of(RUN)(v) or (None if v else "expected at least one run, got []")},
              required=("gpu", "torch", "commit", "repeats", "batches", "runs"))
"""The top of a runtime file; `load` checks the rest by reading it as the page does."""


def load(folder: Path) -> list[dict[str, Any]]:
    """The runtime files in ``folder`` (``benchmarks/bench_runtime.py``'s), each with its file
    name (``file``). A file that is not JSON, or lacks a value or holds one of another type
    than the page and the figure read, raises a `ValueError` naming it and what is wrong."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not JSON ({err})") from None
        wrong = FILE(data)
        if wrong is None:  # the rest as the page reads it, on this file alone
            try:
                render(data), summary([data]), commands([{**data, "file": path.name}], {})
            except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as err:
                wrong = f"{type(err).__name__}: {err}"
        if wrong:
            raise ValueError(f"{path}: not a runtime result of benchmarks/bench_runtime.py ({wrong})")
        found.append({**data, "file": path.name})
    return found


def render(results: dict[str, Any]) -> str:
    """A Markdown table per run: the model and each solver at its matched resolution."""
    lines = [f"{results['gpu']}, torch {results['torch']}, commit {str(results['commit'])[:7]}; times per "
             f"{results['runs'][0]['steps']}-frame rollout (median of {results['repeats']} runs)", ""]
    for run in results["runs"]:
        for name, entry in run["classes"].items():
            sizes = list(entry["model_seconds"])
            lines += [f"**{run['recipe']}, {name}** ({entry['trajectories']} test trajectories): "
                      f"`{run['model']}` nMSE {entry['model_nmse']:.3g}", "",
                      "| | res | nMSE | " + " | ".join(f"ms, batch {b}" for b in sizes) + " |",
                      "| --- | ---: | ---: | " + " | ".join("---:" for _ in sizes) + " |"]
            kind = "captured" if "captured" in entry["model_seconds"][sizes[0]] else "eager"
            lines.append(f"| `{run['model']}` ({kind}) | {run['resolution']} | {entry['model_nmse']:.3g} | "
                         + " | ".join(f"{entry['model_seconds'][b][kind] * 1e3:.2f}" for b in sizes) + " |")
            for method, curve in entry["solvers"].items():
                for p in curve:
                    mark = "**" if p["res"] == entry["matched"][method][sizes[-1]]["res"] else ""
                    lines.append(f"| {method} | {mark}{p['res']}{mark} | {p['nmse']:.3g} | "
                                 + " | ".join(f"{p['seconds'][b] * 1e3:.2f}" for b in sizes) + " |")
            lines.append("")
    return "\n".join(lines)


def _shared_batches(results: list[dict[str, Any]]) -> list[str]:
    """The batch sizes every results file timed."""
    return [str(b) for b in results[0]["batches"] if all(b in r["batches"] for r in results)]


def summary(results: list[dict[str, Any]]) -> str:
    """The results page's table: per recipe and boundary class, the model and every solver at
    its matched resolution, with times per rollout at each batch size and the solver's time
    divided by the model's (above 1: the network is faster)."""
    sizes = _shared_batches(results)
    per = " / ".join(f"b{b}" for b in sizes)
    lines = [(f"| case | model, nMSE | model ms, eager ({per}) | model ms, captured ({per}) | solver | res | "
              f"solver nMSE | solver ms ({per}) | solver ÷ model ({per}) |"),
             "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for result in results:
        for run in result["runs"]:
            for name, entry in run["classes"].items():
                times = entry["model_seconds"]
                captured = " / ".join(f"{times[b]['captured'] * 1e3:.1f}" if "captured" in times[b] else "—"
                                      for b in sizes)
                for method, by_size in entry["matched"].items():
                    m = [by_size[b] for b in sizes]  # the match depends on the error only: one per size alike
                    lines.append(
                        f"| {run['recipe']}, {name} | `{run['model']}`, {entry['model_nmse']:.3g} | "
                        + " / ".join(f"{times[b]['eager'] * 1e3:.1f}" for b in sizes) + f" | {captured} | {method} | "
                        + f"{m[0]['res']}{'' if m[0]['as_accurate'] else ' (finest)'} | "
                        + f"{m[0]['nmse']:.2g} | " + " / ".join(f"{x['seconds'] * 1e3:.1f}" for x in m) + " | "
                        + " / ".join(f"{x['speedup']:.2g}" for x in m) + " |")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path, batches: list[str] | None = None) -> None:
    """Error against time per frame: each solver's curve over resolutions and the model as a
    point, one panel per recipe and boundary class of every results file (columns) and per
    batch size (rows; default: every size the files share)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    batches = batches or _shared_batches(results)
    panels = [(run, name, entry) for result in results for run in result["runs"]
              for name, entry in run["classes"].items()]
    fig, axes = plt.subplots(len(batches), len(panels), figsize=(4.2 * len(panels), 3.4 * len(batches)),
                             squeeze=False)
    for row, batch in zip(axes, batches):
        for ax, (run, name, entry) in zip(row, panels):
            per_frame = 1e3 / run["steps"]
            for method, curve in entry["solvers"].items():
                ax.loglog([p["seconds"][batch] * per_frame for p in curve], [p["nmse"] for p in curve], "o-",
                          label=method)
                for p in curve:
                    ax.annotate(str(p["res"]), (p["seconds"][batch] * per_frame, p["nmse"]), fontsize=7,
                                textcoords="offset points", xytext=(3, 3))
            kind = "captured" if "captured" in entry["model_seconds"][batch] else "eager"
            ax.loglog([entry["model_seconds"][batch][kind] * per_frame], [entry["model_nmse"]], "r*",
                      markersize=12, label=f"{run['model']} ({kind})")
            ax.set_title(f"{run['recipe']}, {name}, batch {batch}", fontsize=10)
            ax.set_xlabel(f"ms per frame, batch {batch}")
            ax.set_ylabel("rollout nMSE")
            ax.legend(fontsize=7)
    fig.suptitle(f"{', '.join(sorted({r['gpu'] for r in results}))}: error against time per frame")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def commands(found: list[dict[str, Any]], tables: dict[str, Any]) -> list[str]:
    """The commands that reproduce runtime results: train the table's run again (where the run
    folder is a benchmark run, ``<table>/<recipe>/<row>-seed<N>``; its result goes beside the
    run, since the committed one would skip it), then time it."""
    out = []
    for r in found:
        for run in r["runs"]:
            table, recipe, name = Path(run["run"]).parts[-3:]
            row, _, seed = name.rpartition("-seed")
            trajectories = sum(c["trajectories"] for c in run["classes"].values())
            resolutions = sorted({p["res"] for c in run["classes"].values() for curve in c["solvers"].values()
                                  for p in curve})
            if table in tables and seed.isdigit():
                out.append(f"python recipes/benchmark.py run --table {table} --recipes {recipe} --rows {row} "
                           f"--seeds {seed} --output-root runs --results runs/results")
            out.append(f"python benchmarks/bench_runtime.py run runs/{table}/{recipe}/{name} --out "
                       f"runs/runtime/{r['file']} --trajectories {trajectories} --resolutions "
                       f"{' '.join(map(str, resolutions))} --repeats {r['repeats']}")
    return out
