import h5py
import numpy as np
import pytest
import torch
from gno_ext.adapters import ArrayDataset, open_dataset

from gno_ext.schema import BCType, BoundarySpec, Grid, collate


def arrays(n=4, t=6, c=2, s=(8, 8), seed=0):
    rng = np.random.default_rng(seed)
    return {"u": rng.standard_normal((n, t, c, *s)).astype(np.float32),
            "theta": rng.random((n, 2)).astype(np.float32),
            "theta_field": rng.standard_normal((n, 2, *s)).astype(np.float32),
            "group": np.arange(n) % 2}


def test_array_dataset_values_and_time_dependent_boundary():
    a = arrays()
    t = a["u"].shape[1]
    values = torch.arange(4 * t, dtype=torch.float32).reshape(4, t, 1)  # per face, per frame
    bc = BoundarySpec(torch.ones(4, dtype=torch.long), values)
    ds = ArrayDataset(a["u"], theta=a["theta"], grid=Grid((8, 8), (2.0, 2.0)), dt=0.1, bc=bc,
                      theta_field=a["theta_field"], group=a["group"], n_steps_input=2, n_steps_output=2)
    assert len(ds) == 4 * (t - 3)
    s = ds[4]  # trajectory 1, start 1
    assert torch.equal(s.u_in, torch.from_numpy(a["u"][1, 1:3])) and torch.equal(s.u_out, torch.from_numpy(a["u"][1, 3:5]))
    assert torch.equal(s.theta, torch.from_numpy(a["theta"][1])) and s.group == 1
    # boundary data at the input time (frame 2) and the output times (frames 3, 4)
    assert s.bc.values[0, :, 0].tolist() == [2.0, 3.0, 4.0]
    batch = collate([ds[0], ds[4]])
    assert batch.bc.values.shape == (2, 4, 3, 1)


def test_custom_file_hdf5_and_npz_with_workers(tmp_path):
    a = arrays()
    h5 = tmp_path / "runs.h5"
    with h5py.File(h5, "w") as f:
        for k, v in a.items():
            f[k] = v
        f["bc_kind"] = np.array([1, 1, 2, 2])
        f["bc_values"] = np.array([1.0, -1.0, 0.5, 0.0], dtype=np.float32).reshape(4, 1, 1)
        f.attrs["dt"] = 0.05
        f.attrs["extent"] = [1.0, 2.0]
    npz = tmp_path / "runs.npz"
    np.savez(npz, **a, dt=0.05, extent=np.array([1.0, 2.0]))
    ds = open_dataset("custom", h5, n_steps_output=2)
    s = ds[4]  # 4 windows per trajectory: trajectory 1, start 0
    assert torch.equal(s.u_in[0], torch.from_numpy(a["u"][1, 0]))
    assert s.bc.kind.tolist() == [BCType.DIRICHLET] * 2 + [BCType.NEUMANN] * 2 and s.dt == pytest.approx(0.05)
    assert s.grid.extent == (1.0, 2.0)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate)
    assert sum(len(b) for b in loader) == len(ds) == 16
    ds_npz = open_dataset("custom", npz, n_steps_output=2)
    assert torch.equal(ds_npz[4].u_in, s.u_in) and ds_npz[4].bc.kind.tolist() == [0] * 4


def test_bad_input(tmp_path):
    a = arrays()
    with pytest.raises(ValueError, match=r"theta: expected shape \(N=4"):
        ArrayDataset(a["u"], theta=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="does not match grid"):
        ArrayDataset(a["u"], grid=Grid((8, 4)))
    with pytest.raises(ValueError, match="T_bc must be 1 or the trajectory length 6"):
        ArrayDataset(a["u"], bc=BoundarySpec(torch.ones(4, dtype=torch.long), torch.zeros(4, 3, 1)))
    u = a["u"].copy()
    u[2, 4, 1, 3, 3] = np.inf
    ds = ArrayDataset(u, name="mine")
    with pytest.raises(ValueError, match="mine: NaN or Inf in trajectory 2, frame 4"):
        ds[2 * 5 + 3]
    # (before: a theta of shape (N,) was taken as one vector of N parameters shared by every
    # trajectory, and NaN in theta_field passed)
    with pytest.raises(ValueError, match=r"theta of shape \(4,\) is ambiguous with 4 trajectories: pass theta\[:, None\]"):
        ArrayDataset(a["u"], theta=np.arange(4.0))
    assert ArrayDataset(a["u"], theta=np.arange(4.0)[:, None])[5].theta.tolist() == [1.0]
    field = np.zeros((4, 2, 8, 8), np.float32)
    field[3, 1, 0, 0] = np.nan
    with_field = ArrayDataset(a["u"], theta_field=field, name="mine")
    with pytest.raises(ValueError, match="mine: NaN or Inf in theta_field of trajectory 3"):
        with_field[3 * 5]
    with pytest.raises(ValueError, match="mine: NaN or Inf in theta_field of trajectory 3"):
        with_field.__getitems__([0, 3 * 5])
    with_field[0]  # the others read
    np.savez(tmp_path / "x.npz", v=a["u"])
    with pytest.raises(KeyError, match="missing the required array 'u'"):
        open_dataset("custom", tmp_path / "x.npz")
    with pytest.raises(FileNotFoundError):
        open_dataset("custom", tmp_path / "none.h5")


