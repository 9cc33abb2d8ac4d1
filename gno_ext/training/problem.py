"""What the training loop needs to know about the form of its data.

The loop, the objective, the validation and the evaluation are the same for every recipe; the
batches are not. Grid recipes batch `gno_ext.schema.PDESample` windows into a `PDEBatch`
(fields ``(B, T, C, *S)``, one sample per trajectory window); mesh recipes batch
`gno_ext.mesh.MeshSample` windows into a torch-geometric ``Batch`` (fields ``(N, T, C)`` over
the nodes of all graphs, one graph per window). A `Problem` says, for one form, how to batch
windows, move a batch, count its samples, read their DRO groups, predict the next frame and
reduce errors to one number per sample. `problem_for` picks it from ``data.kind``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gno_ext.layers.embeddings import field_statistics
from gno_ext.losses import mse_per_sample, nmse
from gno_ext.schema import PDEBatch, collate
from gno_ext.training.recipe_data import batch_to

__all__ = ["Batch", "GridProblem", "MeshProblem", "Problem", "problem_for"]

Batch = Any  # a `PDEBatch` (grids) or a torch-geometric ``Batch`` of mesh samples


class GridProblem:
    """Windows on grids, batched into a `PDEBatch`; models take ``model(u_in, theta=, theta_field=,
    bc=, grid=)``."""

    name = "grid"

    @staticmethod
    def collate(samples: Sequence[Any]) -> PDEBatch:
        return collate(samples)

    train_collate = collate  # (the training batches: the same)

    to = staticmethod(batch_to)

    @staticmethod
    def size(batch: PDEBatch) -> int:
        return len(batch.theta)

    @staticmethod
    def groups(binner: Any, batch: PDEBatch) -> Tensor:
        return binner(batch.theta, batch.bc.kind)

    @staticmethod
    def predict(model: nn.Module, batch: PDEBatch) -> Tensor:
        return model(batch.u_in, theta=batch.theta, theta_field=batch.theta_field, bc=batch.bc, grid=batch.grid)

    @staticmethod
    def target(batch: PDEBatch) -> Tensor:
        return batch.u_out[:, :1]

    @staticmethod
    def mse(pred: Tensor, target: Tensor, batch: PDEBatch) -> Tensor:
        return mse_per_sample(pred, target)

    @staticmethod
    def nmse(pred: Tensor, target: Tensor, batch: PDEBatch) -> Tensor:
        return nmse(pred, target)

    @staticmethod
    def fields(batch: PDEBatch) -> Tensor:
        """The batch's frames, ``(B, T_in + T_out, C, *S)``."""
        return torch.cat([batch.u_in, batch.u_out], 1)

    @classmethod
    def finite(cls, batch: PDEBatch) -> Tensor:
        """Whether each sample's fields are all finite, ``(B,)``."""
        return torch.isfinite(cls.fields(batch)).flatten(1).all(1)

    @staticmethod
    def scale(fields: Tensor, channels: int, ndim: int) -> Tensor:
        """Per-channel standard deviation, shaped to divide predictions ``(B, 1, C, *S)``."""
        return field_statistics(fields.float(), channels, ndim)[1].view(1, 1, -1, *([1] * ndim))


