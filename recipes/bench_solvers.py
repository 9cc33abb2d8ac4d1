"""Throughput of the batched solvers: trajectories/s and cell updates/s.

Each case solves ``FRAMES`` output frames for a batch; one warm-up run, then the median of
``--repeats`` timed runs (CUDA synchronised). A *cell update* is one cell advanced by one time
step (``cells x steps x batch``); the exact heat path takes no steps, so for it the table
counts one update per cell and output frame ("steps" = frames, "ms/step" = ms per frame).

Examples
--------
    python recipes/bench_solvers.py --device cpu --batch 1 16
    python recipes/bench_solvers.py --device cuda --batch 1 256 --out docs/benchmarks/solvers_cuda.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from gno_ext.schema import BoundarySpec, Grid
from gno_ext.solvers import (
    gaussian_random_field,
    random_velocity,
    solve_advection,
    solve_burgers,
    solve_heat,
    solve_navier_stokes,
)

FRAMES = 10


def heat_case(method: str, bounded: bool) -> Callable:
    def run(grid: Grid, batch: int, device: str, stats: dict) -> torch.Tensor:
        u0 = gaussian_random_field(grid, range(batch), device=device)
        kinds = ["dirichlet", "neumann"] * grid.ndim if bounded else ["periodic"] * grid.n_faces
        bc = BoundarySpec.from_types(kinds, 1.0 if bounded else 0.0, batch_size=batch).to(device)
        alpha = torch.linspace(0.01, 0.1, batch, device=device)
        times = [0.002 * (k + 1) for k in range(FRAMES)]
        return solve_heat(u0, alpha, bc, times, grid=grid, method=method, stats=stats)
    return run


def advection_case(compile: bool) -> Callable:
    def run(grid: Grid, batch: int, device: str, stats: dict) -> torch.Tensor:
        u0 = gaussian_random_field(grid, range(batch), device=device)
        vel = random_velocity(grid, range(10_000, 10_000 + batch), device=device)
        bc = BoundarySpec.periodic(grid.ndim, batch).to(device)
        return solve_advection(u0, vel, bc, [0.01 * (k + 1) for k in range(FRAMES)], grid=grid,
                               stats=stats, compile=compile)
    return run


def burgers_case(compile: bool) -> Callable:
    def run(grid: Grid, batch: int, device: str, stats: dict) -> torch.Tensor:
        u0 = gaussian_random_field(grid, range(batch), channels=2, length_scale=0.3, device=device)
        nu = torch.logspace(math.log10(5e-4), math.log10(5e-2), batch, device=device)
        return solve_burgers(u0, nu, [0.01 * (k + 1) for k in range(FRAMES)], grid=grid, stats=stats,
                             compile=compile)
    return run


def ns_case(grid: Grid, batch: int, device: str, stats: dict) -> torch.Tensor:
    w0 = gaussian_random_field(grid, range(batch), length_scale=0.2, sigma=3.0, device=device)
    nu = 1.0 / torch.linspace(500, 1000, batch, device=device)
    return solve_navier_stokes(w0, nu, [0.1 * (k + 1) for k in range(FRAMES)], grid=grid, stats=stats)


CASES: dict[str, tuple[Callable, tuple[int, ...]]] = {
    "heat exact, periodic": (heat_case("exact", False), (2, 3)),
    "heat exact, Dirichlet/Neumann": (heat_case("exact", True), (2, 3)),
    "heat FTCS, Dirichlet/Neumann": (heat_case("ftcs", True), (2,)),
    "advection WENO5": (advection_case(False), (2, 3)),
    "advection WENO5, compiled": (advection_case(True), (2, 3)),
    "Burgers WENO5": (burgers_case(False), (2,)),
    "Burgers WENO5, compiled": (burgers_case(True), (2,)),
    "Navier-Stokes": (ns_case, (2,)),
}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench(run: Callable, grid: Grid, batch: int, device: str, repeats: int) -> dict:
    stats: dict = {}
    run(grid, batch, device, stats)  # warm-up: cuFFT plans, cuBLAS handles, torch.compile
    times = []
    for _ in range(repeats):
        stats = {}
        sync(device)
        start = time.perf_counter()
        out = run(grid, batch, device, stats)
        sync(device)
        times.append(time.perf_counter() - start)
    assert torch.isfinite(out).all()
    seconds = statistics.median(times)
    steps = stats.get("steps", 0) or FRAMES
    cells = math.prod(grid.shape)
    return {"seconds": seconds, "steps": steps, "ms_per_step": 1e3 * seconds / steps,
            "traj_per_s": batch / seconds,
            "cell_updates_per_s": cells * steps * batch / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128], help="2-D resolutions")
    parser.add_argument("--size3d", type=int, default=64, help="3-D resolution (0 to skip)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="*", default=list(CASES), help="subset of case names")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    rows = []
    print(f"device: {args.device} ({device_name}), torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'case':32s} {'grid':>10s} {'batch':>6s} {'steps':>6s} {'s/run':>9s} {'ms/step':>8s} {'traj/s':>10s} {'cell upd/s':>11s}")
    for name in args.cases:
        run, dims = CASES[name]
        grids = [Grid((n, n)) for n in args.sizes] if 2 in dims else []
        if 3 in dims and args.size3d:
            grids.append(Grid((args.size3d,) * 3))
        for grid in grids:
            for batch in args.batch:
                r = bench(run, grid, batch, args.device, args.repeats)
                r.update(case=name, grid="x".join(map(str, grid.shape)), batch=batch)
                rows.append(r)
                print(f"{name:32s} {r['grid']:>10s} {batch:6d} {r['steps']:6d} {r['seconds']:9.4f} {r['ms_per_step']:8.3f} "
                      f"{r['traj_per_s']:10.2f} {r['cell_updates_per_s']:11.3e}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"device": args.device, "device_name": device_name, "torch": torch.__version__,
                "threads": torch.get_num_threads(), "frames": FRAMES}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
