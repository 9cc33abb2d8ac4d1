r"""The one data schema of gno_ext.

Every adapter yields `PDESample` objects and every model consumes
`PDEBatch` objects (``collate`` turns a list of the first into the second).

Conventions
-----------
* Fields are stored as ``(T, C, *S)`` per sample and ``(B, T, C, *S)`` per batch, where
  ``S`` are the spatial axes in the order x, y[, z] (the layout of The Well).
* The domain is the box $[0, L_x] \times [0, L_y] (\times [0, L_z])$ sampled at
  cell centres $x_i = (i + 1/2) h$, $h = L / N$ (see `Grid`).
* A box in ``d`` dimensions has ``F = 2 d`` faces, ordered ``x-, x+, y-, y+, z-, z+``.
  `BoundarySpec` holds one boundary condition per face.
* Neumann data is the *outward* normal derivative $\partial u / \partial n$;
  Robin data ``g`` means $a u + b\, \partial u / \partial n = g$ with ``coeffs = (a, b)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import IntEnum
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "BCType",
    "FACE_NAMES",
    "Grid",
    "BoundarySpec",
    "robin_coefficients",
    "PDESample",
    "PDEBatch",
    "collate",
    "face_view",
    "model_inputs",
    "check_model_inputs",
]

FACE_NAMES: tuple[str, ...] = ("x-", "x+", "y-", "y+", "z-", "z+")


class BCType(IntEnum):
    """Boundary condition type of one face.

    ``PERIODIC``, ``DIRICHLET``, ``NEUMANN`` and ``ROBIN`` are the conditions our solvers
    impose; ``OPEN`` and ``WALL`` carry The Well's boundary codes through unchanged.
    """

    PERIODIC = 0
    DIRICHLET = 1
    NEUMANN = 2
    ROBIN = 3
    OPEN = 4
    WALL = 5

    @classmethod
    def parse(cls, value: BCType | str | int) -> BCType:
        """Return the member named or numbered by ``value`` (case-insensitive names).

        Raises
        ------
        ValueError
            If ``value`` names no member; the message lists the valid names.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and value in cls._value2member_map_:
            return cls(value)
        names = ", ".join(m.name.lower() for m in cls)
        raise ValueError(f"unknown boundary type {value!r}; expected one of: {names}")


def _shape_error(name: str, expected: str, got: Sequence[int]) -> ValueError:
    return ValueError(f"{name}: expected shape {expected}, got {tuple(got)}")


