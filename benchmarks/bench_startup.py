"""How long a run takes to reach its first training step, cold and warm.

    python benchmarks/bench_startup.py --models gno gno_fno_soft --out benchmarks/history/startup_h100.json
    python benchmarks/bench_startup.py --device cpu --size smoke --models fno     # the CPU check

For each model it trains the recipe twice for a few steps with ``trainer.compile=true`` (and
``trainer.capture=true`` on a GPU), both runs with the same fresh ``trainer.compile_cache``
folder: the first run compiles (cold), the second finds the compiled code of the first (warm).
Each run is a process of its own (``recipes/train.py``), so nothing but the cache folder carries
over. It reads from each run's ``metrics.jsonl`` the seconds from the training loop's start to
its first optimizer step (compilation included) and to its first step replayed from CUDA graphs
(capture included), and reports the process's whole wall time beside them (data preparation
and evaluation included; the data are generated before the first run). The goal this measures:
a warm start reaches its first captured step within 30 s, a cold one within 90 s, at the
``bench`` size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from gno_ext import _children as children

ROOT = Path(__file__).resolve().parent.parent


def startup(metrics: Path) -> dict[str, float | None]:
    """The startup times a run logged (``startup/first_step_s``, ``startup/first_captured_step_s``) and
    the graphs it had compiled and loaded from the cache by then (the last record's counts)."""
    found: dict[str, float | None] = {"first_step_s": None, "first_captured_step_s": None,
                                      "graphs_compiled": None, "graphs_loaded": None}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        for key in found:
            if f"startup/{key}" in row:
                found[key] = row[f"startup/{key}"]
    return found


def run(recipe: str, model: str, size: str, device: str, cache: Path, folder: Path, steps: int) -> dict:
    """One training process; its startup times and wall time."""
    args = [sys.executable, str(ROOT / "recipes" / "train.py"), "--recipe", recipe, f"model={model}", f"size={size}",
            f"run_dir={folder}", "trainer.compile=true", f"trainer.compile_cache={cache}", f"trainer.max_steps={steps}",
            "trainer.progress=false", "trainer.tensorboard=false", "eval.enabled=false", "trainer.num_workers=0"]
    args += ["trainer.capture=true"] if device == "cuda" else ["trainer.device=cpu"]
    start = time.perf_counter()
    proc = children.run(args, capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{model}: training failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**startup(folder / "metrics.jsonl"), "wall_s": wall}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="heat-param")
    parser.add_argument("--models", nargs="+", default=["gno", "gno_fno_soft"])
    parser.add_argument("--size", default="bench")
    parser.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of each run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import torch

    from gno_ext._files import write_json
    from gno_ext.benchmark.run import git_commit

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.steps < 2:
        parser.error(f"--steps: at least 2 (the first captured step is the second), got {args.steps}")
    rows = []
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "commit": git_commit(), "recipe": args.recipe, "size": args.size, "steps": args.steps, "rows": rows}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            cache = Path(tmp) / f"cache-{model}"
            row = {"model": model}
            for kind in ("cold", "warm"):
                row[kind] = run(args.recipe, model, args.size, device, cache, Path(tmp) / f"{model}-{kind}", args.steps)
            rows.append(row)
            print(f"{model:14s} " + "  ".join(
                f"{kind}: first step {r['first_step_s']:.1f} s, first captured step "
                f"{'—' if r['first_captured_step_s'] is None else format(r['first_captured_step_s'], '.1f')} s, "
                f"process {r['wall_s']:.0f} s, graphs compiled {r['graphs_compiled']} / loaded {r['graphs_loaded']}"
                for kind, r in ((k, row[k]) for k in ("cold", "warm"))), flush=True)
            if args.out:  # after each model, so that a run stopped part-way keeps the models it finished
                write_json(args.out, result)
    return result


if __name__ == "__main__":
    children.forward_signals()  # killed or interrupted, the run it started stops with it
    main()
