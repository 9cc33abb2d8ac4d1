"""`recipes/bench_model.py`: a CPU row, the whole-graph mode's refusal on the CPU and, on a GPU,
that a training step captured in one CUDA graph trains exactly as the step run from Python."""

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[1] / "recipes" / "bench_model.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_model_times_an_eager_step_on_the_cpu():
    row = load().bench("vit-standin", 1, "eager", (32, 32), 1, "cpu", repeats=1)
    assert row["step_ms"] > 0 and row["forward_ms"] > 0
    assert row["step_gflop"] > 0 and row["kernels_used"] == [1] * 8


def test_whole_graph_mode_says_it_needs_a_gpu():
    with pytest.raises(SystemExit, match="whole-graph needs a CUDA device"):
        load().bench("vit-standin", 1, "whole-graph", (32, 32), 1, "cpu", repeats=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_captured_training_step_updates_like_the_step_run_from_python():
    bm = load()
    from gno_ext.models import GNO

    def run(capture: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = GNO(latent=64, patch=8, depth=2, heads=4, n_kernels=3, gate_hidden=8).cuda()
        model.param_norm.fit(torch.logspace(-2, 0, 64)[:, None].cuda())
        x = bm.make_inputs(8, (32, 32), 1, "cuda")
        x["target"] = x["u"] + 0.01
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)
        start = [p.detach().clone() for p in model.parameters()]

        def step() -> None:  # float32, so that the two paths differ only by the capture
            loss = (model(x["u"], theta=x["theta"], bc=x["bc"]) - x["target"]).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        # a capture records the step without running it: 2 warm-up steps, then 4 replays
        replay = bm.captured(step, warmup=2) if capture else step
        for _ in range(4 if capture else 6):
            replay()
        torch.cuda.synchronize()
        return start, [p.detach() for p in model.parameters()]

    start, eager = run(False)
    start_graph, graph = run(True)
    assert all(torch.equal(a, b) for a, b in zip(start, start_graph))
    moved = torch.cat([(e - s).flatten() for e, s in zip(eager, start)])
    moved_graph = torch.cat([(g - s).flatten() for g, s in zip(graph, start)])
    # six optimizer steps either way; a replay that reused stale gradients or skipped the
    # optimizer would leave a difference of the order of one step (a sixth of the path)
    assert moved.norm() > 0
    assert (moved_graph - moved).norm() < 1e-3 * moved.norm()
