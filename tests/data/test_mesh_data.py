"""Heat and advection datasets on irregular domains (`gno_ext.data.mesh`): the file's layout,
the reader's windows, and frames that re-solving from the stored mesh and conditions reproduces."""

import h5py
import pytest
import torch

from gno_ext.adapters.mesh import FIELDS, LAYOUT, MeshDataset
from gno_ext.data.mesh import DOMAINS, generate_advection_mesh, generate_heat_mesh
from gno_ext.schema import BCType
from gno_ext.solvers.fem import TriangleMesh, heat_fem
from gno_ext.solvers.fvm import advection_fvm


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mesh")
    return {domain: generate_heat_mesh(folder / f"{domain}.h5", 4, domain, frames=5, dt=0.02, resolution=3, seed=3)
            for domain in DOMAINS}


@pytest.fixture(scope="module")
def dataset(files):
    return files["annulus"]


def test_the_file_has_the_documented_layout(dataset):
    with h5py.File(dataset) as f:
        assert f.attrs["layout"] == LAYOUT and list(f.attrs["parameter_names"]) == ["alpha"]
        assert f.attrs["domain"] == "annulus" and f.attrs["dataset_name"] == "heat_annulus"
        assert set(FIELDS) <= set(f)
        n, frames, nodes, channels = f["u"].shape
        assert (n, frames, nodes, channels) == (4, 5, 48, 1) and f["pos"].shape == (4, 48, 2)
        assert f["boundary_index"].shape == (4, 24) and f["boundary_values"].shape == (4, 24, 1)
        assert set(f["boundary_kind"][()].flatten().tolist()) == {int(BCType.DIRICHLET), int(BCType.NEUMANN)}
        assert 0.1 <= f["theta"][()].min() and f["theta"][()].max() <= 1.0
    assert not list(dataset.parent.glob(".*tmp*"))  # written under a temporary name, then renamed


def test_windows_are_valid_mesh_samples_of_every_start(dataset):
    ds = MeshDataset(dataset, n_steps_input=2, n_steps_output=1)
    assert len(ds) == 4 * 3
    s = ds[5]  # trajectory 1, start 2
    assert s.meta["trajectory"] == 1 and s.meta["start"] == 2 and s.u_in.shape == (48, 2, 1)
    whole = MeshDataset(dataset, 1, 4)[1]  # trajectory 1 from frame 0
    assert torch.equal(s.u_in[:, 0], whole.u_out[:, 1]) and torch.equal(s.u_out[:, 0], whole.u_out[:, 3])
    assert s.n_segments == 2 and s.edge_index.shape[0] == 2 and s.dt == pytest.approx(0.02)
    with pytest.raises(ValueError, match="have 5 frames"):
        MeshDataset(dataset, 3, 3)
    with pytest.raises(IndexError):
        ds[12]
    from gno_ext.adapters import open_dataset  # the same reader, as every other source is opened

    opened = open_dataset("mesh", dataset, n_steps_input=2, n_steps_output=1)
    assert isinstance(opened, MeshDataset) and torch.equal(opened[5].u_in, s.u_in)


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_frames_are_the_solvers_and_the_dirichlet_data_hold(files, domain):
    """Re-solving the stored first frame on the stored mesh, with the stored conditions,
    reproduces the stored frames (to float32 storage)."""
    dataset = files[domain]
    ds = MeshDataset(dataset, 1, 4)
    for traj in range(4):
        s = ds[traj]
        with h5py.File(dataset) as f:
            alpha = float(f["theta"][traj, 0])
        mesh, dirichlet, value = _stored_problem(dataset, s, traj)
        u = s.u_in[:, 0, 0].double()
        for frame in range(4):
            u = heat_fem(mesh, u, alpha, 0.02, 4, dirichlet, g_dirichlet=lambda x, t: value,
                         g_neumann=lambda x, t: value)
            torch.testing.assert_close(u.float(), s.u_out[:, frame, 0], rtol=1e-4, atol=1e-4)
        held = s.boundary_index[s.boundary_kind == int(BCType.DIRICHLET)]
        assert torch.allclose(s.u_out[held, :, 0], value[held].float()[:, None].expand(-1, 4))
        # outward unit normals: a step along the normal leaves the domain (the mesh's triangles)
        normal = s.boundary_normal.double()
        assert torch.allclose(normal.norm(dim=1), torch.ones(len(normal), dtype=torch.float64))
        assert not _inside(mesh, s.pos[s.boundary_index].double() + 1e-3 * normal).any()
        assert _inside(mesh, s.pos[s.boundary_index].double() - 1e-3 * normal).all()


