"""benchmarks/compare_square.py: mesh and grid models on the same square trajectories."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gno_ext.benchmark.tables import has_readings

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "compare_square.py"


@pytest.mark.slow
def test_mesh_and_grid_runs_see_the_same_test_trajectories_and_render(tmp_path):
    results = tmp_path / "results"
    command = [sys.executable, str(SCRIPT), "run", "--pde", "heat", "--models", "gno_mesh", "gno_fno", "--size",
               "smoke", "--data-root", str(tmp_path / "data"), "--runs", str(tmp_path / "runs"), "--results",
               str(results), "--", "trainer.epochs=1", "trainer.batch_size=4"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "GNO_EXT_COMMIT": "c" * 40})
    assert done.returncode == 0, done.stderr[-3000:]
    mesh, grid = (json.loads((results / f"heat-{m}.json").read_text()) for m in ("gno_mesh", "gno_fno"))
    assert (mesh["form"], grid["form"]) == ("mesh", "grid")
    for key in ("epochs", "batch_size", "lr", "seed", "splits", "test_trajectories", "rollout_steps"):
        assert mesh[key] == grid[key], key
    assert mesh["epochs"] == 1 and mesh["splits"] == [4, 2, 2] and mesh["grid_side"] == 7
    # the same test trajectories under the same metric: persistence scores the same on both forms
    assert mesh["persistence_per_step_nmse"] == pytest.approx(grid["persistence_per_step_nmse"], rel=1e-5)
    assert mesh["nmse_mean"] > 0 and grid["nmse_mean"] > 0 and mesh["nmse_mean"] != grid["nmse_mean"]
    for result in (mesh, grid):  # every reading of the nMSE, and each trajectory's value with its parameters
        assert has_readings(result) and result["nmse_readings"]["per_trajectory"] == pytest.approx(result["nmse_mean"])
        assert len(result["per_trajectory"]["theta"]) == len(result["per_trajectory"]["nmse"]) == 2
    assert mesh["per_trajectory"]["theta"] == grid["per_trajectory"]["theta"]  # the same test trajectories
    table = subprocess.run([sys.executable, str(SCRIPT), "render", "--results", str(results)], capture_output=True,
                           text=True, check=True).stdout
    assert f"| `gno_mesh` | mesh | {mesh['nmse_mean']:.3f} |" in table and "| `gno_fno` | grid |" in table
    assert "size=smoke (4 training, 2 test trajectories, a 7 x 7 grid), 1 epochs, batch 4" in table
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.count("exists, skipped") == 2
    # a file written before the readings were recorded is made again by --refresh-readings, with its own settings
    older = {k: v for k, v in grid.items() if k not in ("nmse_readings", "per_trajectory")}
    (results / "heat-gno_fno.json").write_text(json.dumps(older))
    refresh = [*command[:-3], "--refresh-readings", *command[-3:]]
    other = subprocess.run([*refresh[:-1], "trainer.batch_size=2"], capture_output=True, text=True)
    assert other.returncode != 0 and "heat-gno_fno.json: it was run with overrides ['trainer.batch_size=4', " \
        "'trainer.epochs=1'] (this command: ['trainer.batch_size=2', 'trainer.epochs=1'])" in other.stderr
    assert json.loads((results / "heat-gno_fno.json").read_text()) == older  # refused before any run
    done = subprocess.run(refresh, capture_output=True, text=True, env={**os.environ, "GNO_EXT_COMMIT": "d" * 40})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("exists, skipped") == 1  # the mesh model's file has them
    grid = json.loads((results / "heat-gno_fno.json").read_text())
    assert has_readings(grid) and grid["commit"] == "d" * 40 and not list(results.glob("*.stale"))
    # a file evaluated on other trajectories is refused, by name
    grid["persistence_per_step_nmse"] = [2 * x for x in grid["persistence_per_step_nmse"]]
    (results / "heat-gno_fno.json").write_text(json.dumps(grid))
    bad = subprocess.run([sys.executable, str(SCRIPT), "render", "--results", str(results)], capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "heat-gno_fno.json's persistence error differs" in bad.stderr


@pytest.mark.slow
def test_on_the_curved_domains_grid_models_are_scored_at_the_nodes(tmp_path):
    """``--domains curved``: the mesh model on the annulus, star and L-shape trajectories, the grid
    model on the same ones carried to a masked grid; the grid model's rollout is carried back to
    the nodes and scored there: persistence, computed at the nodes for both, is the same."""
    results = tmp_path / "results"
    command = [sys.executable, str(SCRIPT), "run", "--domains", "curved", "--pde", "heat", "--models", "mesh_gnn",
               "fno", "--size", "smoke", "--data-root", str(tmp_path / "data"), "--runs", str(tmp_path / "runs"),
               "--results", str(results), "--", "trainer.epochs=1", "trainer.batch_size=4"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "GNO_EXT_COMMIT": "c" * 40})
    assert done.returncode == 0, done.stderr[-3000:]
    mesh, grid = (json.loads((results / f"heat-{m}.json").read_text()) for m in ("mesh_gnn", "fno"))
    assert mesh["domains"] == grid["domains"] == ["annulus", "star", "l-shape"]
    assert mesh["splits"] == grid["splits"] == [12, 6, 6] and mesh["test_trajectories"] == grid["test_trajectories"] == 4
    assert mesh["persistence_per_step_nmse"] == pytest.approx(grid["persistence_per_step_nmse"], rel=1e-5)
    assert len(grid["per_trajectory_nmse"]) == 4 and grid["nmse_mean"] == pytest.approx(
        sum(grid["per_trajectory_nmse"]) / 4)
    assert grid["grid_nmse_mean"] != grid["nmse_mean"]  # the recipe's own figure, over every cell, kept apart
    # the readings too are the nodes' (one channel: the per-channel reading is the per-trajectory one)
    read = grid["nmse_readings"]
    assert has_readings(grid) and read["per_trajectory"] == pytest.approx(grid["nmse_mean"])
    assert read["per_channel"] == pytest.approx(read["per_trajectory"]) and read["pooled"] != read["per_trajectory"]
    assert read["per_step"] == pytest.approx(sum(grid["per_step_nmse"]) / len(grid["per_step_nmse"]))
    assert grid["grid_nmse_readings"]["per_trajectory"] == pytest.approx(grid["grid_nmse_mean"])
    assert grid["per_trajectory"]["nmse"] == grid["per_trajectory_nmse"] and len(grid["per_trajectory"]["theta"]) == 4
    assert 0 < grid["carried_nmse_mean"] < 0.2
    table = subprocess.run([sys.executable, str(SCRIPT), "render", "--results", str(results)], capture_output=True,
                           text=True, check=True).stdout
    assert f"| `fno` | masked grid | {grid['nmse_mean']:.3f} |" in table and "| `mesh_gnn` | mesh |" in table
    assert f"(the grid's own error) | — | {grid['carried_nmse_mean']:.3f} |" in table


def test_a_refresh_keeps_the_old_file_aside_and_puts_it_back_where_the_run_fails(tmp_path, monkeypatch):
    """``run --refresh-readings``: the old file waits as ``.stale`` while its run runs, comes back
    where the run fails, and a refresh killed before it could tidy up is put back by the next run."""
    import types

    compare = _module()
    results, runs = tmp_path / "results", tmp_path / "runs"
    results.mkdir()
    runs.mkdir()
    target, stale = results / "heat-fno.json", results / "heat-fno.json.stale"
    old = {"pde": "heat", "model": "fno", "size": "smoke", "extra": [], "nmse_mean": 0.5}
    target.write_text(json.dumps(old))
    during = []

    def fails(cmd, **kwargs):
        during.append((target.exists(), stale.exists()))
        return types.SimpleNamespace(returncode=3)

    monkeypatch.setattr(compare.children, "run", fails)
    job = ("heat", "fno", "smoke", tmp_path, tmp_path / "grid.h5", [4, 2, 2], 7, runs, results, [], ("square",))
    assert compare.run_one(*job, refresh=True) is None
    assert during == [(False, True)]  # aside while the run ran
    assert json.loads(target.read_text()) == old and not stale.exists()  # back in place
    assert compare.run_one(*job) is None and during == [(False, True)]  # no refresh: skipped, not run
    target.rename(stale)  # as a refresh killed outright leaves it
    assert compare.run_one(*job) is None and json.loads(target.read_text()) == old and not stale.exists()
    assert len(during) == 1
    # the command says the refresh failed (the old file back in place is not a result with the readings)
    monkeypatch.setattr(compare, "prepare", lambda *args: (tmp_path / "grid.h5", [4, 2, 2], 7))
    with pytest.raises(SystemExit, match="1 of 1 runs failed: heat/fno"):
        compare.main(["run", "--pde", "heat", "--models", "fno", "--size", "smoke", "--refresh-readings",
                      "--data-root", str(tmp_path), "--runs", str(runs), "--results", str(results)])
    assert len(during) == 2 and json.loads(target.read_text()) == old


def test_prepare_keeps_a_current_grid_file_and_writes_a_stale_one_again(tmp_path):
    """The grid form is written once per mesh data: kept while it is newer than its mesh files and
    was written from them in today's layout, written again after a mesh file changes."""
    import shutil

    import h5py

    compare = _module()
    grid, counts, side = compare.prepare("heat", "smoke", tmp_path)
    written = grid.stat().st_mtime_ns
    assert compare.prepare("heat", "smoke", tmp_path) == (grid, counts, side)
    assert grid.stat().st_mtime_ns == written  # kept
    folder = tmp_path / "mesh" / "heat-square"
    shutil.copytree(folder, tmp_path / "mesh" / "heat-copy")  # older files (their times kept), other folders
    assert compare._current_grid(grid, [tmp_path / "mesh" / "heat-copy"]) is None
    assert compare._current_grid(grid, [folder]) == counts
    with h5py.File(grid, "a") as f:  # a file of an earlier layout
        today, f.attrs["grid_form_version"] = f.attrs["grid_form_version"], 0
    assert compare._current_grid(grid, [folder]) is None
    with h5py.File(grid, "a") as f:
        f.attrs["grid_form_version"] = today
    assert compare._current_grid(grid, [folder]) == counts
    written = grid.stat().st_mtime_ns
    later = written / 1e9 + 10
    os.utime(folder / "test.h5", (later, later))  # a mesh file changed after the grid was written
    assert compare._current_grid(grid, [folder]) is None
    assert compare.prepare("heat", "smoke", tmp_path) == (grid, counts, side)
    assert grid.stat().st_mtime_ns != written


