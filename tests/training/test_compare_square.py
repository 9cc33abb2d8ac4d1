"""benchmarks/compare_square.py: mesh and grid models on the same square trajectories."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "compare_square.py"


@pytest.mark.slow
def test_mesh_and_grid_runs_see_the_same_test_trajectories_and_render(tmp_path):
    results = tmp_path / "results"
    command = [sys.executable, str(SCRIPT), "run", "--pde", "heat", "--models", "gno_mesh", "gno_fno", "--size",
               "smoke", "--data-root", str(tmp_path / "data"), "--runs", str(tmp_path / "runs"), "--results",
               str(results), "--", "trainer.epochs=1", "trainer.batch_size=4"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "GNO_EXT_COMMIT": "c" * 40})
    assert done.returncode == 0, done.stderr[-3000:]
    mesh, grid = (json.loads((results / f"heat-{m}.json").read_text()) for m in ("gno_mesh", "gno_fno"))
    assert (mesh["form"], grid["form"]) == ("mesh", "grid")
    for key in ("epochs", "batch_size", "lr", "seed", "splits", "test_trajectories", "rollout_steps"):
        assert mesh[key] == grid[key], key
    assert mesh["epochs"] == 1 and mesh["splits"] == [4, 2, 2] and mesh["grid_side"] == 7
    # the same test trajectories under the same metric: persistence scores the same on both forms
    assert mesh["persistence_per_step_nmse"] == pytest.approx(grid["persistence_per_step_nmse"], rel=1e-5)
    assert mesh["nmse_mean"] > 0 and grid["nmse_mean"] > 0 and mesh["nmse_mean"] != grid["nmse_mean"]
    table = subprocess.run([sys.executable, str(SCRIPT), "render", "--results", str(results)], capture_output=True,
                           text=True, check=True).stdout
    assert f"| `gno_mesh` | mesh | {mesh['nmse_mean']:.3f} |" in table and "| `gno_fno` | grid |" in table
    assert "size=smoke (4 training, 2 test trajectories, a 7 x 7 grid), 1 epochs, batch 4" in table
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.count("exists, skipped") == 2
    # a file evaluated on other trajectories is refused, by name
    grid["persistence_per_step_nmse"] = [2 * x for x in grid["persistence_per_step_nmse"]]
    (results / "heat-gno_fno.json").write_text(json.dumps(grid))
    bad = subprocess.run([sys.executable, str(SCRIPT), "render", "--results", str(results)], capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "heat-gno_fno.json's persistence error differs" in bad.stderr


def test_the_irregular_domains_page_shows_the_committed_comparison():
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_square", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (ROOT / "docs" / "irregular-domains.md").read_text()
    assert module.render() in page, "docs/irregular-domains.md: paste `python benchmarks/compare_square.py render`"
