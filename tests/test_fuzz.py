"""Malformed inputs, generated at random, into the readers a user points at files: the dataset
adapters (every published layout and our own), the results pages (``render``: result files,
runtime files, ``tables.yaml``). Each case must end either well (the input was still valid) or
in one of the project's own errors, a one-line message that names the file; never another
exception (a `TypeError`, an `IndexError`, h5py's or numpy's own error) and never a hang.

The cases are drawn from fixed seeds, so a failure reproduces: the test's id names the seed."""

from __future__ import annotations

import json
import math
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml

from gno_ext.adapters import open_dataset
from gno_ext.adapters.fixtures import (
    write_pdebench_cfd,
    write_pdebench_seeds,
    write_pdebench_tensor,
    write_trl_dataset,
)

OWN_ERRORS = (ValueError, FileNotFoundError, KeyError)
REPO = Path(__file__).resolve().parents[1]
CASES = 60  # per source (400 per source passed when the test was last changed)


# ---------------------------------------------------------------- malformed HDF5 files

def _datasets(f: h5py.File) -> list[str]:
    found: list[str] = []
    f.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) else None)
    return found


def _objects(f: h5py.File) -> list[Any]:
    found: list[Any] = [f]
    f.visititems(lambda name, obj: found.append(obj))
    return found


def _garbage(rng: random.Random, shape: tuple[int, ...]) -> Any:
    """A value of another type or shape than a dataset's ``shape``."""
    choice = rng.randrange(7)
    if choice == 0:
        return np.zeros(shape, dtype=np.complex64) + 1j
    if choice == 1:
        return np.full(shape, 7, dtype=np.int16)
    if choice == 2:
        return np.array([b"text"] * max(1, math.prod(shape[:1])))
    if choice == 3:
        return np.zeros(shape[:-1] if len(shape) > 1 else (), dtype=np.float32)  # a dimension fewer
    if choice == 4:
        return np.zeros((*shape, 2), dtype=np.float32)  # a dimension more
    if choice == 5:
        return np.zeros(tuple(max(0, s - 1) if i == 0 else s for i, s in enumerate(shape)) or (0,), dtype=np.float32)
    return np.zeros(tuple(s + 1 for s in shape) or (3,), dtype=np.float64)


def _attribute_garbage(rng: random.Random) -> Any:
    return rng.choice(["x", -1, 0, 1e300, np.array([1.5, 2.5]), np.array([], dtype=np.float32), np.nan,
                       np.array(["a", "b"], dtype=h5py.string_dtype())])


def mutate_h5(path: Path, rng: random.Random) -> str:
    """Damage the HDF5 file ``path`` one way at random; returns what was done."""
    kind = rng.choice(["drop", "replace", "replace", "attr_drop", "attr_set", "truncate", "empty"])
    if kind == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[:rng.randrange(len(data))])
        return "truncated"
    if kind == "empty":
        path.write_bytes(b"")
        return "emptied"
    with h5py.File(path, "r+") as f:
        names = _datasets(f)
        if kind in ("drop", "replace") and names:
            name = rng.choice(names)
            shape = f[name].shape
            del f[name]
            if kind == "drop":
                return f"dropped {name}"
            f[name] = _garbage(rng, shape)
            return f"replaced {name} {shape} by {f[name].dtype}{f[name].shape}"
        holders = [o for o in _objects(f) if len(o.attrs)] or [f]
        obj = rng.choice(holders)
        attrs = list(obj.attrs)
        if kind == "attr_drop" and attrs:
            key = rng.choice(attrs)
            del obj.attrs[key]
            return f"dropped attribute {obj.name}:{key}"
        key = rng.choice(attrs) if attrs else "extent"
        obj.attrs[key] = _attribute_garbage(rng)
        return f"set attribute {obj.name}:{key} to {obj.attrs[key]!r}"


def _read(ds: Any) -> None:
    """What training and evaluation read of a dataset: its length, windows at both ends, its
    trajectories' parameters, boundary kinds and rollout starts."""
    n = len(ds)
    for i in {0, max(n - 1, 0)} if n else ():
        ds[i]
    for method in ("parameter_values", "window_boundary_kinds", "rollout_indices", "trajectory_lengths"):
        if hasattr(ds, method):
            getattr(ds, method)()


def _custom(folder: Path) -> Path:
    path = folder / "runs.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["u"] = rng.standard_normal((3, 5, 1, 8, 8)).astype(np.float32)
        f["theta"] = rng.random((3, 2)).astype(np.float32)
        f["bc_kind"] = np.array([1, 1, 2, 2], dtype=np.int64)
        f["bc_values"] = np.zeros((4, 1, 8), dtype=np.float32)
        f["group"] = np.arange(3)
        f.attrs["extent"] = np.array([1.0, 2.0])
        f.attrs["dt"] = 0.1
    return path


