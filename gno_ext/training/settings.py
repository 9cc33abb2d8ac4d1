r"""The training loop's settings: one typed definition of every key it reads, with its default,
checked once when a run starts.

`Settings.from_config` reads the ``trainer`` and ``optimizer`` sections of a recipe's
configuration (and the loss weights of its ``model`` section) into frozen dataclasses. A key
that is absent takes the default written here; a value of the wrong type, out of its range or
not among its choices raises a `ValueError` that names the key (``trainer.dro.tau: expected a
number above 0, got 0``), and so does a key that is not a setting. The check runs before any
data is generated, any model trained or any run folder replaced: many bad values would
otherwise fail late or train wrongly without a word (a negative clipping norm reverses the
gradients, ``trainer.dro.tau=inf`` gives a NaN loss).

``recipes/conf/trainer/default.yaml`` and ``recipes/conf/optimizer/adamw.yaml`` list the same
keys with the same defaults, with comments for users; a test holds them equal to these
classes.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, get_type_hints

__all__ = ["CurriculumSettings", "DROSettings", "DataSettings", "EMASettings", "EvalSettings", "OptimizerSettings",
           "Settings", "TrainerSettings", "defaults"]


@dataclass(frozen=True)
class Number:
    """A numeric setting's rule: at least ``low`` (``"> 0"``: above zero), at most ``high``, an
    integer where ``integer``, null allowed where ``nullable``."""

    low: float | str = -math.inf
    high: float = math.inf
    integer: bool = False
    nullable: bool = False


@dataclass(frozen=True)
class Choice:
    """A setting that takes one of ``choices``."""

    choices: tuple[Any, ...]

    def __init__(self, *choices: Any) -> None:
        object.__setattr__(self, "choices", choices)


@dataclass(frozen=True)
class Flag:
    """A setting that is true or false."""


@dataclass(frozen=True)
class Text:
    """A setting that is text or null."""


@dataclass(frozen=True)
class Items:
    """A setting that is a list of ``kind`` ("flag": true or false; "name": text), null allowed
    where ``nullable``; read as a tuple."""

    kind: str
    nullable: bool = False


@dataclass(frozen=True)
class Proportions:
    """A setting that is one number >= 0 per name of ``names``, not all zero (fractions, or
    counts: each is read as its share of their sum); read as a tuple of floats."""

    names: tuple[str, ...]

    def __init__(self, *names: str) -> None:
        object.__setattr__(self, "names", names)


RULES = (Number, Choice, Flag, Text, Items, Proportions)
ITEMS = {"flag": (bool, "true or false"), "name": (str, "names")}


@dataclass(frozen=True)
class EMASettings:
    """``trainer.ema``: an exponential moving average of the weights, evaluated at the end."""

    enabled: Annotated[bool, Flag()] = False
    decay: Annotated[float, Number(0, 1)] = 0.999


@dataclass(frozen=True)
class CurriculumSettings:
    """``trainer.curriculum``: plain MSE for the first ``P`` epochs, then group DRO (the paper's
    Algorithm 1); batches of one boundary configuration each, visited in ``order``."""

    warmup_fraction: Annotated[float, Number(0, 1)] = 0.7  # P as a fraction of the epochs (the paper: 70 of 100)
    warmup_epochs: Annotated[int | None, Number(0, integer=True, nullable=True)] = None  # P in epochs, where set
    order: Annotated[str, Choice("interleave", "sequential")] = "interleave"


@dataclass(frozen=True)
class DROSettings:
    """``trainer.dro``: the log-sum-exp temperature, how it is read (``relative``: in units of the
    inverse mean group loss, scale-free; ``absolute``: the paper's formula as written), which
    group losses weigh the groups (``batch``: the batch's; ``running``: every group's running
    loss across batches, moved by ``rate`` per batch; `gno_ext.losses.DRO_WEIGHTS`) and the
    bins per parameter of the groups."""

    tau: Annotated[float, Number("> 0")] = 1.0
    temperature: Annotated[str, Choice("absolute", "relative")] = "absolute"
    weights: Annotated[str, Choice("batch", "running")] = "batch"
    rate: Annotated[float, Number("> 0", 1)] = 0.1
    bins: Annotated[int, Number(1, integer=True)] = 8


@dataclass(frozen=True)
class TrainerSettings:
    """``trainer``: the loop, its precision and its speed settings."""

    epochs: Annotated[int, Number(1, integer=True)] = 30
    batch_size: Annotated[int, Number(1, integer=True)] = 32  # per process
    grad_accum: Annotated[int, Number(1, integer=True)] = 1
    precision: Annotated[str, Choice("auto", "bf16", "fp16", "no")] = "auto"
    device: Annotated[str, Choice("auto", "cpu")] = "auto"  # GPUs are chosen by the launcher
    clip_grad: Annotated[float | None, Number("> 0", nullable=True)] = 1.0  # maximum gradient norm
    flat_parameters: Annotated[bool, Flag()] = True
    ema: EMASettings = field(default_factory=EMASettings)
    curriculum: CurriculumSettings = field(default_factory=CurriculumSettings)
    dro: DROSettings = field(default_factory=DROSettings)
    loss_normalization: Annotated[bool, Flag()] = True
    max_nonfinite: Annotated[int, Number(1, integer=True)] = 5
    checkpoint_every: Annotated[int | None, Number(0, integer=True, nullable=True)] = 0  # 0 or null: every epoch's end
    keep_checkpoints: Annotated[int, Number(0, integer=True)] = 3
    log_every: Annotated[int, Number(1, integer=True)] = 10
    val_every: Annotated[int, Number(1, integer=True)] = 1
    val_batches: Annotated[int, Number(0, integer=True)] = 4
    val_batch_size: Annotated[int | None, Number(1, integer=True, nullable=True)] = None  # null: batch_size
    max_steps: Annotated[int | None, Number(1, integer=True, nullable=True)] = None
    num_workers: Annotated[int, Number(0, integer=True)] = 0
    cpu_threads: Annotated[int | None, Number(1, integer=True, nullable=True)] = None  # null: the free cores (CPU runs)
    compile: bool | str = False  # false | true | a torch.compile mode (checked by compile_model)
    capture: Annotated[bool, Flag()] = False
    grad_sync: Annotated[str, Choice("auto", "ddp", "flat")] = "auto"
    compile_options: Mapping[str, Any] = field(default_factory=lambda: {"combo_kernels": False})
    compile_cache: str = "auto"  # auto | off | a folder (checked by gno_ext.training.setup.compile_cache_dir)
    dist_timeout_minutes: Annotated[float, Number("> 0")] = 120
    find_unused_parameters: Annotated[bool | str, Choice("auto", True, False)] = "auto"
    tensorboard: Annotated[bool, Flag()] = True
    progress: Annotated[bool, Flag()] = True


@dataclass(frozen=True)
class OptimizerSettings:
    """``optimizer``: AdamW with a cosine (or constant) schedule after a linear warm-up."""

    name: Annotated[str, Choice("adamw")] = "adamw"
    lr: Annotated[float, Number(0)] = 1.0e-3
    weight_decay: Annotated[float, Number(0)] = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Annotated[str, Choice("cosine", "constant")] = "cosine"
    warmup_fraction: Annotated[float, Number(0, 1)] = 0.05  # of all optimizer steps
    min_lr_ratio: Annotated[float, Number(0, 1)] = 0.01  # final learning rate / lr


@dataclass(frozen=True)
class EvalSettings:
    """The ``eval`` section: the test rollouts at the end of training (and after
    ``at_epochs``), checked before training so that a bad value does not fail after it."""

    enabled: Annotated[bool, Flag()] = True
    split: Annotated[str, Choice("test", "valid", "train")] = "test"
    steps: Annotated[int, Number(1, integer=True)] = 10
    start_frame: Annotated[int, Number(0, integer=True)] = 0
    batch_size: Annotated[int, Number(1, integer=True)] = 16
    max_trajectories: Annotated[int | None, Number(1, integer=True, nullable=True)] = None
    figures: Annotated[int, Number(0, integer=True)] = 3
    at_epochs: tuple[int, ...] = ()  # checked against trainer.epochs (`gno_ext.training.loop.test_epochs`)


@dataclass(frozen=True)
class DataSettings:
    """The ``data`` section (``recipes/conf/data/*.yaml``): which source (``kind``) and its
    settings, checked before anything is generated or read. Each source reads the settings of
    its own (`gno_ext.training.recipe_data.SOURCES`); the others keep their defaults."""

    kind: Annotated[str, Choice("generated", "mesh", "the_well", "pdebench", "custom")] = "generated"
    root: Annotated[str | None, Text()] = None  # a folder (or the custom file); generated and mesh: default the cache
    n_steps_input: Annotated[int, Number(1, integer=True)] = 1
    # per-parameter log-scale flags (null: from the data)
    log_params: Annotated[tuple[bool, ...] | None, Items("flag", nullable=True)] = None
    preset: Annotated[str | None, Text()] = None  # generated: the preset (gno_ext.data.presets)
    size: Annotated[str | None, Choice("smoke", "small", "bench", "paper", None)] = None  # generated and mesh
    device: Annotated[str | None, Text()] = None  # generated: generation device (null: cuda when available)
    in_memory: Annotated[bool | str, Choice("auto", True, False)] = "auto"  # generated
    in_memory_limit_gb: Annotated[float, Number("> 0")] = 4.0  # generated
    pde: Annotated[str, Choice("heat", "advection")] = "heat"  # mesh
    domains: Annotated[tuple[str, ...], Items("name")] = ()  # mesh (checked by gno_ext.data.mesh.prepare_mesh)
    seed: Annotated[int, Number(0, integer=True)] = 0  # mesh: the datasets' draws
    name: Annotated[str | None, Text()] = None  # the_well: the dataset's name
    normalize: Annotated[bool, Flag()] = False  # the_well
    reader: Annotated[str, Choice("h5py", "the_well")] = "h5py"  # the_well
    pattern: Annotated[str | None, Text()] = None  # pdebench: the files' glob pattern
    boundary: Annotated[str | None, Text()] = None  # pdebench: the boundary type where the file names do not say
    # pdebench: which parameters form theta
    parameters: Annotated[tuple[str, ...] | None, Items("name", nullable=True)] = None
    # custom: the split of one file's trajectories in consecutive blocks (of their sum)
    split_fractions: Annotated[tuple[float, float, float], Proportions("train", "valid", "test")] = (0.8, 0.1, 0.1)


@dataclass(frozen=True)
class Settings:
    """Everything the training loop reads from a recipe's configuration besides the model's own
    arguments and the run folder.

    Attributes
    ----------
    trainer : TrainerSettings
    optimizer : OptimizerSettings
    eval : EvalSettings
    data : DataSettings
    seed : int
        The run's seed (an integer >= 0: ``seed=1.7`` would train with seed 1 in a folder named
        ``seed1.7``).
    balance_weight : float
        ``model.balance_weight``: weight of the gates' load-balance term in the loss.
    physics_weight : float
        ``model.physics_weight``: weight of a physics-informed model's residual term.
    """

    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    data: DataSettings = field(default_factory=DataSettings)
    seed: Annotated[int, Number(0, integer=True)] = 0
    balance_weight: Annotated[float, Number(0)] = 0.0
    physics_weight: Annotated[float, Number(0)] = 0.0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Settings:
        """The settings of a resolved recipe configuration (a mapping with ``trainer``,
        ``optimizer``, ``eval``, ``data`` and ``model`` sections; absent keys take their
        defaults), checked."""
        model = cfg.get("model") or {}
        weights = {k: model[k] for k in ("balance_weight", "physics_weight") if k in model}
        top = {"seed": _checked(cls, _field(cls, "seed"), cfg["seed"], "seed")} if "seed" in cfg else {}
        return cls(trainer=_read(TrainerSettings, cfg.get("trainer") or {}, "trainer."),
                   optimizer=_read(OptimizerSettings, cfg.get("optimizer") or {}, "optimizer."),
                   eval=_read(EvalSettings, cfg.get("eval") or {}, "eval."),
                   data=_read(DataSettings, cfg.get("data") or {}, "data."), **top,
                   **{k: _checked(cls, _field(cls, k), v, f"model.{k}") for k, v in weights.items()})

    @property
    def warmup_epochs(self) -> int:
        """The epochs of plain MSE before group DRO: ``trainer.curriculum.warmup_epochs``, or
        ``warmup_fraction`` of the epochs (rounded) where it is null."""
        curriculum = self.trainer.curriculum
        if curriculum.warmup_epochs is not None:
            return curriculum.warmup_epochs
        return int(round(curriculum.warmup_fraction * self.trainer.epochs))


def defaults(cls: type) -> dict[str, Any]:
    """A settings class's defaults as a nested mapping (the form of the recipes' YAML)."""
    return {f.name: defaults(_NESTED[cls, f.name]) if (cls, f.name) in _NESTED else _default(f)
            for f in dataclasses.fields(cls)}


def _default(f: dataclasses.Field) -> Any:
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value


_NESTED = {(TrainerSettings, "ema"): EMASettings, (TrainerSettings, "curriculum"): CurriculumSettings,
           (TrainerSettings, "dro"): DROSettings}


def _field(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def _read(cls: type, section: Mapping[str, Any], prefix: str) -> Any:
    """An instance of the settings class ``cls`` from ``section``, every value checked."""
    if not isinstance(section, Mapping):
        raise ValueError(f"{prefix[:-1]}: expected a mapping of settings, got {section!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    for key in section:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {prefix}{close[0]}?" if close else f"; the settings are {', '.join(names)}"
            raise ValueError(f"{prefix}{key}: no such setting{hint}")
    values = {}
    for f in dataclasses.fields(cls):
        nested = _NESTED.get((cls, f.name))
        if nested is not None:
            values[f.name] = _read(nested, section.get(f.name) or {}, f"{prefix}{f.name}.")
        elif f.name in section:
            values[f.name] = _checked(cls, f, section[f.name], prefix + f.name)
    return cls(**values)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The annotations of ``cls``, rules included, evaluated once per class."""
    return get_type_hints(cls, include_extras=True)


def _rule(cls: type, name: str) -> Any:
    """The rule (one of `RULES`) that the field ``name`` of ``cls`` carries in its annotation,
    or None."""
    hint = _hints(cls)[name]
    return next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, RULES)), None)


def _checked(cls: type, f: dataclasses.Field, value: Any, key: str) -> Any:
    """``value`` of the field ``f`` of ``cls`` (the dotted ``key`` in messages), checked and
    converted."""
    rule = _rule(cls, f.name)
    if isinstance(rule, Number):
        low, high, integer, nullable = rule.low, rule.high, rule.integer, rule.nullable
        if value is None and nullable:
            return None
        wanted = "an integer" if integer else "a number"
        bounds = "above 0" if low == "> 0" else f"in [{low}, {high}]" if high < math.inf else f">= {low}"
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or (integer and value != int(value)) or value > high \
                or (value <= 0 if low == "> 0" else value < low):
            raise ValueError(f"{key}: expected {wanted} {bounds}{' or null' if nullable else ''}, got {value!r}")
        return int(value) if integer else float(value)
    if isinstance(rule, Choice):
        choices = rule.choices
        if not any(value == c and type(value) is type(c) for c in choices):
            shown = ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)
            raise ValueError(f"{key}: expected one of {shown}, got {value!r}")
        return value
    if isinstance(rule, Flag):
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true or false, got {value!r}")
        return value
    if f.name == "betas":
        if not (isinstance(value, (list, tuple)) and len(value) == 2
                and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in value)):
            raise ValueError(f"{key}: expected two numbers in [0, 1), got {value!r}")
        return tuple(float(b) for b in value)
    if f.name == "compile_options":
        if not isinstance(value, Mapping):
            raise ValueError(f"{key}: expected a mapping of inductor options, got {value!r}")
        return dict(value)
    if isinstance(rule, Text):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{key}: expected text or null, got {value!r}")
        return value
    if isinstance(rule, (Items, Proportions)):
        return _items(rule, value, key)
    if f.name == "compile":
        if not isinstance(value, (bool, str)):
            raise ValueError(f"{key}: expected true, false or a torch.compile mode, got {value!r}")
        return value
    return value


def _items(rule: Items | Proportions, value: Any, key: str) -> tuple[Any, ...] | None:
    """``value`` of a list setting (`Items`, `Proportions`), checked, as a tuple."""
    nullable = isinstance(rule, Items) and rule.nullable
    if value is None and nullable:
        return None
    kind, what = ITEMS[rule.kind] if isinstance(rule, Items) else ((int, float), "numbers")
    items = list(value) if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(v, kind) and (kind is bool or not isinstance(v, bool)) for v in items):
        raise ValueError(f"{key}: expected a list of {what}{' or null' if nullable else ''}, got {value!r}")
    if isinstance(rule, Proportions):
        n = len(rule.names)
        if len(items) != n or min(items) < 0 or sum(items) <= 0:
            raise ValueError(f"{key}: expected {_COUNTS.get(n, n)} proportions >= 0 ({', '.join(rule.names)}; of their "
                             f"sum), got {value!r}")
        return tuple(float(v) for v in items)
    return tuple(items)


_COUNTS = {2: "two", 3: "three", 4: "four"}
