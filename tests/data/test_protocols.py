"""The generated datasets follow the paper's protocols (Appendix C) and no held-out data is seen in training."""

import dataclasses
import json

import h5py
import numpy as np
import pytest
import torch

from gno_ext.data import PRESETS, generate, get_preset
from gno_ext.data.fingerprint import StaleDatasetError, fingerprint
from gno_ext.data.generate import dataset_info
from gno_ext.data.simulate import velocity_fields
from gno_ext.schema import BCType

ADVECTION = sorted(n for n, p in PRESETS.items() if p.family == "advection")


def unit_fields(preset, split, size="small"):
    """Every distinct velocity field of a split, flattened to unit Frobenius norm, per boundary kind
    (periodic trajectories draw periodic fields, bounded ones non-periodic fields)."""
    out = {}
    for periodic in (True, False):
        trajs = {t.field_seed: t for t in preset.trajectories(size, split) if (t.boundary == "periodic") == periodic}
        if trajs:
            v = velocity_fields(preset, list(trajs.values()), size).double().flatten(1)
            out[periodic] = v / v.norm(dim=1, keepdim=True)
    return out


@pytest.mark.parametrize("name", ADVECTION)
def test_no_held_out_velocity_field_is_a_rescaled_training_field(name):
    preset = get_preset(name)
    train = unit_fields(preset, "train")
    for split in ("valid", "test"):
        held_out = unit_fields(preset, split)
        for periodic, fields in held_out.items():
            similarity = (fields @ train[periodic].T).abs().max()
            if preset.fixed_parameter is not None:
                # boundary-only protocol: the paper fixes one velocity field for every split
                assert fields.shape[0] == 1 and similarity > 1 - 1e-12
            else:
                assert similarity < 0.9, (split, periodic, float(similarity))


def test_velocity_field_seeds_depend_on_split_and_preset():
    a, b = get_preset("advection-param"), get_preset("advection-joint")
    seeds = {(p.name, split): {t.field_seed for t in p.trajectories("small", split)}
             for p in (a, b) for split in ("train", "valid", "test")}
    keys = sorted(seeds)
    for i, k in enumerate(keys):
        for other in keys[i + 1:]:
            assert not seeds[k] & seeds[other], (k, other)


@pytest.mark.parametrize("name,lo,hi,n", [("heat-param", 0.01, 1.0, 501), ("heat-joint", 0.01, 1.0, 501),
                                          ("burgers-param", 5e-4, 5e-2, 501)])
def test_paper_parameter_grids_are_linearly_spaced(name, lo, hi, n):
    values = get_preset(name).parameter_values("paper", "train")
    np.testing.assert_allclose(values, np.linspace(lo, hi, n), rtol=1e-12)
    np.testing.assert_allclose(np.diff(values), (hi - lo) / (n - 1), rtol=1e-9)


def test_ood_split_lies_outside_the_training_range_on_both_sides():
    preset = get_preset("advection-ood")
    train = preset.trajectories("small", "train")
    test = preset.trajectories("small", "test")
    # every protocol type of the joint protocol, in both splits
    assert {t.boundary for t in train} == {t.boundary for t in test} == {"periodic", "dirichlet", "neumann"}

    def norms(trajs):
        return velocity_fields(preset, trajs, "small").double().flatten(1).norm(dim=1)

    train_norms = torch.cat([norms([t for t in train if t.boundary == k]) for k in ("periodic", "dirichlet")])
    test_norms = torch.cat([norms([t for t in test if t.boundary == k]) for k in ("periodic", "dirichlet")])
    below, above = test_norms < train_norms.min(), test_norms > train_norms.max()
    assert bool((below | above).all()) and bool(below.any()) and bool(above.any())
    for kind in ("dirichlet", "neumann"):
        train_data = np.array([t.face_values for t in train if t.boundary == kind])
        test_data = np.abs([t.face_values for t in test if t.boundary == kind])
        assert np.abs(train_data).max() <= 10
        assert test_data.min() >= 10 and test_data.max() <= 15
    valid = preset.parameter_values("small", "valid")
    assert valid.min() >= 0.5 and valid.max() <= 1.5  # validation stays in distribution