@dataclass(frozen=True)
class Grid:
    r"""A uniform cell-centred grid on the box $\prod_a [0, L_a]$.

    Parameters
    ----------
    shape : tuple of int
        Number of cells per axis ``(N_x, N_y[, N_z])``.
    extent : tuple of float, optional
        Side lengths ``(L_x, L_y[, L_z])``; defaults to the unit box.
    """

    shape: tuple[int, ...]
    extent: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        shape = tuple(int(n) for n in self.shape)
        extent = tuple(float(x) for x in self.extent) or (1.0,) * len(shape)
        if not 1 <= len(shape) <= 3:
            raise ValueError(f"Grid.shape: expected 1 to 3 axes, got {shape}")
        if any(n < 2 for n in shape):
            raise ValueError(f"Grid.shape: every axis needs at least 2 cells, got {shape}")
        if len(extent) != len(shape):
            raise ValueError(f"Grid.extent: expected {len(shape)} lengths, got {extent}")
        if any(not (math.isfinite(x) and x > 0) for x in extent):
            raise ValueError(f"Grid.extent: lengths must be positive and finite, got {extent}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "extent", extent)

    @property
    def ndim(self) -> int:
        """Number of spatial axes ``d``."""
        return len(self.shape)

    @property
    def n_faces(self) -> int:
        """Number of box faces ``2 d``."""
        return 2 * self.ndim

    @property
    def spacing(self) -> tuple[float, ...]:
        """Cell sizes ``h_a = L_a / N_a``."""
        return tuple(length / n for length, n in zip(self.extent, self.shape))

    def face_shape(self, face: int) -> tuple[int, ...]:
        """Grid shape of face ``face``: the cell counts of the other axes."""
        axis = face // 2
        return tuple(n for a, n in enumerate(self.shape) if a != axis)

    @property
    def n_face_max(self) -> int:
        """Largest number of points on any face (the ``N_face`` of full boundary data)."""
        return max(math.prod(self.face_shape(f)) for f in range(self.n_faces))

    def axis_coordinates(self, axis: int, dtype: torch.dtype = torch.float64,
                         device: torch.device | str | None = None) -> Tensor:
        """Cell-centre coordinates ``(i + 1/2) h`` along one axis, shape ``(N_axis,)``."""
        n, h = self.shape[axis], self.spacing[axis]
        return (torch.arange(n, dtype=dtype, device=device) + 0.5) * h

    def coordinates(self, dtype: torch.dtype = torch.float64,
                    device: torch.device | str | None = None) -> Tensor:
        """Cell-centre coordinates of every cell, shape ``(d, *S)``."""
        axes = [self.axis_coordinates(a, dtype, device) for a in range(self.ndim)]
        return torch.stack(torch.meshgrid(*axes, indexing="ij"))

    def face_coordinates(self, face: int, dtype: torch.dtype = torch.float64,
                         device: torch.device | str | None = None) -> Tensor:
        """Coordinates of the points of ``face`` (on the face itself), shape ``(d, N_face)``.

        The points are the cell centres of the adjacent layer projected onto the face,
        flattened in C order, which is the order of `BoundarySpec.values`.
        """
        axis = face // 2
        coords = self.coordinates(dtype, device)
        index = [slice(None)] * (self.ndim + 1)
        index[axis + 1] = 0
        pts = coords[tuple(index)].clone()
        pts[axis] = 0.0 if face % 2 == 0 else self.extent[axis]
        return pts.reshape(self.ndim, -1)


@dataclass
class BoundarySpec:
    r"""Boundary conditions of a box, one per face (``x-, x+, y-, y+[, z-, z+]``).

    The same class serves a single sample (no leading batch axis) and a batch.

    Parameters
    ----------
    kind : Tensor, shape (F,) or (B, F), long
        `BCType` value of each face.
    values : Tensor, shape (F, T_bc, N_face) or (B, F, T_bc, N_face)
        Boundary data along each face at ``T_bc`` times (``T_bc = 1``: constant in time).
        ``N_face = 1`` is constant along the face; otherwise the points of
        `Grid.face_coordinates`, zero-padded to the longest face. Dirichlet: the value;
        Neumann: the outward normal derivative; Robin: ``g``; periodic: ignored (zero).
    coeffs : Tensor, shape (F, 2) or (B, F, 2), optional
        Robin coefficients ``(a, b)`` of $a u + b\,\partial_n u = g$. ``None`` means
        ``(1, 0)`` for Dirichlet faces and ``(0, 1)`` for Neumann faces.
    """

    kind: Tensor
    values: Tensor
    coeffs: Tensor | None = None

    def __post_init__(self) -> None:
        kind, values = self.kind, self.values
        if not isinstance(kind, Tensor) or kind.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"BoundarySpec.kind: expected an integer tensor, got {kind!r}")
        self.kind = kind = kind.long()
        if kind.ndim not in (1, 2):
            raise _shape_error("BoundarySpec.kind", "(F,) or (B, F)", kind.shape)
        n_faces = kind.shape[-1]
        if n_faces not in (2, 4, 6):
            raise _shape_error("BoundarySpec.kind", "(..., F) with F in {2, 4, 6}", kind.shape)
        valid = torch.tensor([m.value for m in BCType], device=kind.device)
        bad = ~torch.isin(kind, valid)
        if bad.any():
            raise ValueError(f"BoundarySpec.kind: unknown boundary type code(s) "
                             f"{sorted(set(kind[bad].tolist()))}; valid: "
                             f"{ {m.name: m.value for m in BCType} }")
        lead = tuple(kind.shape[:-1])
        if values.ndim != kind.ndim + 2 or tuple(values.shape[: kind.ndim]) != tuple(kind.shape):
            raise _shape_error("BoundarySpec.values", f"{lead + (n_faces,)} + (T_bc, N_face)",
                               values.shape)
        if not values.is_floating_point():
            raise TypeError(f"BoundarySpec.values: expected a floating tensor, got {values.dtype}")
        if not torch.isfinite(values).all():
            raise ValueError("BoundarySpec.values: contains NaN or Inf")
        if self.coeffs is not None:
            if tuple(self.coeffs.shape) != lead + (n_faces, 2):
                raise _shape_error("BoundarySpec.coeffs", f"{lead + (n_faces, 2)}",
                                   self.coeffs.shape)
            if not torch.isfinite(self.coeffs).all():
                raise ValueError("BoundarySpec.coeffs: contains NaN or Inf")
        robin = kind == BCType.ROBIN
        if robin.any():
            if self.coeffs is None:
                raise ValueError("BoundarySpec.coeffs: required when a face is ROBIN")
            ab = self.coeffs[robin]
            if (ab.abs().sum(-1) == 0).any():
                raise ValueError("BoundarySpec.coeffs: Robin coefficients (a, b) must not both be 0")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_types(cls, types: Sequence[BCType | str | int], values: float | Sequence[float] = 0.0,
                   *, batch_size: int | None = None, coeffs: Sequence[Sequence[float]] | None = None,
                   dtype: torch.dtype = torch.float32) -> BoundarySpec:
        """Build a spec with constant data per face.

        Parameters
        ----------
        types : sequence of BCType or str, length F
            One type per face, e.g. ``["dirichlet", "dirichlet", "periodic", "periodic"]``.
        values : float or sequence of float, length F
            Constant data per face.
        batch_size : int, optional
            If given, the spec is batched with ``batch_size`` identical rows.
        coeffs : sequence of (a, b), length F, optional
            Robin coefficients.
        """
        kinds = torch.tensor([BCType.parse(t).value for t in types], dtype=torch.long)
        vals = torch.as_tensor(values, dtype=dtype).reshape(-1)
        if vals.numel() == 1:
            vals = vals.expand(len(kinds))
        if vals.numel() != len(kinds):
            raise ValueError(f"values: expected 1 or {len(kinds)} numbers, got {vals.numel()}")
        vals = vals.reshape(len(kinds), 1, 1).clone()
        co = None if coeffs is None else torch.as_tensor(coeffs, dtype=dtype).reshape(len(kinds), 2)
        spec = cls(kinds, vals, co)
        return spec if batch_size is None else spec.expand(batch_size)

    @classmethod
    def periodic(cls, ndim: int, batch_size: int | None = None,
                 dtype: torch.dtype = torch.float32) -> BoundarySpec:
        """All faces periodic in a ``ndim``-dimensional box."""
        return cls.from_types(["periodic"] * (2 * ndim), batch_size=batch_size, dtype=dtype)

    def expand(self, batch_size: int) -> BoundarySpec:
        """Batch an unbatched spec by repeating it ``batch_size`` times."""
        if self.batched:
            raise ValueError("BoundarySpec.expand: spec is already batched")
        rep = lambda t: None if t is None else t.unsqueeze(0).repeat(batch_size, *([1] * t.ndim))
        return BoundarySpec(rep(self.kind), rep(self.values), rep(self.coeffs))

    # ------------------------------------------------------------------ properties
    @property
    def batched(self) -> bool:
        """Whether the spec has a leading batch axis."""
        return self.kind.ndim == 2

    @property
    def n_faces(self) -> int:
        """Number of faces ``F``."""
        return self.kind.shape[-1]

    @property
    def ndim(self) -> int:
        """Spatial dimension of the box, ``F / 2``."""
        return self.n_faces // 2

    def robin_coeffs(self) -> Tensor:
        """Coefficients ``(a, b)`` of every face, shape ``(..., F, 2)``.

        Filled from the type where `coeffs` is ``None`` or the face is not Robin:
        Dirichlet and WALL ``(1, 0)``, Neumann and OPEN ``(0, 1)``, periodic ``(0, 0)``.
        """
        return robin_coefficients(self.kind, self.coeffs, self.values.dtype)

    # ------------------------------------------------------------------ tensor plumbing
    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
           non_blocking: bool = False) -> BoundarySpec:
        """Move tensors to ``device``; ``dtype`` applies to the floating tensors only."""
        mv = lambda t, d: None if t is None else t.to(device=device, dtype=d, non_blocking=non_blocking)
        return BoundarySpec(mv(self.kind, None), mv(self.values, dtype), mv(self.coeffs, dtype))

    def __getitem__(self, index: Any) -> BoundarySpec:
        if not self.batched:
            raise TypeError("BoundarySpec: only a batched spec can be indexed")
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
            sub = self[index]
            return BoundarySpec(sub.kind[0], sub.values[0], None if sub.coeffs is None else sub.coeffs[0])
        pick = lambda t: None if t is None else t[index]
        return BoundarySpec(pick(self.kind), pick(self.values), pick(self.coeffs))

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        if not self.batched:
            raise TypeError("BoundarySpec: an unbatched spec has no length")
        return self.kind.shape[0]

    def face_data(self, face: int, grid: Grid, time_index: int = 0) -> Tensor:
        """Data of one face on its own grid, shape ``(..., *face_shape)`` (``...`` = batch).

        Constant data (``N_face = 1``) is broadcast; padded data is cut to the face's length.
        """
        return face_view(self.values[..., time_index, :], face, grid)

    def check_grid(self, grid: Grid, *, kinds: bool = True) -> None:
        """Raise ``ValueError`` unless the spec fits ``grid``: its faces and data lengths, and
        (``kinds``) that periodic faces come in opposite pairs, which reads ``kind``'s values
        (a device-to-host copy for a spec on a GPU)."""
        if self.n_faces != grid.n_faces:
            raise ValueError(f"BoundarySpec: {self.n_faces} faces do not fit a {grid.ndim}-D grid "
                             f"({grid.n_faces} faces)")
        n_face = self.values.shape[-1]
        if n_face not in (1, grid.n_face_max):
            raise ValueError(f"BoundarySpec.values: N_face must be 1 or {grid.n_face_max} for grid "
                             f"{grid.shape}, got {n_face}")
        if not kinds:
            return
        # A periodic face needs a periodic partner: periodicity is a property of an axis.
        per = self.kind == BCType.PERIODIC
        lo, hi = per[..., 0::2], per[..., 1::2]
        if (lo != hi).any():
            raise ValueError("BoundarySpec.kind: a periodic face must be paired with a periodic "
                             "opposite face (x-/x+, y-/y+, z-/z+)")


