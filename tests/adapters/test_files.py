"""`open_h5`: a data file is read only if it holds its own values (no external or virtual
storage in other files) and does not declare far more than it stores."""

import h5py
import numpy as np
import pytest
from gno_ext.adapters import PDEBenchDataset
from gno_ext.adapters.files import open_h5

from gno_ext.adapters.mesh import MeshDataset


def test_external_and_virtual_storage_in_other_files_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(16, dtype=np.float32).tobytes())
    with h5py.File(tmp_path / "external.h5", "w") as f:
        f.create_dataset("tensor", shape=(16,), dtype="f4", external=[(str(secret), 0, 64)])
    with pytest.raises(ValueError, match=r"external.h5: dataset 'tensor' keeps its values in other files .*secret.bin"):
        open_h5(tmp_path / "external.h5")
    with h5py.File(tmp_path / "source.h5", "w") as f:
        f["y"] = np.arange(10.0)
    layout = h5py.VirtualLayout(shape=(10,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(tmp_path / "source.h5"), "y", shape=(10,))
    with h5py.File(tmp_path / "virtual.h5", "w") as f:
        f.create_virtual_dataset("tensor", layout)
    with pytest.raises(ValueError, match=r"virtual.h5: dataset 'tensor' is a virtual dataset that maps other files"):
        open_h5(tmp_path / "virtual.h5")
    # a virtual dataset within its own file reads nothing else
    with h5py.File(tmp_path / "own.h5", "w") as f:
        f["y"] = np.arange(10.0)
        inner = h5py.VirtualLayout(shape=(10,), dtype="f8")
        inner[:] = h5py.VirtualSource(".", "y", shape=(10,))
        f.create_virtual_dataset("v", inner)
    open_h5(tmp_path / "own.h5").close()


def test_a_file_that_declares_gigabytes_it_does_not_store_is_refused_before_any_read(tmp_path):
    """A 2 kB file that declares a (2^15, 2^15) float64 tensor (8 GiB): refused when it is opened,
    by PDEBench's reader too; a compressed field of zeros (about 400 to 1) is read."""
    path = tmp_path / "2D_diff-react_NA_NA.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("tensor", shape=(2, 2**12, 2**9, 2**9), dtype="f8", chunks=(1, 1, 64, 64))
    assert path.stat().st_size < 10_000
    with pytest.raises(ValueError, match=r"dataset 'tensor' declares shape \(2, 4096, 512, 512\) .* but stores 0 bytes"):
        open_h5(path)
    with pytest.raises(ValueError, match="stores 0 bytes"):
        PDEBenchDataset(path)
    with h5py.File(tmp_path / "zeros.h5", "w") as f:
        f.create_dataset("tensor", data=np.zeros((512, 512)), compression="gzip")
    with open_h5(tmp_path / "zeros.h5") as f:
        assert f["tensor"].shape == (512, 512)


def test_a_mesh_dataset_with_external_storage_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 64)
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f.create_dataset("u", shape=(16,), dtype="f4", external=[(str(secret), 0, 64)])
    with pytest.raises(ValueError, match="keeps its values in other files"):
        MeshDataset(tmp_path / "train.h5")


def test_uneven_coordinates_and_a_split_of_two_grids_are_named(tmp_path):
    """(Before: uneven coordinates gave a wrong extent without a word, and a split whose files
    had different extents was read with the first file's grid.)"""
    import shutil

    from gno_ext.adapters import GeneratedDataset
    from gno_ext.data import generate

    root = generate("heat-param", "smoke", tmp_path / "gen", device="cpu", progress=False)
    train = root / "data" / "train"
    shard = sorted(train.glob("*.hdf5"))[0]
    (root / "manifest.json").unlink()  # data of one's own: no manifest to check it against
    copy = train / "z-copy.hdf5"  # (sorted after the shard: the shard sets the grid)
    shutil.copy(shard, copy)
    with h5py.File(copy, "r+") as f:
        f["dimensions/x"][...] = 2 * f["dimensions/x"][()]  # evenly spaced, twice the extent
    with pytest.raises(ValueError, match=r"z-copy.hdf5: its grid \(16, 16\) of extent \(2.0, 1.0\) differs from heat-param_\w+.hdf5's"):
        GeneratedDataset(root, split="train")
    with h5py.File(copy, "r+") as f:
        x = f["dimensions/x"][()] / 2
        x[-1] += 0.05  # the last cell moved
        f["dimensions/x"][...] = x
    with pytest.raises(ValueError, match=r"z-copy.hdf5: dimensions/x is not evenly spaced"):
        GeneratedDataset(root, split="train")


def test_complex_arrays_are_refused_not_truncated():
    from gno_ext.adapters import ArrayDataset

    u = np.zeros((2, 4, 1, 8, 8), np.complex64)
    with pytest.raises(ValueError, match="mine: u holds complex values; .* real and imaginary parts as two channels"):
        ArrayDataset(u, name="mine")
    with pytest.raises(ValueError, match="theta holds complex values"):
        ArrayDataset(u.real, theta=np.ones((2, 1), np.complex128))


def test_a_well_split_of_two_grids_is_named(tmp_path):
    """The Well's files of one split must share a grid (before: the first file's was used for all)."""
    pytest.importorskip("the_well")
    from gno_ext.adapters.fixtures import write_trl_dataset, write_well_trl
    from gno_ext.adapters.the_well import WellAdapter

    base = write_trl_dataset(tmp_path / "well", shape=(16, 48))
    train = base / "datasets" / "turbulent_radiative_layer_2D" / "data" / "train"
    other = sorted(train.glob("*.hdf5"))[-1]
    write_well_trl(other, 0.32, shape=(16, 24), t=12)
    with pytest.raises(ValueError, match=rf"{other.name}: its grid \(16, 24\) of extent .* differs from"):
        WellAdapter(base, name="turbulent_radiative_layer_2D", split="train")
