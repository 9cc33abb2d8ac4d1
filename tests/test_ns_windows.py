"""`recipes/ns_windows.py`: persistence on Navier-Stokes rollouts from frame 0 and later frames,
and the figures the pages quote from its committed output."""

import json
from pathlib import Path

import pytest
import torch

from ._recipes import load_recipe

ROOT = Path(__file__).resolve().parent.parent
windows = load_recipe("ns_windows")


def test_persistence_scores_zero_on_a_still_field_and_the_mean_predictor_one():
    torch.manual_seed(0)
    still = torch.randn(3, 1, 2, 8, 8).expand(3, 6, 2, 8, 8)
    moving = torch.cat([still[:, :3], still[:, 3:] + torch.randn(3, 3, 2, 8, 8)], 1)
    row = windows.score(still + 0.0, 1, 10)
    assert row["steps"] == 4  # shortened to the frames there are
    assert row["nmse"]["persistence"] == 0 and row["nmse"]["persistence, first step"] == 0
    assert windows.score(moving, 0, 2)["nmse"]["persistence"] == 0  # frames 1, 2 equal frame 0
    late = windows.score(moving, 2, 3)["nmse"]
    assert late["persistence"] > 0.1 and late["mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="start=5: the trajectories have 6 frames"):
        windows.score(moving, 5, 1)


def test_the_script_solves_the_presets_test_trajectories(tmp_path):
    out = tmp_path / "w.json"
    result = windows.main(["--size", "smoke", "--trajectories", "1", "--start", "0", "2", "--steps", "2",
                           "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == result["rows"]
    assert [r["start"] for r in result["rows"]] == [0, 2] and result["frames"] == 6
    assert all(0 < r["nmse"]["persistence"] < 1 for r in result["rows"])


def test_the_pages_quote_the_committed_figures():
    """`python recipes/ns_windows.py --out benchmarks/protocol/ns_windows.json`: the recipe page and
    the param notes quote its persistence figures from frames 0 and 50."""
    rows = {r["start"]: r["nmse"] for r in
            json.loads((ROOT / "benchmarks" / "protocol" / "ns_windows.json").read_text())["rows"]}
    page = " ".join((ROOT / "docs" / "recipes" / "burgers-ns.md").read_text().split())
    notes = " ".join((ROOT / "benchmarks" / "notes" / "param.md").read_text().split())
    for text in (page, notes):
        assert (f"persistence scores {rows[0]['persistence, first step']:.2g} at the first step from frame 0 "
                f"and {rows[50]['persistence, first step']:.2g} from frame 50") in text
