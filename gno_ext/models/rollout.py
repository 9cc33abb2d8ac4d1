"""Autoregressive rollout for any model with the schema forward.

A model of this package predicts the next frame with
``model(u_in, theta=..., theta_field=..., bc=..., grid=...) -> (B, 1, C, *S)``;
`rollout` feeds its predictions back for ``steps`` steps.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor, nn

from gno_ext.checks import is_integer
from gno_ext.schema import BoundarySpec, PDEBatch

__all__ = ["rollout"]


@torch.no_grad()
def rollout(model: nn.Module, batch: PDEBatch, steps: int) -> Tensor:
    """Predict ``steps`` frames from ``batch.u_in``, each from the previous predictions.

    Boundary data for step ``k`` is read at ``bc.values[:, :, k]`` (input time) and
    ``bc.values[:, :, k + 1]`` (target time), clamped to the last available time, so
    time-dependent data for the whole horizon is given with ``T_bc = steps + 1``.

    Returns
    -------
    Tensor, shape (B, steps, C, *S)
    """
    if not isinstance(batch, PDEBatch):
        raise TypeError(f"batch: expected a PDEBatch (u_in, theta, bc, ... of the trajectories' start), got "
                        f"{type(batch).__name__}")
    if not is_integer(steps) or steps < 1:  # (Python's, NumPy's or a 0-d tensor's integers)
        raise ValueError(f"steps: must be an integer >= 1, got {steps!r}")
    steps = operator.index(steps)
    u, frames = batch.u_in, []
    t_bc = batch.bc.values.shape[2]
    for k in range(steps):
        idx = torch.tensor([min(k, t_bc - 1), min(k + 1, t_bc - 1)], device=batch.bc.values.device)
        bc = BoundarySpec(batch.bc.kind, batch.bc.values.index_select(2, idx), batch.bc.coeffs)
        nxt = model(u, theta=batch.theta, theta_field=batch.theta_field, bc=bc, grid=batch.grid)
        frames.append(nxt.to(u.dtype))
        u = torch.cat([u[:, 1:], frames[-1]], 1)
    return torch.cat(frames, 1)
