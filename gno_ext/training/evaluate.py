r"""Evaluation by autoregressive rollout: metrics, figures and the JSON/Markdown report.

Every test trajectory is rolled out from its first frame(s) for ``steps`` steps (the model's
own predictions fed back). Per trajectory:

* nMSE $= \|\hat u - u\|^2 / \|u - \bar u\|^2$ over the whole rollout (time, channels, space);
* relative L2 $= \|\hat u - u\| / \|u\|$ over the rollout;
* the per-step nMSE (each step on its own), averaged into an error curve, beside that of
  persistence (the input frame copied forward: what a model that learnt nothing scores).

The report gives the mean and standard deviation over trajectories, the error of every DRO
group (boundary configuration x parameter bin, the groups training uses; test parameters below or
above the training range form groups of their own, `GroupBinner.covering`) and of every
boundary configuration, the training loss curve where the run's ``metrics.jsonl`` is given, and
shows the rollouts of the worst, the median and the best trajectory.

The entry points: `evaluate_run` evaluates a model on a recipe's test split (the training loop
runs it at the end of training); `evaluate_saved` evaluates a run's folder, or any checkpoint,
afterwards (``recipes/evaluate.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset

from gno_ext._files import read_yaml_mapping
from gno_ext.losses import mse_per_sample, nmse, relative_l2
from gno_ext.models.rollout import rollout
from gno_ext.schema import BCType, collate
from gno_ext.training.checkpoint import latest_checkpoint
from gno_ext.training.objective import choose_precision
from gno_ext.training.recipe_data import (
    GroupBinner,
    batch_to,
    open_split,
    parameter_values,
    rollout_indices,
    spread,
    training_groups,
    trajectory_lengths,
)

__all__ = ["evaluate_rollouts", "evaluate_run", "evaluate_saved", "reading_sums", "readings", "write_report"]


@torch.no_grad()
def evaluate_rollouts(model: nn.Module, dataset: Dataset, indices: list[int], steps: int, binner: GroupBinner,
                      device: torch.device | str = "cpu", batch_size: int = 16, autocast_dtype: torch.dtype | None = None,
                      keep_examples: int = 3) -> dict[str, Any]:
    """Roll out ``model`` over the windows ``indices`` of ``dataset`` and compute the metrics.

    Parameters
    ----------
    model : nn.Module
        A model with the schema forward (``model(u_in, theta=, theta_field=, bc=, grid=)``).
    dataset : Dataset
        Windows with ``n_steps_output >= steps``.
    indices : list of int
        One window per trajectory (see `gno_ext.training.recipe_data.rollout_indices`).
    steps : int
    binner : GroupBinner
        The training run's groups (`evaluate_run` passes them `GroupBinner.covering` the test
        split's parameter values).
    device, batch_size, autocast_dtype
    keep_examples : int
        Trajectories kept (prediction and truth) for the figures: the worst, the median and the
        best by nMSE, in that order (at most 3; they are rolled out again once chosen).

    Returns
    -------
    dict
        ``nmse``, ``rel_l2``, ``mse`` (per trajectory, numpy; ``mse`` in the data's units, the mean
        over steps, channels and points), ``error_sum``, ``variance_sum`` and ``nmse_per_channel``
        (per trajectory, for the other readings of the nMSE, `readings`), ``per_step`` and ``per_step_persistence``
        (trajectories x steps), ``theta``, ``group``, ``boundary`` (each trajectory's boundary
        types, a list of names), ``examples`` and ``steps``.
    """
    model.eval()
    device = torch.device(device)

    def roll(chosen: list[int]):
        loader = DataLoader(Subset(dataset, chosen), batch_size=batch_size, shuffle=False, collate_fn=collate)
        for batch in loader:
            batch = batch_to(batch, device)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                pred = rollout(model, batch, steps).float()
            yield batch, pred, batch.u_out[:, :steps].float()

    out: dict[str, list] = {"nmse": [], "rel_l2": [], "mse": [], "per_step": [], "per_step_persistence": [],
                            "theta": [], "group": [], "error_sum": [], "variance_sum": [], "nmse_per_channel": []}
    for batch, pred, truth in roll(indices):
        still = batch.u_in[:, -1:].float().expand_as(truth)  # persistence: the input frame copied forward
        sums = reading_sums(pred, truth)
        for key, value in sums.items():
            out[key].append(value.cpu())
        # the nMSE from the same sums (`gno_ext.losses.nmse`'s formula and floor): not computed twice
        out["nmse"].append((sums["error_sum"] / sums["variance_sum"].clamp_min(1e-12)).cpu())
        out["rel_l2"].append(relative_l2(pred, truth).cpu())
        out["mse"].append(mse_per_sample(pred, truth).cpu())
        out["per_step"].append(torch.stack([nmse(pred[:, k], truth[:, k]) for k in range(steps)], 1).cpu())
        out["per_step_persistence"].append(torch.stack([nmse(still[:, k], truth[:, k]) for k in range(steps)], 1).cpu())
        out["theta"].append(batch.theta.cpu())
        out["group"].append(binner(batch.theta.cpu(), batch.bc.kind.cpu()))
    result: dict[str, Any] = {k: torch.cat(v).numpy() for k, v in out.items()}
    # each trajectory's boundary configuration, named as the report's table names it
    result["boundary"] = [binner.boundary_label(binner.configuration(g)) for g in result["group"]]
    order = np.argsort(result["nmse"], kind="stable")
    picks = [("worst", int(order[-1])), ("median", int(order[len(order) // 2])), ("best", int(order[0]))]
    picks = picks[:max(0, min(keep_examples, 3))]
    examples: list[dict[str, Any]] = []
    if picks:  # rolled out again (the same result: evaluation is deterministic), in the picks' order
        rows = [(batch, pred, truth) for batch, pred, truth in roll([indices[i] for _, i in picks])]
        flat = [(b, p[j], t[j], j) for b, p, t in rows for j in range(len(p))]
        for (label, i), (batch, pred, truth, j) in zip(picks, flat):
            kinds = [BCType(int(k)).name.lower() for k in batch.bc.kind[j].tolist()]
            examples.append({"pred": pred.cpu().numpy(), "truth": truth.cpu().numpy(), "label": label,
                             "theta": batch.theta[j].cpu().numpy(), "boundary": kinds,
                             "nmse": float(result["nmse"][i])})
    result["examples"], result["steps"] = examples, steps
    return result


def reading_sums(pred: Tensor, truth: Tensor) -> dict[str, Tensor]:
    """What the other readings of the nMSE (`readings`) need, per trajectory of a rollout
    ``(B, T, C, *S)``: ``error_sum`` and ``variance_sum``, the squared error and the squared
    deviation from the trajectory's mean summed over the rollout (their sums over the split give
    the pooled nMSE), and ``nmse_per_channel``, the nMSE of each channel on its own variance
    averaged over the channels."""
    centred = truth - truth.flatten(1).mean(1).view(-1, *[1] * (truth.ndim - 1))
    error = (pred - truth).pow(2)
    channels = error.transpose(1, 2).flatten(2).sum(2)  # (B, C)
    spread = truth.transpose(1, 2).flatten(2)
    spread = (spread - spread.mean(2, keepdim=True)).pow(2).sum(2)
    return {"error_sum": error.flatten(1).sum(1), "variance_sum": centred.pow(2).flatten(1).sum(1),
            "nmse_per_channel": (channels / spread.clamp_min(1e-12)).mean(1)}


def readings(result: Mapping[str, Any]) -> dict[str, float]:
    """The nMSE of `evaluate_rollouts`'s result read four ways (the paper does not say which it
    uses): ``per_trajectory``, each trajectory's error over its own variance about its mean,
    averaged (the tables' reading); ``pooled``, the split's summed squared error over its summed
    variances; ``per_step``, each step's error over that frame's own variance, averaged over
    steps and trajectories; ``per_channel``, each channel's error over its own variance,
    averaged over channels and trajectories (for one channel the first reading)."""
    out = {"per_trajectory": float(result["nmse"].mean())}
    if "error_sum" in result:
        out["pooled"] = float(result["error_sum"].sum() / max(float(result["variance_sum"].sum()), 1e-12))
        out["per_channel"] = float(result["nmse_per_channel"].mean())
    out["per_step"] = float(result["per_step"].mean())
    return out


def summarize(result: Mapping[str, Any], binner: GroupBinner) -> dict[str, Any]:
    """Mean, std and worst group of the metrics of `evaluate_rollouts`, the other readings of
    the nMSE (`readings`) and each trajectory's nMSE with its parameters and boundary
    configuration (so that a cell can be re-read by any grouping)."""
    e, groups = result["nmse"], result["group"]
    per_group = []
    for g in np.unique(groups):
        sel = groups == g
        per_group.append({"group": int(g), "label": binner.label(int(g)), "n": int(sel.sum()),
                          "nmse_mean": float(e[sel].mean()), "rel_l2_mean": float(result["rel_l2"][sel].mean())})
    worst = max(per_group, key=lambda r: r["nmse_mean"])
    configs = np.array([binner.configuration(g) for g in groups], dtype=np.int64)
    per_boundary = [{"boundary": binner.boundary_label(int(c)), "n": int((configs == c).sum()),
                     "nmse_mean": float(e[configs == c].mean()), "rel_l2_mean": float(result["rel_l2"][configs == c].mean())}
                    for c in np.unique(configs)]
    return {
        "trajectories": int(len(e)), "steps": int(result["steps"]),
        "nmse": {"mean": float(e.mean()), "std": float(e.std()), "worst_group": worst},
        "rel_l2": {"mean": float(result["rel_l2"].mean()), "std": float(result["rel_l2"].std())},
        "mse": {"mean": float(result["mse"].mean()), "std": float(result["mse"].std())},
        "per_step_nmse": [float(x) for x in result["per_step"].mean(0)],
        "per_step_nmse_persistence": [float(x) for x in result["per_step_persistence"].mean(0)]
        if "per_step_persistence" in result else [],
        "groups": per_group,
        "boundaries": per_boundary,
        "readings": readings(result),
        # columns, one entry per trajectory (5 significant digits)
        "per_trajectory": {"nmse": [float(f"{v:.5g}") for v in e],
                           "theta": [[float(f"{t:.5g}") for t in theta] for theta in result["theta"]],
                           "boundary": list(result["boundary"])},
    }


def read_metrics(path: str | Path) -> dict[str, tuple[list[int], list[float]]]:
    """A run's ``metrics.jsonl`` as ``{name: (steps, values)}`` (a line cut short by an
    interrupted write is skipped)."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                steps, values = series.setdefault(key, ([], []))
                steps.append(int(row.get("step", len(steps))))
                values.append(float(value))
    return series


