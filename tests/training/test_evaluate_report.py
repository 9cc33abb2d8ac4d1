"""The rollout report: the worst, median and best trajectories, persistence beside the model."""

import numpy as np
import torch

from gno_ext.adapters import ArrayDataset
from gno_ext.training.data import GroupBinner
from gno_ext.training.evaluate import evaluate_rollouts, write_report


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
