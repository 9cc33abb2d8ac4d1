"""Generate a preset's dataset into The Well's layout, resumably.

Layout under ``out``::

    datasets/PRESET/data/{train,valid,test}/PRESET_{boundary}_{shard:04d}.hdf5
    datasets/PRESET/stats.yaml
    datasets/PRESET/manifest.json

Trajectories are grouped by boundary type (one configuration per file) into shards of at most
``shard_size`` trajectories. A shard is written under a temporary name, renamed when complete,
and then recorded in the manifest with its trajectory count and SHA-256; a run that is
interrupted and restarted regenerates exactly the shards the manifest does not list, and
temporary files never count. The same trajectory index always gives the same trajectory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import yaml
from tqdm.auto import tqdm

from gno_ext._files import held, remove_leftovers, write_json
from gno_ext.data.fingerprint import check_protocol, fingerprint, protocol, protocol_digest
from gno_ext.data.presets import SPLITS, Preset, Trajectory, get_preset
from gno_ext.data.simulate import simulate
from gno_ext.data.writer import write_well_file
from gno_ext.schema import BoundarySpec

__all__ = ["generate", "dataset_info", "default_cache", "default_root", "shards", "verify_dataset"]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shards(preset: Preset, size: str, split: str, shard_size: int) -> list[tuple[str, list[Trajectory]]]:
    """``(file name, trajectories)`` of every shard of a split, in a fixed order."""
    by_type: dict[str, list[Trajectory]] = {}
    for t in preset.trajectories(size, split):
        by_type.setdefault(t.boundary, []).append(t)
    out = []
    for kind, trajs in by_type.items():
        for k in range(0, len(trajs), shard_size):
            out.append((f"{preset.name}_{kind}_{k // shard_size:04d}.hdf5", trajs[k : k + shard_size]))
    return out


def default_cache() -> Path:
    """Where generated datasets go unless told otherwise (the recipes' ``data.root`` unset,
    ``gno-data generate`` without ``--out``): ``$GNO_EXT_CACHE`` or ``~/.cache/gno_ext``."""
    return Path(os.environ.get("GNO_EXT_CACHE", Path.home() / ".cache" / "gno_ext"))


def default_root(size: str) -> Path:
    """The base folder of generated datasets of ``size`` that the recipes read and generate into
    when ``data.root`` is unset: ``default_cache()/data/SIZE`` (it holds ``datasets/PRESET``)."""
    return default_cache() / "data" / str(size)


def generate(name: str, size: str = "small", out: str | Path = "data", device: str | None = None,
             batch_size: int = 64, shard_size: int = 256, splits: tuple[str, ...] = SPLITS,
             progress: bool = True, on_shard: Callable[[Path], None] | None = None,
             dtype: str = "float32") -> Path:
    """Generate (or finish generating) preset ``name`` at ``size`` under ``out``.

    Parameters
    ----------
    name : str
        Preset name (see `gno_ext.data.PRESETS`).
    size : {"smoke", "small", "bench", "paper"}
    out : str or Path
        Base folder (it will hold ``datasets/NAME``, like The Well's base path).
    device : str, optional
        ``"cuda"`` when available by default.
    batch_size : int
        Trajectories solved together.
    shard_size : int
        Trajectories per file.
    splits : tuple of str
    progress : bool
        Show a progress bar.
    on_shard : callable, optional
        Called with each completed shard's path (used by tests to interrupt a run).
    dtype : {"float32", "float16"}
        Storage type of the fields.

    Raises
    ------
    StaleDatasetError
        ``out`` already holds this preset at this size, generated under another protocol
        (see `gno_ext.data.fingerprint`): it is neither resumed nor overwritten.

    Returns
    -------
    Path
        The dataset folder ``out/datasets/NAME``.
    """
    preset = get_preset(name)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    root = Path(out) / "datasets" / preset.name
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root, progress):  # one generating process per dataset folder; the manifest is read under the lock
        for folder in (root, *sorted((root / "data").glob("*"))):  # what interrupted writes left
            remove_leftovers(folder, TEMPORARY)
        return _generate(preset, size, root, device, batch_size, shard_size, splits, progress, on_shard, dtype)


TEMPORARY = re.compile(r"^\..+\.(hdf5|json)\.tmp-\d+$")  # what an interrupted write of ours leaves (writer.py)


@contextlib.contextmanager
def _locked(root: Path, progress: bool) -> Iterator[None]:
    """Hold ``root/.generate.lock`` (an advisory lock, released when the process ends): a second
    process that generates into the same folder waits here, then resumes what the first left."""
    def say(holder: str) -> None:
        if progress:
            print(f"{root}: another process is generating this dataset{f' ({holder})' if holder else ''}; waiting "
                  "for it to finish", flush=True)

    with held(root / ".generate.lock", wait=True, on_wait=say):
        yield


def _shard_intact(path: Path, record: dict[str, Any]) -> bool:
    """A shard the manifest lists is there with its recorded size and checksum."""
    if not path.is_file() or ("bytes" in record and path.stat().st_size != record["bytes"]):
        return False
    return _sha256(path) == record.get("sha256")


def _generate(preset: Preset, size: str, root: Path, device: str, batch_size: int, shard_size: int,
              splits: tuple[str, ...], progress: bool, on_shard: Callable[[Path], None] | None, dtype: str) -> Path:
    manifest_path = root / "manifest.json"
    manifest: dict[str, Any] = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    current = protocol(preset, size)
    config = {"preset": preset.name, "size": size, "shard_size": shard_size, "dtype": dtype,
              "fingerprint": protocol_digest(current)}
    if manifest:
        if manifest.get("config", {}).get("preset") == preset.name and manifest["config"].get("size") == size:
            check_protocol(root, manifest, preset, size, current)
        if manifest.get("config") != config:
            raise ValueError(f"{root}: already holds {manifest.get('config')}; refusing to mix with {config}")
    manifest.setdefault("config", config)
    manifest.setdefault("protocol", current)
    manifest.setdefault("files", {})
    todo = [(split, fname, trajs) for split in splits for fname, trajs in shards(preset, size, split, shard_size)]
    total = sum(len(t) for _, _, t in todo)
    # disable=None: no bar where the output is not a terminal (a redirected log fills with its updates)
    bar = tqdm(total=total, desc=f"{preset.name} ({size})", unit="traj", disable=True if not progress else None)
    times = torch.arange(preset.frames[size], dtype=torch.float64) * preset.frame_dt
    grid = preset.grid(size)
    for split, fname, trajs in todo:
        folder = root / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        key = f"{split}/{fname}"
        path = folder / fname
        if key in manifest["files"]:
            if _shard_intact(path, manifest["files"][key]):
                bar.update(len(trajs))
                continue
            # listed, but missing, truncated or changed since it was written: made again
            print(f"{path}: does not match the size and checksum the manifest recorded; generating it again",
                  flush=True)
            del manifest["files"][key]
            write_json(manifest_path, manifest)
        parts = []
        for k in range(0, len(trajs), batch_size):
            parts.append(simulate(preset, trajs[k : k + batch_size], size, device))
            bar.update(len(trajs[k : k + batch_size]))
        cat = lambda attr: torch.cat([getattr(p, attr) for p in parts])
        bc = BoundarySpec(torch.cat([p.bc.kind for p in parts]), torch.cat([p.bc.values for p in parts]),
                          None if parts[0].bc.coeffs is None else torch.cat([p.bc.coeffs for p in parts]))
        write_well_file(path, cat("u"), parts[0].field_names, grid, times, bc, cat("theta")[:, None],
                        [preset.parameter], preset.name,
                        theta_field=None if parts[0].theta_field is None else cat("theta_field"),
                        trajectory_index=torch.tensor([t.index for t in trajs]),
                        seed=torch.tensor([t.seed for t in trajs]),
                        group=torch.tensor([t.param_index for t in trajs]),
                        attrs={"preset": preset.name, "split": split, "size": size, "boundary": trajs[0].boundary,
                               "fingerprint": config["fingerprint"]},
                        dtype=dtype)
        stat = path.stat()
        manifest["files"][key] = {"trajectories": len(trajs), "bytes": stat.st_size, "sha256": _sha256(path),
                                  "mtime_ns": stat.st_mtime_ns}
        write_json(manifest_path, manifest)
        if on_shard is not None:
            on_shard(path)
    bar.close()
    _write_stats(root)
    manifest["splits"] = sorted(set(manifest.get("splits", [])) | set(splits))
    manifest["complete"] = set(manifest["splits"]) == set(SPLITS)
    write_json(manifest_path, manifest)
    return root


VERIFIED = ".verified.json"  # beside the manifest: files whose checksum matched at their current size and time


def verify_dataset(root: str | Path, splits: tuple[str, ...] | list[str] | None = None,
                   checksums: bool = False) -> None:
    """Check a generated dataset against its ``manifest.json`` before it is used.

    For each of ``splits`` (default: those the manifest records as written): every file the
    manifest lists is there with its recorded size, no other ``.hdf5`` file lies in the split's
    folder (a shard of another preset or size dropped in), each file's ``gno_ext`` attributes
    name the manifest's preset, size, split and protocol fingerprint, and a file whose
    modification time is not the one recorded at generation (written to since, or copied) has
    the recorded SHA-256 (once: a match is remembered in ``.verified.json`` with the file's size
    and time). With ``checksums`` every file's SHA-256 is compared (reads every byte). A folder
    without a manifest (data written by other means) is not checked.

    Raises
    ------
    FileNotFoundError
        A split the manifest records, or one of its files, is missing.
    ValueError
        A file changed after generation, does not belong, or names another dataset; the message
        names the file and what differs, and how to repair it.
    """
    root = Path(root)
    path = root / "manifest.json"
    if not path.is_file():
        return
    try:
        manifest = json.loads(path.read_text())
        cfg, files = manifest["config"], manifest["files"]
        if not isinstance(cfg, dict) or not isinstance(files, dict):
            raise TypeError("its config and files must be objects")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a readable manifest ({err}); generate the dataset again into a new folder") from None
    # files found intact by their checksum after their modification time changed (a copy): not read again
    seen_path = root / VERIFIED
    try:
        seen = json.loads(seen_path.read_text()) if seen_path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        seen = {}
    seen_before = dict(seen)
    repair = (f"run `gno-data generate {cfg.get('preset')} --size {cfg.get('size')} --out {root.parent.parent}`, "
              "which makes the files that do not match again")
    for split in manifest.get("splits", []) if splits is None else splits:
        listed = {k.split("/", 1)[1]: v for k, v in files.items() if k.startswith(split + "/")}
        if not listed:
            if split in manifest.get("splits", []):
                raise FileNotFoundError(f"{root}: the manifest lists no file of the {split} split it records")
            continue
        folder = root / "data" / split
        present = {p.name for p in folder.glob("*.hdf5")} if folder.is_dir() else set()
        missing = sorted(set(listed) - present)
        if missing:
            raise FileNotFoundError(f"{folder}: {len(missing)} of the {len(listed)} files the manifest lists are "
                                    f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); {repair}")
        foreign = sorted(present - set(listed))
        if foreign:
            raise ValueError(f"{folder / foreign[0]}: not a file of this dataset (its manifest does not list it"
                             f"{f', nor {len(foreign) - 1} more' if len(foreign) > 1 else ''}); move it out of the folder")
        for name, record in sorted(listed.items()):
            file = folder / name
            size = file.stat().st_size
            if "bytes" in record and size != record["bytes"]:
                raise ValueError(f"{file}: {size} bytes, the manifest recorded {record['bytes']}: changed after it "
                                 f"was generated; {repair}")
            try:
                with h5py.File(file, "r") as f:
                    attrs = dict(f["gno_ext"].attrs) if "gno_ext" in f else {}
            except OSError as err:
                raise ValueError(f"{file}: not a readable HDF5 file ({err}); {repair}") from None
            expected = {"preset": cfg.get("preset"), "size": cfg.get("size"), "split": split,
                        "fingerprint": cfg.get("fingerprint")}
            for key, value in expected.items():
                if value is not None and key in attrs and str(attrs[key]) != str(value):
                    raise ValueError(f"{file}: its {key} is {str(attrs[key])!r}, the dataset's {value!r}: a file of "
                                     f"another dataset; move it out and {repair}")
            mtime, key = file.stat().st_mtime_ns, f"{split}/{name}"
            touched = "mtime_ns" in record and mtime != record["mtime_ns"] and seen.get(key) != [size, mtime]
            if checksums or touched:
                if _sha256(file) != record.get("sha256"):
                    raise ValueError(f"{file}: its SHA-256 differs from the manifest's: changed after it was "
                                     f"generated; {repair}")
                seen[key] = [size, mtime]
    if seen != seen_before:
        with contextlib.suppress(OSError):  # a read-only copy is checked each time
            write_json(seen_path, seen)


def _write_stats(root: Path) -> None:
    """The Well's ``stats.yaml`` (mean, std, rms of each field) over the training split."""
    sums: dict[str, list[float]] = {}
    for path in sorted((root / "data" / "train").glob("*.hdf5")):
        with h5py.File(path, "r") as f:
            for order in ("t0_fields", "t1_fields"):
                for name in f[order].attrs["field_names"]:
                    x = f[order][name][()].astype(np.float64)
                    s = sums.setdefault(name, [0.0, 0.0, 0.0])
                    s[0] += x.size
                    s[1] += x.sum()
                    s[2] += (x * x).sum()
    stats: dict[str, dict[str, float]] = {"mean": {}, "std": {}, "rms": {}}
    for name, (n, s1, s2) in sums.items():
        mean = s1 / n
        stats["mean"][name] = float(mean)
        stats["std"][name] = float(np.sqrt(max(s2 / n - mean * mean, 0.0)))
        stats["rms"][name] = float(np.sqrt(s2 / n))
    (root / "stats.yaml").write_text(yaml.safe_dump(stats))


def _fingerprint_status(cfg: dict[str, Any]) -> str:
    recorded = cfg.get("fingerprint")
    if recorded is None:
        return "not recorded (made before datasets recorded their protocol: regenerate it)"
    try:
        current = fingerprint(get_preset(cfg["preset"]), cfg["size"])
    except KeyError:
        return f"{recorded[:12]} (preset {cfg['preset']!r} is not defined in this version)"
    return f"{recorded[:12]} ({'matches the current preset' if recorded == current else 'STALE: regenerate it'})"


def dataset_info(root: str | Path, checksums: bool = False) -> str:
    """A human-readable summary of a generated dataset folder, with the check of its files
    against the manifest (`verify_dataset`; ``checksums``: every byte too)."""
    root = Path(root)
    manifest_path = root / "manifest.json"
    if not manifest_path.exists():
        candidates = list(root.glob("datasets/*/manifest.json"))
        if len(candidates) != 1:
            raise FileNotFoundError(f"{root}: no manifest.json (not a generated dataset folder)")
        manifest_path = candidates[0]
        root = manifest_path.parent
    manifest = json.loads(manifest_path.read_text())
    cfg = manifest["config"]
    lines = [f"dataset {root.name}: preset {cfg['preset']}, size {cfg['size']}, "
             f"{'complete' if manifest.get('complete') else 'INCOMPLETE (run generate again to resume)'}",
             f"  protocol fingerprint {_fingerprint_status(cfg)}"]
    try:
        verify_dataset(root, checksums=checksums)
        lines.append(f"  files: as generated (names, sizes and attributes{', and checksums,' if checksums else ''} "
                     f"checked against the manifest{'' if checksums else '; --checksums reads every byte'})")
    except (FileNotFoundError, ValueError) as err:
        lines.append(f"  files: DAMAGED: {err}")
    for split in SPLITS:
        files = {k: v for k, v in manifest["files"].items() if k.startswith(split + "/")}
        if not files:
            continue
        n = sum(v["trajectories"] for v in files.values())
        with h5py.File(root / "data" / next(iter(files)), "r") as f:
            fields = [(k, f[o][k].shape[1:]) for o in ("t0_fields", "t1_fields") for k in f[o].attrs["field_names"]]
            theta = f["gno_ext/theta"][()]
        types = sorted({k.split("/")[1][len(cfg["preset"]) + 1:].rsplit("_", 1)[0] for k in files})
        lines.append(f"  {split}: {n} trajectories in {len(files)} files; boundary types {types}; "
                     f"fields {fields}; parameter in first file {theta.min():.4g}..{theta.max():.4g}")
    return "\n".join(lines)
