"""`benchmarks/bench_startup.py`: a cold and a warm start of the same model through one
compile-cache folder (CPU: compiled, no capture)."""

import json

import pytest

from tests._recipes import load_recipe


def test_startup_times_are_read_from_a_runs_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in ({"step": 1, "startup/first_step_s": 3.5},
                                                          {"step": 1, "train/loss": 1.0},
                                                          {"step": 2, "startup/first_captured_step_s": 4.25,
                                                           "startup/graphs_compiled": 0, "startup/graphs_loaded": 6})))
    assert load_recipe("bench_startup").startup(metrics) == {"first_step_s": 3.5, "first_captured_step_s": 4.25,
                                                             "graphs_compiled": 0, "graphs_loaded": 6}


@pytest.mark.slow
def test_a_warm_start_reuses_the_cold_starts_compiled_code(tmp_path, monkeypatch):
    """The second run of the same model and shapes, with the first run's cache folder, loads the
    compiled code instead of compiling (on 2 CPU cores its first step comes about 35 s after the
    loop's start cold and 10 s warm for the FNO at the smoke size: timed by the benchmark, not here)."""
    monkeypatch.setenv("GNO_EXT_CACHE", str(tmp_path / "data"))
    result = load_recipe("bench_startup").main(["--device", "cpu", "--size", "smoke", "--models", "fno", "--steps", "2",
                                                "--out", str(tmp_path / "startup.json")])
    (row,) = result["rows"]
    assert row["cold"]["graphs_compiled"] > 0 and row["cold"]["graphs_loaded"] == 0
    assert row["warm"]["graphs_compiled"] == 0 and row["warm"]["graphs_loaded"] > 0
    assert row["cold"]["first_captured_step_s"] is None  # no CUDA graphs on a CPU
    assert json.loads((tmp_path / "startup.json").read_text())["rows"][0]["model"] == "fno"
