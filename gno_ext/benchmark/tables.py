"""The results tables: their definitions (``benchmarks/tables.yaml``), the runs they plan, the
result files they hold and what makes two results the same computation.

A table is a set of recipes (its columns) times rows (models, with optional overrides) times
seeds, with a budget: the dataset size of each column (``size=bench`` unless the paper's own size
is affordable) and the training overrides (epochs, batch size) that every run of the table
shares. Each run leaves one JSON file, ``benchmarks/results/<table>/<recipe>/<row>-seed<N>.json``.
The tables and their results belong to a source checkout of the project (`REPO`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
"""The checkout whose ``benchmarks/`` and ``recipes/`` the tables use."""
TABLES = REPO / "benchmarks" / "tables.yaml"
RESULTS = REPO / "benchmarks" / "results"


REQUIRED = ("table", "recipe", "model", "seed", "size", "epochs", "batch_size", "n_params", "gpu", "wall_s", "commit",
            "nmse_mean", "nmse_std", "nmse_worst_group", "rel_l2_mean", "per_step_nmse", "paper_nmse")


Check = Callable[[Any], "str | None"]
"""A check of one value read from a file: what is wrong with it, or None."""


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(test: Callable[[Any], bool], what: str) -> Check:
    return lambda v: None if test(v) else f"expected {what}, got {_short(v)}"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


NUMBER = _kind(_is_number, "a number")
POSITIVE = _kind(lambda v: _is_number(v) and math.isfinite(v) and v > 0, "a finite number above 0")  # (ratios' divisors)
INTEGER = _kind(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
TEXT = _kind(lambda v: isinstance(v, str), "text")
FLAG = _kind(lambda v: isinstance(v, bool), "true or false")


def optional(check: Check) -> Check:
    """``check``, or null."""
    return lambda v: None if v is None else check(v)


def list_of(check: Check) -> Check:
    """A list whose every item passes ``check`` (the first that does not is named by index)."""
    def checked(v: Any) -> str | None:
        if not isinstance(v, list):
            return f"expected a list, got {_short(v)}"
        return next((f"[{i}]: {why}" for i, item in enumerate(v) if (why := check(item))), None)
    return checked


def record(fields: dict[str, Check], required: tuple[str, ...] = (), closed: bool = False) -> Check:
    """A JSON object with the ``required`` keys, whose keys of ``fields`` pass their checks
    (other keys are free, or refused where ``closed``: a misspelt key)."""
    def checked(v: Any) -> str | None:
        if not isinstance(v, dict):
            return f"expected an object, got {_short(v)}"
        missing = [k for k in required if k not in v]
        if missing:
            return f"no {', '.join(missing)}"
        unknown = [str(k) for k in v if k not in fields] if closed else []
        if unknown:
            return f"unknown key(s) {', '.join(unknown)} (known: {', '.join(fields)})"
        return next((f"{k}: {why}" for k, check in fields.items() if k in v and (why := check(v[k]))), None)
    return checked


def mapping_of(check: Check, nonempty: bool = False) -> Check:
    """An object of named entries (text keys), each passing ``check`` (the first that does not
    is named)."""
    def checked(v: Any) -> str | None:
        if not isinstance(v, dict) or (nonempty and not v):
            return f"expected {'a non-empty' if nonempty else 'an'} object of named entries, got {_short(v)}"
        return next((f"{k}: {why}" for k, item in v.items()
                     if (why := "expected a text name" if not isinstance(k, str) else check(item))), None)
    return checked


GROUP = record({"group": INTEGER, "label": TEXT, "n": INTEGER, "nmse_mean": NUMBER, "rel_l2_mean": NUMBER},
               required=("label", "nmse_mean"))
TESTED = record({"epoch": INTEGER, "nmse_mean": NUMBER, "nmse_worst_group": NUMBER, "rel_l2_mean": NUMBER,
                 "train_s": NUMBER}, required=("epoch", "nmse_mean", "train_s"))
RESULT = record({
    "table": TEXT, "recipe": TEXT, "model": TEXT, "model_config": TEXT, "overrides": list_of(TEXT),
    "extra": list_of(TEXT), "seed": INTEGER, "size": TEXT, "epochs": INTEGER, "batch_size": INTEGER,
    "processes": INTEGER, "lr": NUMBER, "precision": optional(TEXT), "n_params": INTEGER, "steps": INTEGER,
    "gpu": TEXT, "wall_s": NUMBER, "commit": TEXT, "nmse_mean": POSITIVE, "nmse_std": NUMBER,
    "nmse_worst_group": GROUP, "rel_l2_mean": NUMBER, "per_step_nmse": list_of(NUMBER), "mse_mean": POSITIVE,
    "mse_std": NUMBER, "rollout_steps": INTEGER, "test_trajectories": INTEGER, "paper_nmse": optional(NUMBER),
    "groups": list_of(GROUP), "resumed": FLAG, "train_s": optional(NUMBER), "same_run_as": TEXT,
    "relabelled": TEXT, "at_epochs": list_of(TESTED),
    "dro": optional(record({"tau": NUMBER, "temperature": TEXT, "weights": TEXT, "rate": NUMBER},
                           required=("tau", "temperature"))),
    "dro_weights": list_of(record({"epoch": INTEGER, "max": NUMBER, "min": NUMBER})),
    "nmse_readings": optional(record({})), "per_trajectory": optional(record({})),
}, required=("table", "recipe", "model", "seed", "size", "epochs", "batch_size", "gpu", "commit", "nmse_mean"))
"""What the pages read of a result file: the keys they cannot do without, and the types of
every key they read (a run writes `REQUIRED` and more)."""


BUDGET = record({"size": TEXT, "sizes": mapping_of(TEXT), "overrides": list_of(TEXT)}, closed=True)
ROW = optional(record({"model": TEXT, "overrides": list_of(TEXT), "paper": list_of(optional(NUMBER))}, closed=True))
TABLE = record({"title": TEXT, "headline": FLAG, "paper_table": optional(TEXT),
                "recipes": lambda v: list_of(TEXT)(v) or (None if v else "expected at least one recipe, got []"),
                "rows": mapping_of(ROW, nonempty=True), "budget": optional(BUDGET), "worst": FLAG, "metric": TEXT,
                "needs": optional(TEXT)}, required=("title", "recipes", "rows"), closed=True)
TABLES_FILE = record({"budget": optional(BUDGET), "tables": mapping_of(TABLE, nonempty=True)}, required=("tables",),
                     closed=True)
"""What ``tables.yaml`` holds (`load_tables` refuses anything else, naming the table and key)."""


# what a table's cells show (its `metric`): the rollout's normalised MSE, or its plain MSE in the
# data's units where the paper reports that (The Well's turbulent radiative layer)
METRICS = {"nmse": "nMSE", "mse": "MSE"}


def load_tables(path: str | Path = TABLES) -> dict[str, Any]:
    """The tables of ``path``, each row completed with its model name and overrides, and each
    table with its budget (``{"size": ..., "sizes": {recipe: size}, "overrides": [...]}``,
    from the file's default ``budget`` and the table's own), its ``metric`` (`METRICS`, default
    ``nmse``) and ``needs`` (what a table of downloaded data needs before it can run, or None)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    wrong = TABLES_FILE(data)
    if wrong:
        raise ValueError(f"{path}: {wrong}")
    tables = data["tables"]
    for name, table in tables.items():
        budget = {"size": "bench", "sizes": {}, "overrides": [], **(data.get("budget") or {}), **(table.get("budget") or {})}
        unknown = sorted(set(budget["sizes"]) - set(table["recipes"]))
        if unknown:
            raise ValueError(f"{path}: table {name}: budget.sizes names {unknown}, not among its recipes {table['recipes']}")
        table["budget"] = budget
        metric = table.setdefault("metric", "nmse")
        if metric not in METRICS:
            raise ValueError(f"{path}: table {name}: metric {metric!r}, not one of {sorted(METRICS)}")
        table.setdefault("needs", None)
        table.setdefault("headline", False)
        for row, spec in table["rows"].items():
            spec = table["rows"][row] = dict(spec or {})
            spec.setdefault("model", row)
            spec.setdefault("overrides", [])
            paper = spec.setdefault("paper", [None] * len(table["recipes"]))
            if len(paper) != len(table["recipes"]):
                raise ValueError(f"{path}: table {name}, row {row}: {len(paper)} paper values for "
                                 f"{len(table['recipes'])} recipes {table['recipes']}")
    return tables


