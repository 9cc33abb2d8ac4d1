"""A generated dataset's protocol and its fingerprint.

A dataset is only comparable with another, or with the paper, if it was made by the same
protocol: the same counts, parameter grids, boundary data, seeds, resolution, time axis and
solver settings. `protocol` writes all of that down for a preset at a size; `fingerprint` is
its SHA-256. The generator records both in the dataset's manifest (and the fingerprint in every
file), and `check_protocol` refuses to resume or reuse a dataset whose fingerprint differs from
the current preset's, so old and new data never mix silently.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gno_ext.data.presets import SPLITS, Preset
from gno_ext.data.simulate import SOLVER_SETTINGS

__all__ = ["PROTOCOL_VERSION", "protocol", "protocol_digest", "fingerprint", "check_protocol", "StaleDatasetError"]

# Raise when the meaning of a field of `protocol` changes without its value changing.
PROTOCOL_VERSION = 2


class StaleDatasetError(ValueError):
    """A dataset folder holds data generated under another protocol than the current preset's."""


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def protocol(preset: Preset, size: str) -> dict[str, Any]:
    """Everything that defines the trajectories of ``preset`` at ``size`` (JSON-serialisable).

    Per split: the counts, the parameter grid and a digest of every trajectory's definition
    (parameter, boundary type and data, initial-condition and field seeds).
    """
    splits = {}
    for split in SPLITS:
        plan = preset.plan(size, split)
        trajectories = [[t.param_index, t.boundary, t.setup, t.seed, t.field_seed, repr(t.theta),
                         [repr(v) for v in t.face_values]] for t in preset.trajectories(size, split)]
        splits[split] = {"n_params": plan.n_params, "setups": plan.setups, "trajectories_per_setup": plan.trajectories,
                         "n_trajectories": len(trajectories),
                         "parameter_values": [repr(float(v)) for v in preset.parameter_values(size, split)],
                         "trajectories_sha256": _digest(trajectories)}
    return {"version": PROTOCOL_VERSION, "preset": preset.name, "size": size, "family": preset.family,
            "ndim": preset.ndim, "parameter": preset.parameter, "resolution": preset.resolution[size],
            **({"extent": preset.extent} if preset.extent != 1 else {}),  # (the unit box's datasets stay valid)
            "frames": preset.frames[size], "frame_dt": preset.frame_dt,
            "value_ranges": preset.value_ranges, "test_value_ranges": preset.test_value_ranges,
            "solver": {"family": SOLVER_SETTINGS.get(preset.family, {}),
                       "dirichlet_time": SOLVER_SETTINGS["dirichlet_time"], "robin": SOLVER_SETTINGS["robin"]},
            "splits": splits}


def protocol_digest(protocol: dict[str, Any]) -> str:
    """SHA-256 (hex) of a `protocol` dictionary."""
    return _digest(protocol)


def fingerprint(preset: Preset, size: str) -> str:
    """SHA-256 (hex) of `protocol` ``(preset, size)``."""
    return _digest(protocol(preset, size))


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append(f"{prefix}{key}")
    return out


def check_protocol(root: str | Path, manifest: dict[str, Any], preset: Preset, size: str,
                   current: dict[str, Any] | None = None) -> None:
    """Raise `StaleDatasetError` if the dataset at ``root`` was not made by today's protocol.

    Parameters
    ----------
    root : str or Path
        The dataset folder (``.../datasets/NAME``), named in the message.
    manifest : dict
        Its ``manifest.json``.
    preset : Preset
    size : str
    current : dict, optional
        ``protocol(preset, size)`` if the caller has it (it takes seconds at paper size).
    """
    recorded = manifest.get("config", {}).get("fingerprint")
    current = current or protocol(preset, size)
    digest = protocol_digest(current)
    if recorded == digest:
        return
    if recorded is None:
        why = "it was generated before datasets recorded their protocol"
    else:
        changed = _differences(manifest.get("protocol", {}), current)
        why = (f"its protocol fingerprint {recorded[:12]} differs from the current {digest[:12]} "
               f"(changed: {', '.join(changed[:8]) or 'unknown'}{', ...' if len(changed) > 8 else ''})")
    raise StaleDatasetError(
        f"{root}: this {preset.name} dataset (size {size}) does not match the current preset: {why}. "
        f"Its trajectories are not those the preset defines now, so it is neither resumed nor used. "
        f"Regenerate it: move or remove the folder {root}, then run "
        f"`gno-data generate {preset.name} --size {size} --out {Path(root).parent.parent}` "
        f"(or generate into another --out / data.root).")