def test_render_averages_the_seeds_of_several_folders(tmp_path):
    """``render`` over one folder per seed: a cell is the seeds' mean ± their standard deviation,
    the budget line names the seeds; files of other test trajectories are refused, by name."""
    def result(model, seed, nmse, persistence=(1.0, 3.0), extra=()):
        return {"pde": "heat", "model": model, "form": "mesh" if model == "gno_mesh" else "grid", "seed": seed,
                "nmse_mean": nmse, "per_step_nmse": [nmse / 2, 2 * nmse], "rollout_steps": 2,
                "persistence_per_step_nmse": list(persistence), "size": "bench", "splits": [400, 64, 64],
                "grid_side": 17, "epochs": 10, "batch_size": 64, "lr": 3e-4, "device": "gpu",
                "extra": [f"seed={seed}", f"trainer.num_workers={seed + 2}", *extra],
                "commit": "c" * 40}
    folders = [tmp_path / "seed0", tmp_path / "seed1"]
    for folder, seed, (mesh, fno) in zip(folders, (0, 1), ((0.10, 0.50), (0.14, 0.40))):
        folder.mkdir()
        for model, nmse in (("gno_mesh", mesh), ("fno", fno)):
            (folder / f"heat-{model}.json").write_text(json.dumps(result(model, seed, nmse)))
    table = _module().render(folders)
    assert "| `gno_mesh` | mesh | 0.120 ± 0.028 | 0.060 ± 0.014 | 0.240 ± 0.057 |" in table
    assert "| `fno` | grid | 0.450 ± 0.071 |" in table and "(MIXED" not in table
    assert "| persistence (first cell: the mean of its per-step nMSE) | — | 2.000 | 1.000 | 3.000 |" in table
    assert "seeds 0, 1 (a cell: the mean ± the standard deviation over the seeds)" in table
    assert "| `gno_mesh` | mesh | 0.100 | 0.050 | 0.200 |" in _module().render(folders[0])  # one seed: the value
    (folders[0] / "heat-fno.json").unlink()  # a cell that has fewer seeds than the table names its own
    assert "| `fno` | grid | 0.400 (seed 1) | 0.200 (seed 1) | 0.800 (seed 1) |" in _module().render(folders)
    # the seed and the speed settings may differ between the folders, what a run computes may not
    (folders[1] / "heat-fno.json").write_text(json.dumps(result("fno", 1, 0.4, extra=["trainer.epochs=30"])))
    assert "(MIXED: the files differ in their budget)" in _module().render(folders)
    (folders[1] / "heat-fno.json").write_text(json.dumps(result("fno", 1, 0.4, persistence=(1.0, 6.0))))
    with pytest.raises(ValueError, match=r"seed1/heat-fno.json's persistence error differs"):
        _module().render(folders)


