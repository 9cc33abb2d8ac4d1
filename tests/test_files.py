"""Whole-or-nothing writes (gno_ext._files) and the writers that use them."""

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
