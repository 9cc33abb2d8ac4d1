"""`recipes/bench_layers.py` runs on the CPU (the PyTorch path) and refuses the fused path there."""

import pytest

from tests._recipes import load_recipe


def test_bench_layers_times_the_boundary_operator_on_the_cpu():
    row = load_recipe("bench_layers").bench_boundary("unfused", "eager", batch=3, tokens=8, dim=32, device="cpu", calls=2, repeats=3)
    assert (row["path"], row["mode"], row["width"], row["tokens"]) == ("unfused", "eager", 16, 8)
    assert row["forward_us"] > 0 and row["forward_backward_us"] > 0


def test_bench_layers_says_why_the_fused_path_cannot_run_on_the_cpu():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        load_recipe("bench_layers").bench_boundary("fused", "eager", batch=3, tokens=8, dim=32, device="cpu", calls=2, repeats=2)


def test_bench_layers_times_the_attention_on_the_cpu():
    row = load_recipe("bench_layers").bench_attention("sdpa", "eager", batch=2, queries=8, keys=9, heads=2, head_dim=8,
                                                      device="cpu", calls=2, repeats=3)
    assert (row["path"], row["backward"], row["queries"], row["keys"]) == ("sdpa", "sdpa", 8, 9)
    assert row["forward_us"] > 0 and row["forward_backward_us"] > 0


@pytest.mark.parametrize("path", ["fused", "fused-query-tiles"])
def test_bench_layers_says_why_the_fused_attention_cannot_run_on_the_cpu(path):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        load_recipe("bench_layers").bench_attention(path, "eager", batch=2, queries=8, keys=9, heads=2, head_dim=8,
                                                    device="cpu", calls=2, repeats=2)


def test_bench_layers_names_an_unknown_attention_path():
    with pytest.raises(SystemExit, match="unknown attention path 'unfused'"):
        load_recipe("bench_layers").bench_attention("unfused", "eager", batch=2, queries=8, keys=9, heads=2,
                                                    head_dim=8, device="cpu", calls=2, repeats=2)
