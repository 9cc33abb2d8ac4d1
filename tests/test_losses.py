import math

import numpy as np
import pytest
import torch

from gno_ext.losses import (
    Curriculum,
    RunningGroupLosses,
    bin_parameters,
    dro_from_group_sums,
    dro_group_weights,
    group_dro_loss,
    group_sums,
    mse_per_sample,
    nmse,
    relative_l2,
)


def test_group_dro_equals_the_formula_by_hand():
    loss = torch.tensor([1.0, 3.0, 0.5, 4.0, 2.0])
    groups = torch.tensor([0, 0, 2, 5, 5])  # groups 1, 3, 4 are empty and must not count
    tau = 0.7
    means = [2.0, 0.5, 3.0]
    expected = math.log(sum(math.exp(tau * m) for m in means) / 3) / tau
    assert math.isclose(group_dro_loss(loss, groups, tau).item(), expected, rel_tol=1e-6)


def test_group_dro_limits():
    loss = torch.tensor([1.0, 3.0, 0.5, 4.0, 2.0])
    groups = torch.tensor([0, 0, 1, 2, 2])
    means = torch.tensor([2.0, 0.5, 3.0])
    assert math.isclose(group_dro_loss(loss, groups, 1e-6).item(), means.mean().item(), rel_tol=1e-4)
    big = group_dro_loss(loss, groups, 200.0).item()
    assert big <= means.max().item() and big > means.max().item() - 0.01  # -> worst group
    taus = [0.1, 1.0, 10.0]
    values = [group_dro_loss(loss, groups, t).item() for t in taus]
    assert values == sorted(values)