def dro_start(series: Mapping[str, tuple[Any, Any]]) -> float | None:
    """The first logged optimizer step of group DRO in a run's metrics (`read_metrics`'s series:
    ``train/dro`` is 1 on DRO steps), or None where the run never reached it."""
    if "train/dro" not in series:
        return None
    steps, flags = series["train/dro"]
    return next((float(step) for step, flag in zip(steps, flags) if flag > 0.5), None)


def no_better_than_the_mean(per_step: Sequence[float]) -> int | None:
    """The first rollout step (from 1) whose mean nMSE is at least 1, the error of predicting
    each frame's own mean, or None where every step is below it."""
    return next((k + 1 for k, x in enumerate(per_step) if x >= 1), None)


def _figures(result: Mapping[str, Any], out: Path, log_theta: bool, parameter: str,
             boundaries: list[dict[str, Any]], metrics: Path | None) -> list[str]:
    """The report's figures in ``out``: the error along the rollout, against the parameter, by
    boundary configuration, the training curve and the rollouts kept; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=100 if name.startswith("rollout_") else 120)
        plt.close(fig)
        files.append(name)

    save(_per_step_figure(result, plt), "per_step_nmse.png")
    if result["theta"].shape[1] > 0:
        save(_parameter_figure(result, plt, log_theta, parameter), "error_vs_parameter.png")
    if len(boundaries) > 1:
        save(_boundary_figure(result, plt, boundaries), "error_by_boundary.png")
    series = read_metrics(metrics) if metrics is not None and Path(metrics).is_file() else {}
    if "train/loss" in series:
        save(_training_figure(series, plt), "training_curve.png")
    for n, ex in enumerate(result["examples"]):
        save(_rollout_figure(ex, n, plt, parameter), f"rollout_{ex.get('label', n)}.png")
    return files


def _per_step_figure(result: Mapping[str, Any], plt: Any) -> Any:
    """The error along the rollout, with persistence and the mean predictor (nMSE 1)."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    curve = result["per_step"].mean(0)
    ax.semilogy(np.arange(1, len(curve) + 1), curve, marker="o", label="model")
    if "per_step_persistence" in result:
        still = result["per_step_persistence"].mean(0)
        ax.semilogy(np.arange(1, len(still) + 1), still, ls="--", color="grey", label="persistence (input copied)")
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="each frame's mean (nMSE 1)")
    ax.legend(fontsize=8)
    ax.set(xlabel="rollout step", ylabel="nMSE (mean over trajectories)", title="error along the rollout")
    ax.grid(alpha=0.3)
    return fig


