import h5py
import numpy as np
import pytest
import torch
from gno_ext.adapters import PDEBenchDataset, open_dataset, parameters_from_name
from gno_ext.adapters.fixtures import write_pdebench_cfd as write_cfd_2d
from gno_ext.adapters.fixtures import write_pdebench_seeds as write_seeds_2d
from gno_ext.adapters.fixtures import write_pdebench_tensor as write_tensor_1d

from gno_ext.schema import BCType, collate


def test_parameters_from_published_names():
    assert parameters_from_name("1D_Advection_Sols_beta0.1.hdf5") == {"beta": 0.1}
    assert parameters_from_name("1D_Burgers_Sols_Nu0.001.hdf5") == {"nu": 0.001}
    assert parameters_from_name("2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5") == {
        "m": 0.1, "eta": 0.01, "zeta": 0.01}
    assert parameters_from_name("2D_diff-react_NA_NA.h5") == {}


def test_single_tensor_layout_values_windows_and_split(tmp_path):
    path = tmp_path / "1D_Advection_Sols_beta0.4.hdf5"
    data = write_tensor_1d(path)
    ds = open_dataset("pdebench", path, n_steps_input=2, n_steps_output=1, boundary="periodic")
    assert len(ds) == 3 * (7 - 2)
    s = ds[6]  # trajectory 1, start 1
    assert torch.equal(s.u_in[:, 0], torch.from_numpy(data[1, 1:3]))
    assert torch.equal(s.u_out[:, 0], torch.from_numpy(data[1, 3:4]))
    assert s.theta.tolist() == [pytest.approx(0.4)] and ds.parameter_names == ["beta"]
    assert s.dt == pytest.approx(0.05) and s.grid.shape == (16,) and s.grid.extent[0] == pytest.approx(1.0)
    assert s.bc.kind.tolist() == [BCType.PERIODIC] * 2
    strided = PDEBenchDataset(path, 1, 1, stride=3, boundary="periodic")
    assert torch.equal(strided[0].u_out[0, 0], torch.from_numpy(data[0, 3])) and strided[0].dt == pytest.approx(0.15)
    test = PDEBenchDataset(path, split="test", split_fractions=(1, 1, 1), boundary="periodic")
    assert {test[i].meta["trajectory"] for i in range(len(test))} == {2}


def test_cfd_layout_channels_parameters_and_boundary_from_name(tmp_path):
    path = tmp_path / "2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_16_Train.hdf5"
    fields = write_cfd_2d(path)
    ds = PDEBenchDataset(path, parameters=["m", "eta", "zeta"])
    s = ds[len(ds) - 1]  # trajectory 1, last start (3)
    want = np.stack([fields[k][1, 3] for k in ("density", "Vx", "Vy", "pressure")])
    assert torch.equal(s.u_in[0], torch.from_numpy(want))
    assert s.meta["fields"] == ["density", "Vx", "Vy", "pressure"]
    assert s.theta.tolist() == pytest.approx([0.1, 0.01, 0.01])
    assert s.grid.extent == pytest.approx((1.0, 2.0)) and s.bc.kind.tolist() == [0, 0, 0, 0]