@dataclass(frozen=True)
class Run:
    """One cell of a table for one seed."""

    table: str
    recipe: str
    row: str
    model: str
    overrides: tuple[str, ...]
    seed: int
    paper_nmse: float | None
    size: str = "bench"
    budget: tuple[str, ...] = ()
    """The table's training overrides (epochs, batch size), the same for every run of it."""

    def path(self, results: Path = RESULTS) -> Path:
        return results / self.table / self.recipe / f"{self.row}-seed{self.seed}.json"


def plan(tables: dict[str, Any], table: str, seeds: list[int], recipes: list[str] | None = None,
         rows: list[str] | None = None, size: str | None = None) -> list[Run]:
    """Every run of ``table`` (optionally a subset of its recipes and rows), at the sizes of the
    table's budget or at ``size``."""
    if table not in tables:
        raise SystemExit(f"--table {table!r}: unknown; available: {', '.join(tables)}")
    spec = tables[table]
    for kind, chosen, known in (("recipe", recipes, spec["recipes"]), ("row", rows, list(spec["rows"]))):
        unknown = sorted(set(chosen or []) - set(known))
        if unknown:
            raise SystemExit(f"table {table}: no {kind} {unknown}; it has {known}")
    out, budget = [], spec["budget"]
    for column, recipe in enumerate(spec["recipes"]):
        if recipes and recipe not in recipes:
            continue
        for row, r in spec["rows"].items():
            if rows and row not in rows:
                continue
            for seed in seeds:
                out.append(Run(table, recipe, row, r["model"], tuple(r["overrides"]), seed, r["paper"][column],
                               size or budget["sizes"].get(recipe, budget["size"]), tuple(budget["overrides"])))
    return out


