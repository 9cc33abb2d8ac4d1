"""The objective across processes, the non-finite guard, precision, the sampler and DRO groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gno_ext.losses import RunningGroupLosses, dro_group_weights, group_dro_loss, group_sums
from gno_ext.training.recipe_data import CurriculumBatchSampler, GroupBinner
from gno_ext.training.objective import (
    NonFiniteGuard,
    NonFiniteLossError,
    choose_precision,
    global_objective,
)

from .conftest import ROOT, env_with_cache, torchrun


def _simulated_processes(losses: torch.Tensor, groups: torch.Tensor, world: int, dro: bool,
                         temperature: str = "absolute"):
    """Run `global_objective` as ``world`` processes would: an all-reduce returns the sum of what
    every process passes to its k-th call; the per-process gradients are summed and divided by
    ``world``, as DDP does."""
    x = losses.detach().clone().requires_grad_(True)
    shards = list(zip(x.chunk(world), groups.chunk(world)))
    calls: list[list[torch.Tensor]] = [[] for _ in shards]
    for k, (s, g) in enumerate(shards):  # pass 1: record what each process would reduce
        global_objective(s.detach(), g, 5, dro, tau=3.0, world_size=world, temperature=temperature,
                         all_reduce=lambda t, k=k: calls[k].append(t.detach().clone()) or t.detach())
    values = []
    for k, (s, g) in enumerate(shards):  # pass 2: reduce across the recorded calls
        n_call = [0]

        def reduce(t, n_call=n_call):
            out = sum(c[n_call[0]] for c in calls)
            n_call[0] += 1
            return out
        loss, backward, weights = global_objective(s, g, 5, dro, tau=3.0, world_size=world, all_reduce=reduce,
                                                   temperature=temperature)
        (backward / world).backward()
        values.append((float(loss), weights))
    return values, x.grad


@pytest.mark.parametrize("dro,temperature,scale", [(True, "absolute", 3.0), (False, "absolute", 3.0),
                                                   (True, "relative", 3.0), (True, "relative", 3e-3)])
def test_sharded_objective_equals_one_process(dro, temperature, scale):
    """Two processes (an all-reduce simulated) compute the objective, its gradient and the group
    weights of one process holding the global batch; with the relative temperature too, whose
    mean group loss must be the global batch's, not a process's own."""
    torch.manual_seed(0)
    losses = torch.rand(8) * scale
    groups = torch.tensor([0, 4, 1, 1, 4, 4, 0, 2])
    ref = losses.clone().requires_grad_(True)
    expected = group_dro_loss(ref, groups, 3.0, temperature) if dro else ref.mean()
    expected.backward()
    values, grad = _simulated_processes(losses, groups, world=2, dro=dro, temperature=temperature)
    assert [v for v, _ in values] == pytest.approx([float(expected.detach())] * 2, rel=1e-6)
    torch.testing.assert_close(grad, ref.grad, rtol=1e-5, atol=1e-7 * scale)
    sums, counts = group_sums(losses, groups, 5)
    want = dro_group_weights(sums, counts, 3.0, temperature) if dro else torch.ones(5)
    for _, weights in values:
        torch.testing.assert_close(weights, want, rtol=1e-5, atol=1e-6)
    # without the reduction, each process's own DRO differs from the global objective
    own = group_dro_loss(losses[:4], groups[:4], 3.0, temperature) if dro else losses[:4].mean()
    assert abs(float(own) - float(expected)) > 1e-3 * scale


@pytest.mark.slow
def test_two_gloo_processes_match_one(tmp_path, cache):
    """2 CPU processes (torchrun, gloo, a GNO whose gate routes samples to different kernels)
    give the loss and gradients of 1 process holding the same global batch."""
    script = ROOT / "tests" / "training" / "ddp_objective.py"
    out = {}
    for n in (1, 2):
        path = tmp_path / f"world{n}.pt"
        proc = torchrun(n, [str(script), str(path)], env_with_cache(cache), 300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[n] = torch.load(path, weights_only=True)
    assert float(out[1]["loss"]) == pytest.approx(float(out[2]["loss"]), rel=1e-6)
    scale = max(float(g.abs().max()) for g in out[1]["grads"].values())
    assert scale > 0
    for name, g in out[1]["grads"].items():
        torch.testing.assert_close(out[2]["grads"][name], g, rtol=1e-4, atol=1e-6 * scale, msg=name)


def test_non_finite_guard():
    guard = NonFiniteGuard(patience=3)
    assert guard.ok(torch.tensor(1.0), "loss", 0)
    assert not guard.ok(float("nan"), "loss", 1)
    assert not guard.ok(float("inf"), "loss", 2)
    assert guard.ok(0.5, "loss", 3) and guard.consecutive == 0 and guard.skipped == 2
    guard.ok(float("nan"), "loss", 4)
    guard.ok(float("nan"), "loss", 5)
    with pytest.raises(NonFiniteLossError, match="step 6: 3 consecutive.*learning rate"):
        guard.ok(float("nan"), "loss", 6)


def test_a_non_finite_gradient_counts_even_when_the_loss_is_finite():
    guard = NonFiniteGuard(patience=2)
    for step in range(2):
        assert guard.check(0.25, "loss") and guard.clean
        assert not guard.check(float("nan"), "gradient norm") and not guard.clean
        if step == 0:
            assert not guard.update(step) and guard.consecutive == 1 and guard.clean
    with pytest.raises(NonFiniteLossError, match="2 consecutive updates.*this one: gradient norm nan"):
        guard.update(1)


def test_choose_precision_cpu():
    assert choose_precision("auto", "cpu") == "no"
    with pytest.raises(ValueError, match="mixed precision is for GPUs"):
        choose_precision("bf16", "cpu")
    with pytest.raises(ValueError, match="expected auto"):
        choose_precision("half", "cpu")


def test_sampler_one_configuration_per_batch_and_shards():
    configs = np.array([0] * 10 + [1] * 5 + [2] * 3)
    one = CurriculumBatchSampler(configs, batch_size=4, seed=3)
    batches = one.global_batches(0)
    assert all(len({configs[i] for i in b}) == 1 for b in batches)  # one boundary configuration each
    order = [configs[b[0]] for b in batches]
    assert order[:3] == [0, 1, 2]  # interleaved: types in turn
    assert set(np.concatenate(batches)) == set(range(len(configs)))  # every sample seen
    two = [CurriculumBatchSampler(configs, batch_size=2, rank=r, world_size=2, seed=3) for r in range(2)]
    shards = [list(s) for s in two]
    assert len(shards[0]) == len(shards[1]) == len(batches)
    for b, s0, s1 in zip(batches, *shards):  # two processes see exactly one process's global batches
        assert s0 + s1 == b.tolist()
    assert not np.array_equal(np.concatenate(one.global_batches(1)), np.concatenate(batches))  # reshuffled
    seq = CurriculumBatchSampler(configs, batch_size=4, order="sequential").global_batches(0)
    assert [configs[b[0]] for b in seq] == sorted(configs[b[0]] for b in seq)
    resumed = CurriculumBatchSampler(configs, batch_size=4, seed=3)
    resumed.set_epoch(0, start=2)
    assert [tuple(b) for b in resumed] == [tuple(b) for b in batches[2:]]


def test_group_binner():
    theta = torch.tensor([[0.01], [0.1], [1.0]]).repeat(4, 1)
    kinds = np.array([[0, 0, 0, 0], [1, 1, 1, 1]])
    few = GroupBinner(theta, kinds, bins=8, log_params=[True])  # 3 distinct values: one group each
    assert few.n_groups == 2 * 3
    g = few(torch.tensor([[0.01], [0.1], [1.0], [0.1]]), torch.tensor([[0] * 4, [0] * 4, [0] * 4, [1] * 4]))
    assert g.tolist() == [0, 1, 2, 4]
    dense = GroupBinner(torch.logspace(-2, 0, 50)[:, None], kinds[:1], bins=2, log_params=[True])
    g = dense(torch.tensor([[0.02], [0.5], [50.0]]), torch.zeros(3, 4, dtype=torch.long))
    assert g.tolist() == [0, 1, 1]  # log-spaced halves; out of range -> outer bin
    assert few.label(4) == "dirichlet/dirichlet/dirichlet/dirichlet, theta0 = 0.1"  # a bin per value: the value
    with pytest.raises(ValueError, match="not in the training data"):
        few(torch.tensor([[0.1]]), torch.tensor([[2, 2, 2, 2]]))


def test_the_training_objective_adds_the_gates_balance_terms_with_their_weight():
    """`make_objective` collects the terms of the gates that ran (`balance_losses`) and adds them
    with ``model.balance_weight``; the logged loss is the data term alone."""
    import types
    from contextlib import nullcontext

    from gno_ext.layers import ParameterGate
    from gno_ext.training.steps import make_objective

    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gates = torch.nn.ModuleList(ParameterGate(1, 3, hidden=4) for _ in range(2))

        def forward(self, u_in, theta, theta_field, bc, grid):
            return u_in[:, :1] * sum(g(theta).weight for g in self.gates)[:, None, None, None]

    torch.manual_seed(0)
    model = Gated()
    batch = types.SimpleNamespace(u_in=torch.randn(6, 1, 1, 4), u_out=torch.randn(6, 1, 1, 4), theta=torch.randn(6, 1),
                                  theta_field=None, bc=None, grid=None)
    groups, scale = torch.zeros(6, dtype=torch.long), torch.ones(1, 1, 1, 1)
    terms = sum(g(batch.theta).balance_loss for g in model.gates)
    runs = {w: make_objective(model, model, nullcontext, scale, 1, 1.0, 1, balance_weight=w)(batch, groups, False)
            for w in (0.0, 0.5)}
    # what is logged ([loss, largest, smallest group weight]) leaves the balance term out
    assert torch.equal(runs[0.0][0], runs[0.5][0]) and torch.equal(runs[0.0][0][0], runs[0.0][1])
    assert runs[0.0][0][1:].tolist() == [1.0, 1.0]  # the plain mean favours no group
    torch.testing.assert_close(runs[0.5][1] - runs[0.0][1], 0.5 * terms)
    with pytest.raises(ValueError, match="model.physics_weight=1.0: Gated has no physics residual"):
        make_objective(model, model, nullcontext, scale, 1, 1.0, 1, physics_weight=1.0)


def test_running_dro_across_processes_equals_one_process():
    """With ``trainer.dro.weights=running``, two processes (the all-reduce simulated with the
    global batch's sums and counts) keep the running group losses one process keeps, and their
    averaged gradients are its gradient."""
    torch.manual_seed(1)
    one = RunningGroupLosses(5, rate=0.3)
    shards = [RunningGroupLosses(5, rate=0.3) for _ in range(2)]
    for _ in range(3):  # three global batches
        losses = torch.rand(8) * 1e-3
        groups = torch.tensor([0, 4, 1, 1, 4, 4, 0, 2])
        ref = losses.clone().requires_grad_(True)
        global_objective(ref, groups, 5, True, 2.0, world_size=1, temperature="relative",
                         running=one).backward_loss.backward()
        sums, counts = group_sums(losses, groups, 5)
        x = losses.clone().requires_grad_(True)
        for k, (s, g) in enumerate(zip(x.chunk(2), groups.chunk(2))):
            answers = iter([sums, counts])
            out = global_objective(s, g, 5, True, 2.0, world_size=2, temperature="relative", running=shards[k],
                                   all_reduce=lambda t, answers=answers: next(answers))
            (out.backward_loss / 2).backward()
        torch.testing.assert_close(x.grad, ref.grad, rtol=1e-5, atol=1e-9)
        for running in shards:
            torch.testing.assert_close(running.loss, one.loss)
