"""One run of a results table as a Hydra job; `recipes/benchmark.py run` starts the multirun.

    python recipes/sweep.py -m table=param recipe=heat-param,advection-param row=gno,fno seed=0,1
    python recipes/sweep.py -m ... hydra/launcher=joblib hydra.launcher.n_jobs=4   # one run per local GPU
    python recipes/sweep.py -m ... hydra/launcher=submitit_slurm                   # a SLURM cluster
    python recipes/sweep.py -m table=param cell=heat-param/gno-seed0,advection-param/fno-seed1  # these cells alone

A run whose result file exists is skipped (see `recipes/benchmark.py`).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from gno_ext.benchmark.run import execute, parse_cell
from gno_ext.benchmark.tables import RESULTS, TABLES, load_tables, plan

# the job's folder in the sweep's: <table>/<recipe>/<row>-seed<N>, as the cell's result file is named
OmegaConf.register_new_resolver(
    "sweep_cell", lambda cell, recipe, row, seed: cell or f"{recipe}/{row}-seed{seed}", replace=True)


@hydra.main(config_path=".", config_name="sweep", version_base="1.3")
def main(cfg: DictConfig) -> None:
    c = OmegaConf.to_container(cfg, resolve=True)
    tables = load_tables(c["tables"] or TABLES)
    recipe, row, seed = parse_cell(c["cell"]) if c["cell"] else (c["recipe"], c["row"], int(c["seed"]))
    (run,) = plan(tables, c["table"], [seed], [recipe], [row], c["size"])
    execute(run, [str(o) for o in c["extra"]], Path(c["results"] or RESULTS),
            Path(c["output_root"]) if c["output_root"] else None, int(c["processes"]))


if __name__ == "__main__":
    main()
