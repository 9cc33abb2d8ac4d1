"""Whole-or-nothing writes (gno_ext._files) and the writers that use them."""

from pathlib import Path

import h5py
import pytest
import torch

from gno_ext._files import temporary_name, written_whole
from gno_ext.data.writer import write_well_file
from gno_ext.schema import BoundarySpec, Grid


def test_a_finished_write_replaces_the_file_and_a_failed_one_leaves_it(tmp_path):
    target = tmp_path / "sub" / "result.json"
    with written_whole(target) as tmp:
        assert tmp == temporary_name(target) and tmp.parent == target.parent  # the parent is made
        tmp.write_text("old")
        assert not target.exists()  # nothing under the real name until the block ends
    assert target.read_text() == "old"
    with pytest.raises(RuntimeError, match="killed"):
        with written_whole(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["result.json"]  # no temporary left
    with written_whole(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"


def _well_file(path, channels):
    n, t, s = 2, 3, (4, 4)
    return write_well_file(path, torch.rand(n, t, channels, *s), ["u", "v", "w"][:channels], Grid(s),
                           torch.arange(t, dtype=torch.float32), BoundarySpec.periodic(2, batch_size=n),
                           torch.rand(n, 1), ["alpha"], "test")


def test_the_dataset_writer_writes_whole_files_or_nothing(tmp_path):
    path = _well_file(tmp_path / "ok.hdf5", 1)
    with h5py.File(path) as f:
        assert f["t0_fields/u"].shape == (2, 3, 4, 4)
    with pytest.raises(ValueError, match="3 channels are neither one scalar nor one 2-vector field"):
        _well_file(tmp_path / "bad.hdf5", 3)  # fails after the file was opened
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.hdf5"]


# ---------------------------------------------------------------- a full disk

def _writers(folder):
    """Each writer the project saves with, writing into ``folder``: (name, the path it writes, write)."""
    from gno_ext._files import write_json
    from gno_ext.models import get_model, save_checkpoint
    from gno_ext.training.checkpoint import save_training_checkpoint

    model = get_model("gno", latent=128, patch=8, depth=2, heads=2, n_kernels=2)  # 2.6 MB of weights
    opt = torch.optim.AdamW(model.parameters())
    opt.step()  # an optimizer state as big as the weights
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return [
        ("hdf5", folder / "big.hdf5", lambda: write_well_file(
            folder / "big.hdf5", torch.rand(16, 6, 1, 64, 64), ["u"], Grid((64, 64)), torch.arange(6.0),
            BoundarySpec.periodic(2, batch_size=16), torch.rand(16, 1), ["alpha"], "test")),
        ("model", folder / "model", lambda: save_checkpoint(model, folder / "model")),
        ("checkpoint", folder / "run" / "checkpoints" / "step_00000003", lambda: save_training_checkpoint(
            folder / "run", 3, model, opt, sched, {"epoch": 0}, {})),
        ("json", folder / "result.json", lambda: write_json(folder / "result.json", {"x": list(range(200_000))})),
    ]


def _check_disk_full(folder, limit_name):
    from gno_ext._files import DiskFull

    def kept():  # the files, and any hidden (temporary) name (the parent folders made may stay)
        return sorted(str(p) for p in folder.rglob("*") if p.is_file() or p.name.startswith("."))

    for name, target, write in _writers(folder):
        before = kept()
        with pytest.raises(DiskFull) as caught:
            write()
        message = str(caught.value)
        assert str(target) in message and limit_name in message and "\n" not in message, (name, message)
        assert "unexpected pos" not in message and "partial write was removed" in message
        assert kept() == before, f"{name}: a partial write was left behind"


def test_a_write_past_the_file_size_limit_raises_disk_full_and_leaves_nothing(tmp_path):
    """Under ``ulimit -f`` (no privileges needed) every writer fails the way a full disk makes it
    fail (torch's zip writer: "unexpected pos ...", HDF5: its error stack): each raises
    `DiskFull`, naming what it wrote, and leaves no partial file or folder behind."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import resource, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (the write fails with EFBIG instead of killing)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
        import test_files
        test_files._check_disk_full(Path({str(tmp_path)!r}), "ulimit -f")
        print("checked")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "checked" in done.stdout, done.stderr[-3000:]


def test_a_full_disk_raises_disk_full_and_leaves_nothing(tmp_path):
    """The same on a disk that is really full: a 1 MiB tmpfs (skipped where mounting one is not
    permitted)."""
    import subprocess

    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        _check_disk_full(folder, "No space left on device")
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_the_cause_of_a_failed_write_is_read_however_the_writer_reports_it(tmp_path, monkeypatch):
    import errno
    import shutil

    from gno_ext._files import space_error

    target, tmp = tmp_path / "x.pt", tmp_path / ".x.pt.tmp-1"
    tmp.write_bytes(b"0" * 10)
    assert space_error(target, tmp, OSError(errno.ENOSPC, "No space left on device")).errno == errno.ENOSPC
    assert space_error(target, tmp, OSError("Can't write data (file write failed: errno = 28, error message = "
                                            "'No space left on device')")).errno == errno.ENOSPC  # HDF5
    assert space_error(target, tmp, RuntimeError("I/O error: Disk quota exceeded (os error 122)")).errno == \
        errno.EDQUOT  # safetensors
    silent = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")  # torch's zip
    assert space_error(target, tmp, silent) is None  # a disk with room: another cause, raised as it is
    assert space_error(target, tmp, ValueError("bad value")) is None
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=4096))
    full = space_error(target, tmp, silent)
    assert full.errno == errno.ENOSPC and "4096 bytes free" in str(full) and str(target) in str(full)
    assert space_error(target, tmp, ValueError("bad value")) is None  # not a failed write, however full


def test_a_run_configuration_that_is_not_plain_yaml_is_refused_naming_it(tmp_path):
    """A run's config.yaml (read to resume, evaluate or collect a result) with a tag that would
    build an object, broken YAML, or no mapping: one line naming the file, nothing built."""
    from gno_ext._files import read_yaml_mapping
    from gno_ext.training.evaluate import evaluate_saved

    path = tmp_path / "config.yaml"
    for text, message in (("a: !!python/object/apply:os.system ['true']\n", "not a readable YAML configuration"),
                          ("a: [1, 2\n", "not a readable YAML configuration"),
                          ("- 1\n- 2\n", "expected a mapping of settings, got list")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message) as caught:
            read_yaml_mapping(path)
        assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)
    path.write_text("a: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ValueError, match=f"{path}: not a readable YAML configuration"):
        evaluate_saved(tmp_path)
    (tmp_path / "ok.yaml").write_text("seed: 1\n")
    assert read_yaml_mapping(tmp_path / "ok.yaml") == {"seed": 1}
