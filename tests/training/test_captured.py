"""``trainer.capture=true``: the settings it refuses, the static-input helpers (CPU), and the
training loop with captured steps reaching the weights of the eager loop (one GPU, and two
processes on two GPUs)."""

from __future__ import annotations


import pytest
import torch

from gno_ext.schema import BoundarySpec, Grid, PDEBatch
from gno_ext.training.captured import _clone, _copy_into, check_capture_settings, signature

from .conftest import QUIET, TRAIN_PY, env_with_cache, logged, run_weights, torchrun

CUDA = torch.device("cuda")


class _Recorded:
    """Steps that record the calls they get."""

    def __init__(self, replayed: bool, calls: list[str]) -> None:
        self.replayed, self.calls = replayed, calls

    def forward_backward(self, batch, groups, dro, last_micro):
        self.calls.append(f"{'captured' if self.replayed else 'eager'} forward_backward")
        return torch.zeros(3)

    def gradient_norm(self, clean):
        self.calls.append(f"{'captured' if self.replayed else 'eager'} gradient_norm")
        return 1.0

    def optimizer_step(self):
        self.calls.append(f"{'captured' if self.replayed else 'eager'} optimizer_step")

    def zero_grad(self):
        pass


def test_capturing_steps_run_eagerly_until_the_first_update_then_replay():
    """The steps own the switch to CUDA graphs (the loop only reports updates): eager steps
    until the first update has made the optimizer's state, then the captured steps, made once
    on the loop's stream."""
    import inspect

    from gno_ext.training.captured import CapturingSteps
    from gno_ext.training.loop import EpochLoop

    calls, made = [], []

    def captured(stream):
        made.append(stream)
        replays = _Recorded(True, calls)
        replays.captured = 2  # (the graphs a `CapturedSteps` has captured, which the loop logs)
        return replays

    steps = CapturingSteps(_Recorded(False, calls), captured)
    steps.forward_backward(None, None, False, True)
    assert not steps.replayed and not made and steps.captured == 0
    for _ in range(3):
        steps.gradient_norm(True)
        steps.optimizer_step()
        steps.updated()
    assert steps.replayed and made == [None] and steps.captured == 2  # made once (its stream: the loop's)
    assert calls == ["eager forward_backward", "eager gradient_norm", "eager optimizer_step", "captured gradient_norm",
                     "captured optimizer_step", "captured gradient_norm", "captured optimizer_step"]
    loop = inspect.getsource(EpochLoop)  # the loop never asks whether its steps are captured
    assert not any(word in loop for word in ("tr.capture", "CapturedSteps", "cuda.Stream", "cuda.stream"))


@pytest.mark.parametrize("kwargs,message", [
    ({"device": torch.device("cpu")}, "CUDA graphs need a GPU; this run is on cpu"),
    ({"world": 2, "grad_sync": "ddp"}, "this run has 2 processes and trainer.grad_sync=ddp, but DDP's gradient "
                                       "hooks are not captured"),
    ({"accum": 2}, "needs trainer.grad_accum=1, got 2"),
    ({"precision": "fp16"}, "use trainer.precision=bf16 or no"),
    ({"compile_mode": "reduce-overhead"}, "trainer.compile='reduce-overhead' makes CUDA graphs of its own"),
    ({"flat": False}, "needs trainer.flat_parameters=true"),
])
def test_capture_refuses_settings_it_cannot_work_with(kwargs, message):
    settings = {"device": CUDA, "world": 1, "accum": 1, "precision": "bf16", "compile_mode": True, "flat": True,
                **kwargs}
    with pytest.raises(ValueError, match=message):
        check_capture_settings(**settings)
    check_capture_settings(CUDA, 1, 1, "bf16", True, True)  # and accepts the supported ones
    check_capture_settings(CUDA, 1, 1, "no", False, True)
    check_capture_settings(CUDA, 4, 1, "bf16", True, True, "flat")