def robin_coefficients(kind: Tensor, coeffs: Tensor | None, dtype: torch.dtype) -> Tensor:
    r"""The coefficients ``(a, b)`` of $a u + b\,\partial_n u = g$ for boundary type codes ``kind``
    (any shape), shape ``(*kind.shape, 2)``: ``coeffs`` where the type is Robin (and ``coeffs``
    is given, of that shape), else from the type: Dirichlet and WALL ``(1, 0)``, Neumann and
    OPEN ``(0, 1)``, periodic ``(0, 0)``. One rule for the faces of a box (`BoundarySpec`) and the
    boundary nodes of a mesh."""
    # compared with the plain integer codes: torch.compile traces these without a graph break
    out = torch.zeros(*kind.shape, 2, dtype=dtype, device=kind.device)
    out[..., 0] = ((kind == BCType.DIRICHLET.value) | (kind == BCType.WALL.value)).to(dtype)
    out[..., 1] = ((kind == BCType.NEUMANN.value) | (kind == BCType.OPEN.value)).to(dtype)
    if coeffs is not None:
        robin = (kind == BCType.ROBIN.value).unsqueeze(-1)
        out = torch.where(robin, coeffs.to(dtype), out)
    return out


def face_view(values: Tensor, face: int, grid: Grid) -> Tensor:
    """Reshape the data of one face onto the face's grid.

    Parameters
    ----------
    values : Tensor, shape (..., F, N_face)
        Boundary data of every face (``N_face`` 1 or `Grid.n_face_max`).
    face : int
        Face index (``0 = x-, 1 = x+, ...``).
    grid : Grid

    Returns
    -------
    Tensor, shape (..., *grid.face_shape(face))
    """
    fshape = grid.face_shape(face)
    n = math.prod(fshape)
    v = values[..., face, :]
    if v.shape[-1] == 1:
        v = v.expand(*v.shape[:-1], n)
    elif v.shape[-1] < n:
        raise ValueError(f"BoundarySpec.values: face {FACE_NAMES[face]} needs {n} points, got {v.shape[-1]}")
    return v[..., :n].reshape(*v.shape[:-1], *fshape)