def test_the_irregular_domains_page_shows_the_committed_comparison():
    page = (ROOT / "docs" / "irregular-domains.md").read_text()
    assert _module().render() in page, "docs/irregular-domains.md: paste `python benchmarks/compare_square.py render`"


def test_the_irregular_domains_page_shows_the_committed_curved_comparison():
    """The curved domains' table is the committed files' rendering (seeds 0 and 1), and the
    prose's figures (the means over the seeds) and orders are theirs."""
    curved = ROOT / "benchmarks" / "results" / "curved"
    runs, flat = _shown_on_the_page([curved, curved / "seed1"])
    seeds = _cells(runs)
    assert len(seeds) == 10 and all(sorted(r["seed"] for r in rs) == [0, 1] for rs in seeds.values())
    mean = {k: sum(r["nmse_mean"] for r in rs) / len(rs) for k, rs in seeds.items()}
    fig = lambda pde, model: f"{mean[pde, model]:.3f}"  # noqa: E731
    best = {pde: min(_module().GRID_MODELS, key=lambda m: mean[pde, m]) for pde in ("heat", "advection")}
    assert best == {"heat": "gno_fno_soft", "advection": "fno"}
    names = {"gno_fno_soft": "`gno_fno_soft`", "fno": "the FNO"}
    for pde in ("heat", "advection"):
        assert all(r["domains"] == ["annulus", "star", "l-shape"] for r in seeds[pde, "gno_mesh"])
        assert (f"on {pde} {fig(pde, 'gno_mesh')} against {fig(pde, best[pde])} for the best grid model "
                f"({names[best[pde]]})") in flat
        for seed in (0, 1):  # "the order mesh GNO, `mesh_gnn`, best grid model holds with each seed on both PDEs"
            one = {m: next(r["nmse_mean"] for r in seeds[pde, m] if r["seed"] == seed) for m in _module().MODELS}
            assert one["gno_mesh"] < one["mesh_gnn"] < min(one[m] for m in _module().GRID_MODELS), (pde, seed)
    assert f"{mean['heat', 'gno_fno_soft'] / mean['heat', 'gno_mesh']:.1f} times lower, with `mesh_gnn` second " \
           f"({fig('heat', 'mesh_gnn')})" in flat
    assert f"`mesh_gnn` at {fig('advection', 'mesh_gnn')} (narrowly ahead of the grid models)" in flat
    # "on advection it and the FNO are level (a and b: `gno_fno_soft` ahead with seed 0, the FNO with seed 1)"
    assert (f"level ({fig('advection', 'gno_fno_soft')} and {fig('advection', 'fno')}: `gno_fno_soft` ahead with "
            f"seed 0, the FNO with seed 1)") in flat
    by_seed = {(m, r["seed"]): r["nmse_mean"] for m in ("gno_fno_soft", "fno") for r in seeds["advection", m]}
    assert by_seed["gno_fno_soft", 0] < by_seed["fno", 0] and by_seed["fno", 1] < by_seed["gno_fno_soft", 1]
    assert abs(mean["advection", "gno_fno_soft"] - mean["advection", "fno"]) < 0.02 * mean["advection", "fno"]
    carried = {pde: seeds[pde, "fno"][0]["carried_nmse_mean"] for pde in ("heat", "advection")}
    assert all(r["carried_nmse_mean"] == pytest.approx(carried[r["pde"]], rel=1e-6) for r in runs if r["model"] == "fno")
    assert f"back score {carried['heat']:.3f} and {carried['advection']:.3f})" in flat
    assert (f"last on both here ({fig('heat', 'gno_fno')} and {fig('advection', 'gno_fno')}), behind the FNO "
            f"({fig('heat', 'fno')} and {fig('advection', 'fno')})") in flat
    for pde in ("heat", "advection"):  # the orders the prose states
        ranked = sorted(_module().MODELS, key=lambda m: mean[pde, m])
        assert ranked[:2] == ["gno_mesh", "mesh_gnn"] and ranked[2] == best[pde] and ranked[-1] == "gno_fno"