def _batch(b: int, seed: int) -> PDEBatch:
    g = torch.Generator().manual_seed(seed)
    bc = BoundarySpec(torch.tensor([1, 1, 2, 2]).repeat(b, 1), torch.rand(b, 4, 2, 1, generator=g))
    return PDEBatch(u_in=torch.rand(b, 1, 1, 8, 8, generator=g), u_out=torch.rand(b, 1, 1, 8, 8, generator=g),
                    theta=torch.rand(b, 1, generator=g), bc=bc, grid=Grid((8, 8)), dt=torch.rand(b, generator=g))


def test_static_inputs_are_cloned_and_refilled_in_place():
    first, second = _batch(4, 0), _batch(4, 1)
    assert signature(first) == signature(second) != signature(_batch(3, 0))
    static = _clone(first)
    assert static.u_in is not first.u_in and torch.equal(static.u_in, first.u_in)
    held = [static.u_in, static.bc.values, static.theta]
    _copy_into(static, second)
    assert [t.data_ptr() for t in held] == [static.u_in.data_ptr(), static.bc.values.data_ptr(),
                                             static.theta.data_ptr()]  # the same tensors, new values
    for name in ("u_in", "u_out", "theta", "dt"):
        assert torch.equal(getattr(static, name), getattr(second, name)), name
    assert torch.equal(static.bc.values, second.bc.values) and torch.equal(static.bc.kind, second.bc.kind)


