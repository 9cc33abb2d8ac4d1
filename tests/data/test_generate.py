import json

import h5py
import numpy as np
import pytest
import torch

from gno_ext.adapters import GeneratedDataset, open_dataset
from gno_ext.data import PRESETS, generate, get_preset
from gno_ext.data.cli import main as cli
from gno_ext.data.generate import _sha256
from gno_ext.schema import BCType, collate


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_generates_at_smoke_size_and_reads_back(name, tmp_path):
    root = generate(name, "smoke", tmp_path, device="cpu", progress=False)
    manifest = json.loads((root / "manifest.json").read_text())
    preset = get_preset(name)
    assert manifest["complete"]
    for split in ("train", "valid", "test"):
        n = sum(v["trajectories"] for k, v in manifest["files"].items() if k.startswith(split))
        assert n == len(preset.plan("smoke", split))
    ds = GeneratedDataset(root, split="train")
    s = ds[0]
    assert torch.isfinite(s.u_in).all() and torch.isfinite(s.u_out).all()
    assert s.grid.shape == (preset.resolution["smoke"],) * preset.ndim
    assert ds.parameter_names == [preset.parameter]  # the name the reports and group labels use
    assert (root / "stats.yaml").exists()


def test_the_wells_reader_opens_our_files_and_round_trip_is_lossless(tmp_path):
    pytest.importorskip("the_well")
    from the_well.data import WellDataset

    root = generate("advection-joint", "smoke", tmp_path, device="cpu", progress=False)
    well = WellDataset(path=str(root), well_split_name="train", n_steps_input=1, n_steps_output=1,
                       use_normalization=True)  # also reads our stats.yaml
    raw = WellDataset(path=str(root), well_split_name="train", n_steps_input=1, n_steps_output=1)
    ours = GeneratedDataset(root, split="train")
    assert len(well) == len(ours)
    files = sorted((root / "data" / "train").glob("*.hdf5"))
    with h5py.File(files[0]) as f:
        u = f["t0_fields/u"][()]
        vel = f["t1_fields/velocity_field"][()]
        kind = f["gno_ext/bc_kind"][()]
        values = f["gno_ext/bc_values"][()]
        theta = f["gno_ext/theta"][()]
    assert well[0]["input_fields"].shape == raw[0]["input_fields"].shape
    for i in (0, 3):
        w, s = raw[i], ours[i]
        assert torch.equal(w["input_fields"][0, ..., 0], s.u_in[0, 0])
        assert torch.equal(w["output_fields"][0, ..., 0], s.u_out[0, 0])
    # our reader gives back exactly what was written, boundary description included
    windows_per_traj = u.shape[1] - 1
    s = ours[windows_per_traj + 2]  # trajectory 1, start 2
    assert torch.equal(s.u_in[0, 0], torch.from_numpy(u[1, 2])) and torch.equal(s.u_out[0, 0], torch.from_numpy(u[1, 3]))
    assert torch.equal(s.theta_field, torch.from_numpy(np.moveaxis(vel[1], -1, 0)))
    assert torch.equal(s.bc.kind, torch.from_numpy(kind[1])) and torch.equal(s.bc.values, torch.from_numpy(values[1]))
    assert s.theta.tolist() == pytest.approx(theta[1].tolist())


def test_time_dependent_and_robin_boundaries_round_trip(tmp_path):
    root = generate("heat-bc-extended", "smoke", tmp_path, device="cpu", progress=False)
    ds = open_dataset("custom", root, n_steps_output=2, split="train")
    kinds = {tuple(ds[i].bc.kind.tolist()) for i in range(len(ds))}
    assert kinds == {(BCType.DIRICHLET,) * 4, (BCType.ROBIN,) * 4}
    timed = [ds[i] for i in range(len(ds)) if ds[i].bc.values.shape[1] > 1]
    assert timed, "the time-dependent Dirichlet setup must carry one value per frame"
    s = timed[0]
    assert s.bc.values.shape[1] == 3 and not torch.equal(s.bc.values[:, 0], s.bc.values[:, 2])
    robin = [ds[i] for i in range(len(ds)) if ds[i].bc.kind[0] == BCType.ROBIN][0]
    assert robin.bc.coeffs[0].tolist() == pytest.approx([1.0, 0.1])
    assert collate([ds[0], ds[1]]).bc.values.shape[2] == 3