def _stored_problem(path, s, traj: int) -> tuple[TriangleMesh, torch.Tensor, torch.Tensor]:
    """The mesh of trajectory ``traj`` (window ``s``) from the file: boundary edges (those of one
    triangle), each edge's segment and whether it is Dirichlet (both its nodes are: a node shared
    with a Dirichlet segment is one), and the boundary data at the nodes."""
    with h5py.File(path) as f:
        triangles = torch.from_numpy(f["triangles"][traj])
    edges = torch.cat([triangles[:, [0, 1]], triangles[:, [1, 2]], triangles[:, [2, 0]]]).sort(1).values
    unique, count = edges.unique(dim=0, return_counts=True)
    boundary_edges = unique[count == 1]
    assert torch.equal(boundary_edges.flatten().unique(), s.boundary_index.sort().values)
    node_segment = torch.full((s.n_nodes,), -1)
    node_segment[s.boundary_index] = s.boundary_segment
    mesh = TriangleMesh(s.pos.double(), triangles, boundary_edges, node_segment[boundary_edges[:, 0]])
    node_kind = torch.zeros(s.n_nodes, dtype=torch.long)
    node_kind[s.boundary_index] = s.boundary_kind
    value = torch.zeros(s.n_nodes, dtype=torch.float64)
    value[s.boundary_index] = s.boundary_values[:, 0].double()
    return mesh, (node_kind[boundary_edges] == int(BCType.DIRICHLET)).all(1), value


@pytest.fixture(scope="module")
def advection_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mesh_advection")
    return {domain: generate_advection_mesh(folder / f"{domain}.h5", 4, domain, frames=4, dt=0.05, resolution=3,
                                            seed=5) for domain in DOMAINS}


@pytest.mark.parametrize("domain", DOMAINS)
def test_advection_frames_are_the_solvers(advection_files, domain):
    """The advection file's layout, and its frames re-solved from the stored first frame, mesh,
    velocity and conditions; the flow goes in every direction at the documented speeds."""
    path = advection_files[domain]
    with h5py.File(path) as f:
        assert list(f.attrs["parameter_names"]) == ["vx", "vy"] and f.attrs["dataset_name"] == f"advection_{domain}"
        velocity = torch.from_numpy(f["theta"][()]).double()
        kind, values = f["boundary_kind"][()], f["boundary_values"][()][..., 0]
    speed = velocity.norm(dim=1)
    assert velocity.shape == (4, 2) and (0.5 <= speed).all() and (speed <= 1.5).all()
    assert (values[kind == int(BCType.NEUMANN)] == 0).all()  # zero normal gradient
    ds = MeshDataset(path, 1, 3)
    assert ds.parameter_names == ["vx", "vy"]
    for traj in range(4):
        s = ds[traj]
        mesh, dirichlet, value = _stored_problem(path, s, traj)
        u = s.u_in[:, 0, 0].double()
        for frame in range(3):
            u = advection_fvm(mesh, u, velocity[traj], [0.0, 0.05], dirichlet, g_dirichlet=lambda x, t: value)[-1]
            torch.testing.assert_close(u.float(), s.u_out[:, frame, 0], rtol=1e-4, atol=1e-4)
        assert (s.u_out[:, -1] != s.u_in[:, 0]).any()  # it moved
    with pytest.raises(ValueError, match="speed_range: expected 0 < low <= high"):
        generate_advection_mesh(path.parent / "x.h5", 1, speed_range=(0.0, 1.0))
    assert not (path.parent / "x.h5").exists() and not list(path.parent.glob(".*tmp*"))


