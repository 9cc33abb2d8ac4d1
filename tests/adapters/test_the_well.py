import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("the_well")

from gno_ext.adapters import open_dataset  # noqa: E402
from gno_ext.adapters.fixtures import write_well_trl  # noqa: E402
from the_well.utils.dummy_data import write_dummy_data  # noqa: E402

from gno_ext.schema import BCType, collate  # noqa: E402

NX, NY, T, N = 128, 384, 4, 2  # turbulent_radiative_layer_2D grid, reduced in time and trajectories


def write_trl(path, tcool, seed):
    return write_well_trl(path, tcool, seed, n=N, t=T, shape=(NX, NY))


@pytest.fixture(scope="module")
def trl_base(tmp_path_factory):
    base = tmp_path_factory.mktemp("well")
    split = base / "datasets" / "turbulent_radiative_layer_2D" / "data" / "train"
    split.mkdir(parents=True)
    data = {tc: write_trl(split / f"turbulent_radiative_layer_tcool_{tc:.2f}.hdf5", tc, i)
            for i, tc in enumerate((0.03, 3.16))}
    return base, data


def test_trl_layout_maps_fields_parameters_boundaries_and_time(trl_base):
    base, data = trl_base
    ds = open_dataset("the_well", base, name="turbulent_radiative_layer_2D", n_steps_input=1, n_steps_output=2)
    assert len(ds) == 2 * N * (T - 2)
    s = ds[0]
    assert s.u_in.shape == (1, 4, NX, NY) and s.u_out.shape == (2, 4, NX, NY)
    assert s.meta["fields"] == ["density", "pressure", "velocity_x", "velocity_y"]
    want = torch.from_numpy(np.moveaxis(data[0.03][0, 0:3], -1, 1))
    assert torch.equal(s.u_in[0], want[0]) and torch.equal(s.u_out, want[1:3])
    assert s.theta.tolist() == pytest.approx([0.03]) and ds.parameter_names == ["tcool"]
    assert s.bc.kind.tolist() == [BCType.PERIODIC, BCType.PERIODIC, BCType.OPEN, BCType.OPEN]
    assert s.dt == pytest.approx(0.0159, rel=1e-5)
    assert s.grid.shape == (NX, NY) and s.grid.extent == pytest.approx((1.0, 3.0))
    last = ds[len(ds) - 1]
    assert last.theta.tolist() == pytest.approx([3.16]) and last.group != s.group
    assert torch.equal(last.u_out[-1], torch.from_numpy(np.moveaxis(data[3.16][1, 3], -1, 0)))
    batch = collate([ds[0], ds[len(ds) - 1]])
    assert batch.u_in.shape == (2, 1, 4, NX, NY) and batch.group.tolist() == [0, 1]


def test_split_folder_path_and_parameter_filter(trl_base):
    base, _ = trl_base
    split = base / "datasets" / "turbulent_radiative_layer_2D" / "data" / "train"
    ds = open_dataset("the_well", split, parameter_filter=lambda p: p["tcool"] > 1.0)
    assert len(ds) == N * (T - 1)
    assert {round(ds[i].theta.item(), 2) for i in range(len(ds))} == {3.16}


def test_dummy_dataset_written_by_the_well(tmp_path):
    split = tmp_path / "datasets" / "dummy" / "data" / "train"
    split.mkdir(parents=True)
    write_dummy_data(str(split / "dummy.hdf5"))
    ds = open_dataset("the_well", tmp_path, name="dummy")
    s = ds[0]
    assert s.u_in.shape == (1, 2, 32, 32) and s.theta.numel() == 2
    assert s.theta_field.shape == (1, 32, 32)
    with h5py.File(split / "dummy.hdf5") as f:
        assert torch.allclose(s.u_in[0], torch.from_numpy(np.moveaxis(f["t1_fields/field"][0, 0], -1, 0)))
        assert torch.allclose(s.theta_field[0], torch.from_numpy(f["t0_fields/constant_field"][0]))


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such Well split folder"):
        open_dataset("the_well", tmp_path / "nope")
    (tmp_path / "datasets" / "x").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"needs name= \(datasets here: \['x'\]\)"):
        open_dataset("the_well", tmp_path)
    with pytest.raises(ValueError, match="kind: expected .the_well., .pdebench., .custom. or .mesh."):
        open_dataset("zarr", tmp_path)