def _pdebench(writer: Callable[[Path], Any], name: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / name
        writer(path)
        return path
    return make


def _the_well(folder: Path) -> Path:
    base = write_trl_dataset(folder / "well", {"train": (0.03, 0.1)}, n=2, t=6, shape=(16, 32))
    files = sorted((base / "datasets" / "turbulent_radiative_layer_2D" / "data" / "train").glob("*.hdf5"))
    return files[-1]


def _mesh(folder: Path) -> Path:
    from gno_ext.data.mesh import generate_heat_mesh

    path = folder / "train.h5"
    generate_heat_mesh(path, 2, domain="annulus", frames=4, resolution=3)
    return path


SOURCES = {
    "custom": _custom,
    "pdebench-tensor": _pdebench(write_pdebench_tensor, "1D_Advection_Sols_beta0.1.hdf5"),
    "pdebench-cfd": _pdebench(write_pdebench_cfd, "2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5"),
    "pdebench-seeds": _pdebench(write_pdebench_seeds, "2D_DarcyFlow_seeds.h5"),
    "the_well": _the_well,
    "mesh": _mesh,
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Each source's valid files, written once (copied for every case)."""
    root = tmp_path_factory.mktemp("pristine")
    made = {}
    for name, make in SOURCES.items():
        (root / name).mkdir()
        path = make(root / name)
        made[name] = (root / name, path.relative_to(root / name))
    return made


def _problem(action: Callable[[], Any], names: list[str], what: str) -> str | None:
    """Run ``action``: it may succeed, or raise one of the project's errors on one line naming one
    of ``names``; anything else is the problem returned, saying ``what`` the input was. A warning
    counts as a problem (a complex value cast to real with a warning is a silent wrong result)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            action()
    except OWN_ERRORS as err:
        message = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
        if "\n" in message.strip():
            return f"{what}: not one line: {message}"
        if not any(n in message for n in names):
            return f"{what}: the error does not name the file: {message}"
    except Exception as err:  # noqa: BLE001  (any other exception is what this test looks for)
        return f"{what}: {type(err).__name__} instead of a clear error: {str(err)[:300]}"
    except Warning as warning:  # (raised by the filter above)
        return f"{what}: {type(warning).__name__}: {warning}"
    return None


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_malformed_dataset_files_give_only_clear_errors(source, pristine, tmp_path):
    folder, relative = pristine[source]
    problems = []
    for seed in range(CASES):
        case = tmp_path / f"case{seed}"
        shutil.copytree(folder, case)
        path = case / relative
        done = mutate_h5(path, random.Random(f"{source}-{seed}"))
        problems.append(_problem(lambda: _read(_reopen(source, case, path)), [path.name, str(case)],
                                 f"{source} seed {seed} ({done})"))
        shutil.rmtree(case)
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)


def _reopen(source: str, case: Path, path: Path) -> Any:
    if source == "custom":
        return open_dataset("custom", path, 1, 2)
    if source.startswith("pdebench"):
        return open_dataset("pdebench", path, 1, 2)
    if source == "the_well":
        return open_dataset("the_well", case / "well", 1, 2, name="turbulent_radiative_layer_2D", split="train")
    from gno_ext.adapters.mesh import MeshDataset
    return MeshDataset(path, 1, 2)


# ---------------------------------------------------------------- malformed result files and tables

def _mutate_json(value: Any, rng: random.Random) -> Any:
    """``value`` (parsed JSON) with one entry, at any depth, removed or replaced by another type."""
    if isinstance(value, (dict, list)) and value and rng.random() < 0.6:
        keys = list(value) if isinstance(value, dict) else list(range(len(value)))
        key = rng.choice(keys)
        out = dict(value) if isinstance(value, dict) else list(value)
        if rng.random() < 0.2:
            del out[key]
        else:
            out[key] = _mutate_json(out[key], rng)
        return out
    return rng.choice([None, "x", -1, 0, 2.5, float("nan"), True, [], {}, [1, "a"], {"a": None}, "1e-3"])


def _results_copy(tmp_path: Path) -> Path:
    """Part of the committed results (two tables, the runtime files) to damage."""
    results = tmp_path / "results"
    for part in ("bc", "param", "runtime"):
        shutil.copytree(REPO / "benchmarks" / "results" / part, results / part)
    return results


def test_malformed_result_and_runtime_files_are_named_or_left_out(tmp_path):
    from gno_ext.benchmark.render import render_pages
    from gno_ext.benchmark.tables import load_tables

    tables = {name: t for name, t in load_tables().items() if name in ("bc", "param")}
    results = _results_copy(tmp_path)
    files = sorted(results.glob("*/*.json")) + sorted(results.glob("*/*/*.json"))
    problems = []
    for seed in range(3 * CASES):
        rng = random.Random(f"results-{seed}")
        path = rng.choice(files)
        original = path.read_text()
        if rng.random() < 0.15:
            path.write_text(original[:rng.randrange(len(original))])  # cut short
            done = "cut short"
        else:
            path.write_text(json.dumps(_mutate_json(json.loads(original), rng)))
            done = "one entry changed"
        problems.append(_problem(lambda: render_pages(tables, results), [str(path)],
                                 f"{path.name}, seed {seed} ({done})"))
        path.write_text(original)
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)


def test_malformed_tables_files_are_refused_naming_the_file(tmp_path):
    from gno_ext.benchmark.render import render_pages
    from gno_ext.benchmark.tables import load_tables

    original = yaml.safe_load((REPO / "benchmarks" / "tables.yaml").read_text())
    path = tmp_path / "tables.yaml"
    results = _results_copy(tmp_path)
    refused, problems = 0, []
    for seed in range(3 * CASES):
        rng = random.Random(f"tables-{seed}")
        data = _mutate_json(json.loads(json.dumps(original)), rng)
        path.write_text(yaml.safe_dump(data) if rng.random() < 0.9 else "tables: [unclosed")

        def read() -> None:
            tables = load_tables(path)
            render_pages({k: v for k, v in tables.items() if k in ("bc", "param")}, results)

        try:
            load_tables(path)
        except ValueError:
            refused += 1
        problems.append(_problem(read, [str(path)], f"tables.yaml seed {seed}"))
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)
    assert refused > CASES  # most changes make a file that is not a tables file


def test_the_results_command_says_what_is_wrong_with_a_tables_file_in_one_line(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "tables.yaml"
    path.write_text("tables:\n  bc:\n    title: B\n    recipe: [heat-bc]\n    rows: {gno: {}}\n")  # recipe(s)
    done = subprocess.run([sys.executable, str(REPO / "recipes" / "benchmark.py"), "render", "--tables", str(path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.strip() == f"error: {path}: tables: bc: no recipes"
