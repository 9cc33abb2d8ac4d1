"""`benchmarks/bench_layers.py` runs on the CPU (the PyTorch path) and refuses the fused path there."""

import pytest
import torch

from tests._recipes import load_recipe


def test_bench_layers_times_the_boundary_operator_on_the_cpu():
    row = load_recipe("bench_layers").bench_boundary("unfused", "eager", batch=3, tokens=8, dim=32, device="cpu", calls=2, repeats=3)
    assert (row["path"], row["mode"], row["width"], row["tokens"]) == ("unfused", "eager", 16, 8)
    assert row["forward_us"] > 0 and row["forward_backward_us"] > 0


@pytest.mark.parametrize("precision", ["float32", "tf32"])
def test_bench_layers_times_float32_operands_and_restores_the_tf32_setting(precision):
    bench = load_recipe("bench_layers")
    before = torch.backends.cuda.matmul.allow_tf32
    row = bench.bench_boundary("unfused", "eager", batch=3, tokens=8, dim=32, device="cpu", calls=2, repeats=2,
                               precision=precision)
    assert row["precision"] == precision and row["forward_backward_us"] > 0
    row = bench.bench_attention("sdpa", "eager", batch=2, queries=8, keys=9, heads=2, head_dim=8, device="cpu",
                                calls=2, repeats=2, precision=precision)
    assert (row["precision"], row["library"]) == (precision, "sdpa")
    assert torch.backends.cuda.matmul.allow_tf32 == before
    with bench.tf32_products(precision), bench.autocast(precision, "cpu"):
        assert torch.backends.cuda.matmul.allow_tf32 == (precision == "tf32")
        assert not torch.is_autocast_enabled("cpu")
    with bench.tf32_products("bf16"), bench.autocast("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert not torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(SystemExit, match="unknown precision 'fp8'"):
        with bench.tf32_products("fp8"):
            pass


def test_bench_layers_says_why_the_fused_path_cannot_run_on_the_cpu():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        load_recipe("bench_layers").bench_boundary("fused", "eager", batch=3, tokens=8, dim=32, device="cpu", calls=2, repeats=2)


def test_bench_layers_times_the_attention_on_the_cpu():
    row = load_recipe("bench_layers").bench_attention("sdpa", "eager", batch=2, queries=8, keys=9, heads=2, head_dim=8,
                                                      device="cpu", calls=2, repeats=3)
    assert (row["path"], row["forward"], row["backward"], row["queries"], row["keys"]) == ("sdpa", "sdpa", "sdpa", 8, 9)
    assert row["forward_us"] > 0 and row["forward_backward_us"] > 0


@pytest.mark.parametrize("path", ["fused", "fused-query-tiles", "fused-key-tiles"])
def test_bench_layers_says_why_the_fused_attention_cannot_run_on_the_cpu(path):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        load_recipe("bench_layers").bench_attention(path, "eager", batch=2, queries=8, keys=9, heads=2, head_dim=8,
                                                    device="cpu", calls=2, repeats=2)


def test_bench_layers_names_an_unknown_attention_path():
    with pytest.raises(SystemExit, match="unknown attention path 'unfused'"):
        load_recipe("bench_layers").bench_attention("unfused", "eager", batch=2, queries=8, keys=9, heads=2,
                                                    head_dim=8, device="cpu", calls=2, repeats=2)


def _per_sample(x, index, weight, bias):
    return torch.stack([x[b] @ weight[k] + bias[k] for b, k in enumerate(index.tolist())])


@pytest.mark.parametrize("autocast", [False, True])
def test_grouped_mm_product_equals_each_samples_own_product(autocast):
    """The ``grouped-mm`` path is the mixture's product, gradients included, with kernels of
    different sample counts (one kernel chosen by none)."""
    grouped_mm_linear = load_recipe("bench_layers").grouped_mm_linear
    torch.manual_seed(0)
    index = torch.tensor([2, 0, 2, 3, 0, 2])  # kernel 1 unused
    x = torch.randn(6, 5, 16, requires_grad=True)
    weight = torch.randn(4, 16, 8, requires_grad=True)
    bias = torch.randn(4, 8, requires_grad=True)
    grad = torch.randn(6, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = grouped_mm_linear(x, index, weight, bias)
    got = torch.autograd.grad(y, (x, weight, bias), grad.to(y.dtype))
    want_y = _per_sample(x, index, weight, bias)
    want = torch.autograd.grad(want_y, (x, weight, bias), grad)
    tol = {"rtol": 2e-2, "atol": 5e-2} if autocast else {"rtol": 1e-5, "atol": 1e-5}
    assert y.dtype == (torch.bfloat16 if autocast else torch.float32)
    torch.testing.assert_close(y.float(), want_y, **tol)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w, **tol)
    assert got[1][1].abs().max() == 0 and got[2][1].abs().max() == 0


def test_bench_layers_times_the_products_on_the_cpu():
    bench = load_recipe("bench_layers")
    rows = [bench.bench_products(path, "eager", batch=8, rows=5, dim_in=16, dim_out=32, n_kernels=4, device="cpu",
                                 calls=2, repeats=2) for path in ("grouped-mm", "dense")]
    assert [(r["path"], r["rows"], r["dim_out"]) for r in rows] == [("grouped-mm", 5, 32), ("dense", 5, 32)]
    assert sum(rows[0]["samples_per_kernel"]) == 8 and rows[1]["samples_per_kernel"] == [8]
    assert all(r["forward_us"] > 0 and r["forward_backward_us"] > 0 for r in rows)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench.bench_products("gathered", "eager", batch=8, rows=5, dim_in=16, dim_out=32, n_kernels=4, device="cpu",
                             calls=2, repeats=2)
