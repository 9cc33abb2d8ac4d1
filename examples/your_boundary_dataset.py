"""Your own boundary-value dataset, trained on through the custom adapter: heat trajectories whose
diffusivity and boundary conditions vary (Dirichlet walls at a value, insulated or heated Neumann
walls) written to one ``.npz`` file, read back with ``open_dataset("custom", ...)``, then trained
and evaluated with the recipes' ``custom`` recipe.

    python examples/your_boundary_dataset.py [--out my_runs.npz] [--size smoke]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from gno_ext import BCType, BoundarySpec, Grid
from gno_ext.adapters import open_dataset
from gno_ext.solvers import gaussian_random_field, solve_heat

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def make_trajectories(n: int = 48, frames: int = 8, size: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` heat trajectories: diffusivity in [0.05, 0.5]; half with Dirichlet walls held at a
    value in [-1, 1], half with Neumann walls of a flux in [-1, 1] (the same on every face)."""
    g = torch.Generator().manual_seed(seed)
    grid = Grid((size, size))
    alpha = 0.05 + 0.45 * torch.rand(n, generator=g)
    value = 2 * torch.rand(n, generator=g) - 1
    dirichlet = torch.arange(n) % 2 == 0
    kind = torch.where(dirichlet, int(BCType.DIRICHLET), int(BCType.NEUMANN))[:, None].expand(n, 4)
    values = value[:, None, None, None].expand(n, 4, 1, size).contiguous()  # (N, faces, T_bc, points)
    bc = BoundarySpec(kind.contiguous(), values)
    u0 = gaussian_random_field(grid, seeds=range(seed, seed + n))
    times = [0.01 * (k + 1) for k in range(frames - 1)]
    u = torch.cat([u0[:, None], solve_heat(u0, alpha, bc, times=times, grid=grid)], 1)  # (N, T, 1, S, S)
    return {"u": u.numpy().astype(np.float32), "theta": alpha[:, None].numpy(), "bc_kind": kind.numpy(),
            "bc_values": values.numpy(), "dt": np.array(0.01)}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("my_runs.npz"))
    parser.add_argument("--size", default="smoke", help="the recipes' size: smoke (seconds) or small (minutes)")
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="where the run folder goes")
    args = parser.parse_args(argv)

    np.savez(args.out, **make_trajectories())
    ds = open_dataset("custom", args.out)  # the adapter: windows of (frame, next frame) with theta and the boundary
    sample = ds[0]
    print(f"{args.out}: {len(ds)} windows; a sample's input {tuple(sample.u_in.shape)}, theta "
          f"{sample.theta.tolist()}, faces {[BCType(int(k)).name.lower() for k in sample.bc.kind]}")

    # train and evaluate on the file: the default model (gno_fno_soft) at the chosen size
    command = [sys.executable, str(RECIPES / "train.py"), "--recipe", "custom", f"data.root={args.out.resolve()}",
               f"size={args.size}", f"output_root={args.runs.resolve()}", "trainer.progress=false"]
    subprocess.run(command, check=True)
    report = args.runs / "custom" / f"gno_fno_soft-{args.size}-seed0" / "eval" / "report.md"
    print(f"report: {report}")
    return report


if __name__ == "__main__":
    main()