def test_batched_reads_equal_per_sample_reads():
    a = arrays()
    t = a["u"].shape[1]
    bc = BoundarySpec(torch.ones(4, 4, dtype=torch.long), torch.arange(4 * 4 * t, dtype=torch.float32).reshape(4, 4, t, 1))
    ds = ArrayDataset(a["u"], theta=a["theta"], bc=bc, theta_field=a["theta_field"], group=a["group"],
                      n_steps_input=2, n_steps_output=2, stride=1)
    idx = [5, 0, 11, 3]
    fast = ds.__getitems__(idx)
    slow = collate([ds[i] for i in idx])
    for key in ("u_in", "u_out", "theta", "theta_field", "group", "dt"):
        assert torch.equal(getattr(fast, key), getattr(slow, key)), key
    assert torch.equal(fast.bc.values, slow.bc.values) and torch.equal(fast.bc.kind, slow.bc.kind)
    assert fast.meta == slow.meta
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate)
    assert torch.equal(next(iter(loader)).u_in, collate([ds[i] for i in range(4)]).u_in)


def test_process_files_open_once_per_process_and_pickle_empty(tmp_path):
    import pickle

    from gno_ext.adapters.files import ProcessFiles

    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(4)
    files = ProcessFiles()
    first = files.get(path)
    assert files.get(path) is first and first["x"][2] == 2  # opened once here
    calls = []
    assert files.memo("k", lambda: calls.append(1) or 7) == 7 and files.memo("k", lambda: calls.append(1)) == 7
    assert calls == [1]
    clone = pickle.loads(pickle.dumps(files))  # what a DataLoader worker receives
    assert clone._cache == {} and clone.get(path)["x"][3] == 3


@pytest.mark.parametrize("arrays,match", [
    ({"theta": np.array([[0.1], [np.nan]])}, r"theta\[1, 0\] = nan: the parameters must be finite"),
    ({"dt": np.array(0.0)}, r"dt = 0.0: the time between frames must be a finite number above 0"),
    ({"dt": np.array(-0.1)}, r"dt = -0.1"),
    ({"dt": np.array(np.nan)}, r"dt = nan"),
    ({"bc_kind": np.array([1.5, 1, 1, 1])}, r"bc_kind holds 1.5, not a BCType code \(0 PERIODIC, 1 DIRICHLET"),
    ({"bc_kind": np.array([9, 1, 1, 1])}, r"bc_kind holds 9, not a BCType code"),
])
def test_bad_values_of_a_users_file_are_named(tmp_path, arrays, match):
    """(Before, each of these passed silently: NaN parameters, a zero or negative time step,
    boundary codes truncated to a type.)"""
    path = tmp_path / "runs.npz"
    np.savez(path, u=np.zeros((2, 4, 1, 8, 8), np.float32), **arrays)
    with pytest.raises(ValueError, match=rf"runs.npz: {match}"):
        open_dataset("custom", path)


def test_unreadable_files_are_named_and_no_pickle_is_suggested(tmp_path):
    garbage = tmp_path / "runs.npz"
    garbage.write_bytes(b"not a zip archive" * 10)
    with pytest.raises(ValueError, match=r"runs.npz: not a readable .npz archive") as error:
        open_dataset("custom", garbage)
    objects = tmp_path / "objects.npz"
    np.savez(objects, u=np.zeros((2, 4, 1, 8, 8), np.float32), theta=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(ValueError, match=r"objects.npz: array 'theta' holds Python objects, which are not read") as other:
        open_dataset("custom", objects)
    for e in (error, other):
        assert "allow_pickle" not in str(e.value)
    for content, what in ((b"", "an empty file"), (b"x" * 64, "not a readable HDF5 file")):
        (tmp_path / "runs.h5").write_bytes(content)
        with pytest.raises(ValueError, match=rf"runs.h5: {what}"):
            open_dataset("custom", tmp_path / "runs.h5")
