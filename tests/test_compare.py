"""recipes/compare.py: runs side by side, from the reports that evaluation writes."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from gno_ext.adapters import ArrayDataset
from gno_ext.training.recipe_data import GroupBinner
from gno_ext.training.evaluate import evaluate_rollouts, write_report
from tests._recipes import RECIPES, load_recipe


class Scale(torch.nn.Module):
    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, u_in, theta=None, theta_field=None, bc=None, grid=None):
        return u_in[:, -1:] * self.factor


def make_run(folder, factor, recipe="heat-bc", model="gno"):
    """A run folder as training leaves it: config.yaml and eval/report.json (a real report)."""
    u = torch.randn(4, 4, 1, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    theta = np.linspace(0.1, 0.4, 4, dtype=np.float32)[:, None]
    binner = GroupBinner(torch.as_tensor(theta), np.zeros((4, 4), np.int64), 1, [False], names=["alpha"])
    result = evaluate_rollouts(Scale(factor), ArrayDataset(u, theta=theta, n_steps_output=3), [0, 1, 2, 3], 3, binner,
                               keep_examples=0)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"recipe": {"name": recipe}, "model": {"name": model},
                                                        "size": "smoke", "seed": 0, "trainer": {"epochs": 3}}))
    return write_report(result, binner, folder / "eval", info={"recipe": recipe, "model": model, "size": "smoke"},
                        figures=False)


def test_table_best_first_plot_and_left_out_folders(tmp_path, capsys):
    compare = load_recipe("compare")
    good = make_run(tmp_path / "runs" / "gno-smoke-seed0", 0.9)
    bad = make_run(tmp_path / "runs" / "fno-smoke-seed0", -2.0, model="fno")
    (tmp_path / "runs" / "not-evaluated").mkdir()
    plot = tmp_path / "out" / "steps.png"
    text = compare.main([str(p) for p in sorted((tmp_path / "runs").iterdir())] + ["--plot", str(plot)])
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| gno-smoke-seed0", "| fno-smoke-seed0"]  # best first
    assert f"{good['nmse']['mean']:.3e}" in rows[0] and f"{bad['nmse']['mean']:.3e}" in rows[1]
    assert f"{good['per_step_nmse'][-1]:.3e}" in rows[0] and "| 3 | 0 |" in rows[0]  # epochs, seed from config
    assert "not-evaluated: has no eval/report.json" in capsys.readouterr().err
    assert plot.stat().st_size > 1000
    with pytest.raises(FileExistsError, match="steps.png"):  # never replaced silently
        compare.main([str(tmp_path / "runs" / "gno-smoke-seed0"), "--plot", str(plot)])
    compare.main([str(tmp_path / "runs" / "gno-smoke-seed0"), "--plot", str(plot), "--overwrite"])


def test_different_recipes_are_flagged_and_bad_reports_named(tmp_path):
    compare = load_recipe("compare")
    make_run(tmp_path / "heat-bc" / "gno-smoke-seed0", 0.9)
    make_run(tmp_path / "advection-bc" / "gno-smoke-seed0", 0.9, recipe="advection-bc")
    text = compare.main([str(tmp_path / "heat-bc" / "gno-smoke-seed0"), str(tmp_path / "advection-bc" / "gno-smoke-seed0"),
                         "--no-plot"])
    assert "different recipes (advection-bc, heat-bc)" in text
    assert "| heat-bc/gno-smoke-seed0 |" in text and "| advection-bc/gno-smoke-seed0 |" in text  # same names told apart
    broken = tmp_path / "broken" / "eval"
    broken.mkdir(parents=True)
    (broken / "report.json").write_text(json.dumps({"nmse": {"mean": 1}}))
    with pytest.raises(ValueError, match=r"report.json: not a rollout report \(no rel_l2"):
        compare.main([str(tmp_path / "broken"), "--no-plot"])


def test_command_line_gives_one_line_when_nothing_was_evaluated(tmp_path):
    done = subprocess.run([sys.executable, str(RECIPES / "compare.py"), str(tmp_path / "nothing"), "--no-plot"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "error: no evaluated run among the arguments"
    assert "nothing: does not exist; left out" in done.stderr
