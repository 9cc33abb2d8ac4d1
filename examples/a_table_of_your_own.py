"""A results table of your own, run as a sweep and rendered: two models on one recipe, every run
with the same data, epochs, batch and seed, each leaving one result file; then the table's page.
On a cluster the same command takes a Hydra launcher (``--launcher submitit_slurm`` with
hydra-submitit-launcher installed), one job per run; on a host with several GPUs
``--launcher joblib`` runs one per GPU.

    python examples/a_table_of_your_own.py [--size smoke] [--out my_table]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

RECIPES = Path(__file__).resolve().parent.parent / "recipes"

TABLE = {
    "budget": {"size": "small", "overrides": ["trainer.epochs=3", "trainer.batch_size=16"]},
    "tables": {"mine": {
        "title": "The FNO against the recommended GNO on heat across diffusivities",
        "recipes": ["heat-param"],
        "rows": {"fno": {}, "gno_fno_soft": {}},
    }},
}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="smoke", help="the datasets' size (the budget's own: small)")
    parser.add_argument("--out", type=Path, default=Path("my_table"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tables = args.out / "tables.yaml"
    tables.write_text(yaml.safe_dump(TABLE, sort_keys=False))
    common = ["--tables", str(tables), "--results", str(args.out / "results")]
    # the sweep: resumable (a run whose result file exists is skipped), one Hydra job per run
    subprocess.run([sys.executable, str(RECIPES / "benchmark.py"), "run", "--table", "mine", "--size", args.size,
                    *common, "--output-root", str(args.out / "runs"), "--", "trainer.progress=false"], check=True)
    # the pages: the table beside its budget and the command that reproduces it, with its figures
    subprocess.run([sys.executable, str(RECIPES / "benchmark.py"), "render", *common, "--docs", str(args.out / "docs")],
                   check=True)
    page = args.out / "docs" / "results" / "mine.md"
    print(page.read_text().split("## Figures")[0])
    return page


if __name__ == "__main__":
    main()
