"""Data-parallel scaling of a recipe: training samples/s on 1, 2, 4, ... GPUs (or CPU processes).

    python benchmarks/bench_ddp.py --recipe heat-param --size paper --procs 1 2 4 --steps 60

Each count runs ``torchrun --nproc_per_node N recipes/train.py`` for ``--steps`` optimizer steps
with ``--batch`` samples per process (so the global batch grows with N: weak scaling) and reads
the throughput the run logs (``train/samples_per_s`` over each logging window); the first window
(start-up, first kernels) is left out and the median of the rest reported. Scaling efficiency is
``samples/s(N) / (N x samples/s(1))``; "data wait" is the median fraction of the time the
loop waited for the loader (``train/data_wait``). The dataset is generated once, before the first count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from gno_ext import _children as children

TRAIN = Path(__file__).resolve().parents[1] / "recipes" / "train.py"


def throughput(metrics: Path) -> dict[str, float]:
    """The median over a run's logging windows, the first (start-up) left out, of its training
    samples/s and of the fraction of the time it waited for the loader."""
    logged = [json.loads(x) for x in metrics.read_text().splitlines() if "train/samples_per_s" in x]
    if not logged:
        raise ValueError(f"{metrics}: no train/samples_per_s logged (too few steps for trainer.log_every?)")
    logged = logged[1:] if len(logged) > 1 else logged
    return {"samples_per_s": statistics.median(r["train/samples_per_s"] for r in logged),
            "data_wait": statistics.median(r.get("train/data_wait", float("nan")) for r in logged)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="heat-param")
    parser.add_argument("--size", default="paper")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32, help="samples per process per step")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--out", default="runs/bench_ddp")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args(argv)
    rows = []
    for n in args.procs:
        run = Path(args.out) / f"procs{n}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), str(TRAIN),
               "--recipe", args.recipe, f"size={args.size}", f"trainer.max_steps={args.steps}",
               f"trainer.batch_size={args.batch}", f"trainer.log_every={args.log_every}", "trainer.val_every=100000",
               "trainer.progress=false", "eval.enabled=false", f"run_dir={run}", "overwrite=true", *args.overrides]
        proc = children.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{n} process(es) failed:\n{proc.stderr[-4000:]}")
        rows.append({"procs": n, "global_batch": n * args.batch, **throughput(run / "metrics.jsonl")})
    base = rows[0]["samples_per_s"] / rows[0]["procs"]
    print("| processes | global batch | samples/s | speed-up | efficiency | data wait |\n|---|---|---|---|---|---|")
    for r in rows:
        r["efficiency"] = r["samples_per_s"] / (r["procs"] * base)
        print(f"| {r['procs']} | {r['global_batch']} | {r['samples_per_s']:.0f} | "
              f"{r['samples_per_s'] / rows[0]['samples_per_s']:.2f} | {100 * r['efficiency']:.0f} % | "
              f"{100 * r['data_wait']:.1f} % |")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "scaling.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    children.forward_signals()  # killed or interrupted, the run it started stops with it
    main()
