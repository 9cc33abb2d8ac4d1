"""What simple predictors score on Navier-Stokes rollouts from frame 0 and from a later frame.

    python recipes/ns_windows.py                                 # 16 test trajectories, frames 0 and 50
    python recipes/ns_windows.py --trajectories 8 --start 0 25 50 --out ns_windows.json

The ``ns-param`` preset starts each trajectory from a random vorticity field (standard deviation
3, correlation length 0.2) that relaxes onto the Kolmogorov-forced flow over its first frames.
The script solves ``--trajectories`` of the preset's test trajectories (spread over its Reynolds
numbers, at ``--size``) with the dataset's solver and scores, from each start frame, the rollout
nMSE of the results tables (per trajectory, $\\|\\hat u - u\\|^2 / \\|u - \\bar u\\|^2$ over the
rollout's frames, velocity as the models see it) of

* ``persistence``: the start frame copied forward, over the whole rollout and at its first step;
* ``mean``: the trajectory's own mean over the rollout (1 by construction: the scale).

A rollout from frame 0 measures the relaxation of the initial field; from frame 50 it measures
the forced flow.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gno_ext._files import write_json
from gno_ext.data.presets import get_preset
from gno_ext.data.simulate import simulate
from gno_ext.losses import nmse


def score(u: torch.Tensor, start: int, steps: int) -> dict[str, Any]:
    """Persistence and the mean predictor on the rollout of ``steps`` steps from frame ``start``
    of the trajectories ``u`` (B, T, C, *S)."""
    steps = min(steps, u.shape[1] - 1 - start)
    if steps < 1:
        raise ValueError(f"start={start}: the trajectories have {u.shape[1]} frames, no step is left from there")
    truth = u[:, start + 1:start + 1 + steps]
    last = u[:, start:start + 1].expand_as(truth)
    mean = truth.flatten(1).mean(1).view(-1, *[1] * (truth.ndim - 1)).expand_as(truth)
    return {"start": start, "steps": steps,
            "nmse": {"persistence": float(nmse(last, truth).mean()), "mean": float(nmse(mean, truth).mean()),
                     "persistence, first step": float(nmse(last[:, :1], truth[:, :1]).mean())}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=16, help="test trajectories, spread over Re")
    parser.add_argument("--size", default="bench", help="preset size (default: bench, 128^2 and 100 frames)")
    parser.add_argument("--start", type=int, nargs="+", default=[0, 50], help="start frames")
    parser.add_argument("--steps", type=int, default=50, help="rollout length (the ns-param recipe: 50)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="write the scores as JSON")
    args = parser.parse_args(argv)
    if args.trajectories < 1 or args.steps < 1 or any(s < 0 for s in args.start):
        parser.error("--trajectories and --steps: must be at least 1; --start: frames >= 0")
    preset = get_preset("ns-param")
    test = preset.trajectories(args.size, "test")
    chosen = [test[int(i)] for i in np.unique(np.linspace(0, len(test) - 1, min(args.trajectories, len(test))).round())]
    u = simulate(preset, chosen, args.size, args.device).u.double()  # (B, T, 2, H, W): velocity
    rows = [score(u, start, args.steps) for start in args.start]
    print(f"{'from frame':>10s} {'steps':>5s} {'persistence':>12s} {'first step':>11s} {'mean':>6s}")
    for row in rows:
        n = row["nmse"]
        print(f"{row['start']:10d} {row['steps']:5d} {n['persistence']:12.3g} {n['persistence, first step']:11.3g} "
              f"{n['mean']:6.3g}")
    result = {"preset": preset.name, "size": args.size, "trajectories": len(chosen),
              "re": [float(t.theta) for t in chosen], "frames": int(u.shape[1]), "rows": rows,
              "torch": torch.__version__}
    if args.out:
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
