"""Dataset generation throughput: trajectories/s of solving and of writing, per preset and size.

Solves and writes the first ``--shards`` shards of the training split (``--batch`` trajectories
per solver call) into a temporary folder, timing the two stages separately, and extrapolates
to the whole preset (all splits). The first batch is a warm-up (CUDA context, cuFFT plans,
``torch.compile`` of the WENO transport) and is not timed.

    python benchmarks/bench_generate.py heat-joint advection-joint --size paper --device cuda
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from gno_ext.data.generate import shards
from gno_ext.data.presets import SPLITS, get_preset
from gno_ext.data.simulate import simulate
from gno_ext.data.writer import write_well_file
from gno_ext.schema import Grid


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("presets", nargs="+")
    parser.add_argument("--size", default="paper")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--dtype", default="float16", choices=["float32", "float16"])
    args = parser.parse_args()
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}), "
          f"size {args.size}, batch {args.batch}, storage {args.dtype}")
    for name in args.presets:
        preset = get_preset(name)
        total = sum(len(preset.plan(args.size, s)) for s in SPLITS)
        todo = shards(preset, args.size, "train", args.batch)[: args.shards + 1]
        simulate(preset, todo[0][1], args.size, args.device)  # warm-up
        solve_s = write_s = 0.0
        n = 0
        grid = Grid((preset.resolution[args.size],) * preset.ndim)
        times = torch.arange(preset.frames[args.size], dtype=torch.float64) * preset.frame_dt
        with tempfile.TemporaryDirectory() as tmp:
            for fname, trajs in todo[1:]:
                sync(args.device)
                t0 = time.perf_counter()
                out = simulate(preset, trajs, args.size, args.device)
                sync(args.device)
                t1 = time.perf_counter()
                write_well_file(Path(tmp) / fname, out.u, out.field_names, grid, times, out.bc, out.theta[:, None],
                                [preset.parameter], preset.name, theta_field=out.theta_field, dtype=args.dtype)
                t2 = time.perf_counter()
                solve_s, write_s, n = solve_s + t1 - t0, write_s + t2 - t1, n + len(trajs)
            nbytes = sum(p.stat().st_size for p in Path(tmp).iterdir())
        rate = n / (solve_s + write_s)
        print(f"{name}: {n} trajectories, solve {n / solve_s:.1f} traj/s, write {n / write_s:.1f} traj/s, "
              f"overall {rate:.1f} traj/s; whole preset ({total} trajectories) ~ {total / rate / 60:.1f} min, "
              f"~ {nbytes / n * total / 2**30:.1f} GiB on disk", flush=True)


if __name__ == "__main__":
    main()
