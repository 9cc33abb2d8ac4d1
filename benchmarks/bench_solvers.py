"""Throughput of the batched solvers: trajectories/s and cell updates/s.

Each case solves ``FRAMES`` output frames for a batch; one warm-up run, then the median of
``--repeats`` timed runs (CUDA synchronised). A *cell update* is one cell advanced by one time
step (``cells x steps x batch``); the exact heat path takes no steps, so for it the table
counts one update per cell and output frame ("steps" = frames, "ms/step" = ms per frame).

Examples
--------
    python benchmarks/bench_solvers.py --device cpu --batch 1 16
    python benchmarks/bench_solvers.py --device cuda --batch 1 256 --out benchmarks/history/solvers_cuda.json
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


Inputs = dict


def heat_case(method: str, bounded: bool) -> tuple[Callable, Callable]:
    def setup(grid: Grid, batch: int, device: str) -> Inputs:
        kinds = ["dirichlet", "neumann"] * grid.ndim if bounded else ["periodic"] * grid.n_faces
        return {"u0": gaussian_random_field(grid, range(batch), device=device),
                "alpha": torch.linspace(0.01, 0.1, batch, device=device),
                "bc": BoundarySpec.from_types(kinds, 1.0 if bounded else 0.0, batch_size=batch).to(device),
                "times": [0.002 * (k + 1) for k in range(FRAMES)], "grid": grid}

    def solve(x: Inputs, stats: dict) -> torch.Tensor:
        return solve_heat(x["u0"], x["alpha"], x["bc"], x["times"], grid=x["grid"], method=method, stats=stats)
    return setup, solve


def advection_case(compile: bool) -> tuple[Callable, Callable]:
    def setup(grid: Grid, batch: int, device: str) -> Inputs:
        return {"u0": gaussian_random_field(grid, range(batch), device=device),
                "velocity": random_velocity(grid, range(10_000, 10_000 + batch), device=device),
                "bc": BoundarySpec.periodic(grid.ndim, batch).to(device),
                "times": [0.01 * (k + 1) for k in range(FRAMES)], "grid": grid}

    def solve(x: Inputs, stats: dict) -> torch.Tensor:
        return solve_advection(x["u0"], x["velocity"], x["bc"], x["times"], grid=x["grid"], stats=stats,
                               compile=compile)
    return setup, solve


def burgers_case(compile: bool) -> tuple[Callable, Callable]:
    def setup(grid: Grid, batch: int, device: str) -> Inputs:
        return {"u0": gaussian_random_field(grid, range(batch), channels=2, length_scale=0.3, device=device),
                "nu": torch.logspace(math.log10(5e-4), math.log10(5e-2), batch, device=device),
                "times": [0.01 * (k + 1) for k in range(FRAMES)], "grid": grid}

    def solve(x: Inputs, stats: dict) -> torch.Tensor:
        return solve_burgers(x["u0"], x["nu"], x["times"], grid=x["grid"], stats=stats, compile=compile)
    return setup, solve


def ns_case() -> tuple[Callable, Callable]:
    def setup(grid: Grid, batch: int, device: str) -> Inputs:
        return {"w0": gaussian_random_field(grid, range(batch), length_scale=0.2, sigma=3.0, device=device),
                "nu": 1.0 / torch.linspace(500, 1000, batch, device=device),
                "times": [0.1 * (k + 1) for k in range(FRAMES)], "grid": grid}

    def solve(x: Inputs, stats: dict) -> torch.Tensor:
        return solve_navier_stokes(x["w0"], x["nu"], x["times"], grid=x["grid"], stats=stats)
    return setup, solve


CASES: dict[str, tuple[tuple[Callable, Callable], tuple[int, ...]]] = {
    "heat exact, periodic": (heat_case("exact", False), (2, 3)),
    "heat exact, Dirichlet/Neumann": (heat_case("exact", True), (2, 3)),
    "heat FTCS, Dirichlet/Neumann": (heat_case("ftcs", True), (2,)),
    "advection WENO5": (advection_case(False), (2, 3)),
    "advection WENO5, compiled": (advection_case(True), (2, 3)),
    "Burgers WENO5": (burgers_case(False), (2,)),
    "Burgers WENO5, compiled": (burgers_case(True), (2,)),
    "Navier-Stokes": (ns_case(), (2,)),
}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench(case: tuple[Callable, Callable], grid: Grid, batch: int, device: str, repeats: int) -> dict:
    setup, solve = case
    inputs = setup(grid, batch, device)  # random inputs are drawn outside the timed region
    solve(inputs, {})  # warm-up: cuFFT plans, cuBLAS handles, torch.compile
    times = []
    for _ in range(repeats):
        stats: dict = {}
        sync(device)
        start = time.perf_counter()
        out = solve(inputs, stats)
        sync(device)
        times.append(time.perf_counter() - start)
    assert torch.isfinite(out).all()
    seconds = statistics.median(times)
    steps = stats.get("steps", 0) or FRAMES
    cells = math.prod(grid.shape)
    return {"seconds": seconds, "steps": steps, "ms_per_step": 1e3 * seconds / steps,
            "traj_per_s": batch / seconds,
            "cell_updates_per_s": cells * steps * batch / seconds}


def render(path: Path) -> str:
    """A Markdown table of a results file written with ``--out``."""
    data = json.loads(path.read_text())
    m = data["meta"]
    lines = [f"Device: {m['device_name']} ({m['device']}), torch {m['torch']}, {m['threads']} CPU threads.", "",
             "| case | grid | batch | steps | s / run | ms / step | trajectories / s | cell updates / s |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["rows"]:
        lines.append(f"| {r['case']} | {r['grid']} | {r['batch']} | {r['steps']} | {r['seconds']:.4f} | "
                     f"{r['ms_per_step']:.3f} | {r['traj_per_s']:.1f} | {r['cell_updates_per_s']:.2e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128], help="2-D resolutions")
    parser.add_argument("--size3d", type=int, default=64, help="3-D resolution (0 to skip)")
    parser.add_argument("--batch3d", type=int, nargs="+", help="3-D batch sizes (default: --batch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="*", default=list(CASES), help="subset of case names")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--render", type=Path, help="print a results file as a Markdown table and exit")
    args = parser.parse_args()
    if args.render:
        print(render(args.render))
        return

    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    rows = []
    print(f"device: {args.device} ({device_name}), torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'case':32s} {'grid':>10s} {'batch':>6s} {'steps':>6s} {'s/run':>9s} {'ms/step':>8s} {'traj/s':>10s} {'cell upd/s':>11s}")
    meta = {"device": args.device, "device_name": device_name, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "frames": FRAMES}
    for name in args.cases:
        case, dims = CASES[name]
        grids = [Grid((n, n)) for n in args.sizes] if 2 in dims else []
        if 3 in dims and args.size3d:
            grids.append(Grid((args.size3d,) * 3))
        for grid in grids:
            for batch in (args.batch3d or args.batch) if grid.ndim == 3 else args.batch:
                r = bench(case, grid, batch, args.device, args.repeats)
                r.update(case=name, grid="x".join(map(str, grid.shape)), batch=batch)
                rows.append(r)
                print(f"{name:32s} {r['grid']:>10s} {batch:6d} {r['steps']:6d} {r['seconds']:9.4f} {r['ms_per_step']:8.3f} "
                      f"{r['traj_per_s']:10.2f} {r['cell_updates_per_s']:11.3e}", flush=True)
                if args.out:  # rewritten after every row, so an interrupted run keeps its results
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
