"""benchmarks/bench_runtime.py: the solvers at coarser resolutions against a trained model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch
from tests._recipes import load_recipe

bench = load_recipe("bench_runtime")


def _centres(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    return torch.meshgrid(x, x, indexing="ij")


def _band_limited(n: int) -> torch.Tensor:
    x, y = _centres(n)
    f = torch.sin(2 * math.pi * x) + 0.5 * torch.cos(2 * math.pi * 3 * y) + 0.3 * torch.sin(2 * math.pi * (5 * x - 2 * y))
    return f[None, None]


@pytest.mark.parametrize("size", [12, 16, 48, 64])
def test_fourier_resampling_is_exact_for_band_limited_periodic_fields(size):
    out = bench.resample(_band_limited(32), size, periodic=True)
    assert out.shape == (1, 1, size, size)
    torch.testing.assert_close(out, _band_limited(size), rtol=0, atol=1e-12)


def test_bounded_restriction_is_the_cell_average_and_prolongation_converges():
    x, y = _centres(64)
    linear = (2 * x - y)[None, None]
    xc, yc = _centres(16)
    torch.testing.assert_close(bench.resample(linear, 16, periodic=False), (2 * xc - yc)[None, None],
                               rtol=0, atol=1e-12)  # the average of a linear field is its centre value
    smooth = lambda n: torch.exp(_centres(n)[0] * _centres(n)[1])[None, None]  # noqa: E731
    errors = [(bench.resample(smooth(n), 64, periodic=False) - smooth(64)).abs().max() for n in (8, 16, 32)]
    assert errors[0] > errors[1] > errors[2]


def test_time_dependent_boundary_data_is_refused():
    values = torch.linspace(0, 1, 3).view(1, 1, 3, 1).expand(1, 4, 3, 1).contiguous()
    bc = BoundarySpec(torch.full((1, 4), int(BCType.DIRICHLET)), values)
    u = torch.zeros(1, 1, 1, 8, 8)
    batch = PDEBatch(u, torch.zeros(1, 2, 1, 8, 8), torch.ones(1, 1), bc, Grid((8, 8)), torch.full((1,), 0.01))
    with pytest.raises(ValueError, match="time-dependent boundary data"):
        bench.solve("heat", "exact", batch, 4, 2)


def _trained(train_module, tmp_path: Path, recipe: str) -> Path:
    result = train_module.main(["--recipe", recipe, "size=smoke", "model=gno_fno", "trainer.max_steps=2",
                                "eval.enabled=false", "trainer.progress=false", "trainer.tensorboard=false",
                                f"output_root={tmp_path}"])
    return Path(result["run_dir"])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["heat-bc", "advection-bc"])
def test_runtime_on_a_trained_run(recipe, train_module, tmp_path):
    run = _trained(train_module, tmp_path, recipe)
    out = tmp_path / "runtime.json"
    assert bench.main(["run", str(run), "--out", str(out), "--steps", "4", "--resolutions", "8", "16",
                       "--batch", "1", "3", "--repeats", "1"]) == 0
    results = json.loads(out.read_text())
    (entry,) = results["runs"]
    assert entry["recipe"] == recipe and entry["resolution"] == 16
    assert set(entry["classes"]) == {"periodic", "bounded"}  # heat-bc and advection-bc have both
    for name, c in entry["classes"].items():
        # the solver at the data's resolution reproduces the data it generated
        assert c["reference_nmse"] < 1e-10, (name, c["reference_nmse"])
        assert "captured" not in c["model_seconds"]["1"]  # a CPU times the eager rollout only
        for method, curve in c["solvers"].items():
            assert [p["res"] for p in curve] == [8, 16]
            assert curve[0]["nmse"] > 10 * curve[1]["nmse"], (name, method, curve)
            for size in ("1", "3"):
                match = c["matched"][method][size]
                good = [p["res"] for p in curve if p["nmse"] <= c["model_nmse"]]
                assert match["res"] == (min(good) if good else 16) and match["as_accurate"] == bool(good)
                assert match["speedup"] == pytest.approx(match["seconds"] / c["model_seconds"][size]["eager"])
    table = bench.render(results)
    assert f"**{recipe}, bounded**" in table
    assert all(f"| {method} |" in table for method in bench.SOLVERS[recipe.split("-")[0]])
    rows = [l for l in bench.summary([results]).splitlines() if l.startswith(f"| {recipe}, ")]
    assert len(rows) == 2 * len(bench.SOLVERS[recipe.split("-")[0]])  # every solver of both classes
    bounded = entry["classes"]["bounded"]
    assert all(f"`gno_fno`, {bounded['model_nmse']:.3g} |" in l for l in rows if l.startswith(f"| {recipe}, bounded |"))
    bench.plot([results], tmp_path / "runtime.png", ["3"])
    assert (tmp_path / "runtime.png").stat().st_size > 10_000
    with pytest.raises(SystemExit):  # an existing results file is never replaced
        bench.main(["run", str(run), "--out", str(out)])


def test_a_folder_that_is_not_a_trained_run_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["run", str(tmp_path), "--out", str(tmp_path / "x.json")])
    assert f"{tmp_path}: not a trained run" in capsys.readouterr().err
