"""The figures of the results pages: per column the per-step rollout error, the error per group
and the error against training time, each model in its own colour on every figure."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from .runtime import load as load_runtime
from .runtime import plot as plot_runtime
from .tables import _mean, _shown, _tested, grouped_rows, load_results

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
    """Per column of every table: the per-step error of the rollout, with the mean predictor's
    nMSE of 1 as a reference line, and the error per DRO group (boundary configuration x
    parameter bin) where the results record it, for the paper's GNO, the two best other rows and
    persistence (mean over seeds); the error against training time where recorded; and the
    runtime figure. Returns the files written."""
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
            fig, ax = plt.subplots(figsize=(6.4, 3.8))
            for row, rs in shown:
                curves = [r["per_step_nmse"] for r in rs if r.get("per_step_nmse")]
                if not curves:
                    continue
                if len({len(c) for c in curves}) > 1:
                    raise ValueError(f"{results / name / recipe}: the seeds of {row} hold per_step_nmse of "
                                     f"different lengths {sorted({len(c) for c in curves})} (one budget, one rollout)")
                curve = np.mean(curves, axis=0)
                ax.semilogy(np.arange(1, len(curve) + 1), curve, marker="o", ms=3, color=model_colour(row),
                            ls="--" if rs[0].get("model_config", row) == "persistence" else "-", label=f"{row} ({len(rs)} seed{'s' * (len(rs) > 1)})")
            ax.axhline(1.0, color="black", lw=0.8, ls=":", label="each frame's mean (nMSE 1)")
            ax.set_xlabel("rollout step")
            ax.set_ylabel("nMSE of the step")
            ax.grid(True, which="both", alpha=0.3)
            save(fig, ax, f"{name}: {recipe}", f"{name}-{recipe}-per_step")
            grouped = grouped_rows(shown)
            if grouped:
                save(*_plot_groups(grouped, plt), f"{name}: {recipe}, error per group", f"{name}-{recipe}-groups")
            plotted = _plot_epochs(table, found, recipe, plt)
            if plotted:
                save(*plotted, f"{name}: {recipe}, error against training time", f"{name}-{recipe}-vs_gpu_minutes")
    runtime = load_runtime(results / "runtime")
    if runtime:
        path = folder / "runtime.png"
        plot_runtime(runtime, path)
        written.append(path)
    return written


def _plot_groups(grouped: list[tuple[str, list[dict[str, Any]]]], plt: Any):
    """The error per group as dots on one line per group (read down the page, however many
    groups), one colour per model (mean over seeds)."""
    import numpy as np

    labels = [g["label"] for g in grouped[0][1][0]["groups"]]
    fig, ax = plt.subplots(figsize=(6.4, 0.8 + 0.24 * len(labels) + 0.2 * len(grouped)))
    y = np.arange(len(labels))
    for k, (row, rs) in enumerate(grouped):
        by_label = [np.mean([next((g["nmse_mean"] for g in r["groups"] if g["label"] == lab), np.nan) for r in rs])
                    for lab in labels]
        ax.scatter(by_label, y + (k - (len(grouped) - 1) / 2) * 0.12, s=16, color=model_colour(row), label=row, zorder=3)
    ax.set_xscale("log")
    ax.set_yticks(y, [_tick_label(lab, False) for lab in labels], fontsize=7)
    ax.invert_yaxis()
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.set_xlabel("rollout nMSE")
    return fig, ax
