"""Figures of generated trajectories for the datasets page.

    python recipes/plot_datasets.py --out docs/assets/datasets

Generates the test split of ``small`` presets into a temporary folder and shows, for each
boundary type, the trajectories of the smallest and largest parameter (first channel).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from plot_solvers import panel  # recipes/ is the script folder

from gno_ext.adapters import GeneratedDataset
from gno_ext.data import generate, get_preset


def figure(name: str, out: Path, frames: list[int]) -> None:
    preset = get_preset(name)
    with tempfile.TemporaryDirectory() as tmp:
        root = generate(name, "small", tmp, device="cpu", progress=False, splits=("test",))
        ds = GeneratedDataset(root, split="test", n_steps_input=1, n_steps_output=max(frames))
        rows, labels = [], []
        per_traj = preset.frames["small"] - max(frames)
        picks = {}
        for i in range(0, len(ds), per_traj):
            s = ds[i]
            kind = s.meta["file"].split("_")[1]
            theta = float(s.theta[0])
            lo, hi = picks.get(kind, (None, None))
            picks[kind] = (min(lo, (theta, i)) if lo else (theta, i), max(hi, (theta, i)) if hi else (theta, i))
        for kind, ends in picks.items():
            for theta, i in ends:
                s = ds[i]
                traj = [s.u_in[0, 0]] + [s.u_out[f - 1, 0] for f in frames]
                rows.append(torch.stack(traj))
                labels.append(f"{kind}, {preset.parameter}={theta:.3g}")
        times = [0.0] + [f * preset.frame_dt for f in frames]
        panel(out / f"{name}.png", torch.stack(rows), labels, times,
              f"{name} (small): smallest and largest {preset.parameter} per boundary type")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/assets/datasets"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    figure("heat-joint", args.out, [1, 4, 20])
    figure("advection-joint", args.out, [5, 10, 20])
    figure("burgers-param", args.out, [10, 20, 40])
    figure("ns-param", args.out, [10, 20, 40])


if __name__ == "__main__":
    main()
