"""`benchmarks/bench_model.py`: a CPU row, and the whole-graph mode's refusal on the CPU (the
capture itself: tests/training/test_capture.py)."""

import json

import pytest
import torch

from tests._kernels import kernel_module
from tests._recipes import load_recipe


def test_bench_model_times_an_eager_step_on_the_cpu():
    row = load_recipe("bench_model").bench("vit-standin", 1, "eager", (32, 32), 1, "cpu", repeats=1)
    assert row["step_ms"] > 0 and row["forward_ms"] > 0
    assert row["step_gflop"] > 0 and row["kernels_used"] == [1] * 8


def test_bench_model_times_the_fno_backbones_on_the_cpu():
    """The FNO baseline and the GNO on it, at a small grid (every axis divisible by the
    boundary segments of 16 cells)."""
    bench = load_recipe("bench_model")
    fno = bench.bench("fno", 2, "eager", (32, 32), 1, "cpu", repeats=1)
    gno_fno = bench.bench("gno-fno", 2, "eager", (32, 32), 1, "cpu", repeats=1)
    assert fno["kernels_used"] == [1] and fno["boundary"] is None and fno["ran"]["boundary"] is None
    assert len(gno_fno["kernels_used"]) == 4 and gno_fno["ran"]["boundary"] == "unfused"
    assert gno_fno["params_m"] > fno["params_m"] and gno_fno["step_gflop"] > 0 and fno["step_gflop"] > 0
    soft = bench.bench("gno-fno-soft", 2, "eager", (32, 32), 1, "cpu", repeats=1)
    assert soft["kernels_used"] == [4] * 4 and soft["params_m"] == gno_fno["params_m"]
    assert soft["step_gflop"] > gno_fno["step_gflop"]  # the probability-weighted sum of the kernels' results


def test_bench_model_times_both_spectral_transforms_with_a_traffic_floor():
    """``--fourier``: the kept-mode transforms and the FFT on the same model, each row naming the
    one it took; every row carries the floor on its memory traffic (more bytes at a larger
    batch: the saved activations grow with it), its time NaN where no bandwidth was measured."""
    bench = load_recipe("bench_model")
    rows = {f: bench.bench("fno", 2, "eager", (32, 32), 1, "cpu", repeats=1, fourier=f) for f in ("dft", "fft")}
    assert rows["dft"]["fourier"] == "dft" and rows["fft"]["fourier"] == "fft"
    model, x, _, _ = bench.setup("fno", 2, (32, 32), 1, "cpu", None, fourier="fft")
    assert {m.fourier for m in model.modules() if isinstance(m, bench.FullPrecisionSpectralConv)} == {"fft"}
    small = bench.traffic_floor(model, x, "cpu")
    model, x, _, _ = bench.setup("fno", 8, (32, 32), 1, "cpu", None)
    assert bench.traffic_floor(model, x, "cpu") > small > 8 * 4 * sum(p.numel() for p in model.parameters())
    assert rows["dft"]["traffic_floor_gib"] > 0 and rows["dft"]["traffic_floor_ms"] != rows["dft"]["traffic_floor_ms"]
    assert bench.bench("vit-standin", 1, "eager", (32, 32), 1, "cpu", repeats=1)["fourier"] is None


def test_bench_model_times_the_fno_backbones_with_their_blocks_recomputed():
    """``--checkpoint-blocks true``: the row says so, and the step does more work (each block's
    forward pass again in the backward) with the same parameters; models without FNO blocks
    name no such setting."""
    bench = load_recipe("bench_model")
    kept, recomputed = (bench.bench("gno-fno-soft", 2, "eager", (32, 32), 1, "cpu", repeats=1, checkpoint=c)
                        for c in (False, True))
    assert (kept["checkpoint_blocks"], recomputed["checkpoint_blocks"]) == (False, True)
    assert recomputed["params_m"] == kept["params_m"] and recomputed["step_gflop"] > 1.1 * kept["step_gflop"]
    assert bench.bench("vit-standin", 1, "eager", (32, 32), 1, "cpu", repeats=1)["checkpoint_blocks"] is None


def test_whole_graph_mode_says_it_needs_a_gpu():
    with pytest.raises(SystemExit, match="whole-graph needs a CUDA device"):
        load_recipe("bench_model").bench("vit-standin", 1, "whole-graph", (32, 32), 1, "cpu", repeats=1)


