"""`recipes/bench_model.py`: a CPU row, and the whole-graph mode's refusal on the CPU (the
capture itself: tests/training/test_capture.py)."""

import pytest
import torch

from tests._recipes import load_recipe


def test_bench_model_times_an_eager_step_on_the_cpu():
    row = load_recipe("bench_model").bench("vit-standin", 1, "eager", (32, 32), 1, "cpu", repeats=1)
    assert row["step_ms"] > 0 and row["forward_ms"] > 0
    assert row["step_gflop"] > 0 and row["kernels_used"] == [1] * 8


def test_whole_graph_mode_says_it_needs_a_gpu():
    with pytest.raises(SystemExit, match="whole-graph needs a CUDA device"):
        load_recipe("bench_model").bench("vit-standin", 1, "whole-graph", (32, 32), 1, "cpu", repeats=1)


def test_rows_name_the_paths_that_ran_not_the_requested_ones():
    """On the CPU the fused attention and boundary operator fall back to PyTorch; the row says
    so, whatever was asked for."""
    bench = load_recipe("bench_model")
    model, x, _, _ = bench.setup("gno", 1, (32, 32), 1, "cpu", None, boundary="fused", attention="fused")
    assert bench.paths_taken(bench.count_flops(model, x, "cpu")[1], True) == {"attention": "sdpa",
                                                                                "boundary": "unfused",
                                                                                "kv_pair": False}
    row = bench.bench("vit-standin", 1, "eager", (32, 32), 1, "cpu", repeats=1, attention="fused")
    assert row["attention"] == "fused" and row["ran"] == {"attention": "sdpa", "boundary": None, "kv_pair": False}


def test_folded_context_runs_fewer_flops_than_the_unfolded():
    """``--context``: at a batch where folding saves work (64 samples of 8 boundary tokens at
    the paper's widths; `fold_saves`), the folded model computes the same function with fewer
    FLOPs (the boundary tokens' keys and values at the operator's inner width, no output
    projection), and the default (auto) folds; at batch 2 the folded weights cost more than
    the fold saves, and auto does not fold."""
    bench = load_recipe("bench_model")
    flops, outputs = {}, {}
    for context in ("folded", "unfolded", "auto"):
        model, x, _, _ = bench.setup("gno", 64, (32, 32), 1, "cpu", None, context=context)
        assert all(block.fold_context is bench.CONTEXTS[context] for block in model.blocks)
        flops[context] = bench.count_flops(model, x, "cpu")[0]
        with torch.no_grad():
            outputs[context] = model(x["u"], theta=x["theta"], bc=x["bc"])
    assert flops["folded"] < flops["unfolded"] and flops["auto"] == flops["folded"]
    assert torch.allclose(outputs["folded"], outputs["unfolded"], atol=1e-4, rtol=1e-4)
    small = {context: bench.count_flops(*bench.setup("gno", 2, (32, 32), 1, "cpu", None, context=context)[:2],
                                        "cpu")[0] for context in ("folded", "unfolded", "auto")}
    assert small["folded"] > small["unfolded"] == small["auto"]
    with pytest.raises(ValueError, match="context: expected one of"):
        bench.setup("gno", 2, (32, 32), 1, "cpu", None, context="both")


def test_paths_are_read_from_the_operators_that_ran():
    paths_taken = load_recipe("bench_model").paths_taken
    ran = {"aten.mm", "gno_ext.token_attention", "gno_ext.token_attention_backward", "gno_ext.boundary_transfer"}
    assert paths_taken(ran, True) == {"attention": "fused", "boundary": "fused", "kv_pair": False}
    assert paths_taken(ran | {"gno_ext.gathered_mm_pair"}, True)["kv_pair"]
    assert paths_taken({"aten.mm", "aten._scaled_dot_product_efficient_attention"}, True) == {
        "attention": "sdpa", "boundary": "unfused", "kv_pair": False}


@pytest.mark.parametrize(("module", "op"), [("_attention_kernels", "token_attention"),
                                            ("_boundary_kernels", "boundary_transfer"),
                                            ("_gathered_kernels", "gathered_mm_pair")])
def test_the_fused_operators_go_by_the_names_paths_taken_reads(module, op):
    pytest.importorskip(f"gno_ext.layers.{module}", exc_type=ImportError)  # needs Triton
    assert str(getattr(torch.ops.gno_ext, op)) == f"gno_ext.{op}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused paths need a GPU")
@pytest.mark.parametrize(("shape", "channels", "ran"), [
    ((128, 128), 1, {"attention": "fused", "boundary": "fused", "kv_pair": True}),
    ((128, 384), 4, {"attention": "fused", "boundary": "fused", "kv_pair": True})])
def test_gpu_paths_taken_at_the_paper_grid_and_the_trl_grid(shape, channels, ran):
    """At 128^2 (97 keys, 32 boundary tokens) the GNO runs its fused kernels; at the trl grid
    too: the attention's 257 keys take the key-tiled kernels, and the boundary operator's 64
    tokens (inner width 64) take programs of 64 rows (`gno_ext.layers._boundary_kernels.WIDE`);
    the folded context's keys and values are written by the gathered pair of products."""
    pytest.importorskip("triton")
    bench = load_recipe("bench_model")
    model, x, _, _ = bench.setup("gno", 2, shape, channels, "cuda", None)
    assert bench.paths_taken(bench.count_flops(model, x, "cuda")[1], True) == ran
