"""Every model config trains through the real recipe (two steps at size=smoke)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_train_module

train_py = load_train_module()
# (vit-10 needs more frames than the smoke data have; the persistences have no weights: tested on their own)
MODELS = [m for m in train_py.available("model") if m not in ("vit-10", "persistence", "mesh_persistence")]


@pytest.mark.parametrize("model", MODELS)
def test_two_training_steps(model, train_module, tmp_path):
    mesh = model.startswith("gno_mesh") or model == "mesh_gnn"
    recipe = "heat-mesh" if mesh else "heat-joint"  # models of meshes: the mesh recipe
    result = train_module.main(["--recipe", recipe, "size=smoke", f"model={model}", "trainer.max_steps=2",
                                "trainer.log_every=1", "eval.enabled=false", "trainer.progress=false",
                                "trainer.tensorboard=false", f"output_root={tmp_path}"])
    assert result["step"] == 2 and result["skipped"] == 0
    rows = [json.loads(x) for x in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 2 and all(0 < x < 1e3 for x in losses)
    assert (Path(result["run_dir"]) / "model" / "model.safetensors").is_file()


def test_vit_10_needs_trajectories_of_11_frames(train_module, tmp_path):
    with pytest.raises(ValueError, match="no window of 10 \\+ 1 frames"):
        train_module.main(["--recipe", "heat-joint", "size=smoke", "model=vit-10", "trainer.max_steps=2",
                           "eval.enabled=false", "trainer.progress=false", "trainer.tensorboard=false",
                           f"output_root={tmp_path}"])


def test_persistence_is_evaluated_not_trained(train_module, tmp_path):
    import torch
    import yaml

    from gno_ext.adapters import GeneratedDataset
    from gno_ext.losses import nmse
    from gno_ext.training.recipe_data import rollout_indices

    result = train_module.main(["--recipe", "heat-param", "size=smoke", "model=persistence", "eval.figures=0",
                                "trainer.progress=false", "trainer.tensorboard=false", f"output_root={tmp_path}"])
    run = Path(result["run_dir"])
    assert result["step"] == 0 and not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()
    assert (run / "model" / "model.safetensors").is_file()
    report = result["report"]
    # its rollout is the first frame repeated: the error follows from the test data alone
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    steps = report["steps"]
    ds = GeneratedDataset(Path(cfg["data"]["root"]) / "datasets" / "heat-param", n_steps_output=steps, split="test")
    firsts = [ds[i] for i in rollout_indices(ds)]
    errors = torch.cat([nmse(s.u_in[-1:].expand(steps, *s.u_in.shape[1:])[None], s.u_out[None]) for s in firsts])
    assert report["trajectories"] == len(firsts)
    assert abs(report["nmse"]["mean"] - float(errors.mean())) < 1e-5 * float(errors.mean())


def test_the_rollouts_first_step_is_the_one_step_prediction_from_frame_0(train_module, tmp_path):
    """The rollout adds nothing of its own to its first step: it equals the one-step error of the
    test windows that start at frame 0 (which is why it exceeds the validation error, an average
    over every start frame)."""
    import torch
    import yaml

    from gno_ext.adapters import GeneratedDataset
    from gno_ext.losses import nmse
    from gno_ext.models.registry import from_checkpoint
    from gno_ext.schema import collate
    from gno_ext.training.recipe_data import rollout_indices

    # time-dependent Dirichlet and Robin data: the first step must also read the data of the right times
    result = train_module.main(["--recipe", "heat-bc-extended", "size=smoke", "trainer.max_steps=3", "eval.figures=0",
                                "trainer.progress=false", "trainer.tensorboard=false", f"output_root={tmp_path}"])
    run = Path(result["run_dir"])
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    model = from_checkpoint(run / "model").eval()
    ds = GeneratedDataset(Path(cfg["data"]["root"]) / "datasets" / "heat-bc-extended", split="test")
    batch = collate([ds[i] for i in rollout_indices(ds)][: result["report"]["trajectories"]])
    with torch.no_grad():
        pred = model(batch.u_in, theta=batch.theta, theta_field=batch.theta_field, bc=batch.bc, grid=batch.grid)
    first = float(nmse(pred, batch.u_out[:, :1]).mean())
    assert abs(result["report"]["per_step_nmse"][0] - first) < 1e-5 * first
    assert "first step is the one-step prediction from frame 0" in (run / "eval" / "report.md").read_text()


def test_rollouts_can_start_from_a_later_frame(train_module, tmp_path):
    """``eval.start_frame``: persistence rolled out from frame 2 scores the error of copying frame
    2 forward (computed here from the trajectories themselves), with the rollout shortened to the
    frames left; a start past the last window names the setting and what the data allow."""
    import torch
    import yaml

    from gno_ext.adapters import GeneratedDataset
    from gno_ext.losses import nmse
    from gno_ext.training.evaluate import evaluate_saved
    from gno_ext.training.recipe_data import rollout_indices

    result = train_module.main(["--recipe", "heat-param", "size=smoke", "model=persistence", "eval.figures=0",
                                "trainer.progress=false", "trainer.tensorboard=false", f"output_root={tmp_path}"])
    run = Path(result["run_dir"])
    report = evaluate_saved(run, overrides={"start_frame": 2, "figures": 0}, out_dir=tmp_path / "late", device="cpu")
    assert report["start_frame"] == 2 and report["steps"] == 3  # smoke trajectories: 6 frames, 1 of them input
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    whole = GeneratedDataset(Path(cfg["data"]["root"]) / "datasets" / "heat-param", n_steps_output=5, split="test")
    starts = [whole[i] for i in rollout_indices(whole)]
    frames = [torch.cat([s.u_in, s.u_out]) for s in starts]  # each trajectory's 6 frames
    errors = torch.cat([nmse(f[2:3].expand(3, *f.shape[1:])[None], f[3:6][None]) for f in frames])
    assert report["nmse"]["mean"] == pytest.approx(float(errors.mean()), rel=1e-5)
    assert "starts from frame 2" in (tmp_path / "late" / "report.md").read_text()
    with pytest.raises(ValueError, match=r"eval.start_frame=5: the test trajectories have 6 frames, 1 of them input"):
        evaluate_saved(run, overrides={"start_frame": 5}, out_dir=tmp_path / "later", device="cpu")
