import pytest
import torch

from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch, PDESample, collate


def make_sample(shape=(8, 6), t_in=1, t_out=2, channels=3, params=2, seed=0, bc=None, field=True):
    gen = torch.Generator().manual_seed(seed)
    grid = Grid(shape, (1.0, 2.0, 3.0)[: len(shape)])
    d = len(shape)
    bc = bc or BoundarySpec.from_types(["dirichlet", "neumann"] + ["periodic"] * (2 * d - 2), [1.0, -2.0] + [0.0] * (2 * d - 2))
    return PDESample(
        u_in=torch.randn(t_in, channels, *shape, generator=gen),
        u_out=torch.randn(t_out, channels, *shape, generator=gen),
        theta=torch.randn(params, generator=gen),
        bc=bc, grid=grid, dt=0.1,
        theta_field=torch.randn(d, *shape, generator=gen) if field else None,
        group=seed, meta={"index": seed},
    )


@pytest.mark.parametrize("shape", [(16,), (8, 6), (4, 5, 6)])
def test_collate_stacks_every_field(shape):
    samples = [make_sample(shape, seed=i) for i in range(3)]
    batch = collate(samples)
    assert batch.u_in.shape == (3, 1, 3, *shape)
    assert batch.u_out.shape == (3, 2, 3, *shape)
    assert batch.theta.shape == (3, 2)
    assert batch.theta_field.shape == (3, len(shape), *shape)
    assert batch.bc.kind.shape == (3, 2 * len(shape))
    assert batch.group.tolist() == [0, 1, 2]
    assert batch.meta == [{"index": 0}, {"index": 1}, {"index": 2}]
    for i, s in enumerate(samples):
        assert torch.equal(batch.u_in[i], s.u_in)
        assert torch.equal(batch.theta_field[i], s.theta_field)
        assert torch.equal(batch.bc.kind[i], s.bc.kind)


def test_collate_broadcasts_constant_boundary_data():
    grid_faces = 4
    full = torch.arange(grid_faces * 3 * 8, dtype=torch.float32).reshape(grid_faces, 3, 8)
    varying = BoundarySpec(torch.ones(grid_faces, dtype=torch.long), full)
    constant = BoundarySpec.from_types(["dirichlet"] * 4, [1, 2, 3, 4])
    batch = collate([make_sample((8, 8), bc=varying), make_sample((8, 8), bc=constant, seed=1)])
    assert batch.bc.values.shape == (2, 4, 3, 8)
    assert torch.equal(batch.bc.values[0], full)
    assert torch.equal(batch.bc.values[1, 2], torch.full((3, 8), 3.0))


def test_to_moves_everything_and_indexing_selects_samples():
    batch = collate([make_sample(seed=i) for i in range(4)])
    moved = batch.to("cpu")
    assert moved.bc.values.device.type == "cpu"
    sub = batch[torch.tensor([True, False, True, False])]
    assert len(sub) == 2 and sub.meta == [{"index": 0}, {"index": 2}]
    assert torch.equal(sub.u_out[1], batch.u_out[2])
    assert torch.equal(sub.bc.kind, batch.bc.kind[[0, 2]])
    assert len(batch[1:3]) == 2
    assert len(batch[-1]) == 1 and batch[-1].meta == [{"index": 3}]


def test_loader_collate_and_pin_memory_roundtrip():
    data = [make_sample(seed=i) for i in range(5)]
    loader = torch.utils.data.DataLoader(data, batch_size=2, collate_fn=collate)
    sizes = [len(b) for b in loader]
    assert sizes == [2, 2, 1]


@pytest.mark.parametrize("field,value,match", [
    ("u_in", torch.zeros(1, 3, 8, 5), r"PDESample\.u_in: expected shape \(T, C, 8, 6\), got \(1, 3, 8, 5\)"),
    ("u_out", torch.zeros(2, 4, 8, 6), "u_in has 3 channels but u_out has 4"),
    ("theta", torch.zeros(2, 2), r"PDESample\.theta: expected shape \(P,\)"),
    ("theta_field", torch.zeros(2, 8, 7), r"PDESample\.theta_field: expected shape \(C_f, 8, 6\)"),
])
def test_sample_shape_errors_name_the_field(field, value, match):
    s = make_sample()
    kwargs = {k: getattr(s, k) for k in ("u_in", "u_out", "theta", "bc", "grid", "theta_field")}
    kwargs[field] = value
    with pytest.raises(ValueError, match=match):
        PDESample(**kwargs)


def test_batch_checks_batch_axes():
    batch = collate([make_sample(seed=i) for i in range(2)])
    with pytest.raises(ValueError, match=r"PDEBatch\.dt: expected shape \(2,\)"):
        PDEBatch(batch.u_in, batch.u_out, batch.theta, batch.bc, batch.grid, torch.ones(3))
    with pytest.raises(ValueError, match=r"PDEBatch\.bc\.kind"):
        PDEBatch(batch.u_in, batch.u_out, batch.theta, batch.bc[0:1], batch.grid, batch.dt)


