"""Input checks and time loops shared by the solvers."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from gno_ext.schema import BCType, BoundarySpec, Grid


def check_field(name: str, u: Tensor, grid: Grid, channels: int | None = None) -> None:
    """Check that ``u`` is a finite ``(B, C, *grid.shape)`` floating tensor."""
    want = f"(B, {'C' if channels is None else channels}, {', '.join(map(str, grid.shape))})"
    if not isinstance(u, Tensor) or not u.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor of shape {want}, got {type(u).__name__}"
                        + (f" of dtype {u.dtype}" if isinstance(u, Tensor) else ""))
    if u.ndim != 2 + grid.ndim or tuple(u.shape[2:]) != grid.shape or (
            channels is not None and u.shape[1] != channels):
        raise ValueError(f"{name}: expected shape {want}, got {tuple(u.shape)}")
    finite = torch.isfinite(u).flatten(1).all(1)
    if not finite.all():
        bad = torch.nonzero(~finite).flatten().tolist()
        raise ValueError(f"{name}: contains NaN or Inf in sample(s) {bad[:10]}")


def batch_parameter(name: str, value: float | Tensor, batch: int, like: Tensor,
                    positive: bool = True) -> Tensor:
    """Broadcast a scalar or per-sample parameter to shape ``(B,)`` and check its values."""
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device).reshape(-1)
    if t.numel() == 1:
        t = t.expand(batch)
    if t.numel() != batch:
        raise ValueError(f"{name}: expected a scalar or {batch} values (one per sample), got {t.numel()}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: contains NaN or Inf: {t.tolist()[:10]}")
    if positive and (t <= 0).any():
        raise ValueError(f"{name}: must be positive, got {t[t <= 0].tolist()[:10]}")
    return t.contiguous()


def check_times(times: Iterable[float] | Tensor) -> Tensor:
    """Output times as a float64 CPU tensor: non-negative, strictly increasing."""
    t = torch.as_tensor(times, dtype=torch.float64).reshape(-1).cpu()
    if t.numel() == 0:
        raise ValueError("times: expected at least one output time")
    if not torch.isfinite(t).all() or (t < 0).any():
        raise ValueError(f"times: must be finite and >= 0, got {t.tolist()[:10]}")
    if (t[1:] <= t[:-1]).any():
        raise ValueError(f"times: must be strictly increasing, got {t.tolist()[:10]}")
    return t


def check_boundary(bc: BoundarySpec, grid: Grid, batch: int, supported: Iterable[BCType],
                   solver: str) -> None:
    """Check that ``bc`` is a batched spec for ``grid`` with only ``supported`` types."""
    if not isinstance(bc, BoundarySpec):
        raise TypeError(f"bc: expected a BoundarySpec, got {type(bc).__name__}")
    if not bc.batched or len(bc) != batch:
        raise ValueError(f"bc: expected a batched BoundarySpec with {batch} rows, got kind shape "
                         f"{tuple(bc.kind.shape)}")
    bc.check_grid(grid)
    allowed = {int(k) for k in supported}
    kinds = bc.kind.unique().tolist()
    bad = [k for k in kinds if k not in allowed]
    if bad:
        names = ", ".join(BCType(k).name for k in bad)
        ok = ", ".join(BCType(k).name for k in sorted(allowed))
        raise ValueError(f"bc.kind: the {solver} solver does not support {names} (supported: {ok})")


def boundary_data(bc: BoundarySpec, grid: Grid, boundary_fn: Callable[[float], Tensor] | None,
                  t: float, like: Tensor) -> Tensor:
    """Boundary data ``(B, F, N_face)`` at time ``t``: ``boundary_fn(t)`` (checked) or the constant
    ``bc.values[:, :, 0]``."""
    if boundary_fn is None:
        return bc.values[:, :, 0, :]
    batch = len(bc)
    v = torch.as_tensor(boundary_fn(t), dtype=like.dtype, device=like.device)
    if v.ndim != 3 or v.shape[:2] != (batch, grid.n_faces) or v.shape[2] not in (1, grid.n_face_max):
        raise ValueError(f"boundary_fn({t:g}): expected shape ({batch}, {grid.n_faces}, N_face) with "
                         f"N_face in (1, {grid.n_face_max}), got {tuple(v.shape)}")
    if not torch.isfinite(v).all():
        raise ValueError(f"boundary_fn({t:g}): returned NaN or Inf")
    return v


MAX_STEPS = 1_000_000
"""The most time steps a solver plans for one solve (the paper's presets need at most about
10^4); a plan beyond it is an error that names the step count and its cause. Each solver takes
``max_steps=`` to allow more."""


def march(state: Tensor, times: Tensor, max_dt: Callable[[Tensor], Tensor],
          step: Callable[[Tensor, Tensor, float], Tensor], dt: float | None = None,
          record: Callable[[Tensor], Tensor] = lambda s: s, stats: dict | None = None,
          max_steps: int = MAX_STEPS, cause: Callable[[int, Tensor], str] | None = None) -> list[Tensor]:
    """Advance a batched state to each output time with per-sample substeps.

    Every sample ``b`` goes from one output time to the next in ``n_b`` equal substeps,
    ``n_b = ceil(interval / max_dt_b)``; samples that are done are frozen while the others
    finish. A sample's trajectory therefore does not depend on what else is in the batch.

    Parameters
    ----------
    state : Tensor, shape (B, ...)
        State at time 0.
    times : Tensor, shape (T,)
        Output times (from `check_times`).
    max_dt : callable
        ``max_dt(state) -> Tensor (B,)``: the largest stable step of each sample.
    step : callable
        ``step(state, dt, t) -> state``: one step of size ``dt`` (Tensor ``(B,)``) from time ``t``.
    dt : float, optional
        A fixed step; it is checked against ``max_dt`` and the interval is split evenly.
    record : callable
        Maps the state to the recorded output frame.
    stats : dict, optional
        ``stats["steps"]`` is increased by the number of steps taken (largest over the batch).
    max_steps : int
        Refuse (`ValueError`) a plan of more steps than this to reach the last output time.
    cause : callable, optional
        ``cause(b, state) -> str``: what sets sample ``b``'s step (its parameter), for that error.
    """
    out: list[Tensor] = []
    t_now = 0.0
    batch = state.shape[0]
    for t_next in times.tolist():
        interval = t_next - t_now
        if interval > 0:
            limit = max_dt(state)
            if dt is not None:
                if (dt > limit * (1 + 1e-9)).any():
                    worst = float(limit.min())
                    raise ValueError(f"dt={dt:g} violates the stability limit: the largest stable step "
                                     f"is {worst:.4g} for this input (lower dt, or pass dt=None)")
                limit = torch.full_like(limit, dt)
            n_sub = torch.ceil(interval / limit.double() - 1e-9).clamp(min=1).long()
            planned = torch.ceil((float(times[-1]) - t_now) / limit.double() - 1e-9)  # to the end, at this step
            if float(planned.max()) > max_steps:
                b = int(planned.argmax())
                raise ValueError(f"the time-step plan needs {float(planned[b]):,.0f} steps to reach t={float(times[-1]):g}, "
                                 f"more than max_steps={max_steps:,}: the step of sample {b} is {float(limit[b]):.3g}"
                                 + (f", set by its {cause(b, state)}" if cause else "") + ". Check that value (or "
                                 "pass max_steps= to allow the plan)")
            real = state.real.dtype if state.is_complex() else state.dtype
            h = (interval / n_sub.double()).to(device=state.device, dtype=real)
            n_max = int(n_sub.max())
            if stats is not None:
                stats["steps"] = stats.get("steps", 0) + n_max
            n_sub = n_sub.to(state.device)
            for k in range(n_max):
                active = k < n_sub
                new = step(state, h, t_now + k * h)
                state = new if bool(active.all()) else torch.where(
                    active.view(batch, *([1] * (state.ndim - 1))), new, state)
            if not torch.isfinite(state).all():
                raise FloatingPointError(f"solution became non-finite before t={t_next:g}")
        out.append(record(state))
        t_now = t_next
    return out

