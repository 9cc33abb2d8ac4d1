"""The rollout report: the worst, median and best trajectories, persistence beside the model,
the parameter's name, the error by boundary configuration and the training curve."""

import json

import numpy as np
import pytest
import torch

from gno_ext.adapters import ArrayDataset
from gno_ext.benchmark.tables import READING_NAMES
from gno_ext.schema import BCType, BoundarySpec
from gno_ext.training.recipe_data import GroupBinner, parameter_names
from gno_ext.training.evaluate import dro_start, evaluate_rollouts, no_better_than_the_mean, read_metrics, write_report


class Scale(torch.nn.Module):
    """Predicts the input times a per-sample factor from theta: errors that differ by trajectory."""

    def forward(self, u_in, theta=None, theta_field=None, bc=None, grid=None):
        return u_in[:, -1:] * (1 + theta.view(-1, *([1] * (u_in.ndim - 1))))


def test_examples_are_the_worst_median_and_best_and_persistence_is_reported(tmp_path):
    g = torch.Generator().manual_seed(0)
    u = torch.randn(5, 4, 1, 8, 8, generator=g).numpy()
    theta = np.array([[0.0], [0.4], [0.1], [0.9], [0.2]], np.float32)
    ds = ArrayDataset(u, theta=theta, n_steps_output=3)
    binner = GroupBinner(torch.as_tensor(theta), np.zeros((5, 4), np.int64), 2, [False])
    result = evaluate_rollouts(Scale(), ds, [0, 1, 2, 3, 4], 3, binner, keep_examples=3)
    order = np.argsort(result["nmse"])
    assert [e["label"] for e in result["examples"]] == ["worst", "median", "best"]
    assert [e["nmse"] for e in result["examples"]] == [result["nmse"][order[-1]], result["nmse"][order[2]],
                                                       result["nmse"][order[0]]]
    assert float(result["examples"][0]["theta"][0]) == np.float32(0.9)  # the largest factor is the worst
    # persistence is the model at theta = 0 (trajectory 0): the same per-step error there
    np.testing.assert_allclose(result["per_step_persistence"][0], result["per_step"][0], rtol=1e-6)
    summary = write_report(result, binner, tmp_path, parameter="alpha")
    assert {"rollout_worst.png", "rollout_median.png", "rollout_best.png"} <= set(summary["figures"])
    assert len(summary["per_step_nmse_persistence"]) == 3


def test_group_labels_name_the_parameter_and_leave_out_one_that_does_not_vary():
    kinds = np.array([[1, 1, 1, 1], [2, 2, 2, 2]])
    binner = GroupBinner(torch.linspace(0.1, 0.9, 20)[:, None], kinds, 2, [False], names=["alpha"])
    labels = {binner.label(g) for g in range(binner.n_groups)}
    assert labels == {"dirichlet/dirichlet/dirichlet/dirichlet, alpha in [0.1, 0.5]",
                      "dirichlet/dirichlet/dirichlet/dirichlet, alpha in [0.5, 0.9]",
                      "neumann/neumann/neumann/neumann, alpha in [0.1, 0.5]",
                      "neumann/neumann/neumann/neumann, alpha in [0.5, 0.9]"}, labels
    # few distinct values: a bin each, named by its value
    few = GroupBinner(torch.tensor([[0.01], [0.1], [1.0]]), kinds[:1], 8, [True], names=["nu"])
    assert [few.label(g) for g in range(few.n_groups)] == [f"dirichlet/dirichlet/dirichlet/dirichlet, nu = {v}"
                                                          for v in ("0.01", "0.1", "1")]
    # heat-bc: alpha fixed at 0.1, so the groups are the boundary configurations alone
    fixed = GroupBinner(torch.full((6, 1), 0.1), kinds, 8, [False], names=["alpha"])
    assert [fixed.label(g) for g in range(fixed.n_groups)] == ["dirichlet/dirichlet/dirichlet/dirichlet",
                                                              "neumann/neumann/neumann/neumann"]
    assert GroupBinner(torch.zeros(3, 2), kinds, 2, [False, False]).names == ["theta0", "theta1"]
    with pytest.raises(ValueError, match="expected 1 parameter names"):
        GroupBinner(torch.zeros(3, 1), kinds, 2, [False], names=["a", "b"])


