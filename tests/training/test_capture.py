"""`gno_ext.training.capture_step`: a training step captured in one CUDA graph trains as the step
run from Python does (GPU), and a clear error without CUDA."""

import pytest
import torch

from gno_ext.models import GNO
from gno_ext.schema import BoundarySpec
from gno_ext.training import FlatParameters, capture_step


def make_inputs(batch: int, shape: tuple[int, int], device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    bc = BoundarySpec(torch.tensor([1, 1, 2, 2]).repeat(batch, 1), torch.rand(batch, 4, 2, 1, generator=g) * 20 - 10)
    return {"u": torch.randn(batch, 1, 1, *shape, generator=g).to(device),
            "theta": torch.logspace(-2, 0, batch)[:, None].to(device), "bc": bc.to(device)}


def test_capture_step_needs_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="capture_step: CUDA graphs need a CUDA device"):
        capture_step(lambda: None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("flat", [False, True], ids=["parameters", "flat-buffer"])
def test_a_captured_training_step_updates_like_the_step_run_from_python(flat):
    """Also with the optimizer stepping a flat buffer (FlatParameters, gathered in the graph)."""
    def run(capture: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = GNO(latent=64, patch=8, depth=2, heads=4, n_kernels=3, gate_hidden=8).cuda()
        model.param_norm.fit(torch.logspace(-2, 0, 64)[:, None].cuda())
        x = make_inputs(8, (32, 32), "cuda")
        x["target"] = x["u"] + 0.01
        buffers = FlatParameters(model.parameters()) if flat else None
        params = model.parameters() if buffers is None else buffers.param_groups
        opt = torch.optim.AdamW(params, lr=1e-3, fused=True, capturable=True)
        start = [p.detach().clone() for p in model.parameters()]

        def step() -> None:  # float32, so that the two paths differ only by the capture
            loss = (model(x["u"], theta=x["theta"], bc=x["bc"]) - x["target"]).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if buffers is not None:
                buffers.gather_grads()
            opt.step()

        # a capture records the step without running it: 2 warm-up steps, then 4 replays
        replay = capture_step(step, warmup=2) if capture else step
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
