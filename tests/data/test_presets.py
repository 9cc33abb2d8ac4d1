import numpy as np
import pytest
import torch

from gno_ext.data import PRESETS, get_preset


@pytest.mark.parametrize("name,train,test", [
    ("heat-param", 501 * 10, 1001 * 2), ("heat-bc", 1000 + 2 * 100 * 10, 200 + 2 * 100 * 2),
    ("heat-joint", 501 * 15 * 10, 1001 * 15 * 2), ("advection-param", 500 * 10, 1000 * 2),
    ("advection-joint", 500 * 15 * 10, 1000 * 15 * 2), ("burgers-param", 501 * 10, 1001 * 2),
    ("ns-param", 101 * 10, 501 * 2),
])
def test_paper_counts_of_appendix_c(name, train, test):
    p = get_preset(name)
    assert len(p.plan("paper", "train")) == train and len(p.plan("paper", "test")) == test


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_bench_size_is_the_paper_protocol_with_fewer_trajectories(name):
    p = get_preset(name)
    assert p.resolution["bench"] == p.resolution["paper"] and p.frames["bench"] == p.frames["paper"]
    windows = len(p.plan("bench", "train")) * (p.frames["bench"] - 1)
    assert windows <= 31_000  # a fifth of heat-param's paper epoch (100k windows) or less
    for split in ("train", "valid", "test"):
        bench, paper = p.plan("bench", split), p.plan("paper", split)
        assert 0 < len(bench) <= len(paper)
        assert set(bench.setups) == set(paper.setups)  # every boundary type of the protocol
        values, full = p.parameter_values("bench", split), p.parameter_values("paper", split)
        assert values.min() == pytest.approx(full.min()) and values.max() == pytest.approx(full.max())
    # the same ranges of boundary data, and the OOD test split out of the training range
    faces = np.array([t.face_values for t in p.trajectories("bench", "test") if t.boundary != "periodic"])
    if len(faces) and p.test_value_ranges:
        assert np.abs(faces).min() >= 10
    elif len(faces):
        assert np.abs(faces).max() <= 10


def test_parameter_grids_and_ranges():
    heat = get_preset("heat-param").parameter_values("paper", "train")
    assert len(heat) == 501 and heat[0] == pytest.approx(0.01) and heat[-1] == pytest.approx(1.0)
    burgers = get_preset("burgers-param")
    assert burgers.parameter_values("paper", "test")[0] == pytest.approx(0.01)  # the shifted test range
    inside = get_preset("burgers-param-in")  # the in-distribution column: test viscosities on the training grid's interval
    assert inside.parameter_values("paper", "test")[[0, -1]] == pytest.approx([5e-4, 5e-2])
    assert np.array_equal(inside.parameter_values("paper", "train"), burgers.parameter_values("paper", "train"))
    ns = get_preset("ns-param").parameter_values("paper", "test")
    assert len(ns) == 501 and ns.min() == 500 and ns.max() == 1000


def test_boundary_setups():
    joint = get_preset("heat-joint").trajectories("small", "train")
    bounded = [t for t in joint if t.boundary != "periodic"]
    values = np.array([t.face_values for t in bounded])
    assert values.min() >= -10 and values.max() <= 10 and len(set(map(tuple, values))) > 1
    # joint: each parameter value has its own setups; boundary-only: setups shared by all
    by_param = {}
    for t in bounded:
        by_param.setdefault((t.boundary, t.setup), set()).add(t.face_values)
    assert any(len(v) > 1 for v in by_param.values())
    ood = get_preset("advection-ood").trajectories("small", "test")
    ood_values = np.abs([v for t in ood if t.boundary == "dirichlet" for v in t.face_values])
    assert ood_values.min() >= 10 and ood_values.max() <= 15
    seeds = [t.seed for t in joint]
    assert len(set(seeds)) == len(seeds)
    assert get_preset("heat-joint").trajectories("small", "train")[7] == joint[7]


def test_unknown_names():
    with pytest.raises(KeyError, match="available: advection-3d"):
        get_preset("heat")
    with pytest.raises(ValueError, match="size: expected one of"):
        PRESETS["heat-param"].plan("huge", "train")


def test_burgers_lives_on_the_2pi_box_with_the_initial_fields_scaled_to_it():
    """The Burgers presets' box has side 2 pi (the paper leaves it open; on the unit box the test
    fields of the shifted interval all but vanish within the rollout, recipes/burgers_oracles.py),
    and its initial fields are the unit box's stretched to it: the correlation length scales with
    the side, so the same trajectory's initial velocity is the same array. The other presets keep
    the unit box, and their datasets' fingerprints do not name an extent."""
    import dataclasses

    from gno_ext.data.fingerprint import protocol
    from gno_ext.data.simulate import simulate

    burgers = get_preset("burgers-param")
    assert burgers.extent == pytest.approx(2 * np.pi) and burgers.grid("bench").extent == (burgers.extent,) * 2
    assert burgers.grid("bench").spacing == pytest.approx((2 * np.pi / 128,) * 2)
    unit = dataclasses.replace(burgers, extent=1.0, frames={**burgers.frames, "smoke": 1})
    boxed = dataclasses.replace(burgers, frames={**burgers.frames, "smoke": 1})
    trajs = burgers.trajectories("smoke", "train")[:2]
    torch.testing.assert_close(simulate(boxed, trajs, "smoke").u[:, 0], simulate(unit, trajs, "smoke").u[:, 0])
    assert protocol(burgers, "smoke")["extent"] == pytest.approx(2 * np.pi)
    assert "extent" not in protocol(get_preset("heat-param"), "smoke") and get_preset("heat-param").extent == 1.0