def test_held_out_values_outside_the_training_range_get_groups_of_their_own():
    """An OOD test split (advection-ood: speeds in [0.2, 0.45] and [1.6, 2.5], training [0.5, 1.5])
    is not reported under the outermost training bins' names."""
    kinds = np.array([[1, 1, 1, 1]])
    train = GroupBinner(torch.linspace(0.5, 1.5, 81)[:, None], kinds, 8, [False], names=["speed"])
    test = torch.tensor([[0.2], [0.45], [0.5], [1.0], [1.5], [1.6], [2.5]])
    assert train(test, torch.ones(7, 4)).tolist() == [0, 0, 0, 4, 7, 7, 7]  # training groups: outer bins
    ood = train.covering(test)
    assert ood.n_groups == 10 and train.n_groups == 8  # the training binner is left as it was
    groups = ood(test, torch.ones(7, 4)).tolist()
    assert groups == [0, 0, 1, 5, 8, 9, 9]  # the training range's edges stay in their bins
    face = "dirichlet/dirichlet/dirichlet/dirichlet"
    assert ood.label(0) == f"{face}, speed in [0.2, 0.45] (outside the training range)"
    assert ood.label(9) == f"{face}, speed in [1.6, 2.5] (outside the training range)"
    assert [ood.label(g) for g in range(1, 9)] == [train.label(g) for g in range(8)]
    # held-out values inside the range: the same groups and labels
    inside = train.covering(torch.tensor([[0.7], [1.5]]))
    assert inside.n_groups == 8 and [inside.label(g) for g in range(8)] == [train.label(g) for g in range(8)]
    # one side only; log-scaled parameters (Burgers' test viscosities above the training range)
    nu = GroupBinner(torch.logspace(-3.3, -1.3, 50)[:, None], kinds, 4, [True], names=["nu"])
    up = nu.covering(torch.tensor([[0.03], [0.5], [1.0]]))
    assert up.n_groups == 5 and up(torch.tensor([[0.03], [0.5], [1.0]]), torch.ones(3, 4)).tolist() == [3, 4, 4]
    assert up.label(4).endswith("nu in [0.5, 1] (outside the training range)")
    # a group per training value: the same where the held-out values are those values, ranges where not
    few = GroupBinner(torch.tensor([[0.01], [0.1], [1.0]]), kinds, 8, [True], names=["nu"])
    assert few.covering(torch.tensor([[0.1], [1.0]])).label(1) == f"{face}, nu = 0.1"
    new = few.covering(torch.tensor([[0.02], [5.0]]))
    assert new(torch.tensor([[0.01], [0.02], [5.0]]), torch.ones(3, 4)).tolist() == [0, 0, 3]
    assert new.label(0) == f"{face}, nu in [0.01, 0.03162]"
    assert new.label(3) == f"{face}, nu = 5 (outside the training range)"
    # one training value (heat-bc's alpha) and held-out values above it
    held_out = torch.tensor([[0.1], [0.3]])
    fixed = GroupBinner(torch.full((6, 1), 0.1), kinds, 8, [False], names=["alpha"]).covering(held_out)
    assert fixed(held_out, torch.ones(2, 4)).tolist() == [0, 1]
    assert [fixed.label(g) for g in range(2)] == [f"{face}, alpha = 0.1",
                                                  f"{face}, alpha = 0.3 (outside the training range)"]
    with pytest.raises(ValueError, match=r"values: expected 1 parameter\(s\) per row, got shape \(3, 2\)"):
        train.covering(torch.zeros(3, 2))


def test_held_out_values_on_the_training_interval_stay_in_the_training_groups():
    """Burgers' in-distribution column: test viscosities on the training interval [5e-4, 5e-2],
    stored as float32 like the training ones. Log-spaced edges computed as exp(log(v)) rounded
    the lower edge above the smallest training value (by 2e-19), so that value counted as below
    the training range and the evaluation's binning failed with two equal edges."""
    kinds = np.array([[1, 1, 1, 1]])
    train_nu = torch.linspace(5e-4, 5e-2, 101, dtype=torch.float32)[:, None]
    nu = GroupBinner(train_nu, kinds, 8, [True], names=["nu"])
    assert nu.edges[0][0] == float(train_nu.min()) and nu.edges[0][-1] == float(train_nu.max())
    test_nu = torch.linspace(5e-4, 5e-2, 51, dtype=torch.float32)[:, None]
    same = nu.covering(test_nu.double())
    assert same.n_groups == 8 and same.outside == [(None, None)]
    groups = same(test_nu, torch.ones(51, 4))
    assert groups.min() == 0 and groups.max() == 7


def test_parameter_names_come_from_the_data_else_the_recipe():
    class Named(torch.utils.data.Dataset):
        parameter_names = ["tcool"]

        def __len__(self):
            return 1

    assert parameter_names(Named(), 1, "ignored") == ["tcool"]
    assert parameter_names(torch.utils.data.ConcatDataset([Named(), Named()]), 1) == ["tcool"]
    unnamed = ArrayDataset(np.zeros((2, 3, 1, 4, 4), np.float32), theta=np.zeros((2, 2), np.float32))
    assert parameter_names(unnamed, 2, "alpha") == ["alpha", "theta1"]


