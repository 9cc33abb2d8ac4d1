"""`benchmarks/bench_mesh_step.py` (and the throughput reader it shares with `bench_ddp.py`):
on a CPU at the smoke size, uncaptured (capture needs a GPU)."""

import json

import pytest

from tests._recipes import load_recipe

pytest.importorskip("torch_geometric")


def test_the_throughput_leaves_out_the_first_window_and_names_a_run_without_any(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in (
        {"step": 1, "train/samples_per_s": 5.0, "train/data_wait": 0.9}, {"step": 2, "train/samples_per_s": 100.0,
                                                                          "train/data_wait": 0.1},
        {"step": 3, "train/samples_per_s": 120.0, "train/data_wait": 0.3}, {"step": 3, "val/nmse": 1.0})))
    assert load_recipe("bench_ddp").throughput(metrics) == {"samples_per_s": 110.0, "data_wait": 0.2}
    metrics.write_text(json.dumps({"step": 1, "val/nmse": 1.0}))
    with pytest.raises(ValueError, match="no train/samples_per_s logged"):
        load_recipe("bench_ddp").throughput(metrics)


@pytest.mark.slow
def test_a_mesh_and_a_grid_model_are_timed_by_training_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GNO_EXT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "mesh_step.json"
    result = load_recipe("bench_mesh_step").main(["--device", "cpu", "--size", "smoke", "--captures", "false",
                                                  "--models", "mesh_gnn", "--grid-models", "fno", "--steps", "10",
                                                  "--batch", "4", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    mesh, grid = result["rows"]
    assert (mesh["recipe"], mesh["model"], grid["recipe"], grid["model"]) == ("heat-mesh", "mesh_gnn", "heat-param", "fno")
    assert "trainer.capture=false" in mesh["options"]
    for r in (mesh, grid):
        assert r["samples_per_s"] > 0 and r["step_ms"] == pytest.approx(4000 / r["samples_per_s"])
        assert r["captured_graphs"] == 0  # (uncaptured runs)
