import math

import pytest
import torch

from gno_ext.losses import (
    Curriculum,
    bin_parameters,
    dro_from_group_sums,
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
    with pytest.raises(ValueError, match="tau: must be positive"):
        group_dro_loss(torch.rand(3), torch.zeros(3, dtype=torch.long), 0.0)
    with pytest.raises(ValueError, match="matching shapes"):
        group_dro_loss(torch.rand(3), torch.zeros(4, dtype=torch.long), 1.0)


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


def test_curriculum_switches_to_dro_after_warmup():
    cur = Curriculum(warmup_epochs=2, tau=1.0, boundary_types=(1, 2, 0))
    loss, groups = torch.tensor([1.0, 1.0, 5.0]), torch.tensor([0, 0, 1])
    assert [cur.uses_dro(e) for e in range(4)] == [False, False, True, True]
    assert torch.isclose(cur.loss(loss, groups, 0), loss.mean())
    assert torch.isclose(cur.loss(loss, groups, 2), group_dro_loss(loss, groups, 1.0))
    assert cur.boundary_order(0) == [1, 2, 0]