def test_report_has_the_error_by_boundary_configuration_and_the_training_curve(tmp_path):
    g = torch.Generator().manual_seed(1)
    n = 6
    u = torch.randn(n, 4, 1, 8, 8, generator=g).numpy()
    theta = np.array([0.1, 0.6, 0.2, 0.5, 0.3, 0.4], np.float32)[:, None]  # each configuration in both bins
    kind = torch.tensor([[int(BCType.DIRICHLET)] * 4] * 3 + [[int(BCType.NEUMANN)] * 4] * 3)
    bc = BoundarySpec(kind, torch.zeros(n, 4, 1, 8))
    ds = ArrayDataset(u, theta=theta, bc=bc, n_steps_output=3)
    binner = GroupBinner(torch.as_tensor(theta), kind.numpy(), 2, [False], names=["alpha"])  # 2 bins a configuration
    result = evaluate_rollouts(Scale(), ds, list(range(n)), 3, binner, keep_examples=3)
    assert result["boundary"] == ["dirichlet/dirichlet/dirichlet/dirichlet"] * 3 + ["neumann/neumann/neumann/neumann"] * 3
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "train/loss": 1.0 / s} for s in range(1, 6)] + [{"step": 5, "valid/nmse_one_step": 0.3}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "train/lo')  # a cut-off line
    assert read_metrics(metrics)["train/loss"] == ([1, 2, 3, 4, 5], [1.0, 0.5, 1 / 3, 0.25, 0.2])
    summary = write_report(result, binner, tmp_path / "eval", metrics=metrics)
    by = {b["boundary"]: b for b in summary["boundaries"]}
    assert by["dirichlet/dirichlet/dirichlet/dirichlet"]["nmse_mean"] == pytest.approx(float(result["nmse"][:3].mean()))
    assert by["neumann/neumann/neumann/neumann"]["n"] == 3
    assert {"error_by_boundary.png", "training_curve.png", "error_vs_parameter.png"} <= set(summary["figures"])
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "| neumann/neumann/neumann/neumann | 3 |" in report
    assert "theta" not in report.replace("theta_", "")  # the parameter is called alpha everywhere
    # one configuration: no plot by configuration, and no curve without metrics
    one = GroupBinner(torch.as_tensor(theta), np.zeros((n, 4), np.int64), 1, [False])  # periodic
    plain = evaluate_rollouts(Scale(), ArrayDataset(u, theta=theta, n_steps_output=3), list(range(n)), 3, one,
                              keep_examples=0)
    figures = write_report(plain, one, tmp_path / "plain")["figures"]
    assert "error_by_boundary.png" not in figures and "training_curve.png" not in figures


def test_the_rollout_mse_is_in_the_data_units(tmp_path):
    """The plain MSE of a rollout (the metric the paper reports for The Well's data): the mean of
    the squared error over steps, channels and points, not normalised by the field's variance."""
    g = torch.Generator().manual_seed(1)
    u = (5 * torch.randn(3, 4, 2, 6, 6, generator=g) + 3).numpy()
    theta = np.array([[0.0], [0.5], [0.2]], np.float32)
    ds = ArrayDataset(u, theta=theta, n_steps_output=3)
    binner = GroupBinner(torch.as_tensor(theta), np.zeros((3, 4), np.int64), 2, [False])
    result = evaluate_rollouts(Scale(), ds, [0, 1, 2], 3, binner, keep_examples=0)
    # Scale rolls out u0 * (1 + theta)^k
    want = [np.mean((np.stack([u[i, 0] * (1 + theta[i, 0]) ** k for k in (1, 2, 3)]) - u[i, 1:4]) ** 2)
            for i in range(3)]
    np.testing.assert_allclose(result["mse"], want, rtol=1e-5)
    summary = write_report(result, binner, tmp_path, parameter="alpha")
    assert summary["mse"]["mean"] == pytest.approx(np.mean(want), rel=1e-5)
    # scaling the data by 10 scales the MSE by 100 and leaves the nMSE as it was
    scaled = evaluate_rollouts(Scale(), ArrayDataset(10 * u, theta=theta, n_steps_output=3), [0, 1, 2], 3, binner,
                               keep_examples=0)
    np.testing.assert_allclose(scaled["mse"], 100 * np.asarray(want), rtol=1e-4)
    np.testing.assert_allclose(scaled["nmse"], result["nmse"], rtol=1e-4)


def test_the_nmse_is_kept_in_every_reading_with_each_trajectorys_value(tmp_path):
    """Besides the per-trajectory nMSE the report holds the pooled one (summed errors over summed
    variances), the per-step one (each frame's own variance) and the per-channel one (each
    channel's own variance), computed here by hand on a two-channel field whose channels differ
    in scale, and each trajectory's nMSE with its parameter and boundary configuration."""
    g = torch.Generator().manual_seed(2)
    u = torch.randn(3, 4, 2, 6, 6, generator=g)
    u[:, :, 1] *= 10  # a channel of larger variance: the readings differ
    u = u.numpy()
    theta = np.array([[0.0], [0.5], [0.2]], np.float32)
    ds = ArrayDataset(u, theta=theta, n_steps_output=3)
    binner = GroupBinner(torch.as_tensor(theta), np.zeros((3, 4), np.int64), 2, [False])
    result = evaluate_rollouts(Scale(), ds, [0, 1, 2], 3, binner, keep_examples=0)
    pred = np.stack([np.stack([u[i, 0] * (1 + theta[i, 0]) ** k for k in (1, 2, 3)]) for i in range(3)])
    truth = u[:, 1:4]
    err, var = (pred - truth) ** 2, (truth - truth.mean(axis=(1, 2, 3, 4), keepdims=True)) ** 2
    per_trajectory = err.sum(axis=(1, 2, 3, 4)) / var.sum(axis=(1, 2, 3, 4))
    step_var = (truth - truth.mean(axis=(2, 3, 4), keepdims=True)) ** 2
    per_step = (err.sum(axis=(2, 3, 4)) / step_var.sum(axis=(2, 3, 4))).mean()
    channel_var = (truth - truth.mean(axis=(1, 3, 4), keepdims=True)) ** 2
    per_channel = (err.sum(axis=(1, 3, 4)) / channel_var.sum(axis=(1, 3, 4))).mean()
    summary = write_report(result, binner, tmp_path, parameter="alpha", figures=False)
    read = summary["readings"]
    assert read["per_trajectory"] == pytest.approx(per_trajectory.mean(), rel=1e-5)
    assert read["pooled"] == pytest.approx(err.sum() / var.sum(), rel=1e-5)
    assert read["per_step"] == pytest.approx(per_step, rel=1e-5)
    assert read["per_channel"] == pytest.approx(per_channel, rel=1e-5)
    assert len({round(v, 4) for v in read.values()}) == 4  # four different numbers here
    assert set(read) == set(READING_NAMES)  # what a result file must keep to count as having them
    rows = summary["per_trajectory"]
    assert rows["nmse"] == pytest.approx(per_trajectory, rel=1e-4) and rows["theta"] == [[0.0], [0.5], [0.2]]
    assert len(rows["boundary"]) == 3
    assert "pooled over the split" in (tmp_path / "report.md").read_text()


def test_the_report_says_where_the_model_is_no_better_than_the_mean_and_where_dro_starts(tmp_path):
    """A rollout whose step error reaches 1 (the error of predicting each frame's own mean) is
    called no better than the mean from that step; the training curve knows where DRO starts."""
    assert no_better_than_the_mean([0.2, 0.9, 1.0, 3.0]) == 3
    assert no_better_than_the_mean([0.2, 0.9]) is None
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "train/loss": 1.0 / s, "train/dro": float(s >= 4)} for s in range(1, 7)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert dro_start(read_metrics(metrics)) == 4.0
    assert dro_start({"train/dro": ([1, 2], [0.0, 0.0])}) is None and dro_start({}) is None
    g = torch.Generator().manual_seed(0)
    u = torch.randn(5, 4, 1, 8, 8, generator=g).numpy()  # noise: each frame unrelated to the last
    theta = np.array([[0.0], [0.4], [0.1], [0.9], [0.2]], np.float32)
    binner = GroupBinner(torch.as_tensor(theta), np.zeros((5, 4), np.int64), 2, [False])
    result = evaluate_rollouts(Scale(), ArrayDataset(u, theta=theta, n_steps_output=3), list(range(5)), 3, binner,
                               keep_examples=0)
    summary = write_report(result, binner, tmp_path / "eval", metrics=metrics)
    first = no_better_than_the_mean(summary["per_step_nmse"])
    assert first == 1  # copying a frame of noise forward is worse than its mean
    assert f"**From step {first} on, the model is no better than predicting each frame's own mean**" in \
        (tmp_path / "eval" / "report.md").read_text()
    good = {**result, "per_step": result["per_step"] * 0.01}
    write_report(good, binner, tmp_path / "good", figures=False)
    assert "no better than predicting" not in (tmp_path / "good" / "report.md").read_text()