def test_a_new_objective_phase_frees_the_old_graphs_and_their_pool(monkeypatch):
    """MSE graphs (one per batch signature) and the optimizer step share a pool; the first DRO
    step frees them all and captures into a new pool (the MSE phase never returns), so that the
    pool does not sit beside the DRO capture's eager warm-up. Within a phase nothing is freed.
    (CUDA's calls are stood in for: the order of captures, replays and releases is what is tested.)"""
    from types import SimpleNamespace

    from gno_ext.training.captured import CapturedSteps

    pools, events = iter(range(100)), []
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool", next(pools)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("free"))
    weight = torch.zeros(2, requires_grad=True)
    weight.grad = torch.ones(2)
    flat = SimpleNamespace(gather_grads=lambda: None, parameters=lambda: [weight])
    optimizer = SimpleNamespace(step=lambda: None)

    def objective(batch, groups, dro):
        return torch.zeros(3), weight.sum()

    objective.running = None
    steps = CapturedSteps(flat, optimizer, objective, clip=None, stream=None)

    def capture(fn, warmup):  # runs fn once (as a capture records it) and replays nothing
        what = "optimizer" if fn is optimizer.step else "step"
        events.append(f"capture {what} in pool {steps.pool[1]}")
        fn()
        return lambda: events.append(f"replay {what}")

    monkeypatch.setattr(steps, "_capture", capture)
    for seed, (b, dro) in enumerate([(4, False), (4, False), (3, False), (4, True), (3, True), (4, True)]):
        steps.forward_backward(_batch(b, seed), torch.zeros(b, dtype=torch.long), dro)
        steps.optimizer_step()
    assert events == ["capture step in pool 0", "replay step", "capture optimizer in pool 0", "replay optimizer",
                      "replay step", "replay optimizer",
                      "capture step in pool 0", "replay step", "replay optimizer",  # a last, shorter batch
                      "free", "capture step in pool 1", "replay step",  # DRO: everything freed, a new pool
                      "capture optimizer in pool 1", "replay optimizer",
                      "capture step in pool 1", "replay step", "replay optimizer",
                      "replay step", "replay optimizer"]
    assert steps.captured == 2 and all(key[2] for key in steps.graphs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU run set up in this process would stay on the CPU")
def test_capture_on_the_cpu_is_refused_before_training(train_module, tmp_path):
    with pytest.raises(ValueError, match="trainer.capture=true: CUDA graphs need a GPU"):
        train_module.main(["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}", "trainer.capture=true",
                           *QUIET])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("weights", ["batch", "running"])
def test_gpu_captured_training_reaches_the_weights_of_the_eager_loop(train_module, tmp_path, weights):
    """The smoke recipe (both curriculum phases, gradient clipping, a shorter last batch of an
    epoch where there is one) in float32 with and without ``trainer.capture``: the same final
    weights, and the same losses logged; and a captured run resumes from its checkpoint. With the
    running DRO weights, whose state the step updates in place, the capture's warm-up runs must
    leave that state as they found it."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # on the GPU, whatever ran before in this process
    common = ["--recipe", "heat-param", "size=smoke", "trainer.precision=no", "eval.enabled=false",
              f"trainer.dro.weights={weights}", *QUIET]
    train_module.main([*common, f"run_dir={tmp_path / 'eager'}"])
    train_module.main([*common, "trainer.capture=true", f"run_dir={tmp_path / 'captured'}"])
    a, b = run_weights(tmp_path / "eager"), run_weights(tmp_path / "captured")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=5e-5, msg=key)
    losses = [logged(tmp_path / run, "train/loss") for run in ("eager", "captured")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)
    assert len(losses[1]) >= 4
    # the DRO epoch's group weights, read from the replayed graph's output, are the eager loop's
    weights = [logged(tmp_path / run, "train/dro_weight_max") for run in ("eager", "captured")]
    assert len(weights[0]) == 1 and weights[0][0] > 1 and weights[0] == pytest.approx(weights[1], rel=1e-3)
    # a longer captured run resumes from the checkpoint of the first (tensor learning rates saved)
    done = train_module.main([*common, "trainer.capture=true", "trainer.epochs=3", "resume=auto",
                              f"run_dir={tmp_path / 'captured'}"])
    assert done["step"] > 8


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_captured_train_like_ddp(tmp_path, cache):
    """torchrun on 2 GPUs (NCCL), float32: the captured steps (the model outside DDP, the flat
    buffers' gradients all-reduced inside the graph) reach the weights, the losses and the
    gradient norms of the eager loop under DDP."""
    env = env_with_cache(cache)
    common = [str(TRAIN_PY), "--recipe", "heat-param", "size=smoke", "trainer.precision=no", "eval.enabled=false",
              "trainer.batch_size=4", *QUIET]
    for name, extra in (("ddp", []), ("captured", ["trainer.capture=true"])):
        out = torchrun(2, [*common, *extra, f"run_dir={tmp_path / name}"], env, 600)
        assert out.returncode == 0, out.stderr[-3000:]
        sync = "flat" if extra else "ddp"
        assert f"2 process(es) on cuda (gradients averaged by {sync})" in out.stdout, out.stdout[-2000:]
    assert len(logged(tmp_path / "captured", "train/loss")) >= 4
    for key in ("train/loss", "train/grad_norm"):
        assert logged(tmp_path / "captured", key) == pytest.approx(logged(tmp_path / "ddp", key), rel=1e-4), key
    a, b = run_weights(tmp_path / "ddp"), run_weights(tmp_path / "captured")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=5e-5, msg=key)


def test_tensor_learning_rates_are_filled_in_place_by_the_scheduler():
    """A captured optimizer step reads its learning rate from a tensor: the scheduler must fill
    that tensor (not replace it), from a float ``initial_lr``; and back to floats for a run
    without capture (resuming a captured run's checkpoint)."""
    from gno_ext.training.setup import set_lr_type

    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=0.1, foreach=False)
    set_lr_type(opt.param_groups, torch.device("cpu"), True)
    lr = opt.param_groups[0]["lr"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(0.1)
    assert isinstance(opt.param_groups[0]["initial_lr"], float)
    p.grad = torch.ones(3)
    opt.step()
    scheduler.step()
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(0.05)
    set_lr_type(opt.param_groups, torch.device("cpu"), False)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05) and isinstance(opt.param_groups[0]["lr"], float)
