"""The mesh recipes (heat-mesh, advection-mesh) through the training loop, and the mesh problem's
per-graph errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import h5py
import pytest
import torch

pytest.importorskip("torch_geometric")

from gno_ext.benchmark.tables import READING_NAMES  # noqa: E402
from gno_ext.data.mesh import MESH_SIZES  # noqa: E402
from gno_ext.losses import nmse  # noqa: E402
from gno_ext.models import from_checkpoint  # noqa: E402
from gno_ext.training.evaluate import evaluate_saved, reading_sums  # noqa: E402
from gno_ext.training.evaluate_mesh import mesh_reading_sums  # noqa: E402
from gno_ext.training.problem import MeshProblem, problem_for  # noqa: E402
from gno_ext.training.recipe_data import open_split, training_groups  # noqa: E402

from .conftest import QUIET  # noqa: E402

DOMAINS = ("annulus", "star", "l-shape")  # the recipes' default data.domains


def test_heat_mesh_smoke_end_to_end(train_module, tmp_path, cache):
    result = train_module.main(["--recipe", "heat-mesh", "size=smoke", f"output_root={tmp_path}", *QUIET])
    run = Path(result["run_dir"])
    assert run == tmp_path / "heat-mesh" / "gno_mesh-smoke-seed0"
    # the data: one file per domain and split, at the smoke size
    for domain in DOMAINS:
        for split in ("train", "valid", "test"):
            assert (cache / "data" / "smoke" / "mesh" / f"heat-{domain}" / f"{split}.h5").is_file()
    # training: both phases of the curriculum, finite losses, one-step validation
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/loss" in r]
    assert {r["train/dro"] for r in train_rows} == {0.0, 1.0}
    assert all(0 < r["train/loss"] < 1e3 for r in train_rows)
    assert any("valid/nmse_one_step" in r for r in rows)
    # windows seen: every window of the three domains once per epoch (batches padded by wrapping)
    windows = len(DOMAINS) * MESH_SIZES["smoke"]["trajectories"]["train"] * (MESH_SIZES["smoke"]["frames"] - 1)
    assert result["step"] >= 2 * windows // 4
    # the report: per-graph rollout errors of the test trajectories, groups by segment types
    report = json.loads((run / "eval" / "report.json").read_text())
    assert report["trajectories"] == 4 and report["steps"] == MESH_SIZES["smoke"]["frames"] - 1
    assert 0 < report["nmse"]["mean"] < 10 and len(report["per_step_nmse"]) == report["steps"]
    assert all(len(g["label"].split(",")[0].split("/")) == 2 for g in report["groups"])  # two segments
    assert "rollout_worst.png" in report["figures"] and (run / "eval" / "rollout_worst.png").stat().st_size > 10_000
    # the final model rebuilds from its folder, and evaluating the saved run gives the same errors
    model = from_checkpoint(run / "model")
    assert type(model).__name__ == "GNOMesh"
    again = evaluate_saved(run, out_dir=tmp_path / "again")
    assert again["nmse"]["mean"] == pytest.approx(report["nmse"]["mean"], rel=1e-5)


def test_mesh_persistence_is_evaluated_not_trained_and_scores_the_reports_persistence(train_module, tmp_path, cache):
    """``model=mesh_persistence`` (the mesh table's reference row): no weights, so the recipe only
    evaluates it, and its rollout errors are the persistence curve every mesh report prints."""
    result = train_module.main(["--recipe", "advection-mesh", "size=smoke", "model=mesh_persistence",
                                f"output_root={tmp_path}", *QUIET])
    assert result["step"] == 0 and not (Path(result["run_dir"]) / "metrics.jsonl").exists()
    report = result["report"]
    assert report["per_step_nmse"] == pytest.approx(report["per_step_nmse_persistence"], rel=1e-6)
    # every reading of the nMSE, as on grids (one channel: the per-channel one is the per-trajectory one)
    assert set(report["readings"]) == set(READING_NAMES)
    assert report["readings"]["per_channel"] == pytest.approx(report["readings"]["per_trajectory"], rel=1e-6)
    assert report["readings"]["pooled"] != report["readings"]["per_trajectory"]
    assert report["nmse"]["mean"] > 0 and len(report["per_step_nmse"]) == MESH_SIZES["smoke"]["frames"] - 1
    from gno_ext.mesh import collate_meshes
    from gno_ext.models import get_model
    from tests.test_mesh_padding import samples

    with pytest.raises(ValueError, match="data.u_in: expected shape"):  # the batch is checked all the same
        get_model("mesh_persistence", in_channels=7)(collate_meshes(samples()))


def test_advection_mesh_smoke_end_to_end(train_module, tmp_path, cache):
    """The advection recipe: its own files, the velocity (two parameters) reaching the model and
    the DRO groups, and the rollout's report."""
    result = train_module.main(["--recipe", "advection-mesh", "size=smoke", f"output_root={tmp_path}", *QUIET])
    run = Path(result["run_dir"])
    for domain in DOMAINS:
        with h5py.File(cache / "data" / "smoke" / "mesh" / f"advection-{domain}" / "train.h5") as f:
            assert f.attrs["dataset_name"] == f"advection_{domain}"
    model = from_checkpoint(run / "model")
    assert model.n_params == 2
    report = json.loads((run / "eval" / "report.json").read_text())
    assert report["trajectories"] == 4 and 0 < report["nmse"]["mean"] < 10
    # each group names both velocity components (a test value outside the training range: its own group)
    assert all(re.search(r"vx (in|=) .*vy (in|=) ", g["label"]) for g in report["groups"]), report["groups"]


def test_mesh_and_grid_models_are_not_mixed_and_a_refused_run_writes_nothing(train_module, tmp_path):
    with pytest.raises(ValueError, match="model=fno takes grid data, but data.kind=mesh gives mesh batches"):
        train_module.main(["--recipe", "heat-mesh", "size=smoke", "model=fno", f"output_root={tmp_path}", *QUIET])
    with pytest.raises(ValueError, match=r"model.kwargs.bogus: not an argument of the model 'gno_fno'"):
        train_module.main(["--recipe", "heat-param", "size=smoke", "+model.kwargs.bogus=1", f"output_root={tmp_path}",
                           *QUIET])  # before any data is made or any run folder written
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="model=gno_mesh takes mesh data"):
        train_module.main(["--recipe", "heat-param", "size=smoke", "model=gno_mesh", f"output_root={tmp_path}",
                           *QUIET])
    # a mesh run may be captured (its batches padded); on a CPU, capture itself is refused, and
    # before the run's folder is touched
    with pytest.raises(ValueError, match="trainer.capture=true: CUDA graphs need a GPU; this run is on cpu"):
        train_module.main(["--recipe", "heat-mesh", "size=smoke", "trainer.capture=true", "trainer.device=cpu",
                           f"output_root={tmp_path}", *QUIET])
    assert not (tmp_path / "heat-mesh").exists()  # refused before anything was written


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("model", ["gno_mesh", "mesh_gnn"])
def test_a_captured_mesh_run_replays_its_padded_steps_on_a_gpu(train_module, tmp_path, cache, model):
    """``trainer.capture=true`` on a mesh recipe: the padded batches are captured and replayed
    (a first captured step is logged), and the run trains and evaluates as the eager one does."""
    result = train_module.main(["--recipe", "heat-mesh", "size=smoke", f"model={model}", "trainer.capture=true",
                                f"output_root={tmp_path}", *QUIET])
    rows = [json.loads(line) for line in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert any("startup/first_captured_step_s" in r for r in rows)
    captured = [r["train/captured_graphs"] for r in rows if "train/captured_graphs" in r]
    assert captured and 1 <= max(captured) <= 8  # a few padded sizes (and the DRO phase): a few graphs
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert losses and all(0 < x < 1e3 for x in losses)
    assert result["skipped"] == 0 and 0 < result["report"]["nmse"]["mean"] < 10


def _mesh_data(cache: Path) -> dict:
    return {"kind": "mesh", "domains": ["annulus", "l-shape"], "size": "smoke", "root": str(cache / "data" / "smoke")}


def test_per_graph_errors_are_each_graphs_own(cache):
    """The mesh problem's MSE and nMSE of a batch equal those of each graph alone (the grid
    definitions on its nodes), whatever the other graphs are."""
    from gno_ext.training.recipe_data import prepare_data
    cfg = _mesh_data(cache)
    prepare_data(cfg)
    ds = open_split(cfg, "train", 1, 2)
    problem = problem_for(cfg)
    samples = [ds[0], ds[len(ds) - 1], ds[5]]  # an annulus, an L-shape, an annulus
    batch = problem.collate(samples)
    torch.manual_seed(0)
    pred = batch.u_out + 0.1 * torch.randn_like(batch.u_out)
    mse, err = problem.mse(pred, batch.u_out, batch), problem.nmse(pred, batch.u_out, batch)
    two = torch.cat([pred, 3 * pred + 1], 2), torch.cat([batch.u_out, 10 * batch.u_out - 2], 2)  # (N, T, 2)
    sums = mesh_reading_sums(problem, *two, batch)
    assert not torch.allclose(sums["nmse_per_channel"], sums["error_sum"] / sums["variance_sum"])  # readings differ
    start = 0
    for g, s in enumerate(samples):
        nodes = slice(start, start + s.n_nodes)
        start += s.n_nodes
        p, t = pred[nodes].transpose(0, 1)[None], s.u_out.transpose(0, 1)[None]  # as one grid sample (1, T, C, N)
        assert mse[g] == pytest.approx(float((p - t).pow(2).mean()), rel=1e-5)
        assert err[g] == pytest.approx(float(nmse(p, t)[0]), rel=1e-5)
        # the sums of the other readings too, on two channels of different scale and mean
        grid = reading_sums(*(x[nodes].permute(1, 2, 0)[None] for x in two))  # as one grid sample (1, T, C, N)
        for key, value in sums.items():
            assert value[g] == pytest.approx(float(grid[key][0]), rel=1e-5), key
    assert problem.size(batch) == 3
    kinds = MeshProblem.segment_kinds(batch)
    assert kinds.shape == (3, 2) and (kinds >= 0).all()
    # the DRO groups of a batch are those the training run counts for these windows
    _, _, window_kinds, binner = training_groups({"data": cfg, "recipe": {"parameter": "alpha"}}, ds)
    assert torch.equal(kinds, torch.as_tensor(window_kinds[[0, len(ds) - 1, 5]]))
    assert torch.equal(problem.groups(binner, batch), binner(batch.theta, kinds))


def test_the_square_trains_on_its_own_and_is_not_mixed_with_two_segment_domains(train_module, tmp_path, cache):
    """The square's four sides are four segments: its runs group windows by the four types
    (16 configurations at most); a run that mixes it with a domain of two segments is refused
    by name."""
    result = train_module.main(["--recipe", "heat-mesh", "size=smoke", "data.domains=[square]",
                                f"output_root={tmp_path}", *QUIET])
    report = json.loads((Path(result["run_dir"]) / "eval" / "report.json").read_text())
    assert all(len(g["label"].split(",")[0].split("/")) == 4 for g in report["groups"])
    with pytest.raises(ValueError, match=r"data.domains: \{'annulus': 2, 'square': 4\} boundary segments"):
        train_module.main(["--recipe", "heat-mesh", "size=smoke", "data.domains=[annulus,square]",
                           f"output_root={tmp_path / 'mixed'}", *QUIET])
