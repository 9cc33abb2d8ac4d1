"""Reading speed of each adapter: samples/s from local files, single process and with workers.

Files are written to a temporary folder in the published layouts (`gno_ext.adapters.fixtures`)
at realistic per-sample sizes: The Well turbulent_radiative_layer_2D (4 channels, 128 x 384),
PDEBench 2-D CFD (4 channels, 128 x 128) and a custom HDF5 file (1 channel, 128 x 128). Each
case iterates a shuffled DataLoader (batch 16, ``collate``) over the whole dataset once after
a warm-up pass.

    python benchmarks/bench_adapters.py --workers 0 2 [--batch 16]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from gno_ext.adapters import ArrayDataset, open_dataset
from gno_ext.adapters.fixtures import write_pdebench_cfd, write_well_trl
from gno_ext.schema import collate


def make_files(root: Path) -> dict[str, tuple[str, Path, dict]]:
    well = root / "datasets" / "turbulent_radiative_layer_2D" / "data" / "train"
    well.mkdir(parents=True)
    for i, tcool in enumerate((0.03, 0.1, 0.32, 1.0)):
        write_well_trl(well / f"trl_tcool_{tcool}.hdf5", tcool, seed=i, n=8, t=21)
    cfd = root / "2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5"
    write_pdebench_cfd(cfd, n=8, t=21, x=128, y=128)
    custom = root / "custom.h5"
    with h5py.File(custom, "w") as f:
        f["u"] = np.random.default_rng(0).standard_normal((32, 21, 1, 128, 128)).astype(np.float32)
        f["theta"] = np.random.default_rng(1).random((32, 1)).astype(np.float32)
    return {"the_well (TRL 128x384, 4 ch)": ("the_well", well, {}),
            "the_well, reader='h5py'": ("the_well", well, {"reader": "h5py"}),
            "pdebench (CFD 128^2, 4 ch)": ("pdebench", cfd, {}),
            "custom (128^2, 1 ch)": ("custom", custom, {}),
            "custom in memory (128^2, 1 ch)": ("memory", custom, {})}


def bench(kind: str, path: Path, kwargs: dict, workers: int, batch: int) -> tuple[int, float]:
    if kind == "memory":  # the same file read into RAM first: ArrayDataset over numpy arrays
        with h5py.File(path, "r") as f:
            ds = ArrayDataset(f["u"][()], theta=f["theta"][()])
    else:
        ds = open_dataset(kind, path, **kwargs)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(0),
                                         persistent_workers=workers > 0)
    for _ in loader:  # warm-up: worker start, file handles, page cache
        pass
    start = time.perf_counter()
    n = sum(len(batch) for batch in loader)
    return n, n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = make_files(Path(tmp))
        print(f"{'adapter':32s} {'workers':>7s} {'samples':>8s} {'samples/s':>10s}")
        for name, (kind, path, kwargs) in cases.items():
            for workers in args.workers:
                n, rate = bench(kind, path, kwargs, workers, args.batch)
                print(f"{name:32s} {workers:7d} {n:8d} {rate:10.1f}", flush=True)


if __name__ == "__main__":
    main()