def test_per_seed_layout_and_dataloader_workers(tmp_path):
    path = tmp_path / "2D_diff-react_NA_NA.h5"
    data = write_seeds_2d(path)
    ds = PDEBenchDataset(path)  # PDEBench's published name: no-flux walls (its generator's Laplacian)
    assert ds.bc.kind.tolist() == [BCType.NEUMANN] * 4
    assert PDEBenchDataset(path, boundary="dirichlet").bc.kind.tolist() == [BCType.DIRICHLET] * 4  # an override
    s = ds[5]  # seed 1, start 0
    assert torch.equal(s.u_in[0], torch.from_numpy(np.moveaxis(data[1][0], -1, 0)))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)
    batches = list(loader)
    assert sum(len(b) for b in batches) == len(ds) == 15
    assert torch.equal(batches[1].u_in[1], ds[5].u_in)


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such PDEBench file"):
        PDEBenchDataset(tmp_path / "missing.hdf5")
    odd = tmp_path / "odd_periodic.h5"
    with h5py.File(odd, "w") as f:
        f["something"] = np.zeros(3)
    with pytest.raises(ValueError, match="not a known PDEBench layout"):
        PDEBenchDataset(odd)
    path = tmp_path / "1D_Burgers_Sols_Nu0.01.hdf5"
    data = write_tensor_1d(path)
    with pytest.raises(KeyError, match=r"parameter\(s\) \['beta'\] not found"):
        PDEBenchDataset(path, parameters=["beta"], boundary="periodic")
    bad = tmp_path / "2D_CFD_Rand_M0.1_periodic.hdf5"
    write_cfd_2d(bad)
    with h5py.File(bad, "a") as f:
        del f["Vy"]
        f["Vy"] = np.zeros((2, 5, 8, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="different shapes"):
        PDEBenchDataset(bad)
    data[2, 4, 3] = np.nan
    with h5py.File(path, "a") as f:
        f["tensor"][...] = data
    ds = PDEBenchDataset(path, boundary="periodic")
    with pytest.raises(ValueError, match="NaN or Inf in trajectory 2, frame 4"):
        ds[2 * 6 + 3]
    with pytest.raises(ValueError, match="no window of 5 \\+ 5 frames"):
        PDEBenchDataset(path, 5, 5, boundary="periodic")


def _equal_batches(a, b):
    for name in ("u_in", "u_out", "theta", "dt", "group"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.bc.kind, b.bc.kind) and torch.equal(a.bc.values, b.bc.values)
    assert a.grid == b.grid and a.meta == b.meta


def test_batched_reads_equal_per_sample_reads(tmp_path):
    """The DataLoader's batched path (one PDEBatch per batch) gives what per-sample reads and
    collate give, also across files joined by BatchedConcat, in the order asked for."""
    from gno_ext.adapters.windows import BatchedConcat

    paths = []
    for i, m in enumerate((0.1, 1.0)):
        paths.append(tmp_path / f"2D_CFD_Rand_M{m}_Eta0.01_Zeta0.01_periodic_16_Train.hdf5")
        write_cfd_2d(paths[-1], n=3, t=5, seed=i)
    one = PDEBenchDataset(paths[0], n_steps_input=2, n_steps_output=1)
    idx = [5, 0, 3, 7, 1]
    _equal_batches(one.__getitems__(idx), collate([one[i] for i in idx]))
    both = BatchedConcat([PDEBenchDataset(p, n_steps_input=1, n_steps_output=2, group=g) for g, p in enumerate(paths)])
    idx = [len(both) - 1, 0, 7, 2, len(both) // 2 + 1, 4]
    got = both.__getitems__(idx)
    _equal_batches(got, collate([both[i] for i in idx]))
    assert len(both) == 18 and got.group.tolist() == [1, 0, 0, 0, 1, 0]
    loader = torch.utils.data.DataLoader(both, batch_size=4, shuffle=True, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(0))
    assert sum(len(b) for b in loader) == len(both)


@pytest.mark.parametrize("name,kind", [
    ("1D_Advection_Sols_beta0.1.hdf5", BCType.PERIODIC), ("1D_Burgers_Sols_Nu0.001.hdf5", BCType.PERIODIC),
    ("ReacDiff_Nu0.5_Rho1.0.hdf5", BCType.PERIODIC), ("2D_rdb_NA_NA.h5", BCType.NEUMANN),
    ("1D_CFD_Shock_Eta1.e-8_Zeta1.e-8_trans_Train.hdf5", BCType.OPEN),
    ("2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5", BCType.PERIODIC),
])
def test_published_files_open_without_a_boundary_argument(tmp_path, name, kind):
    """(Before, PDEBench's own names were refused: "the boundary type is not in the file name".)"""
    path = tmp_path / name
    write_tensor_1d(path)
    assert PDEBenchDataset(path).bc.kind.tolist() == [kind] * 2
    other = tmp_path / "my_simulation.h5"
    write_tensor_1d(other)
    with pytest.raises(ValueError, match="not one of PDEBench's published names; pass boundary="):
        PDEBenchDataset(other)


def _edit(path, key, value):
    with h5py.File(path, "r+") as f:
        if key in f:
            del f[key]
        f[key] = value


@pytest.mark.parametrize("key,value,match", [
    ("x-coordinate", np.linspace(0, 1, 4), r"x-coordinate has 4 values, but the fields' axis 1 of 16 cells need 16"),
    ("t-coordinate", np.array([0.0, 0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]), r"t-coordinate must increase strictly .* "
                                                                         r"after entry 1"),
    ("t-coordinate", np.full(8, np.nan), "t-coordinate must increase strictly"),
    ("t-coordinate", np.arange(8)[::-1] * 0.1, "t-coordinate must increase strictly"),
])
def test_bad_coordinates_are_named(tmp_path, key, value, match):
    path = tmp_path / "1D_Advection_Sols_beta0.1.hdf5"
    write_tensor_1d(path)
    _edit(path, key, value)
    with pytest.raises(ValueError, match=match):
        PDEBenchDataset(path)


def test_bad_parameters_windows_and_files_are_named(tmp_path):
    path = tmp_path / "1D_Advection_Sols_beta0.1.hdf5"
    write_tensor_1d(path)
    with h5py.File(path, "r+") as f:
        f.attrs["beta"] = np.nan
    with pytest.raises(ValueError, match=r"1D_Advection_Sols_beta0.1.hdf5: parameter beta = nan .*not a finite number"):
        PDEBenchDataset(path)
    write_tensor_1d(path)
    for key, value in (("n_steps_input", 0), ("stride", 0)):
        with pytest.raises(ValueError, match=rf"{key}: expected an integer >= 1, got 0"):
            PDEBenchDataset(path, **{key: value})
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"1D_Advection_Sols_beta0.1.hdf5: an empty file"):
        PDEBenchDataset(path)
