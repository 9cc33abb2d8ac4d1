"""Figures of sample trajectories for the solver pages of the documentation.

    python recipes/plot_solvers.py --out docs/assets/solvers

One PNG per solver family: rows are samples (different parameters / boundary conditions),
columns are output times.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from gno_ext.schema import BoundarySpec, Grid  # noqa: E402
from gno_ext.solvers import (  # noqa: E402
    gaussian_random_field,
    random_velocity,
    solve_advection,
    solve_burgers,
    solve_heat,
    solve_navier_stokes,
)

GRID = Grid((128, 128))


def panel(path: Path, frames: torch.Tensor, rows: list[str], times: list[float], title: str) -> None:
    """Save ``frames`` (R, T, H, W) as an R x T image grid with one colour scale per row."""
    n_rows, n_cols = frames.shape[:2]
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(1.9 * n_cols + 0.6, 1.9 * n_rows), squeeze=False)
    for r in range(n_rows):
        lim = float(frames[r].abs().max())
        for c in range(n_cols):
            ax = axes[r, c]
            im = ax.imshow(frames[r, c].T.cpu(), origin="lower", cmap="RdBu_r", vmin=-lim, vmax=lim,
                           extent=(0, 1, 0, 1))
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"t = {times[c]:g}", fontsize=9)
            if c == 0:
                ax.set_ylabel(rows[r], fontsize=8)
        fig.colorbar(im, ax=axes[r, -1], fraction=0.046)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


def heat(out: Path) -> None:
    times = [0.0, 0.01, 0.05, 0.2]
    u0 = gaussian_random_field(GRID, [1, 1, 1, 1], length_scale=0.2, sigma=3.0)
    kinds = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2]])
    values = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 0], [5.0, -5, 0, 10], [8.0, 0, -4, 0]])[:, :, None, None]
    alpha = torch.tensor([0.01, 1.0, 0.1, 0.1])
    u = solve_heat(u0, alpha, BoundarySpec(kinds, values), times, grid=GRID)
    rows = ["periodic, a=0.01", "periodic, a=1", "Dirichlet, a=0.1", "Neumann, a=0.1"]
    panel(out / "heat.png", u[:, :, 0], rows, times, "Heat: one initial condition, four (alpha, B)")


def advection(out: Path) -> None:
    times = [0.0, 0.1, 0.25, 0.5]
    u0 = gaussian_random_field(GRID, [2, 2, 2], length_scale=0.2)
    vel = torch.cat([random_velocity(GRID, [10, 11]), random_velocity(GRID, [12], periodic=False)])
    bc = BoundarySpec(torch.tensor([[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]),
                      torch.tensor([[0.0] * 4, [0.0] * 4, [3.0, -3.0, 3.0, -3.0]])[:, :, None, None])
    u = solve_advection(u0, vel, bc, times, grid=GRID)
    rows = ["periodic, v1", "periodic, v2", "Dirichlet +-3, v3"]
    panel(out / "advection.png", u[:, :, 0], rows, times, "Advection: one initial condition, three (v(x), B)")


def burgers(out: Path) -> None:
    times = [0.0, 0.25, 0.5, 1.0]
    u0 = gaussian_random_field(GRID, [3, 3], channels=2, length_scale=0.3)
    u = solve_burgers(u0, torch.tensor([5e-4, 5e-2]), times, grid=GRID)
    panel(out / "burgers.png", u[:, :, 0], ["nu=5e-4", "nu=5e-2"], times, "Burgers: u_x for two viscosities")


def navier_stokes(out: Path) -> None:
    times = [0.0, 2.0, 5.0, 10.0]
    w0 = gaussian_random_field(GRID, [4, 4], length_scale=0.2, sigma=3.0)
    w = solve_navier_stokes(w0, torch.tensor([1 / 500, 1 / 1000]), times, grid=GRID)
    panel(out / "navier_stokes.png", w[:, :, 0], ["Re=500", "Re=1000"], times,
          "Navier-Stokes: vorticity, Kolmogorov forcing")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/assets/solvers"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for make in (heat, advection, burgers, navier_stokes):
        make(args.out)
        print(f"wrote {make.__name__}", flush=True)


if __name__ == "__main__":
    main()