def test_3d_advection_varies_parameter_and_boundary_conditions(tmp_path):
    preset = get_preset("advection-3d")
    assert preset.ndim == 3 and preset.resolution["paper"] == 64 and preset.joint
    train = preset.trajectories("small", "train")
    assert {t.boundary for t in train} == {"periodic", "dirichlet", "neumann"}
    assert len({t.theta for t in train}) == preset.plan("small", "train").n_params > 1
    root = generate("advection-3d", "smoke", tmp_path, device="cpu", progress=False)
    kinds = set()
    for path in (root / "data" / "train").glob("*.hdf5"):
        with h5py.File(path) as f:
            kinds |= {int(k) for k in np.unique(f["gno_ext/bc_kind"][()])}
            assert np.isfinite(f["t0_fields/u"][()]).all()
    assert kinds == {int(BCType.PERIODIC), int(BCType.DIRICHLET), int(BCType.NEUMANN)}


def _changed(monkeypatch, name, **changes):
    preset = dataclasses.replace(get_preset(name), **changes)
    monkeypatch.setitem(PRESETS, name, preset)
    return preset


def test_fingerprint_changes_with_the_protocol(monkeypatch):
    base = fingerprint(get_preset("heat-param"), "smoke")
    assert base == fingerprint(get_preset("heat-param"), "smoke")
    assert base != fingerprint(get_preset("heat-param"), "small")
    for change in ({"frame_dt": 0.01}, {"log_parameter": True}, {"value_ranges": ((-5.0, 5.0),)},
                   {"resolution": {"smoke": 8, "small": 32, "paper": 128}}):
        assert fingerprint(dataclasses.replace(get_preset("heat-param"), **change), "smoke") != base, change
    # the seeds are part of it: another name gives other seeds
    assert fingerprint(dataclasses.replace(get_preset("heat-param"), name="heat-param-2"), "smoke") != base


def test_a_stale_dataset_is_neither_resumed_nor_used(tmp_path, monkeypatch):
    from gno_ext.training.recipe_data import prepare_data

    root = generate("heat-param", "smoke", tmp_path, device="cpu", progress=False, splits=("train",))
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["config"]["fingerprint"] == fingerprint(get_preset("heat-param"), "smoke")
    with h5py.File(next((root / "data" / "train").glob("*.hdf5"))) as f:
        assert f["gno_ext"].attrs["fingerprint"] == manifest["config"]["fingerprint"]
    assert "matches the current preset" in dataset_info(root)
    files_before = sorted(p.name for p in (root / "data" / "train").iterdir())

    _changed(monkeypatch, "heat-param", frame_dt=0.01)
    cfg = {"kind": "generated", "preset": "heat-param", "size": "smoke", "root": str(tmp_path)}
    for attempt in (lambda: generate("heat-param", "smoke", tmp_path, device="cpu", progress=False),
                    lambda: prepare_data(cfg, progress=False)):
        with pytest.raises(StaleDatasetError, match=r"changed: frame_dt.*gno-data generate heat-param --size smoke"):
            attempt()
    assert "STALE" in dataset_info(root)
    # nothing was written or deleted
    assert sorted(p.name for p in (root / "data" / "train").iterdir()) == files_before
    assert json.loads((root / "manifest.json").read_text()) == manifest


def test_a_complete_dataset_without_a_fingerprint_is_refused(tmp_path):
    from gno_ext.training.recipe_data import prepare_data

    root = generate("heat-param", "smoke", tmp_path, device="cpu", progress=False)
    manifest = json.loads((root / "manifest.json").read_text())
    del manifest["config"]["fingerprint"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    cfg = {"kind": "generated", "preset": "heat-param", "size": "smoke", "root": str(tmp_path)}
    with pytest.raises(StaleDatasetError, match="before datasets recorded their protocol"):
        prepare_data(cfg, progress=False)