def _inside(mesh: TriangleMesh, points: torch.Tensor) -> torch.Tensor:
    """Whether each point lies in a triangle of ``mesh``."""
    a, b, c = (mesh.nodes[mesh.triangles[:, k]] for k in range(3))

    def cross(p, q, r):  # (P, T): the orientation of r against the edge p -> q
        return (q - p)[None, :, 0] * (r[:, None, 1] - p[None, :, 1]) - (q - p)[None, :, 1] * (r[:, None, 0] - p[None, :, 0])

    return ((cross(a, b, points) >= 0) & (cross(b, c, points) >= 0) & (cross(c, a, points) >= 0)).any(1)


def test_the_domains_differ_as_documented(files):
    with h5py.File(files["star"]) as f:
        radius = torch.from_numpy(f["pos"][()]).norm(dim=-1)  # (n, N)
        outer = torch.from_numpy(f["boundary_segment"][()]) == 0
        index = torch.from_numpy(f["boundary_index"][()]).long()
        rim = torch.gather(radius, 1, index)
        assert (rim[outer].std() > 0.01) and 0.84 < rim[outer].min() and rim[outer].max() < 1.16  # not a circle
    with h5py.File(files["l-shape"]) as f:
        pos = torch.from_numpy(f["pos"][()])
        assert torch.equal(pos[0], pos[3])  # one mesh
        assert not ((pos[..., 0] > 0.5 + 1e-6) & (pos[..., 1] > 0.5 + 1e-6)).any()
        corner = torch.from_numpy(f["boundary_segment"][()]) == 1
        assert corner.any(1).all()
    with h5py.File(files["square"]) as f:  # four sides, each its own segment; a corner on one of its two
        pos = torch.from_numpy(f["pos"][()]).double()
        index = torch.from_numpy(f["boundary_index"][()]).long()
        segment = torch.from_numpy(f["boundary_segment"][()]).long()
        kind = torch.from_numpy(f["boundary_kind"][()]).long()
        dirichlet = kind == int(BCType.DIRICHLET)
        assert segment.unique().tolist() == [0, 1, 2, 3] and pos.shape[1] == 49  # 6 cells per side at resolution 3
        at = torch.gather(pos, 1, index[..., None].expand(-1, -1, 2))
        side = torch.stack([at[..., 0] == 0, at[..., 0] == 1, at[..., 1] == 0, at[..., 1] == 1], -1)
        assert torch.gather(side, 2, segment[..., None]).all()  # each node on its segment's side
        corner = side.sum(-1) == 2
        for t in range(len(pos)):  # trajectory t has configuration t: side q Dirichlet where bit q is 0
            got = [bool(dirichlet[t][(segment[t] == q) & ~corner[t]].all()) for q in range(4)]
            assert got == [((t >> q) & 1) == 0 for q in range(4)] and any(got)
        for t in range(len(pos)):  # a corner takes a Dirichlet side where it has one
            for k in corner[t].nonzero()[:, 0]:
                sides = side[t, k].nonzero()[:, 0]
                side_dirichlet = [bool(dirichlet[t][(segment[t] == q) & ~corner[t]].all()) for q in sides.tolist()]
                assert bool(dirichlet[t, k]) == any(side_dirichlet)
    with pytest.raises(ValueError, match="domain: expected one of annulus, star, l-shape, square, got 'disk'"):
        generate_heat_mesh(files["star"].parent / "x.h5", 1, "disk")


