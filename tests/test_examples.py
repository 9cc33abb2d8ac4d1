"""The gallery's examples (examples/*.py, shown on the site's Gallery page) run as written."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_on_the_gallery_page():
    page = (EXAMPLES.parent / "docs" / "gallery.md").read_text()
    for path in EXAMPLES.glob("*.py"):
        assert f'--8<-- "examples/{path.name}"' in page, f"{path.name} is not shown on docs/gallery.md"


@pytest.mark.slow
def test_gated_kernels_in_your_fno_learn_the_next_frame():
    errors = load("gated_kernels_in_your_fno").main(["--steps", "100"])
    assert set(errors) == {"gated kernels", "theta as a channel"}
    assert all(0 < e < 0.05 for e in errors.values()), errors  # both learnt the step (persistence-free nMSE)


@pytest.mark.slow
def test_your_boundary_dataset_trains_through_the_custom_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GNO_EXT_CACHE", str(tmp_path / "cache"))
    report = load("your_boundary_dataset").main([])
    assert (tmp_path / "my_runs.npz").is_file() and (tmp_path / report).is_file()
    assert "neumann" in (tmp_path / report).read_text() and "dirichlet" in (tmp_path / report).read_text()


@pytest.mark.slow
def test_a_table_of_your_own_runs_and_renders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GNO_EXT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GNO_EXT_SWEEP_DIR", str(tmp_path / "hydra"))
    page = load("a_table_of_your_own").main([]).read_text()
    assert "| `fno` |" in page and "| `gno_fno_soft` |" in page and "size=smoke, 3 epochs, batch 16" in page
    assert len(list((tmp_path / "my_table" / "results" / "mine" / "heat-param").glob("*-seed0.json"))) == 2
    assert os.listdir(tmp_path / "my_table" / "docs" / "results")