def _move(value: Any, device: torch.device | str | None, non_blocking: bool) -> Any:
    if isinstance(value, (Tensor, BoundarySpec)):
        return value.to(device, non_blocking=non_blocking)
    return value


@dataclass
class PDESample:
    r"""One training example: a window of a trajectory with its parameters and boundary.

    Parameters
    ----------
    u_in : Tensor, shape (T_in, C, *S)
        Input frames.
    u_out : Tensor, shape (T_out, C, *S)
        Target frames.
    theta : Tensor, shape (P,)
        Scalar PDE parameters in raw physical units (``P`` may be 0).
    bc : BoundarySpec
        Unbatched boundary conditions (``kind`` shape ``(F,)``).
    grid : Grid
        The spatial grid (``grid.shape == S``).
    dt : float
        Time between consecutive frames.
    theta_field : Tensor, shape (C_f, *S), optional
        Spatially varying coefficients, e.g. an advection velocity.
    group : int
        Group id for group DRO (parameter bin within boundary type).
    meta : dict
        Free-form provenance (dataset name, field names, file and trajectory index).
    """

    u_in: Tensor
    u_out: Tensor
    theta: Tensor
    bc: BoundarySpec
    grid: Grid
    dt: float = 1.0
    theta_field: Tensor | None = None
    group: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self, batched=False)