def test_nan_is_reported_with_file_trajectory_and_frame(tmp_path):
    split = tmp_path / "datasets" / "turbulent_radiative_layer_2D" / "data" / "train"
    split.mkdir(parents=True)
    write_trl(split / "trl_tcool_0.10.hdf5", 0.1, 5)
    with h5py.File(split / "trl_tcool_0.10.hdf5", "a") as f:
        f["t0_fields/pressure"][1, 2, 5, 5] = np.nan
    ds = open_dataset("the_well", split, n_steps_input=1, n_steps_output=1)
    assert ds[0].meta["file"] == "trl_tcool_0.10.hdf5"
    with pytest.raises(ValueError, match=r"trl_tcool_0.10.hdf5: NaN or Inf in trajectory 1, frame 2 \(input_fields\)"):
        ds[(T - 1) + 2]
    with pytest.raises(ValueError, match=r"trajectory 1, frame 2 \(output_fields\)"):
        ds[(T - 1) + 1]


def _same_samples(a, b):
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x.u_in, y.u_in) and torch.equal(x.u_out, y.u_out), i
        assert torch.equal(x.theta, y.theta) and torch.equal(x.bc.kind, y.bc.kind) and x.dt == y.dt
        assert x.group == y.group and x.meta == y.meta
        assert (x.theta_field is None) == (y.theta_field is None)
        if x.theta_field is not None:
            assert torch.equal(x.theta_field, y.theta_field)


@pytest.mark.parametrize("n_in,n_out,stride", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)])
def test_direct_reader_gives_the_samples_of_well_dataset(trl_base, n_in, n_out, stride):
    base, _ = trl_base
    kw = dict(name="turbulent_radiative_layer_2D", n_steps_input=n_in, n_steps_output=n_out, stride=stride)
    _same_samples(open_dataset("the_well", base, **kw), open_dataset("the_well", base, reader="h5py", **kw))


def test_direct_reader_on_the_wells_own_dummy_file(tmp_path):
    """The Well's own writer: scalar and vector fields, a constant field, two constant scalars."""
    split = tmp_path / "datasets" / "dummy" / "data" / "train"
    split.mkdir(parents=True)
    write_dummy_data(str(split / "dummy.hdf5"))
    _same_samples(open_dataset("the_well", tmp_path, name="dummy", n_steps_output=2),
                  open_dataset("the_well", tmp_path, name="dummy", n_steps_output=2, reader="h5py"))
    with pytest.raises(ValueError, match="normalize=True needs reader='the_well'"):
        open_dataset("the_well", tmp_path, name="dummy", reader="h5py", normalize=True)
    with pytest.raises(ValueError, match="reader: expected"):
        open_dataset("the_well", tmp_path, name="dummy", reader="zarr")


def _same_batches(a, b, indices):
    x, y = collate(a.__getitems__(indices)), b.__getitems__(indices)
    for key in ("u_in", "u_out", "theta", "dt", "group", "theta_field"):
        u, v = getattr(x, key), getattr(y, key)
        assert (u is None and v is None) or (u.dtype == v.dtype and torch.equal(u, v)), key
    assert torch.equal(x.bc.kind, y.bc.kind) and torch.equal(x.bc.values, y.bc.values)
    assert x.meta == y.meta and x.grid == y.grid


@pytest.mark.parametrize("n_in,n_out,stride", [(1, 1, 1), (2, 1, 1), (1, 1, 2)])
def test_direct_reader_batches_equal_collated_well_dataset_samples(trl_base, n_in, n_out, stride):
    base, _ = trl_base
    kw = dict(name="turbulent_radiative_layer_2D", n_steps_input=n_in, n_steps_output=n_out, stride=stride)
    well, direct = open_dataset("the_well", base, **kw), open_dataset("the_well", base, reader="h5py", **kw)
    indices = torch.randperm(len(well), generator=torch.Generator().manual_seed(0)).tolist()
    _same_batches(well, direct, indices[:5])
    _same_batches(well, direct, indices)  # windows of both files in one batch


def test_direct_reader_batches_with_constant_fields(tmp_path):
    """The Well's own dummy file: a constant field becomes the batch's theta_field."""
    split = tmp_path / "datasets" / "dummy" / "data" / "train"
    split.mkdir(parents=True)
    write_dummy_data(str(split / "dummy.hdf5"))
    kw = dict(name="dummy", n_steps_output=2)
    well, direct = open_dataset("the_well", tmp_path, **kw), open_dataset("the_well", tmp_path, reader="h5py", **kw)
    batch = direct.__getitems__([3, 0, 1])
    assert batch.theta_field is not None and batch.theta.shape == (3, len(direct.parameter_names))
    _same_batches(well, direct, [3, 0, 1])