def test_boundary_spec_validation():
    with pytest.raises(ValueError, match="unknown boundary type 'slip'"):
        BoundarySpec.from_types(["slip", "dirichlet"])
    with pytest.raises(ValueError, match="unknown boundary type code"):
        BoundarySpec(torch.tensor([0, 9]), torch.zeros(2, 1, 1))
    with pytest.raises(ValueError, match=r"BoundarySpec\.values: expected shape"):
        BoundarySpec(torch.tensor([1, 1]), torch.zeros(3, 1, 1))
    with pytest.raises(ValueError, match="NaN or Inf"):
        BoundarySpec(torch.tensor([1, 1]), torch.full((2, 1, 1), float("nan")))
    with pytest.raises(ValueError, match="required when a face is ROBIN"):
        BoundarySpec.from_types(["robin", "dirichlet"])
    with pytest.raises(ValueError, match="periodic face must be paired"):
        BoundarySpec.from_types(["periodic", "dirichlet"]).check_grid(Grid((8,)))
    with pytest.raises(ValueError, match="4 faces do not fit a 3-D grid"):
        BoundarySpec.periodic(2).check_grid(Grid((4, 4, 4)))
    with pytest.raises(ValueError, match="N_face must be 1 or 8"):
        BoundarySpec(torch.ones(4, dtype=torch.long), torch.zeros(4, 1, 5)).check_grid(Grid((8, 8)))


def test_robin_coefficients_filled_from_type():
    spec = BoundarySpec.from_types(["dirichlet", "neumann", "robin", "periodic"],
                                   coeffs=[[0, 0], [0, 0], [2.0, 0.5], [0, 0]])
    assert spec.robin_coeffs().tolist() == [[1, 0], [0, 1], [2.0, 0.5], [0, 0]]
    assert BCType.parse("Neumann") is BCType.NEUMANN and BCType.parse(3) is BCType.ROBIN


def test_face_data_and_face_coordinates_agree():
    grid = Grid((4, 3), (2.0, 3.0))
    coords = [grid.face_coordinates(f) for f in range(4)]
    assert coords[0].shape == (2, 3) and coords[2].shape == (2, 4)
    assert torch.allclose(coords[1][0], torch.full((3,), 2.0, dtype=torch.float64))
    assert torch.allclose(coords[2][0], grid.axis_coordinates(0))
    values = torch.zeros(4, 1, 4)
    values[0, 0, :3] = coords[0][1]  # y along x-
    values[2, 0, :4] = coords[2][0]  # x along y-
    spec = BoundarySpec(torch.ones(4, dtype=torch.long), values)
    assert torch.allclose(spec.face_data(0, grid), grid.axis_coordinates(1).float())
    assert torch.allclose(spec.face_data(2, grid), grid.axis_coordinates(0).float())


def test_grid_validation_and_geometry():
    grid = Grid((8, 4), (2.0, 1.0))
    assert grid.spacing == (0.25, 0.25) and grid.n_faces == 4 and grid.n_face_max == 8
    assert torch.allclose(grid.coordinates()[0, :, 0], (torch.arange(8) + 0.5).double() * 0.25)
    with pytest.raises(ValueError, match="extent"):
        Grid((8, 8), (1.0, -1.0))
    with pytest.raises(ValueError, match="1 to 3 axes"):
        Grid((2, 2, 2, 2))


def test_model_inputs_unpack_a_batch_and_fill_in_the_defaults():
    from gno_ext.schema import model_inputs

    u = torch.randn(3, 1, 2, 8, 16)
    got_u, theta, field, bc, grid = model_inputs(u, ndim=2)
    assert got_u is u and theta is None and field is None and grid == Grid((8, 16))
    assert (bc.kind == BCType.PERIODIC.value).all() and bc.kind.shape == (3, 4)
    batch = collate([make_sample(seed=i) for i in range(2)])
    unpacked = model_inputs(batch, torch.zeros(1), ndim=2)  # the batch's own fields win
    assert unpacked[0] is batch.u_in and unpacked[1] is batch.theta and unpacked[3] is batch.bc
    assert unpacked[4] == batch.grid


def test_model_inputs_runs_the_models_check_before_the_defaults():
    from gno_ext.schema import model_inputs

    def check(u, theta, field):
        if u.ndim != 5:
            raise ValueError(f"u_in: expected 5 axes, got {u.ndim}")

    with pytest.raises(ValueError, match="u_in: expected 5 axes, got 2"):  # not Grid's error for a () shape
        model_inputs(torch.randn(3, 8), ndim=2, check=check)
