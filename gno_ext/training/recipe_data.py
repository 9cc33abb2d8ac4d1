"""The recipes' data: datasets opened by split, data-dependent model sizes, DRO groups and the
curriculum's batch order. (The generation of datasets is `gno_ext.data`.)

A recipe names its data with a small mapping (the ``data`` group of the Hydra configs):

| ``kind`` | source | keys |
|---|---|---|
| ``generated`` | a preset of `gno_ext.data`, generated on first use into a cache folder | ``preset``, ``size``, ``root`` (optional), ``in_memory`` |
| ``the_well`` | The Well through its own reader | ``root`` (base path), ``name``, ``normalize`` |
| ``pdebench`` | PDEBench HDF5 files, one parameter value per file | ``root`` (folder), ``pattern``, ``boundary`` |
| ``custom`` | a generated folder or a user's ``.h5`` / ``.npz`` file | ``root`` |
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, Dataset

from gno_ext.adapters.windows import TrajectoryData
from gno_ext.data.generate import default_cache, default_root  # noqa: F401 (default_cache: part of this module's API)
from gno_ext.losses import bin_parameters
from gno_ext.mesh import MeshSample
from gno_ext.schema import PDEBatch
from gno_ext.training.settings import Settings

__all__ = ["DataSpec", "open_split", "data_spec", "parameter_values", "window_boundary_kinds", "GroupBinner",
           "CurriculumBatchSampler", "model_kwargs_from_data", "rollout_indices", "trajectory_lengths", "default_cache",
           "prepare_data", "batch_to", "resolved_root", "spread", "training_groups"]

TRL_HELP = ("The Well's turbulent_radiative_layer_2D is not on this machine. Download it (about 7 GB) with\n"
            "    pip install the_well && the-well-download --base-path /path/to/the_well "
            "--dataset turbulent_radiative_layer_2D\n"
            "and pass data.root=/path/to/the_well (the folder that holds datasets/).")


def _generated_root(cfg: Mapping[str, Any]) -> Path:
    if cfg.get("root"):
        return Path(cfg["root"])
    return default_root(cfg["size"])


def prepare_data(cfg: Mapping[str, Any], progress: bool = True) -> None:
    """Make the data of ``cfg`` available: generate a preset that is missing or incomplete.

    Only the main process calls this; the others wait and then open the files.
    """
    if cfg["kind"] == "mesh":
        from gno_ext.data.mesh import prepare_mesh
        prepare_mesh(_generated_root(cfg) / "mesh", str(cfg.get("pde", "heat")), list(cfg["domains"]),
                     str(cfg["size"]), int(cfg.get("seed", 0)))
        return
    if cfg["kind"] != "generated":
        return
    import json

    from gno_ext.data import get_preset
    from gno_ext.data.fingerprint import check_protocol
    from gno_ext.data.generate import generate, verify_dataset

    folder = _generated_root(cfg) / "datasets" / str(cfg["preset"])
    manifest = folder / "manifest.json"
    if manifest.is_file():
        recorded = json.loads(manifest.read_text())
        # a cached dataset of an older protocol stops the run (generate() checks it when resuming)
        check_protocol(folder, recorded, get_preset(str(cfg["preset"])), str(cfg["size"]))
        if recorded.get("complete"):
            verify_dataset(folder)  # every split's files as generated, before any training
            return
    generate(str(cfg["preset"]), size=str(cfg["size"]), out=_generated_root(cfg), device=cfg.get("device"),
             progress=progress)


def resolved_root(cfg: Mapping[str, Any]) -> str | None:
    """``data.root`` made explicit (the cache folder of a generated preset), so that a run's saved
    configuration finds its data again."""
    return str(_generated_root(cfg)) if cfg["kind"] in ("generated", "mesh") else cfg.get("root")


def open_split(cfg: Mapping[str, Any], split: str, n_steps_input: int, n_steps_output: int,
               metadata_only: bool = False) -> Dataset:
    """Open one split of the data described by ``cfg`` as a dataset of `PDESample` windows
    (``metadata_only``: do not read a generated split into memory), by the opener of its
    ``data.kind`` (`SOURCES`)."""
    kind = cfg["kind"]
    if kind not in SOURCES:
        raise ValueError(f"data.kind: expected {', '.join(SOURCES)}, got {kind!r}")
    return SOURCES[kind](cfg, split, n_steps_input, n_steps_output, metadata_only)


def _open_mesh(cfg: Mapping[str, Any], split: str, t_in: int, t_out: int, metadata_only: bool) -> Dataset:
    from gno_ext.adapters.mesh import MeshDataset

    domains = list(cfg["domains"])
    if not domains:
        raise ValueError("data.domains: name at least one domain")
    pde = str(cfg.get("pde", "heat"))
    parts = [MeshDataset(_generated_root(cfg) / "mesh" / f"{pde}-{d}" / f"{split}.h5", t_in, t_out) for d in domains]
    segments = {d: p.n_segments for d, p in zip(domains, parts)}
    if len(set(segments.values())) > 1:  # a DRO configuration is the type of every segment
        raise ValueError(f"data.domains: {segments} boundary segments per domain; a run takes domains with "
                         f"the same number (train the square, with its four sides, on its own)")
    return parts[0] if len(parts) == 1 else ConcatDataset(parts)


def _open_generated(cfg: Mapping[str, Any], split: str, t_in: int, t_out: int, metadata_only: bool) -> Dataset:
    from gno_ext.adapters import GeneratedDataset

    folder = _generated_root(cfg) / "datasets" / str(cfg["preset"])
    in_memory = cfg.get("in_memory", "auto")
    if in_memory == "auto":  # in memory when the split's files are small enough (each process holds a copy)
        size = sum(f.stat().st_size for f in (folder / "data" / split).glob("*.hdf5"))
        in_memory = size <= float(cfg.get("in_memory_limit_gb", 4)) * 2**30
    return GeneratedDataset(folder, t_in, t_out, split=split, in_memory=bool(in_memory) and not metadata_only)


def _open_the_well(cfg: Mapping[str, Any], split: str, t_in: int, t_out: int, metadata_only: bool) -> Dataset:
    from gno_ext.adapters import open_dataset

    if not cfg.get("root"):
        raise FileNotFoundError(TRL_HELP if cfg.get("name") == "turbulent_radiative_layer_2D" else
                                f"data.root: set it to The Well's base path (the folder holding datasets/) "
                                f"for {cfg.get('name')}")
    root = Path(cfg["root"])
    if not root.exists():
        raise FileNotFoundError(f"data.root={root}: no such folder.\n{TRL_HELP}")
    return open_dataset("the_well", root, t_in, t_out, split=split, name=cfg.get("name"),
                        normalize=bool(cfg.get("normalize", False)), reader=cfg.get("reader", "the_well"))


def _open_pdebench(cfg: Mapping[str, Any], split: str, t_in: int, t_out: int, metadata_only: bool) -> Dataset:
    from gno_ext.adapters import PDEBenchDataset
    from gno_ext.adapters.windows import BatchedConcat

    if not cfg.get("root"):
        raise FileNotFoundError(f"data.root: set it to the folder holding PDEBench files matching "
                                f"{cfg['pattern']!r} (download them from DaRUS, see PDEBench's README)")
    files = sorted(Path(cfg["root"]).glob(str(cfg["pattern"])))
    if not files:
        raise FileNotFoundError(f"data.root={cfg['root']}: no file matches {cfg['pattern']!r}")
    return BatchedConcat([PDEBenchDataset(f, t_in, t_out, split=split, boundary=cfg.get("boundary"),
                                          parameters=cfg.get("parameters"), group=i) for i, f in enumerate(files)])


def _open_custom(cfg: Mapping[str, Any], split: str, t_in: int, t_out: int, metadata_only: bool) -> Dataset:
    from gno_ext.adapters import open_dataset
    from gno_ext.adapters.windows import split_trajectories

    if not cfg.get("root"):
        raise FileNotFoundError("data.root: set it to a generated dataset folder or an .h5/.npz file")
    root = Path(cfg["root"])
    if root.is_dir():
        return open_dataset("custom", root, t_in, t_out, split=split)
    # a single file carries no split: consecutive blocks of trajectories (data.split_fractions)
    n = len(open_dataset("custom", root, 1, 1).trajectories)
    fractions = tuple(cfg.get("split_fractions") or (0.8, 0.1, 0.1))
    chosen = split_trajectories(n, split, fractions)
    if not chosen:
        raise ValueError(f"data.root={root}: its {n} trajectories leave the {split} split empty with "
                         f"data.split_fractions={list(fractions)}")
    return open_dataset("custom", root, t_in, t_out, trajectories=chosen)


# data.kind -> the opener of a split: (cfg, split, n_steps_input, n_steps_output, metadata_only) -> Dataset.
# A new source is an adapter (implementing gno_ext.adapters.TrajectoryData) and a line here.
SOURCES: dict[str, Callable[[Mapping[str, Any], str, int, int, bool], Dataset]] = {
    "generated": _open_generated, "mesh": _open_mesh, "the_well": _open_the_well, "pdebench": _open_pdebench,
    "custom": _open_custom}


@dataclass(frozen=True)
class DataSpec:
    """The sizes a model needs from the data (read from the dataset, never written in YAML)."""

    channels: int
    n_params: int
    field_channels: int
    ndim: int
    t_in: int
    shape: tuple[int, ...]
    log_params: tuple[bool, ...]


def parameter_values(ds: Dataset) -> Tensor:
    """The parameter vectors ``(N, P)`` of a dataset's trajectories (files for The Well and
    PDEBench), read from metadata without loading fields (`gno_ext.adapters.TrajectoryData`; a
    dataset without it: its first sample's parameters)."""
    if isinstance(ds, ConcatDataset):
        return torch.cat([parameter_values(d) for d in ds.datasets])
    if isinstance(ds, TrajectoryData):
        return ds.parameter_values()
    return ds[0].theta.reshape(1, -1)


def parameter_names(ds: Dataset, n_params: int, first: str | None = None) -> list[str]:
    """The names of the ``n_params`` parameters (the columns of ``theta``): those the data's
    metadata records (gno_ext's ``parameter_names``, The Well's ``constant_scalar_names``,
    PDEBench's), else ``first`` (a recipe's ``parameter``) for the first and ``theta<p>`` for the
    others."""
    inner = ds.datasets[0] if isinstance(ds, ConcatDataset) else ds
    names = [str(n) for n in (getattr(inner, "parameter_names", None) or [])]
    if len(names) == n_params:
        return names
    return [first if p == 0 and first else f"theta{p}" for p in range(n_params)]


def data_spec(ds: Dataset, log_params: Sequence[bool] | None = None, values: Tensor | None = None) -> DataSpec:
    """Model sizes of ``ds``. A parameter is normalised on a log scale when it is positive and
    spans more than a decade in the training data (unless ``log_params`` says otherwise);
    ``values`` are `parameter_values` of ``ds`` when already at hand."""
    s = ds[0]
    values = parameter_values(ds) if values is None else values
    mesh = isinstance(s, MeshSample)  # node-major fields (N, T, C)
    if log_params is None:
        log_params = tuple(bool((v > 0).all() and v.max() > 10 * v.min()) for v in values.T)
    elif len(log_params) != values.shape[1]:
        raise ValueError(f"data.log_params: expected {values.shape[1]} flags, got {list(log_params)}")
    if mesh:
        return DataSpec(channels=s.u_in.shape[2], n_params=s.theta.numel(),
                        field_channels=0 if s.theta_field is None else s.theta_field.shape[1], ndim=s.ndim,
                        t_in=s.u_in.shape[1], shape=(), log_params=tuple(log_params))
    return DataSpec(channels=s.u_in.shape[1], n_params=s.theta.numel(),
                    field_channels=0 if s.theta_field is None else s.theta_field.shape[0], ndim=s.grid.ndim,
                    t_in=s.u_in.shape[0], shape=tuple(s.grid.shape), log_params=tuple(log_params))


def model_kwargs_from_data(cls: type, spec: DataSpec, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor arguments of ``cls`` completed from the data.

    A model class may define ``data_kwargs(spec, kwargs) -> dict`` returning its complete
    arguments; otherwise the standard names ``in_channels``, ``n_params``, ``field_channels``,
    ``ndim``, ``t_in`` and ``log_params`` are filled where the constructor has them. A value
    given in ``kwargs`` that contradicts the data is an error (``log_params`` may be chosen).
    """
    if hasattr(cls, "data_kwargs"):
        return dict(cls.data_kwargs(spec, dict(kwargs)))
    params = inspect.signature(cls.__init__).parameters
    standard = {"in_channels": spec.channels, "n_params": spec.n_params, "field_channels": spec.field_channels,
                "ndim": spec.ndim, "t_in": spec.t_in, "log_params": list(spec.log_params)}
    derived = {k: v for k, v in standard.items() if k in params}
    out = dict(kwargs)
    for key, value in derived.items():
        if key in out and out[key] is not None and key != "log_params" and out[key] != value:
            raise ValueError(f"model.kwargs.{key}={out[key]} contradicts the data ({key}={value}); "
                             f"leave it out, it is read from the dataset")
        if key not in out or out[key] is None:
            out[key] = value
    return out


def window_boundary_kinds(ds: Dataset) -> np.ndarray:
    """Boundary type of every face for every window, ``(len(ds), F)``, from metadata (a dataset
    without `gno_ext.adapters.TrajectoryData`: its first sample's configuration for every window)."""
    if isinstance(ds, ConcatDataset):
        return np.concatenate([window_boundary_kinds(d) for d in ds.datasets])
    if isinstance(ds, TrajectoryData):
        return ds.window_boundary_kinds()
    kind = ds[0].bc.kind.numpy()
    return np.broadcast_to(kind, (len(ds), kind.shape[-1]))


def _step_up(x: float) -> float:
    """The next float32 value above ``x`` (a bin edge that keeps ``x`` in the bin below it)."""
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


class GroupBinner:
    """DRO groups: a boundary configuration (the type of every face) times bins of each parameter.

    Parameters with no more distinct training values than ``bins`` get one group per value
    (edges half-way between values); others get ``bins`` equal bins over the training range,
    logarithmic for log-scaled parameters. Values outside the training range fall into the
    outer bins; evaluation uses `covering`, which gives them groups of their own.

    Parameters
    ----------
    values : Tensor, shape (N, P)
        Training parameter values.
    kinds : array, shape (M, F)
        Boundary types of the training windows (their distinct rows are the configurations).
    bins : int
        Bins per parameter.
    log_params : sequence of bool
    names : sequence of str, optional
        The parameters' names, for the groups' labels (``alpha in [0.1, 0.2]``; default
        ``theta0``, ``theta1``, ...).
    """

    def __init__(self, values: Tensor, kinds: np.ndarray, bins: int, log_params: Sequence[bool],
                 names: Sequence[str] | None = None) -> None:
        if bins < 1:
            raise ValueError(f"trainer.dro.bins: must be >= 1, got {bins}")
        if names is not None and len(names) != values.shape[1]:
            raise ValueError(f"names: expected {values.shape[1]} parameter names, got {list(names)}")
        self.names = [str(n) for n in names] if names is not None else [f"theta{p}" for p in range(values.shape[1])]
        self.edges: list[list[float]] = []
        # where each distinct value has a bin of its own: those values (a label names the value)
        self.points: list[list[float] | None] = []
        self.log = [bool(x) for x in log_params]
        for p in range(values.shape[1]):
            v = values[:, p].double()
            distinct = torch.unique(v)
            f = torch.log if self.log[p] else (lambda x: x)
            inv = torch.exp if self.log[p] else (lambda x: x)
            if len(distinct) <= bins:
                mids = inv(0.5 * (f(distinct[1:]) + f(distinct[:-1]))) if len(distinct) > 1 else distinct[:0]
                if self.log[p]:
                    lo, hi = distinct[0] / 2, distinct[-1] * 2
                else:
                    lo, hi = distinct[0] - 1 - distinct[0].abs(), distinct[-1] + 1 + distinct[-1].abs()
                edges = torch.cat([lo.reshape(1), mids, hi.reshape(1)])
                self.points.append(distinct.tolist())
            else:
                edges = inv(torch.linspace(float(f(v.min())), float(f(v.max())), bins + 1, dtype=torch.float64))
                # the outer edges are the extreme values themselves (exp(log(v)) may round past them)
                edges[0], edges[-1] = v.min(), v.max()
                self.points.append(None)
            self.edges.append(edges.tolist())
        # per parameter: the range of the held-out values below and above the training range,
        # where `covering` gave them a bin of their own (its first and last bin)
        self.outside: list[tuple[tuple[float, float] | None, tuple[float, float] | None]] = [
            (None, None)] * len(self.edges)
        self.configurations = [tuple(int(k) for k in row) for row in np.unique(np.asarray(kinds), axis=0)]
        self._config_id = {c: i for i, c in enumerate(self.configurations)}
        self._count()

    def _count(self) -> None:
        self.n_bins = int(math.prod(len(e) - 1 for e in self.edges))
        self.n_groups = len(self.configurations) * self.n_bins

    def covering(self, values: Tensor) -> GroupBinner:
        """These groups, refined for held-out parameter values ``values`` (N, P): the values
        below and those above the training range each get a bin of their own, labelled with
        their range and "outside the training range", where the training groups would put them
        into the outermost training bin (an OOD test split, Burgers' shifted test range). A
        parameter with a group per training value whose held-out values are other values gets
        range labels (its bins' edges lie half-way between the training values). The groups of
        the training values are unchanged; the group ids are not (they count the new bins)."""
        values = torch.as_tensor(values).double()
        if values.ndim != 2 or values.shape[1] != len(self.edges):
            raise ValueError(f"values: expected {len(self.edges)} parameter(s) per row, "
                             f"got shape {tuple(values.shape)}")
        out = copy.copy(self)
        out.edges, out.points, out.outside = [], [], []
        for p, (edges, points) in enumerate(zip(self.edges, self.points)):
            v = values[:, p]
            edges = list(edges)
            if points is not None:
                if bool(torch.isin(v, torch.tensor(points, dtype=torch.float64)).all()):
                    out.edges.append(edges), out.points.append(points), out.outside.append((None, None))
                    continue
                edges = [points[0], *edges[1:-1], points[-1]]  # the training range, not the margins
            lo, hi = edges[0], edges[-1]
            below, above = v[v < lo], v[v > hi]
            low = (float(below.min()), float(below.max())) if len(below) else None
            high = (float(above.min()), float(above.max())) if len(above) else None
            if low:
                edges.insert(0, low[0])
            # one float32 step above the training maximum, so that held-out values equal to it stay
            # in its bin (and one training value has a bin of its own, not [v, v])
            if high or len(points or ()) == 1:
                edges[-1] = _step_up(hi)
            if high:
                edges.append(_step_up(high[1]))
            out.edges.append(edges), out.points.append(None), out.outside.append((low, high))
        out._count()
        return out

    def configuration_ids(self, kind: Tensor) -> Tensor:
        """Configuration index of each row of ``kind`` (B, F); an unseen configuration is an error."""
        rows = [tuple(int(k) for k in r) for r in kind.tolist()]
        missing = sorted({r for r in rows if r not in self._config_id})
        if missing:
            raise ValueError(f"boundary configurations {missing} were not in the training data "
                             f"(known: {self.configurations})")
        return torch.tensor([self._config_id[r] for r in rows], dtype=torch.long)

    def __call__(self, theta: Tensor, kind: Tensor) -> Tensor:
        """Group id of each sample, shape (B,)."""
        config = self.configuration_ids(kind.cpu()).to(theta.device)
        if not self.edges:
            return config
        bins = bin_parameters(theta.double(), self.edges)
        return config * self.n_bins + bins

    def configuration(self, group: int) -> int:
        """The boundary configuration (an index into ``configurations``) of group ``group``."""
        return int(group) // self.n_bins

    def boundary_label(self, configuration: int) -> str:
        """A configuration's boundary types, face by face (``dirichlet/neumann/periodic/periodic``)."""
        from gno_ext.schema import BCType

        return "/".join(BCType(k).name.lower() for k in self.configurations[configuration])

    def label(self, group: int) -> str:
        """A readable name of group ``group``: its boundary types and each parameter's range, or
        its value where the training data has one value per bin (a parameter that does not vary
        is left out: ``dirichlet/.../periodic, alpha = 0.1`` would say nothing)."""
        config, rest = divmod(int(group), self.n_bins)
        bins = []
        for edges in reversed(self.edges):  # bin_parameters combines parameter 0 first
            rest, b = divmod(rest, len(edges) - 1)
            bins.insert(0, b)
        parts = [self.boundary_label(config)]
        for name, edges, points, (low, high), b in zip(self.names, self.edges, self.points, self.outside, bins):
            outside = low if low and b == 0 else high if high and b == len(edges) - 2 else None
            if outside:
                lo, hi = f"{outside[0]:.4g}", f"{outside[1]:.4g}"
                parts.append(f"{name} {'= ' + lo if lo == hi else f'in [{lo}, {hi}]'} (outside the training range)")
            elif points is None:
                lo, hi = f"{edges[b]:.4g}", f"{edges[b + 1]:.4g}"
                parts.append(f"{name} = {lo}" if lo == hi else f"{name} in [{lo}, {hi}]")  # = : one training value
            elif len(points) > 1:
                parts.append(f"{name} = {points[b]:.4g}")
        return ", ".join(parts)


class CurriculumBatchSampler:
    """Batches of one boundary configuration each, in the order of the paper's Algorithm 1.

    The global batch order depends only on the seed, the epoch and the global batch size, so
    ``N`` processes with per-process batch ``b`` see exactly the samples one process with batch
    ``N b`` sees: each process takes its slice of every global batch. A configuration with fewer
    samples than a multiple of the global batch is padded by wrapping around its own samples,
    so every process always gets a full slice.

    Parameters
    ----------
    configurations : array, shape (N,)
        Boundary-configuration id of every sample.
    batch_size : int
        Per-process batch size.
    rank, world_size : int
    seed : int
    order : {"interleave", "sequential"}
        ``interleave`` alternates configurations update by update (one update per type in turn,
        as in Algorithm 1); ``sequential`` visits all batches of one type, then the next.
    shuffle : bool
    """

    def __init__(self, configurations: np.ndarray, batch_size: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, order: str = "interleave", shuffle: bool = True) -> None:
        if order not in ("interleave", "sequential"):
            raise ValueError(f"trainer.curriculum.order: expected interleave or sequential, got {order!r}")
        if batch_size < 1:
            raise ValueError(f"trainer.batch_size: must be >= 1, got {batch_size}")
        self.configurations = np.asarray(configurations)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seed, self.order, self.shuffle = seed, order, shuffle
        self.epoch, self.start = 0, 0
        self._cached: tuple[int, list[np.ndarray]] | None = None

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch (its shuffle) and the first batch to yield (to resume mid-epoch)."""
        self.epoch, self.start = epoch, start

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        """Every global batch of ``epoch`` (arrays of sample indices; computed once per epoch)."""
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self._make_batches(epoch))
        return self._cached[1]

    def _make_batches(self, epoch: int) -> list[np.ndarray]:
        size = self.batch_size * self.world_size
        per_type = []
        for c in np.unique(self.configurations):
            idx = np.flatnonzero(self.configurations == c)
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch * 101 + int(c))
                idx = idx[torch.randperm(len(idx), generator=g).numpy()]
            idx = np.resize(idx, math.ceil(len(idx) / size) * size)  # pad by wrapping
            per_type.append(list(idx.reshape(-1, size)))
        if self.order == "sequential":
            return [b for batches in per_type for b in batches]
        out = []
        for k in range(max(len(b) for b in per_type)):
            out += [batches[k] for batches in per_type if k < len(batches)]
        return out

    def __iter__(self) -> Iterator[list[int]]:
        lo, hi = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        for batch in self.global_batches(self.epoch)[self.start:]:
            yield batch[lo:hi].tolist()

    def __len__(self) -> int:
        return len(self.global_batches(self.epoch)) - self.start


def rollout_indices(ds: Dataset, start: int = 0) -> list[int]:
    """Indices of the windows that start at frame ``start`` of a trajectory (one rollout per
    trajectory, from its first frame by default), in order. A trajectory too short to hold a
    window from ``start`` raises a `ValueError` that says how many windows it has. A dataset
    without `gno_ext.adapters.TrajectoryData` is taken as one window per trajectory."""
    if isinstance(ds, ConcatDataset):
        out, offset = [], 0
        for d in ds.datasets:
            out += [offset + i for i in rollout_indices(d, start)]
            offset += len(d)
        return out
    if isinstance(ds, TrajectoryData):
        return ds.rollout_indices(start)
    if start:
        raise ValueError(f"eval.start_frame={start}: this dataset ({type(ds).__name__}) has one window per "
                         "trajectory; only a start at frame 0 is possible")
    return list(range(len(ds)))


def trajectory_lengths(ds: Dataset) -> list[int]:
    """Frames of every trajectory of ``ds`` (from metadata, `gno_ext.adapters.TrajectoryData`)."""
    if isinstance(ds, ConcatDataset):
        return [n for d in ds.datasets for n in trajectory_lengths(d)]
    if isinstance(ds, TrajectoryData):
        return ds.trajectory_lengths()
    raise TypeError(f"{type(ds).__name__}: cannot tell its trajectory lengths (it does not implement "
                    "gno_ext.adapters.TrajectoryData)")


def batch_to(batch: PDEBatch, device: torch.device) -> PDEBatch:
    """Move a batch to ``device`` (no copy when it is there already)."""
    return batch if batch.u_in.device == device else batch.to(device)


def spread(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)`` (all when ``k >= n``)."""
    return list(range(n)) if k >= n else [int(i) for i in np.linspace(0, n - 1, k).round()]


def training_groups(cfg: Mapping[str, Any], train_ds: Dataset) -> tuple[DataSpec, Tensor, np.ndarray, GroupBinner]:
    """From the training split's metadata, read once: the model sizes (`DataSpec`), the parameter
    values, the boundary types of every window, and the run's DRO groups (boundary
    configurations x parameter bins; ``trainer.dro.bins`` per parameter, checked, its default
    where it is absent)."""
    bins = Settings.from_config({"trainer": {"dro": (cfg.get("trainer") or {}).get("dro") or {}}}).trainer.dro.bins
    values, kinds = parameter_values(train_ds), window_boundary_kinds(train_ds)
    spec = data_spec(train_ds, cfg["data"].get("log_params"), values)
    names = parameter_names(train_ds, values.shape[1], cfg.get("recipe", {}).get("parameter"))
    return spec, values, kinds, GroupBinner(values, kinds, bins, spec.log_params, names)
