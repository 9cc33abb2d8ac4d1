"""Sliding windows over trajectories: (input frames, output frames) pairs at every valid start."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import ConcatDataset

__all__ = ["Windows", "window_boundary_values", "BatchedConcat", "split_trajectories", "check_window_settings",
           "TrajectoryData", "WindowedTrajectories", "check_start"]


@runtime_checkable
class TrajectoryData(Protocol):
    """What training and evaluation read of a data source besides its samples, from metadata
    (no field is loaded). Every adapter implements it; a dataset of your own that does too gets
    DRO groups per parameter value and boundary configuration, and rollouts from any start frame
    (without it: one configuration, the parameters of its first sample, one rollout per window).
    """

    def parameter_values(self) -> torch.Tensor:
        """The parameter vectors ``(N, P)``: one row per trajectory (per file where a file holds
        one parameter value: The Well, PDEBench)."""

    def window_boundary_kinds(self) -> np.ndarray:
        """The boundary type of every face (or segment) for every window, ``(len(self), F)``."""

    def rollout_indices(self, start: int = 0) -> list[int]:
        """The window of each trajectory that starts at frame ``start``, in order."""

    def trajectory_lengths(self) -> list[int]:
        """The frames of every trajectory."""


def check_start(start: int, windows: int) -> None:
    """Raise a `ValueError` unless frame ``start`` begins one of the ``windows`` windows of the
    shortest trajectory (the message says what is possible)."""
    if not 0 <= start < windows:
        raise ValueError(f"eval.start_frame={start}: the shortest trajectory holds {windows} rollout window(s) "
                         f"of this length (starts 0 to {windows - 1}); choose an earlier start or fewer eval.steps")


class WindowedTrajectories:
    """`TrajectoryData` for a dataset whose windows are ``self.windows`` (`Windows`, one entry
    per trajectory): a subclass gives ``parameter_values`` and ``trajectory_boundary_kinds``."""

    windows: Windows

    def trajectory_boundary_kinds(self) -> np.ndarray:
        """The boundary type of every face for every trajectory, ``(N, F)``."""
        raise NotImplementedError

    def window_boundary_kinds(self) -> np.ndarray:
        return np.repeat(np.asarray(self.trajectory_boundary_kinds()), self.windows._per, axis=0)

    def rollout_indices(self, start: int = 0) -> list[int]:
        per = self.windows._per
        check_start(start, int(per[per > 0].min()) if (per > 0).any() else 0)
        return [int(o) + start for o, n in zip(self.windows._offsets[:-1], per) if n > 0]

    def trajectory_lengths(self) -> list[int]:
        return [int(n) for n in self.windows.lengths]


def window_boundary_values(values: torch.Tensor, frames: np.ndarray, n_steps_input: int) -> torch.Tensor:
    """Time-dependent boundary data of windows: the last input frame, then every output frame.

    Parameters
    ----------
    values : Tensor, shape (B, F, T, N_face)
        Boundary data at every frame of each window's trajectory.
    frames : array, shape (B, n_in + n_out)
        Frame indices of each window (from `Windows.frames`).
    n_steps_input : int

    Returns
    -------
    Tensor, shape (B, F, 1 + n_out, N_face)
    """
    times = torch.as_tensor(np.concatenate([frames[:, n_steps_input - 1 : n_steps_input],
                                            frames[:, n_steps_input:]], 1))
    index = times[:, None, :, None].expand(-1, values.shape[1], -1, values.shape[3])
    return torch.gather(values, 2, index)


def split_trajectories(n: int, split: str | None, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> list[int]:
    """A deterministic train/valid/test split of ``n`` trajectories in consecutive blocks of the
    given ``fractions`` (for sources that carry no split); ``split=None`` keeps all."""
    if split is None:
        return list(range(n))
    names = ("train", "valid", "test")
    if split not in names:
        raise ValueError(f"split: expected one of {names} or None, got {split!r}")
    bounds = np.round(np.cumsum([0.0, *fractions]) / sum(fractions) * n).astype(int)
    i = names.index(split)
    return list(range(bounds[i], bounds[i + 1]))


@dataclass(frozen=True)
class Windows:
    """Deterministic enumeration of windows over trajectories of given lengths.

    A window starting at frame ``s`` takes input frames ``s, s + k, ..., s + (n_in - 1) k``
    and output frames ``s + n_in k, ..., s + (n_in + n_out - 1) k`` with ``k = stride``.
    Windows are ordered by trajectory, then start frame.

    Parameters
    ----------
    lengths : sequence of int
        Number of frames of each trajectory.
    n_steps_input, n_steps_output, stride : int
    """

    lengths: Sequence[int]
    n_steps_input: int = 1
    n_steps_output: int = 1
    stride: int = 1

    def __post_init__(self) -> None:
        check_window_settings(self.n_steps_input, self.n_steps_output, self.stride)
        span = (self.n_steps_input + self.n_steps_output - 1) * self.stride + 1
        per = np.maximum(np.asarray(self.lengths, dtype=np.int64) - span + 1, 0)
        if per.sum() == 0:
            raise ValueError(f"no window of {self.n_steps_input} + {self.n_steps_output} frames (stride "
                             f"{self.stride}) fits trajectories of lengths {sorted(set(self.lengths))}")
        object.__setattr__(self, "_per", per)
        object.__setattr__(self, "_offsets", np.concatenate([[0], np.cumsum(per)]))

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """``(trajectory, start frame)`` of window ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range [0, {len(self)})")
        traj = int(np.searchsorted(self._offsets, index, side="right") - 1)
        return traj, int(index - self._offsets[traj])

    def locate_many(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised `locate`: trajectories and start frames of many windows."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"window indices out of range [0, {len(self)})")
        traj = np.searchsorted(self._offsets, indices, side="right") - 1
        return traj, indices - self._offsets[traj]

    def frames(self, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Input and output frame indices of the window starting at ``start``."""
        k = self.stride
        inputs = start + k * np.arange(self.n_steps_input)
        outputs = start + k * np.arange(self.n_steps_input, self.n_steps_input + self.n_steps_output)
        return inputs, outputs


class BatchedConcat(ConcatDataset):
    """``ConcatDataset`` whose batches are read part by part through each part's batched reader.

    ``__getitems__`` splits a batch's indices by part, lets every part build its `PDEBatch`
    (its own ``__getitems__``, or per-sample reads and `collate`), and joins them in the order
    asked for. Parts must agree on the grid and on the shapes of their boundary data, as they
    must for `collate`.
    """

    def __getitems__(self, indices: list[int]):
        from gno_ext.schema import BoundarySpec, PDEBatch, collate

        parts: dict[int, list[tuple[int, int]]] = {}
        for pos, index in enumerate(indices):
            if index < 0:
                index += len(self)
            d = bisect.bisect_right(self.cumulative_sizes, index)
            local = index - (self.cumulative_sizes[d - 1] if d else 0)
            parts.setdefault(d, []).append((pos, local))
        batches, order = [], []
        for d, items in parts.items():
            ds = self.datasets[d]
            local = [i for _, i in items]
            got = ds.__getitems__(local) if hasattr(ds, "__getitems__") else [ds[i] for i in local]
            batches.append(collate(got))
            order += [pos for pos, _ in items]
        if len(batches) == 1:
            return batches[0]
        first = batches[0]
        uniform = all(b.grid == first.grid and b.bc.values.shape[1:] == first.bc.values.shape[1:]
                      and (b.bc.coeffs is None) == (first.bc.coeffs is None)
                      and (b.theta_field is None) == (first.theta_field is None) for b in batches)
        if not uniform:  # let collate reconcile (broadcasting, or its error naming the mismatch)
            return collate([self[i] for i in indices])
        inverse = torch.as_tensor(np.argsort(order))
        join = lambda ts: torch.cat(ts).index_select(0, inverse)
        cat = lambda name: join([getattr(b, name) for b in batches])
        bc = BoundarySpec(join([b.bc.kind for b in batches]), join([b.bc.values for b in batches]),
                          None if first.bc.coeffs is None else join([b.bc.coeffs for b in batches]))
        meta = [m for b in batches for m in b.meta]
        return PDEBatch(u_in=cat("u_in"), u_out=cat("u_out"), theta=cat("theta"), bc=bc, grid=first.grid,
                        dt=cat("dt"), theta_field=None if first.theta_field is None else cat("theta_field"),
                        group=cat("group"), meta=[meta[i] for i in inverse.tolist()])


def check_window_settings(n_steps_input: Any, n_steps_output: Any, stride: Any) -> None:
    """Refuse window settings that are not integers >= 1, naming the setting and its value."""
    for key, value in (("n_steps_input", n_steps_input), ("n_steps_output", n_steps_output), ("stride", stride)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{key}: expected an integer >= 1, got {value!r}")