def _parameter_figure(result: Mapping[str, Any], plt: Any, log_theta: bool, parameter: str) -> Any:
    """Each trajectory's error against its first parameter, coloured by group."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.scatter(result["theta"][:, 0], result["nmse"], s=10, c=result["group"], cmap="viridis")
    ax.set_yscale("log")
    if log_theta:
        ax.set_xscale("log")
    ax.set(xlabel=parameter, ylabel="rollout nMSE", title="error versus parameter")
    ax.grid(alpha=0.3)
    return fig


def _boundary_figure(result: Mapping[str, Any], plt: Any, boundaries: list[dict[str, Any]]) -> Any:
    """The error by boundary configuration: every trajectory, and the mean."""
    configs = sorted({b["boundary"] for b in boundaries})
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(configs)), 3.4))
    for x, name in enumerate(configs):
        errors = result["nmse"][np.array(result["boundary"]) == name]
        ax.scatter(x + np.linspace(-0.15, 0.15, len(errors)), errors, s=8, alpha=0.5, color="C0")
        ax.plot([x - 0.25, x + 0.25], [errors.mean()] * 2, color="C3", lw=2)
    ax.set_xticks(range(len(configs)), [c.replace("/", "/\n") for c in configs], fontsize=7)
    ax.set_yscale("log")
    ax.set(ylabel="rollout nMSE", title="error by boundary configuration (red: mean)")
    ax.grid(alpha=0.3, axis="y")
    return fig


def _training_figure(series: Mapping[str, tuple[Any, Any]], plt: Any) -> Any:
    """The training loss and the one-step validation error, with the start of group DRO."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.semilogy(*series["train/loss"], lw=1, label="training loss")
    if "valid/nmse_one_step" in series:
        ax.semilogy(*series["valid/nmse_one_step"], marker="o", label="one-step validation nMSE")
    start = dro_start(series)
    if start is not None:  # where the curriculum's MSE warm-up gives way to group DRO
        ax.axvline(start, color="grey", lw=0.8, ls="--", label="group DRO from here")
    ax.set(xlabel="optimizer step", title="training")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def _rollout_figure(ex: Mapping[str, Any], n: int, plt: Any, parameter: str) -> Any:
    """One kept rollout: prediction, truth and error at its first, middle and last steps."""
    pred, truth = ex["pred"][:, 0], ex["truth"][:, 0]  # channel 0, (steps, *S)
    if pred.ndim == 4:  # 3-D: the middle slice of the last axis
        pred, truth = pred[..., pred.shape[-1] // 2], truth[..., truth.shape[-1] // 2]
    shown = sorted({0, len(pred) // 2, len(pred) - 1})
    fig, axes = plt.subplots(len(shown), 3, figsize=(9, 2.6 * len(shown)), squeeze=False)
    for r, k in enumerate(shown):
        err = pred[k] - truth[k]
        lo, hi = float(min(pred[k].min(), truth[k].min())), float(max(pred[k].max(), truth[k].max()))
        for c, (img, name) in enumerate(((pred[k], "prediction"), (truth[k], "truth"), (err, "error"))):
            a = axes[r, c]
            lim = float(np.abs(err).max()) or 1.0
            kw = dict(vmin=-lim, vmax=lim, cmap="RdBu_r") if name == "error" else dict(vmin=lo, vmax=hi)
            if "triangles" in ex:  # a mesh: node values on its triangles
                im = a.tripcolor(ex["pos"][:, 0], ex["pos"][:, 1], ex["triangles"], img, shading="gouraud", **kw)
                a.set_aspect("equal")
            elif img.ndim == 1:
                a.plot(img)
            else:
                im = a.imshow(img.T, origin="lower", **kw)
            if img.ndim > 1 or "triangles" in ex:
                fig.colorbar(im, ax=a, fraction=0.046)
                a.set_xticks([])
                a.set_yticks([])
            a.set_title(f"{name}, step {k + 1}", fontsize=9)
    theta = ", ".join(f"{v:.3g}" for v in np.atleast_1d(ex["theta"]))
    what = f"{ex['label']} trajectory (nMSE {ex['nmse']:.3g}), " if "label" in ex else f"rollout {n}, "
    where = "segments" if "triangles" in ex else "faces"
    faces = f", {where} {'/'.join(ex['boundary'])}" if ex.get("boundary") else ""
    fig.suptitle(f"{what}{parameter} = {theta}{faces}", fontsize=10)
    return fig


PRECISION_NAMES = {"no": "float32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}
READINGS = {"per_trajectory": "per trajectory, averaged", "pooled": "pooled over the split",
            "per_step": "per step on each frame's variance", "per_channel": "per channel on its own variance"}


def write_report(result: Mapping[str, Any], binner: GroupBinner, out_dir: str | Path,
                 info: Mapping[str, Any] | None = None, log_theta: bool = False,
                 parameter: str | None = None, figures: bool = True, metrics: str | Path | None = None
                 ) -> dict[str, Any]:
    """Write ``report.json``, ``report.md`` and the PNG figures into ``out_dir``; return the summary.

    ``parameter`` names the first parameter in the figures (default: the binner's name for it,
    so the figures and the group labels agree); ``metrics`` is the run's ``metrics.jsonl``, whose
    training loss and validation error make the training curve."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parameter = parameter or (binner.names[0] if binner.names else "theta0")
    summary = {**(info or {}), **summarize(result, binner)}
    summary["figures"] = _figures(result, out, log_theta, parameter, summary["boundaries"],
                                  Path(metrics) if metrics else None) if figures else []
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    n, r = summary["nmse"], summary["rel_l2"]
    lines = [f"# Evaluation: {summary.get('recipe', '')} {summary.get('model', '')}".rstrip(), "",
             f"{summary['trajectories']} test trajectories, autoregressive rollout of {summary['steps']} steps"
             + (f" ({PRECISION_NAMES.get(summary['precision'], summary['precision'])})." if "precision" in summary else "."), "",
             "nMSE is the squared error of a trajectory's rollout divided by its variance about its mean, "
             r"$\|\hat u - u\|^2 / \|u - \bar u\|^2$ over all steps, channels and points (0 is perfect, 1 the "
             r"error of predicting the mean); relative L2 is $\|\hat u - u\| / \|u\|$.", "",
             "| metric | mean | std |", "|---|---|---|",
             f"| nMSE | {n['mean']:.4e} | {n['std']:.4e} |", f"| relative L2 | {r['mean']:.4e} | {r['std']:.4e} |", "",
             f"Worst group: {n['worst_group']['label']} (nMSE {n['worst_group']['nmse_mean']:.4e}, "
             f"{n['worst_group']['n']} trajectories).", "", "| group | trajectories | nMSE | rel. L2 |", "|---|---|---|---|"]
    lines += [f"| {g['label']} | {g['n']} | {g['nmse_mean']:.4e} | {g['rel_l2_mean']:.4e} |" for g in summary["groups"]]
    if 1 < len(summary["boundaries"]) < len(summary["groups"]):  # else the groups are the configurations
        lines += ["", "| boundary configuration | trajectories | nMSE | rel. L2 |", "|---|---|---|---|"]
        lines += [f"| {b['boundary']} | {b['n']} | {b['nmse_mean']:.4e} | {b['rel_l2_mean']:.4e} |"
                  for b in summary["boundaries"]]
    reading = summary["readings"]
    lines += ["", "The same errors read other ways (the tables use the first): "
              + "; ".join(f"{READINGS[k]} {v:.4e}" for k, v in reading.items()) + "."]
    lines += ["", "Per-step nMSE: " + ", ".join(f"{x:.3e}" for x in summary["per_step_nmse"]), ""]
    mean_from = no_better_than_the_mean(summary["per_step_nmse"])
    if mean_from is not None:
        lines += [f"**From step {mean_from} on, the model is no better than predicting each frame's own mean** "
                  f"(nMSE {summary['per_step_nmse'][mean_from - 1]:.3g} at that step, where the mean scores 1): "
                  "its rollout has not learnt the dynamics there.", ""]
    if summary["per_step_nmse_persistence"]:
        lines += ["Persistence (the input frame copied forward): "
                  + ", ".join(f"{x:.3e}" for x in summary["per_step_nmse_persistence"]), ""]
    if summary.get("start_frame"):
        lines += [f"Each rollout starts from frame {summary['start_frame']} of its trajectory (eval.start_frame). "
                  "The rollouts shown are those of the worst, the median and the best trajectory.", ""]
    else:
        lines += ["Each rollout starts from a trajectory's initial condition, so its first step is the one-step "
                  "prediction from frame 0. Training and the one-step validation draw windows from every start "
                  "frame, and for decaying or smoothing dynamics (heat) the step from the rough initial "
                  "condition is much harder than the later ones: a first step well above the one-step "
                  "validation error is expected there, not a defect of the rollout. The rollouts shown are "
                  "those of the worst, the median and the best trajectory.", ""]
    lines += [f"![{f}]({f})" for f in summary["figures"]]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary


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
    cfg = read_yaml_mapping(run_dir / "config.yaml")
    cfg["eval"] = {**cfg.get("eval", {}), **(overrides or {})}
    if checkpoint is None:
        checkpoint = run_dir / "model" if (run_dir / "model").is_dir() else latest_checkpoint(run_dir)
        if checkpoint is None:
            raise FileNotFoundError(f"{run_dir}: no final model and no checkpoint to evaluate")
    checkpoint = Path(checkpoint)
    if out_dir is None:
        own = checkpoint.resolve() == (run_dir / "model").resolve()
        out_dir = run_dir / "eval" if own else run_dir / "eval" / _checkpoint_label(run_dir, checkpoint)
    _check_report_folder(Path(out_dir))  # before the model is built and the data opened
    if (Path(out_dir) / "report.json").exists() and not overwrite:
        raise FileExistsError(f"{Path(out_dir) / 'report.json'}: an earlier report is there; write this one elsewhere "
                              "(--out DIR) or replace it (--overwrite)")
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
    return evaluate_run(cfg, model, training_groups(cfg, train_ds)[3], Path(out_dir), device, precision,
                        checkpoint=str(checkpoint), metrics=run_dir / "metrics.jsonl")


def _check_report_folder(out_dir: Path) -> None:
    """Refuse a report folder that is a file, or lies inside a saved model or a checkpoint (a
    folder holding ``model.safetensors``, or under a run's ``model/`` or ``checkpoints/``): a
    report written there would mix with the weights it describes or another run's."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"--out {out_dir}: is a file; name a folder for the report")
    for folder in (out_dir, *out_dir.parents):
        if (folder / "model.safetensors").is_file() or (
                folder.name in ("model", "checkpoints") and (folder.parent / "config.yaml").is_file()):
            raise ValueError(f"--out {out_dir}: inside {folder}, which holds a saved model or checkpoints; write "
                             "the report elsewhere (the default is the run's eval/ folder)")


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
    start = int(ev.get("start_frame", 0) or 0)
    longest = max(trajectory_lengths(open_split(data_cfg, split, t_in, 1, metadata_only=True)))
    if steps > longest - t_in - start:
        print(f"eval.steps={steps} but the {split} trajectories have {longest} frames"
              f"{f' (the rollouts start at frame {start})' if start else ''}: rolling out {longest - t_in - start}")
        steps = longest - t_in - start
    if steps < 1:
        raise ValueError(f"eval.start_frame={start}: the {split} trajectories have {longest} frames, {t_in} of them "
                         "input: no step is left to roll out from there")
    ds = open_split(data_cfg, split, t_in, steps)
    binner = binner.covering(parameter_values(ds))  # held-out values outside the training range: groups of their own
    indices = rollout_indices(ds, start)
    if ev.get("max_trajectories"):
        indices = [indices[i] for i in spread(len(indices), int(ev["max_trajectories"]))]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if data_cfg.get("kind") == "mesh":
        from gno_ext.training.evaluate_mesh import evaluate_mesh_rollouts
        rollouts = evaluate_mesh_rollouts
    else:
        rollouts = evaluate_rollouts
    result = rollouts(model, ds, indices, steps, binner, device, int(ev.get("batch_size", 16)), dtype,
                      keep_examples=int(ev.get("figures", 3)))
    info = {"recipe": cfg["recipe"]["name"], "model": cfg["model"]["name"], "size": cfg.get("size"), "split": split,
            "precision": precision, "start_frame": start, **({"checkpoint": checkpoint} if checkpoint else {})}
    log_theta = bool(binner.log and binner.log[0])
    return write_report(result, binner, out_dir, info, log_theta=log_theta, figures=int(ev.get("figures", 3)) > 0,
                        metrics=metrics)
