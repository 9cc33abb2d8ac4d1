r"""The reader of mesh datasets: heat and advection on irregular domains, one HDF5 file per
split, as `gno_ext.data.mesh` writes them (``gno-data`` presets, the ``mesh`` recipes), read
into `gno_ext.mesh.MeshSample` windows by `MeshDataset`.

The HDF5 file (one per split), with ``n`` trajectories of ``T`` frames, ``N`` nodes and ``M``
boundary nodes:

| dataset | shape | meaning |
| --- | --- | --- |
| ``pos`` | (n, N, 2) | node positions |
| ``u`` | (n, T, N, 1) | the field at the frames |
| ``theta`` | (n, P) | $\alpha$ (heat), $(v_x, v_y)$ (advection) |
| ``triangles`` | (n, K, 3) | the triangulation (counter-clockwise) |
| ``edge_index`` | (n, 2, E) | the mesh's edges, both directions |
| ``boundary_index`` | (n, M) | boundary nodes |
| ``boundary_kind`` | (n, M) | `BCType` codes |
| ``boundary_values`` | (n, M, 1) | the data (constant in time) |
| ``boundary_normal`` | (n, M, 2) | outward unit normals (at a corner, the bisector) |
| ``boundary_segment`` | (n, M) | the node's segment (0 or 1; 0 to 3 on the square) |

with the attributes ``dataset_name`` (``heat_<domain>`` or ``advection_<domain>``), ``domain``,
``dt`` (time between frames), ``parameter_names`` (``["alpha"]`` or ``["vx", "vy"]``),
``field_names`` (``["temperature"]`` or ``["concentration"]``) and
``layout`` (``"gno_ext.mesh/1"``).

A file is checked when it is opened: its layout attribute, every dataset above, and (as every
adapter does) that it keeps its values in itself (`gno_ext._files.check_self_contained`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gno_ext.adapters.files import open_h5, opening, reading
from gno_ext.adapters.windows import check_start
from gno_ext.mesh import MeshSample

__all__ = ["FIELDS", "LAYOUT", "MeshDataset"]

LAYOUT = "gno_ext.mesh/1"
FIELDS = ("pos", "u", "theta", "triangles", "edge_index", "boundary_index", "boundary_kind", "boundary_values",
          "boundary_normal", "boundary_segment")


class MeshDataset(torch.utils.data.Dataset):
    """Windows of the trajectories of a mesh dataset file as `MeshSample`s (with their edges).

    Parameters
    ----------
    path : str or Path
        A file in the layout of the module's text.
    n_steps_input, n_steps_output : int
        Frames in and out per window; every start frame of every trajectory gives a window.
    """

    def __init__(self, path: str | Path, n_steps_input: int = 1, n_steps_output: int = 1) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such file")
        with opening(self.path, f"the mesh layout {LAYOUT}"), open_h5(self.path) as f:
            if f.attrs.get("layout") != LAYOUT:
                raise ValueError(f"{self.path}: not a mesh dataset of layout {LAYOUT} (its layout attribute is "
                                 f"{f.attrs.get('layout')!r})")
            missing = [name for name in FIELDS if name not in f]
            if missing:
                raise ValueError(f"{self.path}: missing dataset(s) {missing}")
            self.data = {name: torch.from_numpy(_numeric(f[name][()], name)) for name in FIELDS}
            self.dt = float(f.attrs["dt"])
            self.parameter_names = [str(n) for n in f.attrs.get("parameter_names", [])]
            self.domain = str(f.attrs.get("domain", ""))
            _check_shapes(self.data)
        n, frames = self.data["u"].shape[:2]
        if n_steps_input < 1 or n_steps_output < 1 or n_steps_input + n_steps_output > frames:
            raise ValueError(f"n_steps_input={n_steps_input}, n_steps_output={n_steps_output}: the trajectories "
                             f"of {self.path} have {frames} frames")
        self.t_in, self.t_out = n_steps_input, n_steps_output
        self.starts = frames - n_steps_input - n_steps_output + 1
        self.n_trajectories = n
        self.n_segments = int(self.data["boundary_segment"].max()) + 1 if self.data["boundary_segment"].numel() else 0

    def __len__(self) -> int:
        return self.n_trajectories * self.starts

    def segment_kinds(self) -> Tensor:
        """The boundary type of each segment of each trajectory, ``(n, S)``: every node of a
        segment has its type (a node shared by two segments belongs to the one whose type it
        takes)."""
        segment, kind = self.data["boundary_segment"].long(), self.data["boundary_kind"].long()
        out = torch.full((self.n_trajectories, self.n_segments), -1, dtype=torch.long)
        return out.scatter_(1, segment, kind)

    def window_trajectories(self) -> Tensor:
        """The trajectory of every window, ``(len(self),)``."""
        return torch.arange(self.n_trajectories).repeat_interleave(self.starts)

    # gno_ext.adapters.TrajectoryData
    def parameter_values(self) -> Tensor:
        """The parameters ``(N, P)`` of the trajectories."""
        return self.data["theta"].float()

    def window_boundary_kinds(self) -> np.ndarray:
        """The type of each boundary segment for every window, ``(len(self), S)``."""
        return self.segment_kinds()[self.window_trajectories()].numpy()

    def rollout_indices(self, start: int = 0) -> list[int]:
        check_start(start, self.starts)
        return [t * self.starts + start for t in range(self.n_trajectories)]

    def trajectory_lengths(self) -> list[int]:
        return [int(self.data["u"].shape[1])] * self.n_trajectories

    def __getitem__(self, i: int) -> MeshSample:
        if not 0 <= i < len(self):
            raise IndexError(f"window {i}: the dataset has {len(self)}")
        with reading(self.path, f"the mesh layout {LAYOUT}"):
            return self._window(i)

    def _window(self, i: int) -> MeshSample:
        traj, start = divmod(i, self.starts)
        d = {name: value[traj] for name, value in self.data.items()}
        u = d["u"][start:start + self.t_in + self.t_out].transpose(0, 1)  # (N, T, 1)
        return MeshSample(pos=d["pos"], u_in=u[:, :self.t_in], u_out=u[:, self.t_in:], theta=d["theta"],
                          boundary_index=d["boundary_index"], boundary_kind=d["boundary_kind"],
                          boundary_values=d["boundary_values"], boundary_normal=d["boundary_normal"],
                          boundary_segment=d["boundary_segment"], edge_index=d["edge_index"], dt=self.dt,
                          meta={"file": str(self.path), "trajectory": traj, "start": start,
                                "triangles": d["triangles"]})


def _numeric(values: np.ndarray, name: str) -> np.ndarray:
    """``values`` if they are numbers (the dataset ``name``), else a `ValueError`."""
    if not (np.issubdtype(values.dtype, np.number) or values.dtype == np.bool_) or np.iscomplexobj(values):
        raise ValueError(f"dataset {name!r} holds {values.dtype} values, not real numbers")
    return values


# the dimensions of each dataset, named as in the layout's table (n: trajectories; the field first: the
# others must agree with it)
DIMS = {"u": "n T N C", "pos": "n N d", "theta": "n P", "triangles": "n K 3", "edge_index": "n 2 E",
        "boundary_index": "n M", "boundary_kind": "n M", "boundary_values": "n M T_bc", "boundary_normal": "n M d",
        "boundary_segment": "n M"}


def _check_shapes(data: dict[str, Tensor]) -> None:
    """Every dataset with the dimensions of `DIMS`, a size per name (``d`` = 2), at least one
    trajectory and two frames; a `ValueError` names the first that differs."""
    sizes: dict[str, int] = {"3": 3, "2": 2, "d": 2}
    for name, dims in DIMS.items():
        shape, names = tuple(data[name].shape), dims.split()
        if len(shape) != len(names):
            raise ValueError(f"dataset {name!r}: expected the dimensions ({', '.join(names)}), got shape {shape}")
        for dim, size in zip(names, shape):
            if sizes.setdefault(dim, size) != size:
                raise ValueError(f"dataset {name!r}: shape {shape} has {dim} = {size}, but {sizes[dim]} elsewhere "
                                 f"(dimensions ({', '.join(names)}))")
    if sizes["n"] < 1 or sizes["T"] < 2:
        raise ValueError(f"expected at least one trajectory of two frames, got {sizes['n']} of {sizes['T']}")