def test_direct_reader_reports_nan(tmp_path):
    split = tmp_path / "datasets" / "turbulent_radiative_layer_2D" / "data" / "train"
    split.mkdir(parents=True)
    write_trl(split / "trl_tcool_0.10.hdf5", 0.1, 5)
    with h5py.File(split / "trl_tcool_0.10.hdf5", "a") as f:
        f["t1_fields/velocity"][0, 1, 3, 3, 1] = np.inf
    ds = open_dataset("the_well", split, reader="h5py")
    with pytest.raises(ValueError, match=r"NaN or Inf in trajectory 0, frame 1 \(input_fields\)"):
        ds[1]
    with pytest.raises(ValueError, match=r"NaN or Inf in trajectory 0, frame 1 \(output_fields\)"):
        ds.__getitems__([T + 1, 0, 3])  # a clean window first, then windows 0 (frames 0-1) and 1
    batch = ds.__getitems__([2, T - 1])  # windows that do not touch frame 1 of trajectory 0
    assert torch.isfinite(batch.u_in).all()


def test_direct_reader_in_dataloader_workers(trl_base):
    base, _ = trl_base
    ds = open_dataset("the_well", base, name="turbulent_radiative_layer_2D", reader="h5py")
    ds[0]  # handles opened in this process must not travel to the workers
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate)
    got = torch.cat([b.u_in for b in loader])
    assert torch.equal(got, torch.stack([ds[i].u_in for i in range(len(ds))]))


def test_direct_reader_accepts_large_finite_values(tmp_path):
    """The fast check sums each window in float32; an overflow of finite values is not an error."""
    split = tmp_path / "train"
    split.mkdir()
    write_trl(split / "trl_tcool_0.10.hdf5", 0.1, 5)
    with h5py.File(split / "trl_tcool_0.10.hdf5", "a") as f:
        f["t0_fields/density"][0, 0] = 3e38
    batch = open_dataset("the_well", split, reader="h5py").__getitems__([0, 1])
    assert batch.u_in[0, 0, 0].min() == np.float32(3e38)


def _one_file_split(tmp_path, edit=None):
    split = tmp_path / "datasets" / "turbulent_radiative_layer_2D" / "data" / "train"
    split.mkdir(parents=True)
    path = split / "turbulent_radiative_layer_tcool_0.03.hdf5"
    write_well_trl(path, 0.03, 0, n=N, t=T, shape=(16, 8))
    if edit:
        with h5py.File(path, "r+") as f:
            edit(f)
    return path


@pytest.mark.parametrize("reader", ["the_well", "h5py"])
def test_a_field_shorter_than_the_time_axis_is_named_when_the_file_is_indexed(tmp_path, reader):
    """(Before, the direct reader broadcast the short read into the batch: windows got other
    samples' frames or uninitialised memory, and training went on.)"""
    def shorten(f):
        short = f["t0_fields/pressure"][:, : T - 1]
        del f["t0_fields/pressure"]
        f["t0_fields/pressure"] = short
        f["t0_fields/pressure"].attrs.update({"sample_varying": True, "time_varying": True})

    path = _one_file_split(tmp_path, shorten)
    with pytest.raises(ValueError, match=rf"{path.name}: field t0_fields/pressure has shape \(2, 3, 16, 8\), but the "
                                         rf"file's axes give \(2, 4, 16, 8\) \(n_trajectories 2, 4 times"):
        open_dataset("the_well", tmp_path, name="turbulent_radiative_layer_2D", reader=reader)


@pytest.mark.parametrize("edit,match", [
    (lambda f: f["dimensions/time"].__setitem__(slice(None), np.array([0, 1, 1, 2], np.float32)),
     "dimensions/time must increase strictly; it does not after entry 1"),
    (lambda f: f["scalars/tcool"].__setitem__((), np.nan), r"constant scalar tcool = nan: not a finite number"),
    (lambda f: f["t1_fields/velocity"].attrs.__setitem__("time_varying", False),
     r"field t1_fields/velocity has shape \(2, 4, 16, 8, 2\), but the file's axes give \(2, 16, 8, 2\)"),
])
def test_bad_time_axes_and_scalars_are_named(tmp_path, edit, match):
    _one_file_split(tmp_path, edit)
    with pytest.raises(ValueError, match=match):
        open_dataset("the_well", tmp_path, name="turbulent_radiative_layer_2D")


def test_unreadable_files_and_bad_window_settings_are_named(tmp_path):
    path = _one_file_split(tmp_path)
    for key, value in (("n_steps_input", 0), ("stride", 0), ("n_steps_output", 1.5)):
        with pytest.raises(ValueError, match=rf"{key}: expected an integer >= 1, got {value}"):
            open_dataset("the_well", tmp_path, name="turbulent_radiative_layer_2D", **{key: value})
    for content, what in ((b"", "an empty file"), (b"garbage" * 100, "not a readable HDF5 file")):
        path.write_bytes(content)
        with pytest.raises(ValueError, match=rf"{path.name}: {what}"):
            open_dataset("the_well", tmp_path, name="turbulent_radiative_layer_2D")