def test_a_file_of_another_layout_is_named(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["layout"] = "something"
    with pytest.raises(ValueError, match="not a mesh dataset of layout gno_ext.mesh/1"):
        MeshDataset(other)
    generate_heat_mesh(other, 2, frames=4, resolution=3)
    with h5py.File(other, "r+") as f:  # one trajectory fewer in one dataset than in the others
        pos = f["pos"][()]
        del f["pos"]
        f["pos"] = pos[:1]
    with pytest.raises(ValueError, match=r"other.h5: dataset 'pos': shape \(1, 48, 2\) has n = 1, but 2 elsewhere"):
        MeshDataset(other)
    with pytest.raises(FileNotFoundError, match="no such file"):
        MeshDataset(tmp_path / "missing.h5")
    with pytest.raises(ValueError, match="alpha_range: expected 0 < low <= high"):
        generate_heat_mesh(tmp_path / "x.h5", 1, alpha_range=(1.0, 0.1))


def test_the_mesh_gno_learns_from_the_windows(dataset):
    """Data to model: windows of two trajectories, batched by torch-geometric, and a few steps
    of the mesh GNO lower the one-step error."""
    pytest.importorskip("torch_geometric")
    from gno_ext.mesh import collate_meshes
    from gno_ext.models import get_model
    from tests.models._overfit import mesh_loss_ratio

    ds = MeshDataset(dataset, 1, 1)
    batch = collate_meshes([ds[0], ds[4], ds[9]])
    torch.manual_seed(0)
    model = get_model("gno_mesh", n_params=1, log_params=[True], latent=16, depth=2, heads=2, n_kernels=2)
    assert mesh_loss_ratio(model, batch, steps=40, lr=3e-3) < 0.3


def test_a_domains_files_do_not_depend_on_the_other_domains_listed(tmp_path):
    from gno_ext.data.mesh import prepare_mesh

    prepare_mesh(tmp_path / "two", "heat", ["annulus", "l-shape"], "smoke")
    prepare_mesh(tmp_path / "one", "heat", ["l-shape"], "smoke")
    for split in ("train", "valid", "test"):
        with h5py.File(tmp_path / "two" / "heat-l-shape" / f"{split}.h5") as a, \
                h5py.File(tmp_path / "one" / "heat-l-shape" / f"{split}.h5") as b:
            assert torch.equal(torch.from_numpy(a["u"][...]), torch.from_numpy(b["u"][...]))
            assert torch.equal(torch.from_numpy(a["theta"][...]), torch.from_numpy(b["theta"][...]))
    with h5py.File(tmp_path / "two" / "heat-annulus" / "train.h5") as a, \
            h5py.File(tmp_path / "two" / "heat-l-shape" / "train.h5") as b:
        assert not torch.equal(torch.from_numpy(a["theta"][...]), torch.from_numpy(b["theta"][...]))
    with pytest.raises(ValueError, match="data.domains: expected some of .*got 'disk'"):
        prepare_mesh(tmp_path / "bad", "heat", ["annulus", "disk"], "smoke")
    assert not (tmp_path / "bad").exists()  # a bad list writes nothing


def test_the_squares_grid_form_holds_the_same_trajectories(tmp_path):
    from gno_ext.adapters import open_dataset
    from gno_ext.data.mesh import grid_form, prepare_mesh

    prepare_mesh(tmp_path / "mesh", "heat", ["square"], "smoke")
    counts = grid_form(tmp_path / "mesh" / "heat-square", tmp_path / "grid.h5")
    assert counts == [4, 2, 2]
    n = 6  # square_mesh(2 * resolution) at smoke: 6 cells, 7 x 7 nodes
    with h5py.File(tmp_path / "grid.h5") as g:
        u, kind, values, theta = (torch.from_numpy(g[k][...]) for k in ("u", "bc_kind", "bc_values", "theta"))
        assert tuple(u.shape) == (8, 5, 1, n + 1, n + 1) and g.attrs["dt"] == 0.02
        assert list(g.attrs["extent"]) == pytest.approx([(n + 1) / n] * 2)
    start = 0
    for split, count in zip(("train", "valid", "test"), counts):
        with h5py.File(tmp_path / "mesh" / "heat-square" / f"{split}.h5") as f:
            pos, nodal = torch.from_numpy(f["pos"][...]), torch.from_numpy(f["u"][...])
            seg, k, v = (torch.from_numpy(f[name][...]) for name in ("boundary_segment", "boundary_kind",
                                                                      "boundary_values"))
            assert torch.equal(theta[start:start + count], torch.from_numpy(f["theta"][...]))
        for t in range(count):
            i, j = (pos[t] * n).round().long().unbind(-1)
            assert torch.equal(u[start + t, :, 0, i, j], nodal[t, ..., 0])  # node (i/n, j/n) is cell (i, j)
            for side in range(4):  # each face has its side's type and datum
                on = seg[t] == side
                assert (k[t][on] == kind[start + t, side]).all() and (v[t][on, 0] == values[start + t, side, 0, 0]).all()
            # configuration k mod 16 of the file: side s Dirichlet where its bit is 0
            config = t % 16
            assert kind[start + t].tolist() == [int(BCType.NEUMANN if config >> s & 1 else BCType.DIRICHLET)
                                                for s in range(4)]
            dirichlet = kind[start + t] == int(BCType.DIRICHLET)
            faces = [u[start + t, :, 0, 0, 1:-1], u[start + t, :, 0, -1, 1:-1], u[start + t, :, 0, 1:-1, 0],
                     u[start + t, :, 0, 1:-1, -1]]
            for side in range(4):
                if dirichlet[side]:  # the field holds the datum on a Dirichlet face
                    assert torch.allclose(faces[side], values[start + t, side, 0, 0].expand_as(faces[side]))
        start += count
    ds = open_dataset("custom", tmp_path / "grid.h5", 1, 1)  # the custom adapter reads it
    sample = ds[0]
    assert tuple(sample.u_in.shape[-2:]) == (n + 1, n + 1) and sample.bc.kind.tolist() == kind[0].tolist()


def test_grid_form_names_what_it_cannot_convert(tmp_path):
    from gno_ext.data.mesh import grid_form, prepare_mesh

    with pytest.raises(FileNotFoundError, match="train.h5: no such file"):
        grid_form(tmp_path / "nothing", tmp_path / "grid.h5")
    prepare_mesh(tmp_path / "mesh", "heat", ["annulus"], "smoke")
    with pytest.raises(ValueError, match="square domain, got layout 'gno_ext.mesh/1', domain 'annulus'"):
        grid_form(tmp_path / "mesh" / "heat-annulus", tmp_path / "grid.h5")
    assert not (tmp_path / "grid.h5").exists()


def test_a_cached_file_of_another_solver_version_is_refused(tmp_path):
    """A cached advection file made before the solver's fix (version 1, or no version recorded)
    is refused by name, not trained on; a current file is used as it is."""
    import h5py

    from gno_ext.data.fingerprint import StaleDatasetError
    from gno_ext.data.mesh import SOLVER_VERSIONS, prepare_mesh

    prepare_mesh(tmp_path, "advection", ["l-shape"], "smoke")
    test = tmp_path / "advection-l-shape" / "test.h5"
    with h5py.File(test, "r") as f:
        assert int(f.attrs["solver_version"]) == SOLVER_VERSIONS["advection"] == 2
    before = test.read_bytes()
    prepare_mesh(tmp_path, "advection", ["l-shape"], "smoke")  # current: kept as it is
    assert test.read_bytes() == before
    with h5py.File(test, "a") as f:
        del f.attrs["solver_version"]  # as the files written before versions were recorded
    with pytest.raises(StaleDatasetError, match=r"test.h5: its advection trajectories were made by solver version 1, "
                                                r"today's is 2 .* move or remove the folder .*advection-l-shape"):
        prepare_mesh(tmp_path, "advection", ["l-shape"], "smoke")
    assert test.is_file()  # nothing removed
    prepare_mesh(tmp_path, "heat", ["l-shape"], "smoke")
    with h5py.File(tmp_path / "heat-l-shape" / "test.h5", "a") as f:
        del f.attrs["solver_version"]  # heat's trajectories have not changed: version 1 is today's
    prepare_mesh(tmp_path, "heat", ["l-shape"], "smoke")


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    """The smoke heat trajectories of the annulus and the L-shape on a masked grid of side 20."""
    from gno_ext.data.mesh import masked_grid_form, prepare_mesh

    folder = tmp_path_factory.mktemp("masked")
    prepare_mesh(folder / "mesh", "heat", ["annulus", "l-shape"], "smoke")
    sources = [folder / "mesh" / "heat-annulus", folder / "mesh" / "heat-l-shape"]
    counts = masked_grid_form(sources, folder / "grid.h5", side=20)
    return folder, sources, counts


def test_the_masked_grid_holds_each_domains_trajectories_in_split_order(masked):
    from gno_ext.adapters import open_dataset
    from gno_ext.data.mesh import MASK_CHANNELS

    folder, sources, counts = masked
    assert counts == [8, 4, 4]  # two domains of 4 / 2 / 2 trajectories
    with h5py.File(folder / "grid.h5") as g:
        u, theta, fields, kind = (torch.from_numpy(g[k][...]) for k in ("u", "theta", "theta_field", "bc_kind"))
        nodes = g["node_count"][...].tolist()
        assert tuple(u.shape) == (16, 5, 1, 20, 20) and tuple(fields.shape) == (16, len(MASK_CHANNELS), 20, 20)
        assert list(g.attrs["theta_field_names"]) == list(MASK_CHANNELS) and g.attrs["dt"] == 0.02
    expected = []
    for split in ("train", "valid", "test"):  # a split's trajectories: the folders' in order
        for source in sources:
            with h5py.File(source / f"{split}.h5") as f:
                expected += [(t, f["pos"].shape[1]) for t in torch.from_numpy(f["theta"][...])]
    assert all(torch.equal(theta[k], t) for k, (t, _) in enumerate(expected))
    assert nodes == [n for _, n in expected] and len(set(nodes)) == 2  # the rings' node count, the L-shape's
    assert (kind == int(BCType.DIRICHLET)).all()
    for face in (u[..., 0, :], u[..., -1, :], u[..., :, 0], u[..., :, -1]):  # the cell around the domain: zero
        assert (face == 0).all()
    assert ((u != 0).any(1)[:, 0] <= (fields[:, 0] > 0)).all()  # values on inside cells alone
    sample = open_dataset("custom", folder / "grid.h5", 1, 1)[0]  # the custom adapter reads it
    assert tuple(sample.theta_field.shape) == (len(MASK_CHANNELS), 20, 20) and sample.u_in.shape[-1] == 20


def test_the_masked_grids_inside_cells_are_the_domains(masked):
    """The L-shape is [0, 1]^2 without (0.5, 1]^2, divided into 18 cells a side with one around:
    a cell is inside where its centre is in the L (every centre is a quarter cell at least from
    its edges); on the annulus, inside where the centre's radius is between the hole's and 1,
    away from the polygonal rims by a cell."""
    folder, sources, counts = masked
    with h5py.File(folder / "grid.h5") as g:
        fields = g["theta_field"][...]
    with h5py.File(sources[1] / "train.h5") as f:
        pos = f["pos"][0]
    h = 1 / 18
    centre = (torch.arange(20) - 0.5) * h  # cell i's centre: lo - h + (i + 1/2) h with lo = 0
    x, y = torch.meshgrid(centre, centre, indexing="ij")
    in_l = (x > 0) & (x < 1) & (y > 0) & (y < 1) & ~((x > 0.5) & (y > 0.5))
    assert pos.min() == 0 and pos.max() == 1
    assert torch.equal(torch.from_numpy(fields[4, 0] > 0), in_l)  # trajectory 4: the L-shape's first
    with h5py.File(sources[0] / "train.h5") as f:
        pos = torch.from_numpy(f["pos"][0]).double()
        hole = pos.norm(dim=1).min()
    lo, h = pos.min(0).values, float((pos.max(0).values - pos.min(0).values).max()) / 18
    cx, cy = torch.meshgrid(lo[0] - h + (torch.arange(20) + 0.5) * h, lo[1] - h + (torch.arange(20) + 0.5) * h,
                            indexing="ij")
    r = (cx ** 2 + cy ** 2).sqrt()
    inside = torch.from_numpy(fields[0, 0] > 0)
    assert inside[(r > hole + h) & (r < 1 - h)].all() and not inside[(r < hole - h) | (r > 1 + h)].any()


def test_the_masked_grids_boundary_cells_carry_their_segments_condition(masked):
    folder, sources, counts = masked
    with h5py.File(folder / "grid.h5") as g:
        fields, group = torch.from_numpy(g["theta_field"][...]), g["group"][...]
        configurations = g.attrs["configurations"].tolist()
    k = 0
    for split in ("train", "valid", "test"):
        for source in sources:
            with h5py.File(source / f"{split}.h5") as f:
                kind, segment, values = f["boundary_kind"][...], f["boundary_segment"][...], f["boundary_values"][...]
            for t in range(len(kind)):
                inside, dirichlet, neumann, datum = fields[k]
                padded = torch.nn.functional.pad(inside, (1, 1, 1, 1))
                edge = (inside > 0) & ((padded[:-2, 1:-1] * padded[2:, 1:-1] * padded[1:-1, :-2] * padded[1:-1, 2:]) == 0)
                assert torch.equal(dirichlet + neumann, edge.float())  # each boundary cell: one type, no other cell
                own = [(int(kind[t][segment[t] == s][0]), float(values[t][segment[t] == s][0, 0])) for s in (0, 1)]
                for s_kind, s_value in own:  # a segment's type is on some boundary cells, with its datum
                    cells = (dirichlet if s_kind == int(BCType.DIRICHLET) else neumann) > 0
                    assert (datum[cells] == s_value).any()
                assert {float(v) for v in datum[edge]} <= {v for _, v in own} and (datum[~edge] == 0).all()
                assert configurations[group[k]] == [kind for kind, _ in own]  # group: the segments' types
                k += 1
    assert k == sum(counts)


def test_nodes_from_grid_carries_a_linear_field_back_exactly(masked, tmp_path):
    """P1 interpolation to the cells and bilinear interpolation back are exact for a linear
    field wherever a node's four cells are inside; a smooth field comes back closer on a finer
    grid; padded node rows of the smaller domain carry weight 0."""
    import shutil

    from gno_ext.data.mesh import masked_grid_form, nodes_from_grid

    folder, sources, _ = masked
    for source in sources:  # the same meshes with u = 1 + 2x - 3y
        shutil.copytree(source, tmp_path / source.name)
        for split in ("train", "valid", "test"):
            with h5py.File(tmp_path / source.name / f"{split}.h5", "r+") as f:
                pos = f["pos"][...]
                f["u"][...] = (1 + 2 * pos[..., 0] - 3 * pos[..., 1])[:, None, :, None].repeat(f["u"].shape[1], 1)
    masked_grid_form([tmp_path / s.name for s in sources], tmp_path / "linear.h5", side=20)
    with h5py.File(tmp_path / "linear.h5") as g:
        u, cells, weights = (torch.from_numpy(g[k][...]) for k in ("u", "node_cells", "node_weights"))
        count = g["node_count"][...]
    back = nodes_from_grid(u[:, :, 0], cells, weights)  # (16, 5, most nodes)
    for k in (0, 4):  # the annulus's first trajectory, the L-shape's
        with h5py.File(tmp_path / sources[k // 4].name / "train.h5") as f:
            pos = torch.from_numpy(f["pos"][0])
        exact = 1 + 2 * pos[:, 0] - 3 * pos[:, 1]
        full = (weights[k, :count[k]] > 0).all(1)  # the four cells inside
        assert full.sum() > len(pos) / 3
        assert torch.allclose(back[k, 0, :count[k]][full], exact[full], atol=1e-5)
        assert (weights[k, :count[k]].sum(1) - 1).abs().max() < 1e-6
    assert (weights[4:8, count[4]:] == 0).all() and count[4] < count[0]  # the L-shape's padded rows
    errors = []
    for side in (12, 24):  # the smooth smoke fields, carried to the grid and back
        masked_grid_form(sources, tmp_path / f"smooth{side}.h5", side=side)
        with h5py.File(tmp_path / f"smooth{side}.h5") as g:
            carried = nodes_from_grid(torch.from_numpy(g["u"][:4, :, 0]), g["node_cells"][:4], g["node_weights"][:4])
        with h5py.File(sources[0] / "train.h5") as f:
            truth = torch.from_numpy(f["u"][...][..., 0])
        errors.append(float(((carried - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum()))
    assert errors[1] < errors[0] / 2


def test_masked_grid_form_names_what_it_cannot_convert(tmp_path, masked):
    from gno_ext.data.mesh import masked_grid_form

    folder, sources, _ = masked
    with pytest.raises(FileNotFoundError, match="train.h5: no such file"):
        masked_grid_form([tmp_path / "nothing"], tmp_path / "grid.h5")
    with pytest.raises(ValueError, match="name at least one mesh folder"):
        masked_grid_form([], tmp_path / "grid.h5")
    for side in (2, 0, 12.5):  # a side that leaves no cell for the domain, or not a count
        with pytest.raises(ValueError, match=rf"side: an integer >= 3 expected .*got {side}"):
            masked_grid_form(sources, tmp_path / "grid.h5", side=side)
    (tmp_path / "other").mkdir()
    for split in ("train", "valid", "test"):
        with h5py.File(tmp_path / "other" / f"{split}.h5", "w") as f:
            f.attrs["layout"] = "the custom layout"
    with pytest.raises(ValueError, match=r"other/train.h5: expected a gno_ext.mesh/1 file, got layout 'the custom"):
        masked_grid_form([sources[0], tmp_path / "other"], tmp_path / "grid.h5")
    assert not (tmp_path / "grid.h5").exists()  # nothing half-written


def test_gno_data_writes_both_grid_forms_and_says_how_to_train(masked, tmp_path, capsys):
    from gno_ext.data.cli import main as cli
    from gno_ext.data.mesh import prepare_mesh

    folder, sources, _ = masked
    assert cli(["masked-grid-form", *map(str, sources), "--out", str(tmp_path / "curved.h5"), "--side", "16"]) == 0
    said = capsys.readouterr().out
    assert f"{tmp_path / 'curved.h5'}: 16 trajectories (train, valid, test: 8, 4, 4)" in said
    assert f"--recipe custom data.root={tmp_path / 'curved.h5'} data.split_fractions=[8,4,4]" in said
    with h5py.File(tmp_path / "curved.h5") as g:
        assert g["u"].shape[-2:] == (16, 16)
    prepare_mesh(tmp_path / "mesh", "heat", ["square"], "smoke")
    assert cli(["grid-form", str(tmp_path / "mesh" / "heat-square"), str(tmp_path / "square.h5")]) == 0
    assert "data.split_fractions=[4,2,2]" in capsys.readouterr().out