def merge_overrides(budget: tuple[str, ...] | list[str], extra: list[str]) -> list[str]:
    """The budget's overrides with those of ``extra`` replacing any of the same key, then the rest
    of ``extra``."""
    key = lambda o: o.lstrip("+~").split("=", 1)[0]
    given = {key(o) for o in extra}
    return [o for o in budget if key(o) not in given] + list(extra)


def load_results(results: Path, name: str, table: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The result files of table ``name`` that hold what their place says (a recipe and a row of
    the table, the table, recipe, row and seed of their path), and a line for each file left out,
    naming it and why (a file of another table or seed copied here, a file that is not a result,
    JSON that does not parse)."""
    found, left_out = [], []
    for path in sorted((results / name).glob("*/*.json")):
        shown = path.relative_to(results.parent) if results.parent in path.parents else path
        try:
            result = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            left_out.append(f"`{shown}` (not JSON: {error})")
            continue
        wrong = RESULT(result)
        why = (f"not a result file: {wrong}" if wrong else
               misplaced(path, result) or
               (f"recipe {path.parent.name!r} is not a column of the table" if path.parent.name not in table["recipes"]
                else f"row {result['model']!r} is not a row of the table" if result["model"] not in table["rows"]
                else None))
        if why:
            left_out.append(f"`{shown}` ({why})")
        else:
            found.append(result)
    return found, left_out


def misplaced(path: Path, result: dict[str, Any]) -> str | None:
    """Why the result file ``path`` (under ``results/TABLE/RECIPE/ROW-seedN.json``) does not hold
    what its place says, or None: its table, recipe, row or seed differ from the path's."""
    table, recipe = path.parent.parent.name, path.parent.name
    row, _, seed = path.stem.rpartition("-seed")
    said = {"table": table, "recipe": recipe, "model": row, "seed": seed}
    held = {k: str(result.get(k)) for k in said}
    diff = [f"{k} {held[k]!r}" for k in said if held[k] != said[k]]
    return f"it holds {', '.join(diff)}" if diff else None


# Overrides that change how fast a run goes or what it prints, never what it computes: left out
# of the budget that a table states (a row may need capture off where its step cannot be captured).
NOT_BUDGET = ("trainer.compile", "trainer.capture", "trainer.progress", "trainer.num_workers", "trainer.tensorboard",
              "trainer.grad_sync", "trainer.compile_options", "data.in_memory", "data.root", "eval.figures",
              "eval.batch_size", "trainer.val_batch_size", "model.kwargs.checkpoint_blocks")


def computing_overrides(overrides: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The overrides that change what a run computes (those not in `NOT_BUDGET`)."""
    return tuple(o for o in overrides if not o.lstrip("+~").startswith(NOT_BUDGET))


def _without_dro(overrides: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(o for o in overrides if not o.lstrip("+").startswith("trainer.dro."))


DRO = tuple[float, str, str, float | None]
"""A run's DRO objective: ``(tau, temperature, weights, rate)``, the rate None unless the weights
are ``running`` (`gno_ext.training.settings.DROSettings`)."""


def _dro_key(overrides: list[str], dro: DRO) -> DRO | None:
    """``dro``, or None where the curriculum never reaches DRO (its MSE phase takes every epoch:
    the objective's settings change nothing)."""
    fractions = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("trainer.curriculum.warmup_fraction=")]
    return None if fractions and float(fractions[-1]) >= 1 else dro


PAPER_DRO: DRO = (1.0, "absolute", "batch", None)
"""The DRO of results that record none: the paper's formula with tau = 1 over the batch's
groups, the training default until the relative temperature replaced it."""


def _dro(tau: float, temperature: str, weights: str, rate: float) -> DRO:
    return (float(tau), temperature, weights, float(rate) if weights == "running" else None)


def dro_of_result(result: dict[str, Any]) -> DRO:
    """The DRO objective a result was trained with (`DRO`; a result from before the running
    weights recorded none: the batch's)."""
    dro = result.get("dro")
    return _dro(dro["tau"], dro["temperature"], dro.get("weights", "batch"), dro.get("rate", 0.1)) if dro else PAPER_DRO


def dro_of_overrides(overrides: list[str] | tuple[str, ...]) -> DRO:
    """The DRO objective a run with ``overrides`` trains with (the last override of a key wins;
    the training defaults otherwise)."""
    from gno_ext.training.settings import DROSettings

    given = dict(o.lstrip("+").split("=", 1) for o in overrides if o.lstrip("+").startswith("trainer.dro."))
    default = DROSettings()
    return _dro(given.get("trainer.dro.tau", default.tau), given.get("trainer.dro.temperature", default.temperature),
                given.get("trainer.dro.weights", default.weights), given.get("trainer.dro.rate", default.rate))


def budget_of(result: dict[str, Any]) -> tuple | None:
    """What every run of a table must share: size, epochs, batch size, learning rate, the
    overrides that change the computation (the DRO temperature aside: a table states its own
    objective, and rows may set theirs), and the precision (None for an untrained reference,
    which has no budget)."""
    if result.get("steps", 1) == 0:
        return None
    return (result["size"], result["epochs"], result["batch_size"], result.get("lr"),
            _without_dro(computing_overrides(result.get("extra", []))), result.get("precision"))


def budget_difference(run: Run, extra: list[str], result: dict[str, Any]) -> str | None:
    """What differs between the computation ``run`` (with the command's ``extra`` overrides)
    asks for and the one ``result`` records: the size, the model config, the row's overrides,
    the overrides that change the computation, the DRO temperature; None where they agree (the
    result is this run's)."""
    budget = merge_overrides(run.budget, extra)
    wanted = {"size": run.size, "model config": run.model, "row overrides": _without_dro(computing_overrides(run.overrides)),
              "overrides": _without_dro(computing_overrides(budget)),
              "DRO": _dro_key([*budget, *run.overrides], dro_of_overrides([*budget, *run.overrides]))}
    found = {"size": result.get("size"), "model config": result.get("model_config", result.get("model")),
             "row overrides": _without_dro(computing_overrides(result.get("overrides", ()))),
             "overrides": _without_dro(computing_overrides(result.get("extra", []))),
             "DRO": _dro_key([*result.get("extra", []), *result.get("overrides", [])], dro_of_result(result))}
    diff = [f"{k} {found[k]!r} where this run has {wanted[k]!r}" for k in wanted if found[k] != wanted[k]]
    return "; ".join(diff) or None


def same_run(run: Run, extra: list[str], results: Path = RESULTS) -> Path | None:
    """A result of another table that is this run: the same recipe, model config, row overrides,
    seed, size, computing overrides and DRO temperature, however set (the ablation's full GNO is
    the joint table's GNO; a row that sets the paper's temperature is a result that predates the
    setting), itself trained rather than taken from a third table (`budget_difference` finds
    nothing between them). None if there is none."""
    pattern = f"*/{run.recipe}/*-seed{run.seed}.json"
    # (a file another table's refresh has moved aside for its rerun is that run still: `read_result`)
    paths = {*results.glob(pattern), *(p.with_suffix("") for p in results.glob(pattern + ASIDE))}
    for path in sorted(paths):
        if path.parent.parent.name == run.table:
            continue
        other = read_result(path)
        if other is None or other.get("same_run_as"):  # itself taken from another table: name the original
            continue
        if other.get("seed") == run.seed and budget_difference(run, extra, other) is None:
            return path
    return None


def objective_text(table: dict[str, Any]) -> str:
    """The objective a table's budget trains with, in words."""
    tau, temperature, weights, rate = dro_of_overrides(table["budget"]["overrides"])
    if weights == "running":
        return (f"the curriculum's group DRO weighing each group by its running loss across batches (tau = {tau:g}"
                f"{' relative to the mean group loss' if temperature == 'relative' else ''}, rate {rate:g})")
    if temperature == "absolute":
        return (f"the curriculum's group DRO as the paper writes it, tau = {tau:g} on the loss (at these losses "
                "the plain mean: in effect MSE throughout)")
    return f"the curriculum's group DRO at tau = {tau:g} relative to the mean group loss"


ASIDE = ".stale"  # the ending of a result file set aside while its cell runs again


def aside(path: Path) -> Path:
    """Where ``benchmark.py run --refresh-*`` keeps the result file ``path`` while its cell runs
    again: ``<cell>.json.stale``."""
    return path.with_name(path.name + ASIDE)


def read_result(path: Path) -> dict[str, Any] | None:
    """The result file ``path``, read where another table's refresh may be running in the same
    results folder: ``benchmark.py run --refresh-*`` moves a stale file aside (``.json.stale``,
    the same computation without the newer readings) while its cell runs again, and back if the
    run fails. That aside file is read in its place; None where neither exists."""
    for candidate in (path, aside(path), path):  # (the last: moved back between the two)
        try:
            return json.loads(candidate.read_text())
        except FileNotFoundError:
            continue
    return None


def adopt(run: Run, source: Path, results: Path = RESULTS) -> Path:
    """Write ``source`` (`same_run`) as ``run``'s result: the same figures, this table's name, row
    and paper value, and ``same_run_as`` naming the file it came from."""
    result = read_result(source)
    if result is None:
        raise FileNotFoundError(f"{source}: the result to take for {run.table}/{run.recipe}/{run.row}-seed{run.seed} "
                                "is gone")
    result.update(table=run.table, model=run.row, paper_nmse=run.paper_nmse,
                  same_run_as=str(source.relative_to(results)))
    return write_result(run.path(results), result)


def write_result(target: Path, result: dict[str, Any]) -> Path:
    """Write a result file whole or not at all (a temporary name, then renamed)."""
    from gno_ext._files import write_json

    return write_json(target, result)


def _values(found: list[dict[str, Any]], metric: str, recipe: str, row: str) -> list[float]:
    """The ``metric`` of every seed of one cell (a result without it, as one written before the
    metric was recorded, is left out)."""
    return [r[f"{metric}_mean"] for r in found if r["recipe"] == recipe and r["model"] == row
            and r.get(f"{metric}_mean") is not None]


def _ranked(found: list[dict[str, Any]], recipe: str, metric: str = "nmse") -> list[tuple[str, list[dict[str, Any]]]]:
    """The column's rows as (row, its results), best mean of ``metric`` first; `persistence`
    apart (last)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for r in found:
        if r["recipe"] == recipe:
            rows.setdefault(r["model"], []).append(r)

    def mean(rs: list[dict[str, Any]]) -> float:
        values = _values(rs, metric, recipe, rs[0]["model"])
        return sum(values) / len(values) if values else math.inf

    trained = sorted(((m, rs) for m, rs in rows.items() if m != "persistence"), key=lambda x: mean(x[1]))
    return trained + [(m, rs) for m, rs in rows.items() if m == "persistence"]


READING_NAMES = ("per_trajectory", "pooled", "per_step", "per_channel")
"""The readings of the nMSE a result keeps in ``nmse_readings``
(`gno_ext.training.evaluate.readings`)."""


def has_readings(result: dict[str, Any]) -> bool:
    """Whether a result keeps every reading of the nMSE (``nmse_readings``, `READING_NAMES`) and
    each trajectory's value (``per_trajectory``): the runs made before they were recorded do
    not, nor the mesh runs made before their pooled and per-channel readings were."""
    kept = result.get("nmse_readings")
    return isinstance(kept, dict) and all(name in kept for name in READING_NAMES) and "per_trajectory" in result


def ranked_values(found: list[dict[str, Any]], recipe: str, metric: str = "nmse") -> list[tuple[str, list[float]]]:
    """The column's trained rows that hold a value of ``metric``, each with its values (one per
    seed), lowest mean first; `persistence` left out."""
    ranked = [(r, _values(rs, metric, recipe, r)) for r, rs in _ranked(found, recipe, metric) if r != "persistence"]
    return [(r, v) for r, v in ranked if v]


def _shown(found: list[dict[str, Any]], recipe: str, metric: str = "nmse") -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows a column's figures show: the paper's GNO, the two best other trained rows,
    persistence. The GNO's and persistence's rows are those of their name or, where a table names
    them otherwise (``gno_from50``), its one row of that model config."""
    ranked = _ranked(found, recipe, metric)

    def row_of(config: str) -> str | None:
        if any(row == config for row, _ in ranked):
            return config
        named = [row for row, rs in ranked if rs[0].get("model_config") == config]
        return named[0] if len(named) == 1 else None

    gno, persistence = row_of("gno"), row_of("persistence")
    others = [x for x in ranked if x[0] not in (gno, persistence)][:2]
    return [x for x in ranked if x[0] == gno] + others + [x for x in ranked if x[0] == persistence]


def grouped_rows(shown: list[tuple[str, list[dict[str, Any]]]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Of a column's shown rows (`_shown`), those whose every seed records its error per group:
    none where only persistence does (the reference alone compares nothing)."""
    grouped = [(row, rs) for row, rs in shown if all(r.get("groups") for r in rs)]
    return grouped if any(rs[0].get("model_config", row) != "persistence" for row, rs in grouped) else []


def _tested(found: list[dict[str, Any]], recipe: str, row: str, epoch: int) -> list[dict[str, Any]]:
    """The test rollouts after ``epoch`` of every seed of one cell (``eval.at_epochs``)."""
    return [e for r in found if r["recipe"] == recipe and r["model"] == row for e in r.get("at_epochs") or []
            if e["epoch"] == epoch]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _cell(values: list[float]) -> str:
    if not values:
        return "—"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.2e}"
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:.2e} ± {std:.1e}"
