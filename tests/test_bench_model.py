"""`recipes/bench_model.py`: a CPU row, and the whole-graph mode's refusal on the CPU (the
capture itself: tests/training/test_capture.py)."""

import pytest

from tests._recipes import load_recipe


def test_bench_model_times_an_eager_step_on_the_cpu():
    row = load_recipe("bench_model").bench("vit-standin", 1, "eager", (32, 32), 1, "cpu", repeats=1)
    assert row["step_ms"] > 0 and row["forward_ms"] > 0
    assert row["step_gflop"] > 0 and row["kernels_used"] == [1] * 8


def test_whole_graph_mode_says_it_needs_a_gpu():
    with pytest.raises(SystemExit, match="whole-graph needs a CUDA device"):
        load_recipe("bench_model").bench("vit-standin", 1, "whole-graph", (32, 32), 1, "cpu", repeats=1)