def test_the_irregular_domains_page_shows_the_square_at_bench():
    """The square's bench comparison: the table is the committed files' rendering (two seeds'
    folders), the prose's figures and orders are theirs, and the small size's figures it compares
    with are too."""
    folders = [ROOT / "benchmarks" / "results" / "square" / "bench" / f"seed{s}" for s in (0, 1)]
    runs, flat = _shown_on_the_page(folders)
    heat = {m: [r["nmse_mean"] for r in runs if r["pde"] == "heat" and r["model"] == m] for m in _module().MODELS}
    assert all(len(v) == 2 for v in heat.values())
    mean = {m: f"{sum(v) / 2:.3f}" for m, v in heat.items()}
    small = {m: json.loads((ROOT / "benchmarks" / "results" / "square" / f"heat-{m}.json").read_text())["nmse_mean"]
             for m in ("gno_mesh", "mesh_gnn")}
    assert (f"the mesh GNO scores {mean['gno_mesh']} against `mesh_gnn`'s {mean['mesh_gnn']} on heat (the mean of "
            f"seeds 0 and 1, below it with both; at `small`: {small['gno_mesh']:.3f} against "
            f"{small['mesh_gnn']:.3f})") in flat
    assert max(heat["gno_mesh"]) < min(heat["mesh_gnn"])
    assert (f"`gno_fno_soft` is close behind the graph baseline ({mean['gno_fno_soft']}), then `gno_fno` "
            f"({mean['gno_fno']}) and the FNO ({mean['fno']})") in flat
    assert sorted(heat, key=lambda m: sum(heat[m])) == list(_module().MODELS)  # the order said
    advection = {m: [r for r in runs if r["pde"] == "advection" and r["model"] == m] for m in _module().MODELS}
    seeds = {m: sorted(r["seed"] for r in rs) for m, rs in advection.items()}  # "seed 1, and seed 0 so far for ..."
    assert seeds == {m: [0, 1] if m in ("gno_fno_soft", "mesh_gnn") else [1] for m in _module().MODELS}, seeds
    persistence = advection["gno_mesh"][0]["persistence_per_step_nmse"]
    for model, rs in advection.items():  # "every model beats persistence at every step"
        for r in rs:
            assert r["persistence_per_step_nmse"] == pytest.approx(persistence, rel=1e-5)  # the same test data
            assert all(a < b for a, b in zip(r["per_step_nmse"], persistence, strict=True)), model
    n = {m: f"{sum(r['nmse_mean'] for r in rs) / len(rs):.3f}" for m, rs in advection.items()}
    assert (f"(`gno_fno_soft` {n['gno_fno_soft']}, `gno_fno` {n['gno_fno']}, the FNO {n['fno']}), then `mesh_gnn` "
            f"({n['mesh_gnn']}) and `gno_mesh` ({n['gno_mesh']}; persistence "
            f"{sum(persistence) / len(persistence):.2f})") in flat
    assert sorted(advection, key=lambda m: float(n[m])) == ["gno_fno_soft", "gno_fno", "fno", "mesh_gnn", "gno_mesh"]
    assert {r["size"] for r in runs} == {"bench"}
    walls = [r["wall_s"] for r in runs]
    assert f"took {min(walls):.0f} to {max(walls):.0f} s each" in flat