def test_same_index_same_trajectory_whatever_the_batch(tmp_path):
    a = generate("heat-param", "smoke", tmp_path / "a", device="cpu", batch_size=1, progress=False)
    b = generate("heat-param", "smoke", tmp_path / "b", device="cpu", batch_size=64, progress=False)
    for fa in sorted((a / "data" / "test").glob("*.hdf5")):
        with h5py.File(fa) as x, h5py.File(b / "data" / "test" / fa.name) as y:
            assert np.array_equal(x["t0_fields/u"][()], y["t0_fields/u"][()])
            assert np.array_equal(x["gno_ext/seed"][()], y["gno_ext/seed"][()])


class Interrupt(Exception):
    pass


def test_interrupted_generation_resumes_to_the_same_dataset(tmp_path):
    full = generate("heat-joint", "smoke", tmp_path / "full", device="cpu", shard_size=2, progress=False)
    written = []

    def stop_after_two(path):
        written.append(path)
        if len(written) == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        generate("heat-joint", "smoke", tmp_path / "run", device="cpu", shard_size=2, progress=False,
                 on_shard=stop_after_two)
    root = tmp_path / "run" / "datasets" / "heat-joint"
    manifest = json.loads((root / "manifest.json").read_text())
    assert len(manifest["files"]) == 2 and not manifest.get("complete")
    # a leftover temporary file (a killed write) never counts as a shard
    (root / "data" / "train" / ".heat-joint_periodic_0000.hdf5.tmp-1").write_bytes(b"partial")
    assert "INCOMPLETE" in cli_info(root)
    seen = []
    generate("heat-joint", "smoke", tmp_path / "run", device="cpu", shard_size=2, progress=False,
             on_shard=seen.append)
    assert len(seen) == len(json.loads((full / "manifest.json").read_text())["files"]) - 2
    assert not list(root.rglob(".*.tmp-*"))  # the interrupted write's leftover is removed
    done = json.loads((root / "manifest.json").read_text())
    ref = json.loads((full / "manifest.json").read_text())
    assert done["complete"]
    assert {k: v["trajectories"] for k, v in done["files"].items()} == {k: v["trajectories"] for k, v in ref["files"].items()}
    for key in ref["files"]:
        with h5py.File(full / "data" / key) as x, h5py.File(root / "data" / key) as y:
            assert np.array_equal(x["t0_fields/u"][()], y["t0_fields/u"][()])


def cli_info(path):
    from gno_ext.data.generate import dataset_info

    return dataset_info(path)