@dataclass
class PDEBatch:
    r"""A batch of `PDESample` (leading axis ``B`` on every tensor).

    Parameters
    ----------
    u_in : Tensor, shape (B, T_in, C, *S)
    u_out : Tensor, shape (B, T_out, C, *S)
    theta : Tensor, shape (B, P)
    bc : BoundarySpec
        Batched (``kind`` shape ``(B, F)``).
    grid : Grid
        Shared by the whole batch.
    dt : Tensor, shape (B,)
    theta_field : Tensor, shape (B, C_f, *S), optional
    group : Tensor, shape (B,), long
    meta : list of dict, length B
    """

    u_in: Tensor
    u_out: Tensor
    theta: Tensor
    bc: BoundarySpec
    grid: Grid
    dt: Tensor
    theta_field: Tensor | None = None
    group: Tensor | None = None
    meta: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.group is None:
            self.group = torch.zeros(self.u_in.shape[0], dtype=torch.long, device=self.u_in.device)
        _validate(self, batched=True)

    def __len__(self) -> int:
        return self.u_in.shape[0]

    def to(self, device: torch.device | str | None = None, non_blocking: bool = False) -> PDEBatch:
        """Return the batch with every tensor (boundary spec included) on ``device``."""
        moved = {f.name: _move(getattr(self, f.name), device, non_blocking) for f in fields(self)}
        return PDEBatch(**moved)

    def pin_memory(self) -> PDEBatch:
        """Pin host tensors (called by ``DataLoader(pin_memory=True)``)."""
        pin = lambda t: t.pin_memory() if isinstance(t, Tensor) else t
        bc = BoundarySpec(pin(self.bc.kind), pin(self.bc.values), pin(self.bc.coeffs))
        kw = {f.name: pin(getattr(self, f.name)) for f in fields(self) if f.name != "bc"}
        return PDEBatch(bc=bc, **kw)

    def __getitem__(self, index: int | slice | Tensor) -> PDEBatch:
        """Select samples along the batch axis (an int, slice, index tensor or boolean mask);
        the result is always a batch."""
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        pick = lambda t: None if t is None else t[index]
        kept = torch.arange(len(self))[index].reshape(-1).tolist()
        meta = [self.meta[i] for i in kept] if self.meta else []
        return replace(self, u_in=pick(self.u_in), u_out=pick(self.u_out), theta=pick(self.theta),
                       bc=self.bc[index], dt=pick(self.dt), theta_field=pick(self.theta_field),
                       group=pick(self.group), meta=meta)