def test_the_irregular_domains_page_shows_the_curved_domains_at_bench():
    """The curved domains' bench comparison (heat and advection, seeds 0 and 1): the rendered
    table, its figures and orders, and the `mesh` table's gno_mesh runs quoted beside it, on the
    same test trajectories and with the same budget."""
    bench = ROOT / "benchmarks" / "results" / "curved" / "bench"
    runs, flat = _shown_on_the_page([bench / "seed0", bench / "seed1"])
    grid_models, pdes = _module().GRID_MODELS, ("heat", "advection")
    found = _cells(runs)
    assert {(pde, m) for pde in pdes for m in ("mesh_gnn", *grid_models)} <= set(found)
    assert all(sorted(r["seed"] for r in rs) == [0, 1] for rs in found.values()), "two seeds for every cell"
    mean = {k: sum(r["nmse_mean"] for r in rs) / 2 for k, rs in found.items()}
    n = {k: f"{v:.3f}" for k, v in mean.items()}
    assert (f"`gno_fno_soft`, scores {n['heat', 'gno_fno_soft']} on heat and {n['advection', 'gno_fno_soft']} on "
            f"advection (the FNO {n['heat', 'fno']} and {n['advection', 'fno']}, the hard-gated `gno_fno` "
            f"{n['heat', 'gno_fno']} and {n['advection', 'gno_fno']})") in flat
    best = {pde: min(grid_models, key=lambda m: mean[pde, m]) for pde in pdes}
    assert best == {"heat": "gno_fno_soft", "advection": "gno_fno_soft"}  # "the best grid model on both PDEs"
    soft = {(r["pde"], r["seed"]): r["nmse_mean"] for r in runs if r["model"] == "gno_fno_soft"}
    assert all(r["nmse_mean"] >= soft[r["pde"], r["seed"]] for r in runs if r["model"] in grid_models)  # each seed
    assert "At this size `gno_fno_soft` is the best grid model on both PDEs, with both seeds." in flat
    # "the graph baseline ahead of them on heat, not on advection"
    assert mean["heat", "mesh_gnn"] < mean["heat", "gno_fno_soft"]
    assert mean["advection", "mesh_gnn"] > mean["advection", "gno_fno_soft"]
    assert 0.45 < mean["heat", "mesh_gnn"] / mean["heat", "gno_fno_soft"] < 0.55  # "half the best grid model's error"
    assert (f"`mesh_gnn` is second on heat ({n['heat', 'mesh_gnn']}, half the best grid model's error) but on "
            f"advection narrowly behind `gno_fno_soft` ({n['advection', 'mesh_gnn']} against "
            f"{n['advection', 'gno_fno_soft']}, each over both seeds)") in flat
    # "every model is below persistence at every step, by a factor of X (the FNO, advection, step 1) or more"
    ratio, model, pde, step = min((p / m, r["model"], r["pde"], i + 1) for r in runs for i, (p, m) in
                                  enumerate(zip(r["persistence_per_step_nmse"], r["per_step_nmse"], strict=True)))
    assert (model, pde, step) == ("fno", "advection", 1) and ratio > 1
    assert f"by a factor of {ratio:.1f} (the FNO, advection, step 1) or more" in flat
    carried = {pde: {round(r["carried_nmse_mean"], 3) for r in runs if r["pde"] == pde and "carried_nmse_mean" in r}
               for pde in pdes}
    assert all(len(c) == 1 for c in carried.values())
    assert f"back score {carried['heat'].pop():.3f} and {carried['advection'].pop():.3f})" in flat
    # the mesh table's gno_mesh: the same test trajectories (count and persistence's error at every
    # step), the same budget, both seeds; the prose's figures are their means
    table, gnn = {}, {}
    for pde in pdes:
        folder = ROOT / "benchmarks" / "results" / "mesh" / f"{pde}-mesh"
        gno = [json.loads((folder / f"gno_mesh-seed{s}.json").read_text()) for s in (0, 1)]
        still = json.loads((folder / "persistence-seed0.json").read_text())
        ours = found[pde, "mesh_gnn"][0]
        assert still["per_step_nmse"] == pytest.approx(ours["persistence_per_step_nmse"], rel=1e-5)
        for g in gno:
            assert g["test_trajectories"] == ours["test_trajectories"]
            assert (g["size"], g["epochs"], g["batch_size"], g["lr"]) == (ours["size"], ours["epochs"],
                                                                         ours["batch_size"], ours["lr"])
        table[pde] = sum(g["nmse_mean"] for g in gno) / 2
        assert table[pde] < mean[pde, best[pde]]
        gnn[pde] = sum(json.loads((folder / f"mesh_gnn-seed{s}.json").read_text())["nmse_mean"] for s in (0, 1)) / 2
    # "its runs in the `mesh` table score a and b: on advection 5% below this comparison's, more than
    # the spread of its two seeds here, and level with `gno_fno_soft`"
    assert f"score {gnn['heat']:.3f} and {gnn['advection']:.3f}: on advection " \
           f"{1 - gnn['advection'] / mean['advection', 'mesh_gnn']:.0%} below this comparison's" in flat
    spread = [r["nmse_mean"] for r in found["advection", "mesh_gnn"]]
    assert mean["advection", "mesh_gnn"] - gnn["advection"] > max(spread) - min(spread)
    assert abs(gnn["advection"] - mean["advection", "gno_fno_soft"]) < 0.02 * mean["advection", "gno_fno_soft"]
    assert (f"scores {table['heat']:.3f} on heat and {table['advection']:.3f} on advection (seeds 0 and 1): "
            f"{mean['heat', 'gno_fno_soft'] / table['heat']:.1f} times below `gno_fno_soft` on heat and "
            f"{mean['advection', 'gno_fno_soft'] / table['advection']:.1f} times below it on advection") in flat
    assert (f"(two seeds: {table['heat']:.3f} against {n['heat', 'gno_fno_soft']} for `gno_fno_soft` on heat, "
            f"{table['advection']:.3f} against {n['advection', 'gno_fno_soft']} on advection)") in flat
    mesh_page = " ".join((ROOT / "docs" / "results" / "mesh.md").read_text().split())
    assert (f"`gno_fno_soft`, scores {n['heat', 'gno_fno_soft']} on heat and {n['advection', 'gno_fno_soft']} on "
            f"advection against this table's {table['heat']:.3g} and {table['advection']:.3g} for `gno_mesh`") in mesh_page


def _shown_on_the_page(results: Path | list[Path]) -> tuple[list[dict], str]:
    """The result files of a comparison folder (or of one folder per seed), after checking that
    the irregular-domains page shows their rendered table; and the page's text with its line
    breaks folded."""
    folders = results if isinstance(results, list) else [results]
    page = (ROOT / "docs" / "irregular-domains.md").read_text()
    assert _module().render(results) in page, ("docs/irregular-domains.md: paste `python benchmarks/compare_square.py "
                                               f"render --results {' '.join(str(f.relative_to(ROOT)) for f in folders)}`")
    return [json.loads(p.read_text()) for f in folders for p in f.glob("*.json")], " ".join(page.split())


