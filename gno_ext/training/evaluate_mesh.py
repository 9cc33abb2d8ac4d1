"""Rollouts on meshes: `evaluate_rollouts`'s metrics for mesh datasets (``data.kind: mesh``).

Errors are per graph (one trajectory), as on grids per sample: nMSE over the rollout's nodes,
steps and channels with the sums its other readings need (pooled, per channel), relative L2,
the per-step nMSE beside persistence's, and the groups of the training run (the segments'
boundary types x parameter bins). The examples keep each trajectory's node positions and
triangles, so the report draws them on the mesh.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset

from gno_ext.schema import BCType
from gno_ext.training.problem import MeshProblem

__all__ = ["evaluate_mesh_rollouts", "mesh_reading_sums", "mesh_rollout"]


@torch.no_grad()
def mesh_rollout(model: nn.Module, batch: Any, steps: int) -> Tensor:
    """Predict ``steps`` frames of every node of a torch-geometric batch, each from the previous
    predictions (the boundary data are constant in time); ``(N, steps, C)``."""
    data = copy.copy(batch)  # its own attribute store: the batch keeps its u_in
    u, frames = batch.u_in, []
    for _ in range(steps):
        data.u_in = u
        frames.append(model(data).to(u.dtype))
        u = torch.cat([u[:, 1:], frames[-1]], 1)
    return torch.cat(frames, 1)


def mesh_reading_sums(problem: MeshProblem, pred: Tensor, truth: Tensor, batch: Any) -> dict[str, Tensor]:
    """`gno_ext.training.evaluate.reading_sums` per graph of a mesh rollout ``(N, T, C)``: the
    summed squared error and the summed squared deviation from the graph's mean (for the pooled
    nMSE), and the nMSE of each channel on its own variance, averaged over the channels."""
    error, variance = problem.nmse_sums(pred, truth, batch)
    per_channel = torch.stack([problem.nmse(pred[..., c:c + 1], truth[..., c:c + 1], batch)
                               for c in range(truth.shape[-1])]).mean(0)
    return {"error_sum": error, "variance_sum": variance, "nmse_per_channel": per_channel}


@torch.no_grad()
def evaluate_mesh_rollouts(model: nn.Module, dataset: Dataset, indices: list[int], steps: int, binner: Any,
                           device: torch.device | str = "cpu", batch_size: int = 16,
                           autocast_dtype: torch.dtype | None = None, keep_examples: int = 3) -> dict[str, Any]:
    """The result of `gno_ext.training.evaluate.evaluate_rollouts` for windows of mesh samples
    (``indices``: one window per trajectory, from its first frame, with ``steps`` target frames)."""
    model.eval()
    device = torch.device(device)
    problem = MeshProblem()

    def roll(chosen: list[int]):
        loader = DataLoader(Subset(dataset, chosen), batch_size=batch_size, shuffle=False, collate_fn=problem.collate)
        for batch in loader:
            batch = problem.to(batch, device)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                pred = mesh_rollout(model, batch, steps).float()
            yield batch, pred, batch.u_out[:, :steps].float()

    out: dict[str, list] = {k: [] for k in ("nmse", "rel_l2", "mse", "per_step", "per_step_persistence", "theta",
                                            "group", "error_sum", "variance_sum", "nmse_per_channel")}
    for batch, pred, truth in roll(indices):
        still = batch.u_in[:, -1:].float().expand_as(truth)
        sums = mesh_reading_sums(problem, pred, truth, batch)
        for key, value in sums.items():
            out[key].append(value.cpu())
        # the nMSE and the relative L2 from the same sums (`MeshProblem.nmse`'s formula and floor)
        out["nmse"].append((sums["error_sum"] / sums["variance_sum"].clamp_min(1e-12)).cpu())
        size = problem.per_graph(truth.pow(2).flatten(1).sum(1), batch)
        out["rel_l2"].append((sums["error_sum"] / size.clamp_min(1e-12)).sqrt().cpu())
        out["mse"].append(problem.mse(pred, truth, batch).cpu())
        out["per_step"].append(torch.stack([problem.nmse(pred[:, k:k + 1], truth[:, k:k + 1], batch)
                                            for k in range(steps)], 1).cpu())
        out["per_step_persistence"].append(torch.stack([problem.nmse(still[:, k:k + 1], truth[:, k:k + 1], batch)
                                                        for k in range(steps)], 1).cpu())
        out["theta"].append(batch.theta.cpu())
        out["group"].append(binner(batch.theta.cpu(), problem.segment_kinds(batch).cpu()))
    result: dict[str, Any] = {k: torch.cat(v).numpy() for k, v in out.items()}
    result["boundary"] = [binner.boundary_label(binner.configuration(g)) for g in result["group"]]
    order = np.argsort(result["nmse"], kind="stable")
    picks = [("worst", int(order[-1])), ("median", int(order[len(order) // 2])), ("best", int(order[0]))]
    examples = []
    for label, i in picks[:max(0, min(keep_examples, 3))]:
        sample = dataset[indices[i]]
        (batch, pred, truth), = roll([indices[i]])
        kinds = [BCType(int(k)).name.lower() for k in problem.segment_kinds(batch)[0].tolist()]
        examples.append({"pred": pred.permute(1, 2, 0).cpu().numpy(), "truth": truth.permute(1, 2, 0).cpu().numpy(),
                         "pos": sample.pos.numpy(), "triangles": np.asarray(sample.meta["triangles"]),
                         "label": label, "theta": sample.theta.numpy(), "boundary": kinds,
                         "nmse": float(result["nmse"][i])})
    result["examples"], result["steps"] = examples, steps
    return result
