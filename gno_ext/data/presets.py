r"""Dataset presets: the paper's protocols (Appendix C) at three sizes.

A preset fixes the equation, the parameter range, the boundary setups, the resolution and the
time axis. Its trajectories are enumerated deterministically: trajectory ``i`` of a split has a
parameter value, a boundary setup and a seed that depend only on ``(preset, split, i)``, so the
same index always gives the same trajectory, whatever the batch or the device.

Sizes: ``smoke`` (seconds, for tests), ``small`` (a CPU in minutes), ``bench`` (the paper's
resolution, time axis, ranges and boundary types with about a fifth of its training windows or
fewer: the results benchmark's tier, a GNO run in minutes on one GPU) and ``paper`` (the counts of
Appendix C: e.g. heat-joint is 501 diffusivities x 15 setups x 10 trajectories for training).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from gno_ext.schema import Grid

__all__ = ["Preset", "SplitPlan", "Trajectory", "PRESETS", "get_preset", "BOUNDARY_TYPES"]

BOUNDARY_TYPES = ("periodic", "dirichlet", "neumann", "robin", "dirichlet-time")
SIZES = ("smoke", "small", "bench", "paper")
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class SplitPlan:
    """Counts of one split: parameter values x boundary setups per type x trajectories.

    ``setups`` maps a boundary type to its number of setups; for a boundary-only preset the
    setups are shared by all parameter values, for a joint preset each parameter value has its
    own. ``trajectories`` is per setup, for all types or per type.
    """

    n_params: int
    setups: dict[str, int]
    trajectories: int | dict[str, int]

    def per_setup(self, kind: str) -> int:
        """Trajectories per setup of boundary type ``kind``."""
        return self.trajectories[kind] if isinstance(self.trajectories, dict) else self.trajectories

    def __len__(self) -> int:
        return self.n_params * sum(n * self.per_setup(k) for k, n in self.setups.items())


@dataclass(frozen=True)
class Trajectory:
    """Everything that defines one trajectory of a split."""

    index: int
    param_index: int
    boundary: str
    setup: int
    seed: int
    theta: float
    face_values: tuple[float, ...]
    field_seed: int | None = None
    """Seed of the trajectory's parameter field (the advection velocity), or None. It depends on
    the preset, the split and the parameter index, so held-out fields are new fields; a
    boundary-only preset shares one field across its splits (the paper fixes it)."""


def _seed(*parts: object) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class Preset:
    """One dataset protocol.

    Attributes
    ----------
    name : str
        E.g. ``"heat-joint"``.
    family : {"heat", "advection", "burgers", "ns"}
    ndim : int
    parameter : str
        Name of the scalar parameter (``"alpha"``, ``"speed"``, ``"nu"``, ``"re"``).
    ranges : dict
        Parameter range per split, ``{"train": (lo, hi), "test": (lo, hi), ...}``.
    log_parameter : bool
        Space the parameter grid logarithmically instead of linearly (the paper's grids are
        linear; no shipped preset sets this).
    value_ranges : tuple of (lo, hi)
        Intervals the boundary data is drawn from (uniformly over their union).
    resolution : dict
        Cells per axis for each size.
    frames, frame_dt : int, float
        Output frames per trajectory (the initial condition included) and their spacing.
    plans : dict
        ``plans[size][split]`` is a `SplitPlan`.
    joint : bool
        Boundary setups drawn per parameter value (joint) or shared (boundary-only).
    fixed_parameter : float, optional
        The parameter of a boundary-only preset.
    test_value_ranges : tuple, optional
        Boundary data intervals of the test split (OOD presets).
    test_parameter_ranges : tuple of (lo, hi), optional
        Parameter intervals of the test split, its values split evenly among them (OOD
        presets: below and above the training range). Overrides ``ranges["test"]``.
    extent : float
        Side of the periodic box or square (1: the unit box). The initial fields' correlation
        lengths scale with it (`gno_ext.data.simulate.SOLVER_SETTINGS` gives them in units of
        the side).
    """

    name: str
    family: str
    ndim: int
    parameter: str
    ranges: dict[str, tuple[float, float]]
    log_parameter: bool
    value_ranges: tuple[tuple[float, float], ...]
    resolution: dict[str, int]
    frames: dict[str, int]
    frame_dt: float
    plans: dict[str, dict[str, SplitPlan]]
    joint: bool = False
    fixed_parameter: float | None = None
    test_value_ranges: tuple[tuple[float, float], ...] | None = None
    test_parameter_ranges: tuple[tuple[float, float], ...] | None = None
    extent: float = 1.0
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def grid(self, size: str) -> Grid:
        """The grid of ``size``: ``resolution[size]`` cells on every axis of the box of side ``extent``."""
        return Grid((self.resolution[size],) * self.ndim, (self.extent,) * self.ndim)

    def plan(self, size: str, split: str) -> SplitPlan:
        """The counts of ``split`` at ``size``."""
        if size not in self.plans:
            raise ValueError(f"size: expected one of {sorted(self.plans)}, got {size!r}")
        if split not in SPLITS:
            raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
        return self.plans[size][split]

    def parameter_values(self, size: str, split: str) -> np.ndarray:
        """The parameter grid of a split (linear or logarithmic)."""
        n = self.plan(size, split).n_params
        if self.fixed_parameter is not None:
            return np.full(n, self.fixed_parameter)
        if split == "test" and self.test_parameter_ranges:
            intervals = self.test_parameter_ranges
            counts = [n // len(intervals) + (k < n % len(intervals)) for k in range(len(intervals))]
            return np.concatenate([self._grid(lo, hi, m) for (lo, hi), m in zip(intervals, counts)])
        return self._grid(*self.ranges[split if split in self.ranges else "train"], n)

    def _grid(self, lo: float, hi: float, n: int) -> np.ndarray:
        if n == 1:
            return np.array([math.sqrt(lo * hi) if self.log_parameter else 0.5 * (lo + hi)])
        return np.geomspace(lo, hi, n) if self.log_parameter else np.linspace(lo, hi, n)

    def trajectories(self, size: str, split: str) -> list[Trajectory]:
        """Every trajectory of a split, in order."""
        plan = self.plan(size, split)
        thetas = self.parameter_values(size, split)
        ranges = self.test_value_ranges if (split == "test" and self.test_value_ranges) else self.value_ranges
        widths = np.array([hi - lo for lo, hi in ranges])
        out = []
        for p in range(plan.n_params):
            for kind, n_setups in plan.setups.items():
                for s in range(n_setups):
                    # joint presets draw setups per parameter value; boundary-only ones share them
                    rng = np.random.default_rng(_seed(self.name, split, p if self.joint else "-", kind, s))
                    faces = []
                    for _ in range(2 * self.ndim):
                        k = rng.choice(len(ranges), p=widths / widths.sum())
                        faces.append(float(rng.uniform(*ranges[k])))
                    values = tuple(faces) if kind != "periodic" else (0.0,) * (2 * self.ndim)
                    for t in range(plan.per_setup(kind)):
                        i = len(out)
                        out.append(Trajectory(i, p, kind, s, _seed(self.name, split, i), float(thetas[p]), values,
                                              self._field_seed(split, p)))
        return out

    def _field_seed(self, split: str, param_index: int) -> int | None:
        if self.family != "advection":
            return None
        if self.fixed_parameter is not None:  # boundary-only: one velocity field for every split
            return _seed(self.name, "velocity")
        return _seed(self.name, "velocity", split, param_index)


def _plans(smoke: tuple, small: tuple, bench: tuple, paper: tuple) -> dict[str, dict[str, SplitPlan]]:
    """Each argument: ((n_params_train, n_params_test), setups dict, (traj_train, traj_test))."""
    plans = {}
    for size, ((p_train, p_test), setups, (t_train, t_test)) in zip(SIZES, (smoke, small, bench, paper)):
        plans[size] = {"train": SplitPlan(p_train, setups, t_train),
                       "valid": SplitPlan(p_test, setups, t_test),
                       "test": SplitPlan(p_test, setups, t_test)}
    return plans


HEAT_RANGE = {"train": (0.01, 1.0), "valid": (0.01, 1.0), "test": (0.01, 1.0)}
SPEED_RANGE = {"train": (0.5, 1.5), "valid": (0.5, 1.5), "test": (0.5, 1.5)}
# OOD speeds: strictly below and strictly above the training range, half of the test fields each
OOD_SPEEDS = ((0.2, 0.45), (1.6, 2.5))
BC_ONLY = ("periodic", "dirichlet", "neumann")
BC_VALUES = ((-10.0, 10.0),)
OOD_VALUES = ((-15.0, -10.0), (10.0, 15.0))
JOINT_BENCH = ((334, 100), dict.fromkeys(BC_ONLY, 1), (1, 1))
RES = {"smoke": 16, "small": 32, "bench": 128, "paper": 128}
FRAMES = {"smoke": 6, "small": 21, "bench": 21, "paper": 21}
LONG = {"smoke": 6, "small": 41, "bench": 100, "paper": 100}  # Burgers and Navier-Stokes: 100 frames


def _family(family: str, ndim: int, parameter: str, ranges: dict, log: bool, frame_dt: float,
            fixed: float, res: dict[str, int] | None = None, frames: dict[str, int] | None = None,
            extended: bool = False) -> list[Preset]:
    res, frames = res or RES, frames or FRAMES
    counts = (501, 1001) if family == "heat" else (500, 1000)  # diffusivities, or velocity fields
    periodic = {"periodic": 1}
    bc_only = dict.fromkeys(BC_ONLY, 1)
    # Robin data is defined for diffusion only; advection gets time-dependent inflow data
    ext = {"dirichlet-time": 1, "robin": 1} if family == "heat" else {"dirichlet-time": 1}
    # bench: every training parameter value with 2 trajectories (the paper: 10), test grids of a quarter
    bench = (counts[0], counts[1] // 4)
    presets = [
        Preset(f"{family}-param", family, ndim, parameter, ranges, log, BC_VALUES, res, frames, frame_dt,
               _plans(((3, 3), periodic, (1, 1)), ((16, 32), periodic, (4, 2)), (bench, periodic, (2, 1)),
                      (counts, periodic, (10, 2)))),
        Preset(f"{family}-bc", family, ndim, parameter, ranges, log, BC_VALUES, res, frames, frame_dt,
               # paper: 100 Dirichlet and 100 Neumann setups x 10 trajectories and 1000 periodic
               # trajectories for training; valid and test: the same setups structure, 2 per setup.
               # bench: all 100 setups of each type, 3 trajectories each (test: 50 setups x 1)
               {size: {split: SplitPlan(1, {"periodic": 1, "dirichlet": d, "neumann": d},
                                        {"periodic": p, "dirichlet": k, "neumann": k})
                       for split, (p, d, k) in zip(SPLITS, counts)} for size, counts in
                (("smoke", ((2, 1, 1), (1, 1, 1), (1, 1, 1))), ("small", ((40, 8, 4), (8, 4, 2), (8, 4, 2))),
                 ("bench", ((334, 100, 3), (100, 50, 1), (100, 50, 1))), ("paper", ((1000, 100, 10), (200, 100, 2), (200, 100, 2))))},
               fixed_parameter=fixed),
        # bench: 334 parameter values (the paper: about 500), one setup of each type and one
        # trajectory each (the paper: 5 setups x 10 trajectories); test: 100 values
        Preset(f"{family}-joint", family, ndim, parameter, ranges, log, BC_VALUES, res, frames, frame_dt,
               _plans(((2, 2), bc_only, (1, 1)), ((8, 16), {k: 2 for k in bc_only}, (2, 1)), JOINT_BENCH,
                      (counts, {k: 5 for k in bc_only}, (10, 2))),
               joint=True),
    ]
    if extended:
        presets.append(Preset(f"{family}-bc-extended", family, ndim, parameter, ranges, log, BC_VALUES, res, frames,
                              frame_dt, _plans(((2, 2), ext, (1, 1)), ((8, 8), {k: 2 for k in ext}, (2, 1)),
                                               ((101, 50), {k: 1 for k in ext}, (5, 1)), ((101, 201), {k: 5 for k in ext}, (10, 2))), joint=True))
    return presets


def _burgers() -> list[Preset]:
    """Burgers on the [0, 2 pi]^2 box (the paper leaves the box open: on the unit box the test
    fields of its shifted interval all but vanish within the rollout, `recipes/burgers_oracles.py`),
    its test viscosities on the paper's shifted interval [0.01, 1] (``burgers-param``, an
    extrapolation) or on the training interval (``burgers-param-in``)."""
    train = (5e-4, 5e-2)
    # bench: 101 viscosities x 2 trajectories of 100 frames (about the windows of heat's bench)
    plans = _plans(((3, 3), {"periodic": 1}, (1, 1)), ((16, 16), {"periodic": 1}, (2, 1)),
                   ((101, 101), {"periodic": 1}, (2, 1)), ((501, 1001), {"periodic": 1}, (10, 2)))
    return [Preset(name, "burgers", 2, "nu", {"train": train, "valid": test, "test": test}, False, BC_VALUES, RES, LONG,
                   0.01, plans, extent=2 * math.pi, notes=notes)
            for name, test, notes in (
                ("burgers-param", (0.01, 1.0), "test viscosities on the paper's shifted interval [0.01, 1]: an "
                 "extrapolation above the training interval"),
                ("burgers-param-in", train, "test viscosities on the training interval [5e-4, 5e-2] (new "
                 "trajectories): the in-distribution column beside the paper's shifted one"))]


PRESETS: dict[str, Preset] = {p.name: p for p in [
    # the paper's grids are linear: alpha on [0.01, 1] and nu on [5e-4, 5e-2] "linearly spaced"
    *_family("heat", 2, "alpha", HEAT_RANGE, False, 0.005, 0.1, extended=True),
    *_family("advection", 2, "speed", SPEED_RANGE, False, 0.01, 1.0, extended=True),
    Preset("advection-ood", "advection", 2, "speed", SPEED_RANGE, False, BC_VALUES, RES, FRAMES, 0.01,
           # the joint protocol, with a test split out of distribution in speed and boundary data
           _plans(((2, 2), {k: 1 for k in BC_ONLY}, (1, 1)), ((8, 16), {k: 2 for k in BC_ONLY}, (2, 1)), JOINT_BENCH,
                  ((500, 1000), {k: 5 for k in BC_ONLY}, (10, 2))),
           joint=True, test_value_ranges=OOD_VALUES, test_parameter_ranges=OOD_SPEEDS,
           notes="test velocity fields have RMS speeds in [0.2, 0.45] or [1.6, 2.5] (training: [0.5, 1.5]), "
                 "so their Frobenius norms lie below the training minimum or above the maximum; test "
                 "Dirichlet values and Neumann fluxes lie in [-15, -10] U [10, 15] (training: [-10, 10])"),
    Preset("advection-3d", "advection", 3, "speed", SPEED_RANGE, False, BC_VALUES,
           {"smoke": 8, "small": 16, "bench": 64, "paper": 64}, FRAMES, 0.01,
           # both variations, as the 2D joint protocol: one setup of each type per velocity field
           _plans(((2, 2), {k: 1 for k in BC_ONLY}, (1, 1)), ((8, 8), {k: 1 for k in BC_ONLY}, (1, 1)),
                  ((100, 50), {k: 1 for k in BC_ONLY}, (1, 1)), ((500, 600), {k: 1 for k in BC_ONLY}, (3, 1))),
           joint=True,
           notes="the paper gives no counts for its 64^3 dataset: 500 training fields x 3 boundary types "
                 "x 3 trajectories, 600 test fields x 3 types x 1"),
    *_burgers(),
    Preset("ns-param", "ns", 2, "re", {"train": (500.0, 1000.0), "valid": (500.0, 1000.0), "test": (500.0, 1000.0)},
           False, BC_VALUES, RES, LONG, 0.1,
           _plans(((3, 3), {"periodic": 1}, (1, 1)), ((11, 21), {"periodic": 1}, (2, 1)),
                  ((101, 101), {"periodic": 1}, (2, 1)),
                  ((101, 501), {"periodic": 1}, (10, 2)))),
]}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a missing name lists the available ones."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]
