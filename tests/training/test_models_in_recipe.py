"""Every model config trains through the real recipe (two steps at size=smoke)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_train_module

train_py = load_train_module()
MODELS = [m for m in train_py.available("model") if m != "vit-10"]


@pytest.mark.parametrize("model", MODELS)
def test_two_training_steps(model, train_module, tmp_path):
    result = train_module.main(["--recipe", "heat-joint", "size=smoke", f"model={model}", "trainer.max_steps=2",
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