def _cells(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The result files grouped by their cell, (PDE, model): one file per seed."""
    cells: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        cells.setdefault((r["pde"], r["model"]), []).append(r)
    return cells


@functools.cache
def _module():
    """The script as a module, loaded once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_square", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_variants_table_lists_each_file_with_its_settings(tmp_path):
    def result(nmse, kwargs, seed=0, commit="a" * 40, epochs=30, model="gno_mesh"):
        return {"pde": "heat", "model": model, "size": "small", "epochs": epochs, "batch_size": 32, "lr": 0.001,
                "seed": seed, "extra": [], "model_kwargs": kwargs, "device": "cpu", "commit": commit,
                "wall_s": 12.3, "rollout_steps": 10, "nmse_mean": nmse,
                "per_step_nmse": [nmse / 2] + [nmse] * 8 + [2 * nmse]}

    hard = {"n_kernels": 4, "soft_routing": False, "boundary_nodes": False, "relative_positions": False,
            "local": False, "latent": 64}
    for name, r in {"hard": result(0.9, hard), "soft": result(0.3, {**hard, "soft_routing": True}),
                    "soft-s1": result(0.4, {**hard, "soft_routing": True}, seed=1, commit="b" * 40 + "-dirty"),
                    "gnn": result(0.5, {"latent": 64}, model="mesh_gnn")}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / f"heat-{r['model']}.json").write_text(json.dumps(r))
    table = _module().render_variants(tmp_path)
    assert table.splitlines()[0] == ("| PDE | model | kernels | mixed | boundary nodes | offsets | local path | seed | "
                                     "rollout nMSE | step 1 | step 10 | wall time (s) |")
    rows = [line for line in table.splitlines() if line.startswith("| heat")]
    assert rows == ["| heat | `gno_mesh` | 4 | no | no | no | no | 0 | 0.900 | 0.450 | 1.800 | 12 |",
                    "| heat | `gno_mesh` | 4 | yes | no | no | no | 1 | 0.400 | 0.200 | 0.800 | 12 |",
                    "| heat | `gno_mesh` | 4 | yes | no | no | no | 0 | 0.300 | 0.150 | 0.600 | 12 |",
                    "| heat | `mesh_gnn` | — | — | — | — | — | 0 | 0.500 | 0.250 | 1.000 | 12 |"]
    assert "Commits: aaaaaaaaaa, bbbbbbbbbb-dirty." in table and "MIXED" not in table
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "heat-gno_mesh.json").write_text(json.dumps(result(0.5, hard, epochs=3)))
    assert "(MIXED: the files differ in their budget)" in _module().render_variants(tmp_path)


def test_the_irregular_domains_page_shows_the_committed_variants():
    page = (ROOT / "docs" / "irregular-domains.md").read_text()
    assert _module().render_variants() in page, \
        "docs/irregular-domains.md: paste `python benchmarks/compare_square.py render --variants`"