class MeshProblem:
    """Windows on meshes, batched by torch-geometric (`gno_ext.mesh.collate_meshes`); models take
    ``model(batch)`` and return ``(N, 1, C)``. Per-sample errors are per graph.

    With ``pad`` (``trainer.capture=true``), the training batches are padded to bucketed sizes
    (`gno_ext.mesh.pad_meshes`): a batch's node count changes from batch to batch, which a CUDA
    graph cannot replay, but its padded sizes take few values, each captured once. Per-graph
    errors and groups leave the padding graph out."""

    name = "mesh"

    def __init__(self, pad: bool = False) -> None:
        self.pad = bool(pad)

    @staticmethod
    def collate(samples: Sequence[Any]) -> Any:
        from gno_ext.mesh import collate_meshes
        return collate_meshes(samples)

    def train_collate(self, samples: Sequence[Any]) -> Any:
        """The training batches: `collate`'s, padded where ``pad`` (in the loader's workers)."""
        from gno_ext.mesh import pad_meshes
        batch = self.collate(samples)
        return pad_meshes(batch) if self.pad else batch

    @staticmethod
    def to(batch: Any, device: torch.device) -> Any:
        return batch if batch.pos.device == device else batch.to(device, non_blocking=True)

    @staticmethod
    def size(batch: Any) -> int:
        """The batch's real graphs (a padded batch's padding graph left out)."""
        return int(getattr(batch, "graphs", None) or batch.num_graphs)

    @classmethod
    def segment_kinds(cls, batch: Any) -> Tensor:
        """Each graph's boundary type per segment, ``(G, S)`` (every node of a segment has the
        segment's type)."""
        graph = batch.batch[batch.boundary_index]
        segment = batch.boundary_segment.long()
        out = torch.full((batch.num_graphs, int(segment.max()) + 1), -1, dtype=torch.long, device=segment.device)
        out[graph, segment] = batch.boundary_kind.long()
        return out[:cls.size(batch)]

    @classmethod
    def groups(cls, binner: Any, batch: Any) -> Tensor:
        return binner(batch.theta[:cls.size(batch)], cls.segment_kinds(batch))

    @staticmethod
    def predict(model: nn.Module, batch: Any) -> Tensor:
        return model(batch)

    @staticmethod
    def target(batch: Any) -> Tensor:
        return batch.u_out[:, :1]

    @classmethod
    def per_graph(cls, values: Tensor, batch: Any) -> Tensor:
        """Sum of node values ``(N,)`` per real graph, ``(G,)``."""
        summed = torch.zeros(batch.num_graphs, dtype=values.dtype, device=values.device).index_add_(0, batch.batch, values)
        return summed[:cls.size(batch)]

    @classmethod
    def mse(cls, pred: Tensor, target: Tensor, batch: Any) -> Tensor:
        if pred.shape != target.shape:
            raise ValueError(f"pred and target shapes differ: {tuple(pred.shape)} vs {tuple(target.shape)}")
        sq = (pred - target).pow(2).flatten(1).mean(1)
        nodes = cls.per_graph(torch.ones_like(sq), batch)
        return cls.per_graph(sq, batch) / nodes

    @classmethod
    def nmse(cls, pred: Tensor, target: Tensor, batch: Any, eps: float = 1e-12) -> Tensor:
        """Per graph: the squared error over its nodes, steps and channels divided by the
        squared deviation of the target from its graph's mean."""
        err, var = cls.nmse_sums(pred, target, batch)
        return err / var.clamp_min(eps)

    @classmethod
    def nmse_sums(cls, pred: Tensor, target: Tensor, batch: Any) -> tuple[Tensor, Tensor]:
        """`nmse`'s numerator and denominator per graph, ``(G,)`` each: the summed squared error
        and the summed squared deviation of the target from its graph's mean (summed over a
        split, the pooled nMSE)."""
        if pred.shape != target.shape:
            raise ValueError(f"pred and target shapes differ: {tuple(pred.shape)} vs {tuple(target.shape)}")
        err = cls.per_graph((pred - target).pow(2).flatten(1).sum(1), batch)
        values = target.flatten(1)
        count = cls.per_graph(torch.full_like(values[:, 0], values.shape[1]), batch)
        mean = cls.per_graph(values.sum(1), batch) / count
        var = cls.per_graph((values - _gather(mean, batch.batch)[:, None]).pow(2).sum(1), batch)
        return err, var

    @staticmethod
    def fields(batch: Any) -> Tensor:
        """The batch's frames at every node, ``(N, T_in + T_out, C)``."""
        return torch.cat([batch.u_in, batch.u_out], 1)

    @classmethod
    def finite(cls, batch: Any) -> Tensor:
        ok = torch.isfinite(cls.fields(batch)).flatten(1).all(1)
        return cls.per_graph((~ok).double(), batch) == 0

    @staticmethod
    def scale(fields: Tensor, channels: int, ndim: int) -> Tensor:
        """Per-channel standard deviation over nodes and frames, shaped ``(1, 1, C)``."""
        return fields.float().reshape(-1, channels).std(0, unbiased=False).clamp_min(1e-6).view(1, 1, -1)


def _gather(per_graph: Tensor, graph: Tensor) -> Tensor:
    """Each node's value of its graph, 0 on a padding graph's nodes (whose graph has no entry)."""
    full = torch.cat([per_graph, per_graph.new_zeros(1)])  # the padding graph, if any, is the last
    return full[graph.clamp_max(per_graph.shape[0])]


Problem = GridProblem | MeshProblem


def problem_for(data_cfg: Mapping[str, Any], capture: bool = False) -> Problem:
    """The problem of a recipe's data: `MeshProblem` for ``data.kind: mesh`` (padding its training
    batches for ``capture``, ``trainer.capture``), else `GridProblem`."""
    if str(data_cfg.get("kind")) == "mesh":
        return MeshProblem(pad=capture)
    return GridProblem()
