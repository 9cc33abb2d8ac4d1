"""`gno_ext.adapters.TrajectoryData`: the one interface through which training reads a data
source's parameters, boundary configurations, rollout windows and trajectory lengths; every
adapter implements it, and a dataset of one's own without it gets the documented defaults."""

import numpy as np
import pytest
import torch
from gno_ext.adapters import (
    ArrayDataset,
    GeneratedDataset,
    PDEBenchDataset,
    TrajectoryData,
)
from gno_ext.adapters.fixtures import write_pdebench_tensor, write_trl_dataset

from gno_ext.data import generate
from gno_ext.schema import BoundarySpec, PDESample
from gno_ext.training.recipe_data import (
    parameter_values,
    rollout_indices,
    trajectory_lengths,
    window_boundary_kinds,
)


def adapters(tmp_path):
    root = generate("heat-bc", "smoke", tmp_path / "gen", device="cpu", progress=False)
    yield "generated", GeneratedDataset(root, split="train")
    u = np.random.default_rng(0).normal(size=(4, 6, 1, 8, 8)).astype(np.float32)
    kinds = BoundarySpec.from_types(["periodic"] * 4)
    yield "array", ArrayDataset(u, theta=np.arange(4.0)[:, None], bc=kinds, trajectories=[1, 3])
    write_pdebench_tensor(tmp_path / "1D_Advection_Sols_beta0.4.hdf5", n=3, t=7)
    yield "pdebench", PDEBenchDataset(tmp_path / "1D_Advection_Sols_beta0.4.hdf5", split=None)
    pytest.importorskip("the_well")
    from gno_ext.adapters.the_well import WellAdapter

    base = write_trl_dataset(tmp_path / "well")
    yield "the_well", WellAdapter(base, name="turbulent_radiative_layer_2D", split="train")


def test_every_adapter_implements_the_interface_consistently(tmp_path):
    seen = []
    for name, ds in adapters(tmp_path):
        seen.append(name)
        assert isinstance(ds, TrajectoryData), name
        kinds = window_boundary_kinds(ds)
        assert kinds.shape[0] == len(ds), name  # one row per window
        for i in (0, len(ds) - 1):  # ... the window's own configuration
            assert np.array_equal(kinds[i], ds[i].bc.kind.numpy()), (name, i)
        lengths = trajectory_lengths(ds)
        starts = rollout_indices(ds)
        assert all(ds[i].meta.get("start", 0) == 0 for i in starts), name
        assert len(starts) == len(lengths), name  # one rollout per trajectory
        later = rollout_indices(ds, 1)
        assert [ds[i].meta.get("start") for i in later] == [1] * len(later), name
        values = parameter_values(ds)
        assert values.ndim == 2 and values.shape[1] == ds[0].theta.numel(), name
    assert seen[:3] == ["generated", "array", "pdebench"]


class Plain(torch.utils.data.Dataset):
    """A dataset of one's own: samples only."""

    def __init__(self, sample):
        self.sample = sample

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return self.sample


def test_a_dataset_without_the_interface_gets_the_defaults_and_clear_errors(tmp_path):
    source = next(ds for name, ds in adapters(tmp_path) if name == "array")
    plain = Plain(source[0])
    assert isinstance(source[0], PDESample) and not isinstance(plain, TrajectoryData)
    assert torch.equal(parameter_values(plain), source[0].theta.reshape(1, -1))  # its first sample's parameters
    assert window_boundary_kinds(plain).shape == (3, source[0].bc.kind.shape[-1])
    assert rollout_indices(plain) == [0, 1, 2]  # one window per trajectory
    with pytest.raises(ValueError, match="eval.start_frame=1: this dataset \\(Plain\\) has one window per trajectory"):
        rollout_indices(plain, 1)
    with pytest.raises(TypeError, match="Plain: cannot tell its trajectory lengths .*TrajectoryData"):
        trajectory_lengths(plain)