def _validate(obj: PDESample | PDEBatch, batched: bool) -> None:
    name = type(obj).__name__
    lead = 1 if batched else 0
    grid = obj.grid
    if not isinstance(grid, Grid):
        raise TypeError(f"{name}.grid: expected a Grid, got {type(grid).__name__}")
    d = grid.ndim
    want = ("(B, T, C, " if batched else "(T, C, ") + ", ".join(map(str, grid.shape)) + ")"
    for key in ("u_in", "u_out"):
        u = getattr(obj, key)
        if not isinstance(u, Tensor):
            raise TypeError(f"{name}.{key}: expected a Tensor, got {type(u).__name__}")
        if u.ndim != lead + 2 + d or tuple(u.shape[-d:]) != grid.shape:
            raise _shape_error(f"{name}.{key}", want, u.shape)
    u_in, u_out = obj.u_in, obj.u_out
    if u_in.shape[lead + 1] != u_out.shape[lead + 1]:
        raise ValueError(f"{name}: u_in has {u_in.shape[lead + 1]} channels but u_out has "
                         f"{u_out.shape[lead + 1]}")
    batch = (u_in.shape[0],) if batched else ()
    if batched and u_out.shape[0] != batch[0]:
        raise _shape_error(f"{name}.u_out", f"({batch[0]}, ...)", u_out.shape)
    if obj.theta.ndim != lead + 1 or tuple(obj.theta.shape[:lead]) != batch:
        raise _shape_error(f"{name}.theta", "(B, P)" if batched else "(P,)", obj.theta.shape)
    if obj.theta_field is not None:
        tf = obj.theta_field
        if tf.ndim != lead + 1 + d or tuple(tf.shape[:lead]) != batch or tuple(tf.shape[-d:]) != grid.shape:
            raise _shape_error(f"{name}.theta_field", ("(B, C_f, " if batched else "(C_f, ")
                               + ", ".join(map(str, grid.shape)) + ")", tf.shape)
    bc = obj.bc
    if not isinstance(bc, BoundarySpec):
        raise TypeError(f"{name}.bc: expected a BoundarySpec, got {type(bc).__name__}")
    if bc.batched != batched or tuple(bc.kind.shape[:lead]) != batch:
        raise _shape_error(f"{name}.bc.kind", f"{batch + (grid.n_faces,)}", bc.kind.shape)
    bc.check_grid(grid)
    if batched:
        if tuple(obj.dt.shape) != batch:
            raise _shape_error(f"{name}.dt", f"({batch[0]},)", obj.dt.shape)
        if tuple(obj.group.shape) != batch or obj.group.dtype != torch.long:
            raise ValueError(f"{name}.group: expected a long tensor of shape {batch}, got "
                             f"{obj.group.dtype} {tuple(obj.group.shape)}")
        if obj.meta and len(obj.meta) != batch[0]:
            raise ValueError(f"{name}.meta: expected {batch[0]} entries, got {len(obj.meta)}")


def _stack_padded(tensors: Sequence[Tensor], name: str) -> Tensor:
    """Stack boundary tensors, broadcasting size-1 time/point axes to the largest."""
    target = [max(t.shape[i] for t in tensors) for i in range(tensors[0].ndim)]
    out = []
    for i, t in enumerate(tensors):
        for ax, (n, m) in enumerate(zip(t.shape, target)):
            if n not in (1, m):
                raise ValueError(f"collate: sample {i} has {name} shape {tuple(t.shape)}, which does "
                                 f"not broadcast to {tuple(target)} (axis {ax})")
        out.append(t.expand(*target))
    return torch.stack(out)


def collate(samples: Sequence[PDESample] | PDEBatch) -> PDEBatch:
    """Stack samples into a `PDEBatch`; usable as a ``DataLoader`` ``collate_fn``.

    A `PDEBatch` (what a dataset's batched ``__getitems__`` may return) is passed through.

    Boundary data with ``T_bc = 1`` or ``N_face = 1`` is broadcast to the largest in the
    batch. All samples must share the grid and the shapes of their fields.
    """
    if isinstance(samples, PDEBatch):
        return samples
    if not samples:
        raise ValueError("collate: got an empty list of samples")
    grid = samples[0].grid
    for i, s in enumerate(samples):
        if s.grid != grid:
            raise ValueError(f"collate: sample {i} has grid {s.grid}, sample 0 has {grid}")
    fields_ = samples[0].theta_field is not None
    if any((s.theta_field is not None) != fields_ for s in samples):
        raise ValueError("collate: some samples have theta_field and others do not")

    def stack(key: str) -> Tensor:
        ts = [getattr(s, key) for s in samples]
        shapes = {tuple(t.shape) for t in ts}
        if len(shapes) > 1:
            raise ValueError(f"collate: {key} shapes differ across samples: {sorted(shapes)}")
        return torch.stack(ts)

    kinds = [s.bc.kind for s in samples]
    if len({tuple(k.shape) for k in kinds}) > 1:
        raise ValueError("collate: samples have different numbers of boundary faces")
    has_coeffs = any(s.bc.coeffs is not None for s in samples)
    bc = BoundarySpec(
        torch.stack(kinds),
        _stack_padded([s.bc.values for s in samples], "bc.values"),
        torch.stack([s.bc.robin_coeffs() for s in samples]) if has_coeffs else None,
    )
    return PDEBatch(
        u_in=stack("u_in"), u_out=stack("u_out"), theta=stack("theta"), bc=bc, grid=grid,
        dt=torch.tensor([float(s.dt) for s in samples], dtype=samples[0].u_in.dtype),
        theta_field=stack("theta_field") if fields_ else None,
        group=torch.tensor([int(s.group) for s in samples], dtype=torch.long),
        meta=[dict(s.meta) for s in samples],
    )