def test_the_variants_prose_quotes_the_variant_files():
    """The irregular-domains page's findings about the variants are their files' figures."""
    page = " ".join((ROOT / "docs" / "irregular-domains.md").read_text().split())
    folder = ROOT / "benchmarks" / "results" / "square" / "variants"
    r = {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/*.json")}
    n = {name: f"{v['nmse_mean']:.3f}" for name, v in r.items()}
    assert (f"The mixture of four chosen per graph scores {n['hard-mixture']}, one kernel {n['single-kernel']}, and the "
            f"four kernels mixed by the gate's probabilities {n['soft']}") in page
    last = lambda name: f"{r[name]['per_step_nmse'][-1]:.3f}"  # noqa: E731
    assert (f"takes the hard mixture from {n['hard-mixture']} to {n['boundary-nodes']}, and mainly the late steps "
            f"(step 10: {last('boundary-nodes')} against {last('hard-mixture')})") in page
    assert (f"{n['soft-boundary-nodes']} and {n['soft-boundary-nodes-seed1']} (seeds 0 and 1) against "
            f"{n['mesh-gnn-seed0']} and {n['mesh-gnn-seed1']} for `mesh_gnn`, and below it at every step") in page
    for gno, gnn in (("soft-boundary-nodes", "mesh-gnn-seed0"), ("soft-boundary-nodes-seed1", "mesh-gnn-seed1")):
        assert all(a < b for a, b in zip(r[gno]["per_step_nmse"], r[gnn]["per_step_nmse"], strict=True)), gno
    assert (f"{n['relative-positions']} and {n['local']} on the hard mixture, {n['soft-local']} with the soft mixture "
            f"against its {n['soft']}, and all four changes {n['all-four']}") in page
    slow, fast = r["soft-boundary-nodes"]["wall_s"], r["hard-mixture"]["wall_s"]
    assert f"about {slow / fast:.1f} times the hard choice's training time here ({slow:.0f} s against {fast:.0f} s" in page


def _figure(v: float) -> str:
    """A figure as the irregular-domains page prints it: two significant digits (0.070, 0.52, 1.6, 47)."""
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}" if v >= 1 else f"{v:.2f}" if v >= 0.1 else f"{v:.3f}"


@pytest.mark.parametrize("recipe", ["heat-mesh", "advection-mesh"])
def test_the_curved_domains_figures_are_the_check_files(recipe):
    """The irregular-domains page's tables and findings on the curved domains quote
    benchmarks/checks/mesh_curved_small.json."""
    page = " ".join((ROOT / "docs" / "irregular-domains.md").read_text().split())
    check = json.loads((ROOT / "benchmarks" / "checks" / "mesh_curved_small.json").read_text())
    rows = {r["model"]: r for r in check["rows"] if r["recipe"] == recipe}
    for model, r in rows.items():
        bold = "**" if model == "gno_mesh" else ""
        row = (f"| {r['params'] / 1e6:.2f} M | {bold}{_figure(r['nmse_mean'])} ± {_figure(r['nmse_std'])}{bold} | "
               f"{_figure(r['rel_l2_mean'])} | {_figure(r['valid_nmse_last_epoch'])} | "
               + " / ".join(_figure(r["per_step_nmse"][i]) for i in (0, 4, 9)) + " |")
        assert row in page, (model, row)
    persistence = rows["gno_mesh"]["persistence_per_step_nmse"]
    steps = " / ".join(_figure(persistence[i]) for i in (0, 4, 9))
    assert (f"| persistence | — | — | — | — | {steps} |" if recipe == "heat-mesh" else
            f"| persistence | — | {_figure(sum(persistence) / len(persistence))} (the mean of its per-step errors) | "
            f"— | — | {steps} |") in page
    gno, gnn = rows["gno_mesh"]["by_boundary"], rows["mesh_gnn"]["by_boundary"]
    names = {"dirichlet/dirichlet": "both Dirichlet", "dirichlet/neumann": "Dirichlet and Neumann",
             "neumann/dirichlet": "Neumann and Dirichlet", "neumann/neumann": "both Neumann"}
    assert ("By the two segments' types (rollout nMSE, `gno_mesh` / `mesh_gnn`): " + ", ".join(
        f"{names[k]} {_figure(gno[k])} / {_figure(gnn[k])}" for k in names) + ".") in page
    ratios = [gnn[k] / gno[k] for k in names]
    assert all(x > 1 for x in ratios)
    if recipe == "heat-mesh":
        assert f"by a factor of {min(ratios):.1f} to {max(ratios):.1f}" in page
        return
    for model, r in rows.items():  # both beat persistence at every step
        assert all(m < p for p, m in zip(persistence, r["per_step_nmse"], strict=True)), model
    steps = rows["gno_mesh"]["per_step_nmse"]
    assert (f"by a factor of {persistence[0] / steps[0]:.1f} at the first and "
            f"{persistence[-1] / steps[-1]:.1f} at the tenth") in page
    assert f"to {_figure(steps[-1])} and {_figure(rows['mesh_gnn']['per_step_nmse'][-1])} at step 10" in page


def test_the_square_prose_quotes_the_result_files():
    """The findings under the square's table are its result files' figures."""
    page = " ".join((ROOT / "docs" / "irregular-domains.md").read_text().split())
    r = {p.stem: json.loads(p.read_text()) for p in (ROOT / "benchmarks" / "results" / "square").glob("*.json")}
    heat = {m: r[f"heat-{m}"]["nmse_mean"] for m in ("gno_mesh", "mesh_gnn", "gno_fno_soft", "gno_fno", "fno")}
    assert min(heat, key=heat.get) == "gno_mesh"
    assert (f"{heat['gno_fno_soft'] / heat['gno_mesh']:.1f} times more accurate than the grid GNO `gno_fno_soft` "
            f"({heat['gno_mesh']:.3f} against {heat['gno_fno_soft']:.3f}) and ahead of the graph baseline `mesh_gnn` "
            f"({heat['mesh_gnn']:.3f};") in page
    assert f"({heat['gno_fno_soft']:.3f} and {heat['gno_fno']:.3f} against {heat['fno']:.3f})" in page
    adv = {m: r[f"advection-{m}"] for m in ("gno_mesh", "mesh_gnn", "gno_fno_soft", "gno_fno", "fno")}
    persistence = adv["gno_mesh"]["persistence_per_step_nmse"]
    assert all(all(a < b for a, b in zip(x["per_step_nmse"], persistence, strict=True)) for x in adv.values())
    order = sorted(adv, key=lambda m: adv[m]["nmse_mean"])
    assert order[-1] == "gno_mesh" and order[:2] == ["gno_fno_soft", "fno"]
    n = {m: f"{adv[m]['nmse_mean']:.3f}" for m in adv}
    assert (f"`gno_fno_soft` {n['gno_fno_soft']} and the FNO {n['fno']}, then `mesh_gnn` {n['mesh_gnn']}, "
            f"`gno_fno` {n['gno_fno']} and `gno_mesh` {n['gno_mesh']} (persistence: "
            f"{sum(persistence) / len(persistence):.2f})") in page


def test_the_advice_on_meshes_quotes_the_files():
    """"Which model to use on a mesh": its figures are the variants' and the curved check's."""
    page = " ".join((ROOT / "docs" / "irregular-domains.md").read_text().split())
    variants = ROOT / "benchmarks" / "results" / "square" / "variants"
    load = lambda name: json.loads(next((variants / name).glob("*.json")).read_text())  # noqa: E731
    hard, best, gnn = load("hard-mixture"), load("soft-boundary-nodes"), load("mesh-gnn-seed0")
    assert f"scores {hard['nmse_mean']:.3f} on the square against its {best['nmse_mean']:.3f}" in page
    check = json.loads((ROOT / "benchmarks" / "checks" / "mesh_curved_small.json").read_text())
    assert "wall_s" in check["rows"][0], "the curved check records each run's wall time"
    curved = {r["model"]: r for r in check["rows"] if r["recipe"] == "heat-mesh"}
    assert (f"It trains {curved['gno_mesh']['wall_s'] / curved['mesh_gnn']['wall_s']:.1f} (curved domains) to "
            f"{best['wall_s'] / gnn['wall_s']:.1f} (square) times as long as `mesh_gnn`") in page
    assert (f"four times its parameters ({curved['gno_mesh']['params'] / 1e6:.2f} M against "
            f"{curved['mesh_gnn']['params'] / 1e6:.2f} M)") in page


def test_the_bench_mesh_figures_quote_the_files():
    """The irregular-domains page's (and the mesh table's notes') bench figures: the mesh table's
    result files and the mesh step's timing file."""
    page = " ".join((ROOT / "docs" / "irregular-domains.md").read_text().split())
    notes = " ".join((ROOT / "benchmarks" / "notes" / "mesh.md").read_text().split())
    results = ROOT / "benchmarks" / "results" / "mesh" / "heat-mesh"

    def step_ms(name: str) -> tuple[dict, dict]:
        step = json.loads((ROOT / "benchmarks" / "history" / f"{name}.json").read_text())
        assert step["device"].startswith("NVIDIA H100") and step["size"] == "bench" and step["batch"] == 64
        return step, {(r["model"], r["options"].endswith("capture=true")): r["step_ms"] for r in step["rows"]}

    now, ms = step_ms("mesh_step_h100")  # the page: the current code's steps
    assert (f"a `gno_mesh` step takes {ms['gno_mesh', True]:.0f} ms captured against {ms['gno_mesh', False]:.0f} ms "
            f"eager, and a `mesh_gnn` step {ms['mesh_gnn', True]:.0f} against {ms['mesh_gnn', False]:.0f} ms") in page
    assert ms["gno_mesh", True] < ms["gno_mesh", False] and ms["mesh_gnn", True] < ms["mesh_gnn", False]  # "quicker"
    assert f"takes {ms['gno_fno_soft', True]:.1f} ms on `heat-param`" in page
    assert f"`benchmarks/history/mesh_step_h100.json`, commit {now['commit'][:7]})" in page
    captured = f"({ms['gno_mesh', True]:.0f} against {ms['mesh_gnn', True]:.0f} ms, both captured)"
    ratio = ms["gno_mesh", True] / ms["mesh_gnn", True]
    assert f"at {ratio:.1f} times `mesh_gnn`'s step time on an H100 {captured}" in page
    then, old = step_ms("mesh_step_h100_3be518a")  # the mesh table's notes: the step at its runs' commit
    heat = [json.loads(f.read_text())["commit"] for f in results.glob("gno_mesh-seed*.json")]
    assert len(heat) == 2 and all(c.startswith(then["commit"][:7]) for c in heat)  # "the commit of ... heat runs"
    assert f"at {then['commit'][:7]}, the commit of `gno_mesh`'s heat runs" in notes
    eager = f"({old['gno_mesh', False]:.0f} against {old['mesh_gnn', False]:.0f} ms"
    assert f"about {old['gno_mesh', False] / old['mesh_gnn', False]:.1f} times a `mesh_gnn` one {eager}" in notes
    seeds = {m: [json.loads((results / f"{m}-seed{s}.json").read_text())["nmse_mean"] for s in (0, 1)]
             for m in ("gno_mesh", "mesh_gnn")}
    mean = {m: sum(v) / 2 for m, v in seeds.items()}
    assert max(seeds["gno_mesh"]) < min(seeds["mesh_gnn"])  # "ahead with both seeds"
    assert f"and on the curved domains, on heat ({mean['gno_mesh']:.3f} against {mean['mesh_gnn']:.3f})" in page
    square = ROOT / "benchmarks" / "results" / "square" / "bench"
    on_square = {m: sum(json.loads((square / f"seed{s}" / f"heat-{m}.json").read_text())["nmse_mean"]
                        for s in (0, 1)) / 2 for m in ("gno_mesh", "mesh_gnn")}
    assert (f"ahead of `mesh_gnn` with two seeds on the square, on heat ({on_square['gno_mesh']:.3f} against "
            f"{on_square['mesh_gnn']:.3f})") in page
    advection = {m: [json.loads((results.parent / "advection-mesh" / f"{m}-seed{s}.json").read_text())["nmse_mean"]
                     for s in (0, 1)] for m in ("gno_mesh", "mesh_gnn")}
    assert max(advection["gno_mesh"]) < min(advection["mesh_gnn"])  # "with two seeds, on heat ... and on advection"
    assert (f"on advection ({sum(advection['gno_mesh']) / 2:.3f} against "
            f"{sum(advection['mesh_gnn']) / 2:.3f};") in page
    table = ROOT / "benchmarks" / "results" / "mesh"
    load = lambda recipe, name: json.loads((table / recipe / f"{name}.json").read_text())  # noqa: E731
    gnn, still = load("advection-mesh", "mesh_gnn-seed0"), load("advection-mesh", "persistence-seed0")
    gnn_mean = (gnn["nmse_mean"] + load("advection-mesh", "mesh_gnn-seed1")["nmse_mean"]) / 2
    assert f"(`mesh_gnn` {gnn_mean:.3f} against persistence's {still['nmse_mean']:.2f})" in page
    for recipe, trained in (("heat-mesh", "gno_mesh-seed0"), ("advection-mesh", "mesh_gnn-seed0")):
        # persistence ran on a CPU: the same test trajectories as the GPU runs, one by one
        ran, reference = load(recipe, trained)["per_trajectory"], load(recipe, "persistence-seed0")["per_trajectory"]
        assert ran["theta"] == reference["theta"] and ran["boundary"] == reference["boundary"]
        assert load(recipe, trained)["nmse_mean"] < load(recipe, "persistence-seed0")["nmse_mean"] / 10
