"""What simple predictors score on a Burgers protocol: does its test column measure learning?

    python recipes/burgers_oracles.py                                  # the unit box and the 2 pi box
    python recipes/burgers_oracles.py --extent 6.283185307179586 --trajectories 64 --out oracles.json

For each box side ``L`` the script draws initial velocities as the ``burgers-param`` preset does
(two-component Gaussian random fields of unit standard deviation, correlation length ``0.3 L``),
solves the viscous Burgers equation with the dataset's solver for ``--steps`` frames
``--frame-dt`` apart on a ``--resolution``² grid, for viscosities spread linearly over each test
interval (the paper's training interval [5e-4, 5e-2], as an in-distribution test, and its shifted
test interval [0.01, 1]), and scores, with the rollout nMSE of the results tables (per
trajectory, $\\|\\hat u - u\\|^2 / \\|u - \\bar u\\|^2$ over the rollout's frames):

* ``zero``: predicting zero velocity;
* ``mean``: predicting the trajectory's own mean over the rollout (1 by construction: the scale);
* ``persistence``: the first frame copied forward;
* ``decay (true nu)``: the first frame decayed by viscosity alone, exactly, with the true
  viscosity: what a model that knows nu but not the transport would predict;
* ``decay (nu clipped)``: the same with nu clipped into the training interval: what a model that
  is exact on the training interval predicts where it must extrapolate.

It also reports the share of the trajectories whose last frame keeps less than 0.3 % of the
first frame's variance about its mean (fields that have all but vanished). A column measures
learning where persistence and the mean predictor are both far above what a model can reach.
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path
from typing import Any

import torch

from gno_ext._files import write_json
from gno_ext.losses import nmse
from gno_ext.schema import Grid
from gno_ext.solvers import gaussian_random_field, solve_burgers
from gno_ext.solvers.spectral import spectral_dims, wavenumbers

TRAIN = (5e-4, 5e-2)  # the paper's training viscosities (Appendix C)
INTERVALS = {"in-distribution": TRAIN, "shifted": (0.01, 1.0)}
LENGTH = 0.3  # the preset's initial correlation length, in units of the box side
VANISHED = 3e-3  # a last frame with less of the first frame's variance than this has all but vanished


def decay(u0: torch.Tensor, nu: torch.Tensor, times: torch.Tensor, grid: Grid) -> torch.Tensor:
    """``u0`` (B, d, *S) decayed by viscosity alone to each of ``times``: (B, T, d, *S)."""
    dims = spectral_dims(grid)
    k2 = sum(k ** 2 for k in wavenumbers(grid, u0.dtype, u0.device))
    spectrum = torch.fft.rfftn(u0, dim=dims)
    view = (-1,) + (1,) * (grid.ndim + 1)
    return torch.stack([torch.fft.irfftn(spectrum * torch.exp(-(nu * t).view(view) * k2), s=grid.shape, dim=dims)
                        for t in times], 1)


def score(extent: float, interval: tuple[float, float], n: int, resolution: int, steps: int, frame_dt: float,
          seed: int = 0, start: int = 0) -> dict[str, Any]:
    """The predictors' mean rollout nMSE over ``n`` trajectories with viscosities spread over
    ``interval`` on the box of side ``extent``, the rollout starting from frame ``start`` (a model
    that reads ``k`` frames starts from frame ``k - 1``)."""
    grid = Grid((resolution, resolution), (extent, extent))
    nu = torch.linspace(*interval, n, dtype=torch.float64)
    u0 = gaussian_random_field(grid, [seed * 100_000 + i for i in range(n)], channels=2, length_scale=LENGTH * extent,
                               dtype=torch.float64)
    times = torch.arange(start + steps + 1, dtype=torch.float64) * frame_dt
    u = solve_burgers(u0, nu, times, grid=grid)[:, start:]  # (B, steps + 1, 2, *S), from frame `start`
    u0, times = u[:, 0], times[start:] - times[start]
    truth = u[:, 1:]
    clipped = nu.clamp(*TRAIN)
    predictions = {"zero": torch.zeros_like(truth), "persistence": u0[:, None].expand_as(truth),
                   "decay (true nu)": decay(u0, nu, times[1:], grid),
                   "decay (nu clipped)": decay(u0, clipped, times[1:], grid)}
    scores = {name: float(nmse(p, truth).mean()) for name, p in predictions.items()}
    mean = truth.flatten(1).mean(1).view(-1, *[1] * (truth.ndim - 1)).expand_as(truth)
    scores = {"zero": scores["zero"], "mean": float(nmse(mean, truth).mean()),
              **{k: v for k, v in scores.items() if k != "zero"}}
    spread = lambda f: (f - f.flatten(1).mean(1).view(-1, 1, 1, 1)).pow(2).flatten(1).sum(1)  # noqa: E731
    kept = spread(u[:, -1]) / spread(u[:, 0])
    return {"extent": extent, "interval": list(interval), "trajectories": n, "resolution": resolution,
            "steps": steps, "frame_dt": frame_dt, "start": start, "nmse": scores,
            "vanished_share": float((kept < VANISHED).double().mean()),
            "last_frame_variance_kept": {"min": float(kept.min()), "median": float(kept.median())}}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extent", type=float, nargs="+", default=[1.0, 2 * math.pi],
                        help="box sides to compare (default: the unit box and the 2 pi box)")
    parser.add_argument("--trajectories", type=int, default=24, help="per test interval")
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="rollout length (the tables: 10)")
    parser.add_argument("--frame-dt", type=float, default=0.01, help="time between frames (the preset: 0.01)")
    parser.add_argument("--start", type=int, nargs="+", default=[0],
                        help="frames the rollout starts from (a model reading k frames starts from k - 1)")
    parser.add_argument("--out", type=Path, help="write the scores as JSON")
    args = parser.parse_args(argv)
    for name, value in (("--trajectories", args.trajectories), ("--resolution", args.resolution),
                        ("--steps", args.steps)):
        if value < 1:
            parser.error(f"{name}: must be at least 1, got {value}")
    if not args.frame_dt > 0 or any(not e > 0 for e in args.extent):
        parser.error("--frame-dt and --extent: must be positive")
    if any(s < 0 for s in args.start):
        parser.error(f"--start: frames must be >= 0, got {args.start}")
    rows = []
    print(f"{'box side':>9s} {'test nu':>16s} {'from':>4s} " + " ".join(f"{k:>18s}" for k in
          ("zero", "mean", "persistence", "decay (true nu)", "decay (nu clipped)")) + f" {'vanished':>9s}")
    for extent, (label, interval), start in itertools.product(args.extent, INTERVALS.items(), args.start):
        row = score(extent, interval, args.trajectories, args.resolution, args.steps, args.frame_dt, start=start)
        row["test"] = label
        rows.append(row)
        print(f"{extent:9.4g} {f'[{interval[0]:g}, {interval[1]:g}]':>16s} {start:4d} "
              + " ".join(f"{v:18.4g}" for v in row["nmse"].values()) + f" {row['vanished_share']:9.0%}", flush=True)
    if args.out:
        write_json(args.out, {"rows": rows, "torch": torch.__version__})
    return rows


if __name__ == "__main__":
    main()