def _decade(scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight groups of two samples each, whose means span a decade from ``scale`` (log-spaced),
    the worst group last."""
    means = scale * torch.logspace(0, 1, 8, dtype=torch.float64)
    return means.repeat_interleave(2), torch.arange(8).repeat_interleave(2)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 50.0])
def test_relative_temperature_acts_at_any_loss_scale(scale):
    """Group losses spanning a decade: with the relative temperature (the training default,
    tau = 2) the objective lies at least a third of the way from the mean to the worst group,
    at 1e-3 (normalised MSEs) as at 50, and the gradient weighs the worst group most and the
    best least; with the paper's absolute form and tau = 1 at scale 1e-3 it is the mean to
    within 1% of that distance (the inert objective this setting replaces)."""
    loss, groups = _decade(scale)
    means = loss[::2]
    x = loss.clone().requires_grad_(True)
    got = group_dro_loss(x, groups, 2.0, "relative")
    (grad,) = torch.autograd.grad(got, x)
    way = float((got.detach() - means.mean()) / (means.max() - means.mean()))
    assert 1 / 3 <= way < 1
    per_group = grad.reshape(8, 2).sum(1)
    assert int(per_group.argmax()) == 7 and int(per_group.argmin()) == 0
    assert bool((per_group[1:] > per_group[:-1]).all())
    assert float(per_group.sum()) == pytest.approx(1.0)  # the objective of equal losses moves with them
    sums, counts = group_sums(loss, groups, 8)
    weights = dro_group_weights(sums, counts, 2.0, "relative")
    torch.testing.assert_close(weights / 8, per_group)  # the logged weights are the gradient's
    assert float(weights.max() / weights.min()) > 10
    if scale == 1e-3:
        inert = group_dro_loss(loss, groups, 1.0)  # the paper's formula with tau = 1
        assert float((inert - means.mean()) / (means.max() - means.mean())) < 0.01
        w = dro_group_weights(sums, counts, 1.0)
        assert float(w.max() / w.min()) < 1.01


def test_relative_temperature_is_scale_free_and_handles_zero_losses():
    """Scaling every loss scales the relative objective by the same factor (the absolute one
    does not); all-zero losses give 0 and finite gradients."""
    loss, groups = _decade(1.0)
    one = group_dro_loss(loss, groups, 2.0, "relative")
    torch.testing.assert_close(group_dro_loss(1e-4 * loss, groups, 2.0, "relative"), 1e-4 * one)
    assert not torch.isclose(group_dro_loss(1e-4 * loss, groups, 2.0), 1e-4 * group_dro_loss(loss, groups, 2.0))
    zero = torch.zeros(6, requires_grad=True)
    value = group_dro_loss(zero, torch.tensor([0, 0, 1, 1, 2, 2]), 2.0, "relative")
    value.backward()
    assert float(value) == 0 and torch.isfinite(zero.grad).all()
    with pytest.raises(ValueError, match="temperature: expected one of relative, absolute, got 'Relative'"):
        group_dro_loss(loss, groups, 2.0, "Relative")


def test_group_dro_weights_of_absent_groups_are_zero_and_present_ones_average_one():
    loss = torch.tensor([1.0, 3.0, 0.5, 4.0, 2.0])
    groups = torch.tensor([0, 0, 2, 5, 5])
    sums, counts = group_sums(loss, groups, 6)
    for temperature in ("absolute", "relative"):
        w = dro_group_weights(sums, counts, 0.7, temperature)
        assert w[[1, 3, 4]].tolist() == [0, 0, 0]
        assert float(w.sum()) == pytest.approx(3.0) and float(w[5]) > float(w[0]) > float(w[2])


def test_group_dro_gradient_weights_the_worse_groups_more():
    loss = torch.tensor([1.0, 1.0, 5.0], requires_grad=True)
    group_dro_loss(loss, torch.tensor([0, 0, 1]), 1.0).backward()
    assert loss.grad[2] > loss.grad[0] > 0


def test_group_sums_are_additive_across_shards():
    loss, groups = torch.rand(12), torch.randint(0, 4, (12,))
    s1, c1 = group_sums(loss[:6], groups[:6], 4)
    s2, c2 = group_sums(loss[6:], groups[6:], 4)
    whole = group_dro_loss(loss, groups, 2.0)
    assert torch.isclose(dro_from_group_sums(s1 + s2, c1 + c2, 2.0), whole)


def test_bad_group_dro_input():
    for tau in (0.0, -1.0, math.inf, math.nan):  # (inf gave NaN)
        with pytest.raises(ValueError, match=f"tau: must be positive and finite, got {tau}"):
            group_dro_loss(torch.rand(3), torch.zeros(3, dtype=torch.long), tau)
        with pytest.raises(ValueError, match=f"tau: must be positive and finite, got {tau}"):
            Curriculum(warmup_epochs=1, tau=tau)
    with pytest.raises(ValueError, match="matching shapes"):
        group_dro_loss(torch.rand(3), torch.zeros(4, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match="ids must be >= 0"):
        group_sums(torch.rand(3), torch.tensor([0, -1, 1]), 3)
    with pytest.raises(ValueError, match="ids must be < n_groups = 3, got 3"):
        group_sums(torch.rand(3), torch.tensor([0, 3, 1]), 3)
    with pytest.raises(ValueError, match="no group has a sample"):
        dro_from_group_sums(torch.zeros(4), torch.zeros(4), 1.0)
    for dtype in (torch.float32, torch.bool):  # (a float bin value passed instead of its id)
        with pytest.raises(ValueError, match=f"groups: expected integer group ids, got {dtype}"):
            group_dro_loss(torch.rand(3), torch.tensor([0, 1, 1]).to(dtype), 1.0)


@pytest.mark.parametrize("tau", [0.7, 5.0])  # every deviation below 1 (expm1 form), and not (logsumexp)
def test_group_dro_gradient_with_an_empty_group_matches_the_formula(tau):
    """Both forms of the masked computation give the formula's value and gradient, and an
    empty group passes nothing (no NaN) into the gradient."""
    loss = torch.tensor([1.0, 1.4, 0.9, 1.6, 1.2], dtype=torch.float64, requires_grad=True)
    groups = torch.tensor([0, 0, 3, 1, 1])  # group 2 empty
    got = group_dro_loss(loss, groups, tau)
    (grad,) = torch.autograd.grad(got, loss)
    x = loss.detach().clone().requires_grad_(True)
    means = torch.stack([x[:2].mean(), x[3:].mean(), x[2]])
    want = torch.log(torch.exp(tau * means).mean()) / tau
    (grad_want,) = torch.autograd.grad(want, x)
    assert torch.isclose(got, want, rtol=1e-12) and torch.allclose(grad, grad_want, rtol=1e-10)


def test_training_objective_reads_no_value_on_the_host(monkeypatch):
    """With the checks that run on CPU tensors only switched off (as on a GPU), the objective of
    the training loop and its backward pass read no tensor value on the host, in the MSE and
    in the DRO phase (on a GPU each read would make the host wait for the device). Reads inside
    an operator's own implementation are not seen here (`torch.bincount` on a GPU reads the
    largest id): the counts use `index_add` instead."""
    from gno_ext import losses
    from gno_ext.training.objective import global_objective
    from tests._dispatch import RecordOps

    loss = torch.rand(8, requires_grad=True)
    groups = torch.tensor([0, 0, 2, 2, 2, 4, 4, 0])  # groups 1 and 3 empty
    for dro in (False, True):
        with RecordOps() as ops:
            global_objective(loss, groups, 5, dro, 2.0, world_size=1)[1].backward()
        assert ops.host_reads > 0  # the checks on CPU tensors
        monkeypatch.setattr(losses, "_host_checks", lambda t: False)
        with RecordOps() as ops:
            global_objective(loss, groups, 5, dro, 2.0, world_size=1)[1].backward()
        assert ops.host_reads == 0, dro
        monkeypatch.undo()


def test_metrics():
    target = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    pred = target + torch.tensor([[0.5, -0.5, 0.0, 0.0]])
    assert torch.isclose(nmse(pred, target), torch.tensor([0.5 / 5.0]))
    assert torch.isclose(relative_l2(pred, target), torch.tensor([math.sqrt(0.5) / math.sqrt(30.0)]))
    assert torch.isclose(mse_per_sample(pred, target), torch.tensor([0.125]))
    assert torch.equal(nmse(target, target), torch.zeros(1))
    with pytest.raises(ValueError, match="shapes differ"):
        nmse(pred, target[:, :3])


def test_bin_parameters():
    theta = torch.tensor([[0.011, 5.0], [0.5, 1.0], [0.99, 9.0], [2.0, -1.0]])
    groups = bin_parameters(theta, [[0.01, 0.1, 1.0], [0.0, 5.0, 10.0]])
    assert groups.tolist() == [0 * 2 + 1, 1 * 2 + 0, 1 * 2 + 1, 1 * 2 + 0]
    typed = bin_parameters(theta, [[0.01, 0.1, 1.0], [0.0, 5.0, 10.0]], boundary_type=torch.tensor([0, 1, 2, 0]))
    assert typed.tolist() == [1, 4 + 2, 8 + 3, 2]
    with pytest.raises(ValueError, match="increasing edges"):
        bin_parameters(theta[:, :1], [[1.0, 0.5]])
    with pytest.raises(ValueError, match=r"edges\[0\]: expected at least two increasing edges, got \[0.0, nan, 1.0\]"):
        bin_parameters(theta[:, :1], [[0.0, float("nan"), 1.0]])  # (was taken: NaN compares false)
    assert torch.equal(bin_parameters(theta[:, :1], [[-math.inf, 0.1, math.inf]]), torch.tensor([0, 1, 1, 1]))
    theta[2, 1] = float("nan")  # bucketize would put it in the last bin without a word
    with pytest.raises(ValueError, match=r"theta\[2, 1\] = nan: parameters must be finite"):
        bin_parameters(theta, [[0.01, 0.1, 1.0], [0.0, 5.0, 10.0]])
    for bad in (-1, 6):  # an id past the last type would give groups beyond the declared count
        with pytest.raises(ValueError, match=r"boundary_type: ids must lie in \[0, n_boundary_types = 6\)"):
            bin_parameters(theta[:, :1], [[0.01, 0.1, 1.0]], boundary_type=torch.tensor([0, bad, 2, 0]))


def test_curriculum_switches_to_dro_after_warmup():
    cur = Curriculum(warmup_epochs=2, tau=1.0)
    loss, groups = torch.tensor([1.0, 1.0, 5.0]), torch.tensor([0, 0, 1])
    assert [cur.uses_dro(e) for e in range(4)] == [False, False, True, True]
    assert torch.isclose(cur.loss(loss, groups, 0), loss.mean())
    assert torch.isclose(cur.loss(loss, groups, 2), group_dro_loss(loss, groups, 1.0))  # the paper's, by default
    relative = Curriculum(warmup_epochs=2, tau=1.0, temperature="relative")
    assert torch.isclose(relative.loss(loss, groups, 2), group_dro_loss(loss, groups, 1.0, "relative"))
    assert not torch.isclose(relative.loss(loss, groups, 2), cur.loss(loss, groups, 2))
    assert Curriculum(warmup_epochs=np.int64(2)).uses_dro(2)
    for kwargs, match in [(dict(warmup_epochs=1.5), r"warmup_epochs: must be an integer >= 0, got 1.5"),
                          (dict(warmup_epochs=-1), r"warmup_epochs: must be an integer >= 0, got -1"),
                          (dict(warmup_epochs=1, tau=0.0), r"tau"),
                          (dict(warmup_epochs=1, temperature="kelvin"),
                           r"temperature: expected one of relative, absolute, got 'kelvin'")]:
        with pytest.raises(ValueError, match=match):
            Curriculum(**kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("temperature", ["absolute", "relative"])
def test_gpu_training_objective_does_not_synchronise_and_can_be_captured(temperature):
    """On a GPU the training objective, its gradient and the group weights, MSE and DRO phases,
    run with no host synchronisation (`torch.cuda.set_sync_debug_mode("error")` raises on any),
    and the DRO objective captured in a CUDA graph gives, on new data, what eager mode gives."""
    from gno_ext.training.captured import capture_step
    from gno_ext.training.objective import global_objective

    torch.manual_seed(3)
    loss = torch.rand(64, device="cuda", requires_grad=True)
    groups = torch.randint(0, 6, (64,), device="cuda") * 2  # the odd groups empty
    run = lambda dro: global_objective(loss, groups, 12, dro, 2.0, world_size=1, temperature=temperature)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for dro in (False, True):
            torch.autograd.grad(run(dro).backward_loss, loss)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    out = {}

    def step():
        value, weights = run(True)[1:]
        out["value"], out["weights"], out["grad"] = value.detach(), weights, torch.autograd.grad(value, loss)[0]

    replay = capture_step(step, warmup=2)
    with torch.no_grad():
        loss.copy_(torch.rand(64, device="cuda") * 3)
    replay()
    value, weights = run(True)[1:]
    assert torch.allclose(out["value"], value) and torch.allclose(out["grad"], torch.autograd.grad(value, loss)[0])
    assert torch.allclose(out["weights"], weights)


def test_running_group_losses_follow_each_group_and_leave_the_absent_ones():
    running = RunningGroupLosses(4, rate=0.25)
    running.update(torch.tensor([2.0, 0.0, 6.0, 0.0]), torch.tensor([2.0, 0.0, 3.0, 0.0]))  # first batch: set
    assert running.loss.tolist() == [1.0, 0.0, 2.0, 0.0] and running.seen.tolist() == [1, 0, 1, 0]
    running.update(torch.tensor([0.0, 4.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert running.loss.tolist() == [1.0, 4.0, 2.0, 0.0]  # group 1 set, groups 0 and 2 untouched
    running.update(torch.tensor([10.0, 0.0, 0.0, 0.0]), torch.tensor([2.0, 0.0, 0.0, 0.0]))
    assert running.loss[0] == pytest.approx(0.75 * 1.0 + 0.25 * 5.0)  # moved by the rate
    w = running.weights(2.0, "relative")
    assert w[3] == 0 and float(w[:3].mean()) == pytest.approx(1.0)  # mean 1 over the groups seen
    assert int(w.argmax()) == 1 and int(w[:3].argmin()) == 0  # ordered by running loss
    other = RunningGroupLosses(4, rate=0.25)
    other.load_state_dict(running.state_dict())  # a checkpoint's round trip
    assert torch.equal(other.loss, running.loss) and torch.equal(other.seen, running.seen)
    with pytest.raises(ValueError, match="the checkpoint holds 4 groups' loss, this run has 3 groups"):
        RunningGroupLosses(3).load_state_dict(running.state_dict())
    with pytest.raises(ValueError, match=r"trainer.dro.rate: must lie in \(0, 1\], got 0"):
        RunningGroupLosses(3, rate=0)


@pytest.mark.parametrize("scale", [1e-3, 1.0])
def test_running_weights_act_across_batches_of_one_group_each(scale):
    """The curriculum's batches hold one boundary configuration each. Where the groups are the
    configurations, the batch's log-sum-exp weighs its one group 1: the plain mean, whatever the
    losses. The running losses weigh a batch of the worse configuration more, at any loss scale."""
    from gno_ext.training.objective import global_objective

    running = RunningGroupLosses(2, rate=0.5)
    per_group = {0: 1.0 * scale, 1: 3.0 * scale}  # group 1's loss is three times group 0's
    batch_weights, running_weights = {}, {}
    for _ in range(3):
        for g, value in per_group.items():
            losses = torch.full((4,), value, requires_grad=True)
            groups = torch.full((4,), g)
            plain = global_objective(losses, groups, 2, True, 2.0, world_size=1, temperature="relative")
            batch_weights[g] = float(torch.autograd.grad(plain.backward_loss, losses)[0].sum())
            weighed = global_objective(losses, groups, 2, True, 2.0, world_size=1, temperature="relative",
                                       running=running)
            running_weights[g] = float(torch.autograd.grad(weighed.backward_loss, losses)[0].sum())
    assert batch_weights == pytest.approx({0: 1.0, 1: 1.0})  # inert: each batch is its own mean
    # relative tau 2: group 1 at 1.5 times the mean of (1, 3), group 0 at 0.5: weights 2 e^2 / (e^1 + e^3) ...
    want = 2 * torch.softmax(torch.tensor([2.0 * 0.5, 2.0 * 1.5]), 0)
    assert running_weights == pytest.approx({0: float(want[0]), 1: float(want[1])}, rel=1e-5)
    assert running_weights[1] > 1.7 > 0.3 > running_weights[0]