def check_model_inputs(u_in: Tensor, theta: Tensor | None, theta_field: Tensor | None, *, t_in: int,
                       in_channels: int, ndim: int, n_params: int, field_channels: int) -> None:
    """Raise a `ValueError` naming the argument whose shape does not fit a model with these
    sizes: ``u_in`` ``(B, t_in, in_channels, *S)`` with ``ndim`` spatial axes, ``theta``
    ``(B, n_params)`` where ``n_params > 0``, ``theta_field`` ``(B, field_channels, *S)`` where
    ``field_channels > 0``. Shapes only: no tensor value is read."""
    want = f"(B, {t_in}, {in_channels}, *S) with {ndim} spatial axes"
    if u_in.ndim != 3 + ndim or u_in.shape[1] != t_in or u_in.shape[2] != in_channels:
        raise ValueError(f"u_in: expected shape {want}, got {tuple(u_in.shape)}")
    batch, space = u_in.shape[0], tuple(u_in.shape[3:])
    if n_params and (theta is None or theta.shape != (batch, n_params)):
        raise ValueError(f"theta: expected shape ({batch}, {n_params}), got {None if theta is None else tuple(theta.shape)}")
    if field_channels and (theta_field is None or tuple(theta_field.shape) != (batch, field_channels, *space)):
        raise ValueError(f"theta_field: expected shape {(batch, field_channels, *space)} (B, C_f and u_in's grid), "
                         f"got {None if theta_field is None else tuple(theta_field.shape)}")


def model_inputs(u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                 bc: BoundarySpec | None = None, grid: Grid | None = None, *, ndim: int,
                 check: Callable[[Tensor, Tensor | None, Tensor | None], None] | None = None,
                 ) -> tuple[Tensor, Tensor | None, Tensor | None, BoundarySpec, Grid]:
    """A model's ``forward`` arguments, from a `PDEBatch` or as given, with the defaults filled
    in: all faces periodic (on ``u_in``'s device) and the unit box of ``u_in``'s shape. A
    ``bc`` without a batch axis applies to every sample. A ``bc`` or ``grid`` that does not
    fit ``u_in`` (batch size, number of faces, face data length, grid shape) raises a
    `ValueError`; nothing here reads tensor values.

    Parameters
    ----------
    u_in : Tensor, shape (B, T_in, C, *S), or PDEBatch
        Input frames, or a whole batch (whose fields then replace the other arguments).
    theta, theta_field, bc, grid
        As the models take them; ``bc`` is moved to ``u_in``'s device if needed.
    ndim : int
        Spatial dimension (for the default boundary).
    check : callable, optional
        The model's input check, called as ``check(u_in, theta, theta_field)`` before the
        defaults are built (so that a malformed ``u_in`` is reported as such).

    Returns
    -------
    tuple
        ``(u_in, theta, theta_field, bc, grid)``.
    """
    if isinstance(u_in, PDEBatch):
        u_in, theta, theta_field, bc, grid = u_in.u_in, u_in.theta, u_in.theta_field, u_in.bc, u_in.grid
    if check is not None:
        check(u_in, theta, theta_field)
    batch, shape = u_in.shape[0], tuple(u_in.shape[3:])
    grid = grid or Grid(shape)
    if tuple(grid.shape) != shape:
        raise ValueError(f"grid: shape {tuple(grid.shape)} does not match u_in's spatial shape {shape}")
    bc = bc if bc is not None else BoundarySpec.periodic(ndim, batch)
    if not bc.batched:
        bc = bc.expand(batch)
    elif bc.kind.shape[0] != batch:
        raise ValueError(f"bc: batch size {bc.kind.shape[0]} does not match u_in's {batch}")
    bc.check_grid(grid, kinds=False)
    if bc.kind.device != u_in.device:
        bc = bc.to(u_in.device)
    return u_in, theta, theta_field, bc, grid
