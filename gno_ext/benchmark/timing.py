"""How the speed benchmarks (``benchmarks/bench_model.py``, ``benchmarks/bench_layers.py``)
time a function on the CPU or a GPU."""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["timed"]


def timed(fn, repeats: int, device: str, warmup: int = 3, warmup_s: float = 2.0) -> float:
    """Median time of ``fn`` over ``repeats`` synchronised runs, after ``warmup`` runs and at
    least ``warmup_s`` seconds of runs on a GPU: timed straight after its compilation (a
    minute with the GPU idle, at 345 MHz on an H100), the first model of a call came out 19 %
    slower than the same model timed later, probably while the clocks came back up."""
    start = time.perf_counter()
    runs = 0
    # CUDA graph trees: a warm-up run, a recording, then replays
    while runs < warmup or device == "cuda" and time.perf_counter() - start < warmup_s:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        runs += 1
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