def test_rows_name_the_paths_that_ran_not_the_requested_ones():
    """On the CPU the fused attention and boundary operator fall back to PyTorch; the row says
    so, whatever was asked for."""
    bench = load_recipe("bench_model")
    model, x, _, _ = bench.setup("gno", 1, (32, 32), 1, "cpu", None, boundary="fused", attention="fused")
    assert bench.paths_taken(bench.count_flops(model, x, "cpu")[1], True) == {"attention": "sdpa",
                                                                                "boundary": "unfused"}
    row = bench.bench("vit-standin", 1, "eager", (32, 32), 1, "cpu", repeats=1, attention="fused")
    assert row["attention"] == "fused" and row["ran"] == {"attention": "sdpa", "boundary": None}


def test_paths_are_read_from_the_operators_that_ran():
    paths_taken = load_recipe("bench_model").paths_taken
    ran = {"aten.mm", "gno_ext.token_attention", "gno_ext.token_attention_backward", "gno_ext.boundary_transfer"}
    assert paths_taken(ran, True) == {"attention": "fused", "boundary": "fused"}
    assert paths_taken({"aten.mm", "aten._scaled_dot_product_efficient_attention"}, True) == {
        "attention": "sdpa", "boundary": "unfused"}


@pytest.mark.parametrize(("module", "op"), [("attention", "token_attention"), ("boundary", "boundary_transfer")])
def test_the_fused_operators_go_by_the_names_paths_taken_reads(module, op):
    kernel_module(module)  # registers the operators (needs Triton)
    assert str(getattr(torch.ops.gno_ext, op)) == f"gno_ext.{op}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused paths need a GPU")
@pytest.mark.parametrize(("shape", "channels", "ran"), [((128, 128), 1, {"attention": "fused", "boundary": "fused"}),
                                                        ((128, 384), 4, {"attention": "fused", "boundary": "fused"})])
def test_gpu_paths_taken_at_the_paper_grid_and_the_trl_grid(shape, channels, ran):
    """At 128^2 (97 keys, 32 boundary tokens) the GNO runs its fused kernels; at the trl grid
    too: the attention's 257 keys take the key-tiled kernels, and the boundary operator's 64
    tokens (inner width 64) take programs of 64 rows (`gno_ext.kernels.boundary.WIDE`)."""
    pytest.importorskip("triton")
    bench = load_recipe("bench_model")
    model, x, _, _ = bench.setup("gno", 2, shape, channels, "cuda", None)
    assert bench.paths_taken(bench.count_flops(model, x, "cuda")[1], True) == ran


def test_the_memory_a_step_holds_splits_into_per_sample_and_per_step_parts():
    """``--memory``: activations saved per sample (what grows with the batch) apart from what does
    not (the weights' bf16 copies), in 2-D and 3-D; the FNO saves far more per sample than the
    patch-token GNO."""
    bench = load_recipe("bench_model")
    fno3, gno3 = (bench.memory(m, 1, (16, 16, 16), 1, "cpu") for m in ("fno", "gno"))
    assert fno3["shape"] == [16, 16, 16] and fno3["saved_gib_per_sample"] > 10 * gno3["saved_gib_per_sample"] > 0
    assert fno3["saved_gib_per_step"] > 0 and fno3["state_gib"] == pytest.approx(16 * fno3["params_m"] * 1e6 / 2**30)
    fno2 = bench.memory("fno", 2, (16, 16), 1, "cpu")
    assert 0 < fno2["saved_gib_per_sample"] < fno3["saved_gib_per_sample"]
    x = bench.make_inputs(3, (8, 8, 8), 1, "cpu")
    assert x["u"].shape == (3, 1, 1, 8, 8, 8) and x["bc"].kind.shape == (3, 6)


def test_a_run_stopped_part_way_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    """``--out`` is written after every row: a run stopped at a time limit while timing one
    configuration keeps the configurations it finished, of the same model too."""
    bench = load_recipe("bench_model")
    timed = bench.bench

    def stops_at_the_fft(model, *args, **kwargs):
        if "fft" in args:  # the fourier argument: the second configuration of the model
            raise KeyboardInterrupt("the call's time limit")
        return timed(model, *args, **kwargs)

    monkeypatch.setattr(bench, "bench", stops_at_the_fft)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda device: float("nan"))
    out = tmp_path / "rows.json"
    monkeypatch.setattr("sys.argv", ["bench_model.py", "--device", "cpu", "--batch", "2", "--shape", "32", "32",
                                     "--modes", "eager", "--models", "fno", "--fourier", "dft", "fft",
                                     "--repeats", "1", "--out", str(out)])
    with pytest.raises(KeyboardInterrupt):
        bench.main()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["fourier"]) for r in rows] == [("fno", "dft")] and rows[0]["step_ms"] > 0