def test_cli(tmp_path, capsys):
    assert cli(["generate", "heat-param", "--size", "smoke", "--out", str(tmp_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "preset heat-param, size smoke, complete" in out and "test: 3 trajectories" in out
    assert cli(["list"]) == 0 and "advection-ood" in capsys.readouterr().out
    with pytest.raises(ValueError, match="refusing to mix"):
        generate("heat-param", "small", tmp_path, device="cpu", progress=False)
    with pytest.raises(KeyError, match="unknown preset 'heat'; available"):
        generate("heat", "smoke", tmp_path)


@pytest.mark.slow
def test_a_killed_generation_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "gno_ext.data.cli", "generate", "advection-joint", "--size", "smoke", "--out",
           str(tmp_path), "--device", "cpu", "--shard-size", "1"]
    manifest = tmp_path / "datasets" / "advection-joint" / "manifest.json"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if manifest.exists() and len(json.loads(manifest.read_text())["files"]) >= 2:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    state = json.loads(manifest.read_text())
    assert not state.get("complete") and len(state["files"]) < 18
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = json.loads(manifest.read_text())
    assert state["complete"] and len(state["files"]) == 18
    for key, entry in state["files"].items():
        assert _sha256(tmp_path / "datasets" / "advection-joint" / "data" / key) == entry["sha256"]
    ds = GeneratedDataset(tmp_path / "datasets" / "advection-joint", split="test")
    assert len(ds) == 6 * (get_preset("advection-joint").frames["smoke"] - 1)


def test_generated_dataset_parameter_filter_and_in_memory(tmp_path):
    root = generate("heat-param", "smoke", tmp_path, device="cpu", progress=False)
    full = GeneratedDataset(root, split="train")
    small = GeneratedDataset(root, split="train", parameter_filter=lambda a: a < 0.5)
    assert 0 < len(small) < len(full) and all(small[i].theta.item() < 0.5 for i in range(len(small)))
    cached = GeneratedDataset(root, split="train", in_memory=True)
    for i in (0, len(full) - 1):
        assert torch.equal(cached[i].u_out, full[i].u_out) and torch.equal(cached[i].bc.values, full[i].bc.values)
    with pytest.raises(ValueError, match="kept no trajectory"):
        GeneratedDataset(root, split="train", parameter_filter=lambda a: False)


def test_a_subset_of_splits_is_not_called_complete(tmp_path):
    root = generate("heat-param", "smoke", tmp_path, device="cpu", progress=False, splits=("test",))
    assert not json.loads((root / "manifest.json").read_text())["complete"]
    generate("heat-param", "smoke", tmp_path, device="cpu", progress=False)
    assert json.loads((root / "manifest.json").read_text())["complete"]


@pytest.mark.parametrize("name", ["heat-joint", "heat-bc-extended", "advection-joint"])
def test_batched_in_memory_reads_equal_per_sample_reads(name, tmp_path):
    root = generate(name, "smoke", tmp_path, device="cpu", progress=False, splits=("train",))
    ds = GeneratedDataset(root, split="train", n_steps_output=2, in_memory=True)
    idx = list(range(len(ds)))[::-3]
    fast, slow = ds.__getitems__(idx), collate([ds[i] for i in idx])
    for key in ("u_in", "u_out", "theta", "theta_field", "group", "dt"):
        a, b = getattr(fast, key), getattr(slow, key)
        assert (a is None and b is None) or torch.equal(a, b), key
    assert torch.equal(fast.bc.kind, slow.bc.kind) and torch.equal(fast.bc.values, slow.bc.values)
    assert torch.equal(fast.bc.robin_coeffs(), slow.bc.robin_coeffs()) and fast.meta == slow.meta


def test_a_listed_shard_that_was_truncated_is_made_again(tmp_path, capsys):
    """(Before, a shard the manifest listed was skipped on resume whatever its state, and reading
    it crashed later.)"""
    root = generate("heat-param", "smoke", tmp_path, device="cpu", shard_size=1, progress=False)
    manifest = json.loads((root / "manifest.json").read_text())
    key = sorted(manifest["files"])[0]
    shard = root / "data" / key
    good = shard.read_bytes()
    shard.write_bytes(good[: len(good) // 2])
    generate("heat-param", "smoke", tmp_path, device="cpu", shard_size=1, progress=False)
    assert f"{shard}: does not match the size and checksum the manifest recorded" in capsys.readouterr().out
    assert shard.read_bytes() == good  # the same trajectories, deterministically
    assert json.loads((root / "manifest.json").read_text())["files"][key]["bytes"] == len(good)
    assert len(GeneratedDataset(root, split=key.split("/")[0])) > 0


@pytest.mark.slow
def test_a_second_process_waits_for_the_first_and_only_our_temporaries_are_removed(tmp_path):
    """(Before, two processes generating into one folder with different shard sizes both exited 0
    and left duplicated trajectories.)"""
    import fcntl
    import subprocess
    import sys

    root = tmp_path / "datasets" / "heat-param"
    (root / "data" / "train").mkdir(parents=True)
    ours = [root / ".manifest.json.tmp-12", root / "data" / "train" / ".heat-param_periodic_0000.hdf5.tmp-34"]
    theirs = root / "data" / "train" / ".my-notes.txt"
    for path in (*ours, theirs):
        path.write_text("x")
    held = open(root / ".generate.lock", "w")
    fcntl.flock(held, fcntl.LOCK_EX)  # a first process at work
    cmd = [sys.executable, "-m", "gno_ext.data.cli", "generate", "heat-param", "--size", "smoke", "--out",
           str(tmp_path), "--device", "cpu", "--shard-size", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert "another process is generating this dataset; waiting" in proc.stdout.readline()
    assert not (root / "manifest.json").exists()  # it waits: nothing written
    fcntl.flock(held, fcntl.LOCK_UN)
    held.close()
    assert proc.wait(timeout=300) == 0, proc.stdout.read()
    assert not any(p.exists() for p in ours) and theirs.read_text() == "x"
    # the first process's dataset is not mixed with another shard size
    with pytest.raises(ValueError, match="refusing to mix"):
        generate("heat-param", "smoke", tmp_path, device="cpu", shard_size=1, progress=False)


def test_a_dataset_is_checked_against_its_manifest_before_use(tmp_path, capsys):
    """A generated dataset is verified when it is opened, not only when it is generated: a shard
    written to after generation (same size), a shard of another dataset dropped into a split, a
    file whose attributes name another dataset and a deleted split each stop with a message that
    names the file; `gno-data info` says so and exits 1."""
    import importlib
    import os
    import shutil

    from gno_ext.data.generate import verify_dataset
    from gno_ext.training.recipe_data import prepare_data

    root = generate("heat-param", "smoke", tmp_path / "a", device="cpu", progress=False)
    verify_dataset(root, checksums=True)
    assert "files: as generated" in cli_info(root)
    shard = sorted((root / "data" / "train").glob("*.hdf5"))[0]
    pristine = shard.read_bytes()
    cfg = {"kind": "generated", "preset": "heat-param", "size": "smoke", "root": str(tmp_path / "a")}

    # written to in place after generation: same size, new modification time -> the checksum is compared
    with h5py.File(shard, "r+") as f:
        f["t0_fields/u"][0] = 0.0
    assert shard.stat().st_size == len(pristine)
    with pytest.raises(ValueError, match=rf"{shard.name}: its SHA-256 differs .* changed after it was generated"):
        GeneratedDataset(root, split="train")
    with pytest.raises(ValueError, match="SHA-256 differs"):
        prepare_data(cfg, progress=False)  # before any training
    assert cli(["info", str(root)]) == 1 and "files: DAMAGED" in capsys.readouterr().out
    # a copy with a new modification time but the same bytes is accepted, and its checksum is
    # remembered (not read again at the next opening)
    shard.write_bytes(pristine)
    GeneratedDataset(root, split="train")
    generate_module = importlib.import_module("gno_ext.data.generate")  # (the package exports a function of that name)

    def no_reading(path):
        raise AssertionError(f"{path} read again")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generate_module, "_sha256", no_reading)
        verify_dataset(root)
    os.utime(shard, ns=(0, 0))  # touched again: read again
    verify_dataset(root)

    # another preset's shard dropped into the split
    other = generate("advection-param", "smoke", tmp_path / "b", device="cpu", progress=False)
    foreign = sorted((other / "data" / "train").glob("*.hdf5"))[0]
    shutil.copy(foreign, root / "data" / "train" / foreign.name)
    with pytest.raises(ValueError, match=rf"{foreign.name}: not a file of this dataset .* move it out"):
        GeneratedDataset(root, split="train")
    (root / "data" / "train" / foreign.name).unlink()

    # a file of the dataset's name and size whose attributes name another dataset
    with h5py.File(shard, "r+") as f:
        f["gno_ext"].attrs["preset"] = "advection-param"
    manifest = json.loads((root / "manifest.json").read_text())
    record = manifest["files"][f"train/{shard.name}"]
    saved = dict(record)
    record["bytes"] = shard.stat().st_size
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"{shard.name}: its preset is 'advection-param', the dataset's 'heat-param'"):
        verify_dataset(root, ["train"])
    shard.write_bytes(pristine)
    manifest["files"][f"train/{shard.name}"] = saved
    (root / "manifest.json").write_text(json.dumps(manifest))

    # the test split deleted: found when the data is prepared, before training
    shutil.rmtree(root / "data" / "test")
    with pytest.raises(FileNotFoundError, match=r"data/test: 1 of the 1 files the manifest lists are missing"):
        prepare_data(cfg, progress=False)
    with pytest.raises(FileNotFoundError, match="missing"):
        GeneratedDataset(root, split="test")
    verify_dataset(root, ["train", "valid"])  # the others are intact
