"""Training checkpoints: step-numbered folders written atomically.

``RUN/checkpoints/step_00000120/`` holds

| file | content |
|---|---|
| ``model.safetensors``, ``config.json`` | the weights and constructor arguments (`gno_ext.models.from_checkpoint` reads them) |
| ``ema.safetensors`` | the EMA weights, when EMA is on |
| ``training_state.pt`` | optimizer, scheduler and RNG states (tensors and plain containers, loaded with ``weights_only=True``) |
| ``trainer_state.json`` | step, epoch, position in the epoch, skipped updates |
| ``config.yaml`` | the resolved run configuration |

A checkpoint is written under a hidden temporary name and renamed into place once every file
is there, so a save that is killed never shows up as a checkpoint (the next save removes what
it left); ``resume=auto`` takes the newest complete one. A save that fails for lack of space
removes its partial folder and raises `gno_ext._files.DiskFull`, naming the folder.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import yaml
from torch import nn

from gno_ext._files import remove_leftovers, written_whole_folder
from gno_ext.models.registry import _tensor_state, load_weights, write_model_files

__all__ = ["save_training_checkpoint", "load_training_checkpoint", "latest_checkpoint", "list_checkpoints"]

STATE_FILE = "trainer_state.json"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("step_*") if p.is_dir() and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_training_checkpoint(run_dir: str | Path, step: int, model: nn.Module, optimizer: Any, scheduler: Any,
                             trainer_state: Mapping[str, Any], config: Mapping[str, Any],
                             ema: nn.Module | None = None, keep: int = 3) -> Path:
    """Write checkpoint ``step`` of a run atomically and keep the newest ``keep`` ones.

    Parameters
    ----------
    run_dir : str or Path
    step : int
        Optimizer steps taken.
    model : nn.Module
        The unwrapped model (built through the registry).
    optimizer, scheduler
        Objects with ``state_dict()``.
    trainer_state : mapping
        JSON-serialisable position of the run (epoch, batch in epoch, counters).
    config : mapping
        The resolved configuration.
    ema : nn.Module, optional
        The EMA copy of the model.
    keep : int
        Checkpoints kept (older ones are deleted after the new one is in place); 0 keeps all.
    """
    folder = Path(run_dir) / "checkpoints"
    final = folder / f"step_{step:08d}"
    remove_leftovers(folder, TEMPORARY)  # (the run folder's lock: this process alone saves into it)
    with written_whole_folder(final) as tmp:
        write_model_files(model, tmp, extra={"step": step})
        if ema is not None:
            safetensors.torch.save_file(_tensor_state(ema), str(tmp / "ema.safetensors"), metadata={"format": "pt"})
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": _rng_state()},
                   tmp / "training_state.pt")
        (tmp / "config.yaml").write_text(yaml.safe_dump(dict(config), sort_keys=False))
        (tmp / STATE_FILE).write_text(json.dumps({**trainer_state, "step": step}, indent=1))  # written last
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


TEMPORARY = re.compile(r"^\.step_\d{8}\.(tmp|old)-\d+$")  # a save's temporary folders (gno_ext._files)


def _load_state(file: Path) -> dict[str, Any]:
    """The optimizer, scheduler and random states of ``file``, loaded without running any of its
    code (``weights_only``); a file that holds anything else, or is damaged, raises a one-line
    `ValueError` that names it (not torch's advice to turn the protection off)."""
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such file (an incomplete training checkpoint)")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError (objects that only code can rebuild), or a damaged file
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{file}: refused: it holds something other than tensors and plain values, or is "
                         f"damaged ({first[:200]}); nothing in it was run") from None
    if not isinstance(state, dict) or "optimizer" not in state:
        raise ValueError(f"{file}: not a training state (expected the optimizer's, scheduler's and random states)")
    return state


def load_training_checkpoint(path: str | Path, model: nn.Module, optimizer: Any = None, scheduler: Any = None,
                             ema: nn.Module | None = None, restore_rng: bool = True) -> dict[str, Any]:
    """Restore a run's state from checkpoint folder ``path``; returns its trainer state.

    Nothing is unpickled: weights come from safetensors, the other states through
    ``torch.load(weights_only=True)``.
    """
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path}: not a complete training checkpoint (no {STATE_FILE})")
    load_weights(model, path / "model.safetensors", "the model built from the run's config")
    if ema is not None:
        if not (path / "ema.safetensors").is_file():
            raise FileNotFoundError(f"{path}: trainer.ema is on but the checkpoint has no ema.safetensors")
        load_weights(ema, path / "ema.safetensors", "the model's exponential average")
    state = _load_state(path / "training_state.pt")
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        torch.set_rng_state(state["rng"]["torch"])
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return json.loads((path / STATE_FILE).read_text())
