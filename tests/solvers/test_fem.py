"""`gno_ext.solvers.fem`: P1 finite elements for the heat equation on an annulus, against an exact
solution, with the measured convergence order."""

import math

import pytest
import torch

from gno_ext.solvers.fem import TriangleMesh, annulus_mesh, heat_fem, l_shape_mesh, ring_mesh, square_mesh

ALPHA, T_END = 0.5, 0.2


def exact(x, t):
    """A solution of u_t = alpha Laplacian u: e^{-2 alpha t} sin x sin y."""
    return math.exp(-2 * ALPHA * t) * torch.sin(x[:, 0]) * torch.sin(x[:, 1])


def outward_derivative_on_the_hole(x, t):
    """d u / d n on the hole's rim, whose outward normal (out of the domain) points to the centre."""
    r = x.norm(dim=1)
    gx, gy = torch.cos(x[:, 0]) * torch.sin(x[:, 1]), torch.sin(x[:, 0]) * torch.cos(x[:, 1])
    return math.exp(-2 * ALPHA * t) * (-(x[:, 0] * gx + x[:, 1] * gy) / r)


def test_the_matrices_integrate_exactly_what_p1_elements_must():
    mesh = annulus_mesh(0.3, 1.0, rings=3, sectors=12)
    m, k = mesh.matrices()
    ones = torch.ones(len(mesh.nodes), dtype=torch.float64)
    assert float(ones @ m @ ones) == pytest.approx(float(mesh.areas().sum()), rel=1e-12)  # the domain's area
    assert k.matmul(ones).abs().max() < 1e-12 and torch.allclose(k, k.T) and torch.allclose(m, m.T)
    assert torch.linalg.eigvalsh(k).min() > -1e-10  # positive semi-definite
    x = mesh.nodes[:, 0]  # the energy of a linear function is exact: |grad x|^2 |Omega|
    assert float(x @ k @ x) == pytest.approx(float(mesh.areas().sum()), rel=1e-12)
    outer = mesh.edge_segment == 0  # the load of g = 1 on the outer circle: its (polygon's) length
    perimeter = 12 * 2 * math.sin(math.pi / 12)
    assert float(mesh.boundary_load(ones, outer).sum()) == pytest.approx(perimeter, rel=1e-12)
    assert mesh.boundary_nodes(1).tolist() == list(range(12)) and len(mesh.boundary_nodes()) == 24


@pytest.mark.parametrize("outer_dirichlet", [True, False])
def test_crank_nicolson_p1_converges_at_second_order_with_mixed_conditions(outer_dirichlet):
    """Dirichlet data on one circle and Neumann data on the other; the mesh and the time step
    halved together. The L2 error (through the mass matrix) falls as h^2."""
    errors, sizes = [], []
    for level in range(3):
        mesh = annulus_mesh(0.3, 1.0, rings=4 * 2 ** level, sectors=16 * 2 ** level)
        dirichlet = (mesh.edge_segment == 0) if outer_dirichlet else (mesh.edge_segment == 1)
        normal = mesh.nodes / mesh.nodes.norm(dim=1, keepdim=True)  # outward on the outer circle

        def neumann(x, t):
            if outer_dirichlet:
                return outward_derivative_on_the_hole(x, t)
            g = torch.stack([torch.cos(x[:, 0]) * torch.sin(x[:, 1]), torch.sin(x[:, 0]) * torch.cos(x[:, 1])], 1)
            return math.exp(-2 * ALPHA * t) * (g * normal).sum(1)

        u = heat_fem(mesh, exact(mesh.nodes, 0.0), ALPHA, T_END, 4 * 2 ** level, dirichlet,
                     g_dirichlet=exact, g_neumann=neumann)
        error = u - exact(mesh.nodes, T_END)
        m, _ = mesh.matrices()
        errors.append(float((error @ m @ error).sqrt()))
        sizes.append(mesh.size())
    orders = [math.log(errors[i - 1] / errors[i]) / math.log(sizes[i - 1] / sizes[i]) for i in (1, 2)]
    assert errors[-1] < 5e-4 and min(orders) > 1.85, (errors, orders)


def test_bad_meshes_and_settings_are_refused():
    mesh = annulus_mesh(rings=1, sectors=4)
    with pytest.raises(ValueError, match="counter-clockwise with a positive area"):
        TriangleMesh(mesh.nodes, mesh.triangles[:, [0, 2, 1]], mesh.boundary_edges, mesh.edge_segment)
    with pytest.raises(ValueError, match=r"triangles: triangle 2 has nodes \[3, 8, 4\]; node ids lie in \[0, 8\)"):
        TriangleMesh(mesh.nodes, mesh.triangles + 1, mesh.boundary_edges, mesh.edge_segment)
    nodes = mesh.nodes.clone()
    nodes[5, 1] = float("nan")  # (a NaN node made an all-NaN solution)
    with pytest.raises(ValueError, match=r"nodes: node 5 is at \[.*, nan\], not a finite position"):
        TriangleMesh(nodes, mesh.triangles, mesh.boundary_edges, mesh.edge_segment)
    with pytest.raises(ValueError, match=r"nodes: node 8 \(at \[9.0, 9.0\]\) belongs to no triangle"):
        TriangleMesh(torch.cat([mesh.nodes, torch.full((1, 2), 9.0, dtype=mesh.nodes.dtype)]), mesh.triangles,
                     mesh.boundary_edges, mesh.edge_segment)
    flat = mesh.nodes.clone()
    a, b, c = mesh.triangles[3].tolist()
    flat[c] = (flat[a] + flat[b]) / 2  # on the line through the other two
    with pytest.raises(ValueError, match=r"triangles: triangle \d+ \(nodes .*\) has (zero|negative) area"):
        TriangleMesh(flat, mesh.triangles, mesh.boundary_edges, mesh.edge_segment)
    twice = torch.cat([mesh.triangles, mesh.triangles[:1]])
    with pytest.raises(ValueError, match=r"the edge between nodes \[\d+, \d+\] belongs to 3 triangles"):
        TriangleMesh(mesh.nodes, twice, mesh.boundary_edges, mesh.edge_segment)
    with pytest.raises(ValueError, match=r"boundary_edges: the outer edge between nodes \[\d+, \d+\] is missing"):
        TriangleMesh(mesh.nodes, mesh.triangles, mesh.boundary_edges[1:], mesh.edge_segment[1:])
    inner = next(e for e in mesh.directed_edges().tolist()
                 if sorted(e) not in mesh.boundary_edges.sort(1).values.tolist())
    with pytest.raises(ValueError, match=r"boundary_edges: edge 0 \(nodes .*\) is not an outer edge"):
        TriangleMesh(mesh.nodes, mesh.triangles, torch.cat([torch.tensor([inner]), mesh.boundary_edges]),
                     torch.cat([mesh.edge_segment[:1], mesh.edge_segment]))
    with pytest.raises(ValueError, match=r"edge_segment: boundary edge 0 has segment -1"):
        TriangleMesh(mesh.nodes, mesh.triangles, mesh.boundary_edges, torch.cat([torch.tensor([-1]), mesh.edge_segment[1:]]))
    with pytest.raises(ValueError, match="expected 0 < r_in < r_out"):
        annulus_mesh(1.0, 0.5)
    with pytest.raises(ValueError, match="steps >= 1 expected"):
        heat_fem(mesh, torch.zeros(8, dtype=torch.float64), 0.1, 1.0, 0, mesh.edge_segment == 0)


def test_boundary_normals_point_out_of_the_domain():
    mesh = annulus_mesh(0.4, 1.0, rings=2, sectors=16)
    outer, inner = mesh.boundary_nodes(0), mesh.boundary_nodes(1)
    radial = lambda nodes: mesh.nodes[nodes] / mesh.nodes[nodes].norm(dim=1, keepdim=True)  # noqa: E731
    torch.testing.assert_close(mesh.boundary_normals(outer), radial(outer))  # the bisectors of a regular polygon
    torch.testing.assert_close(mesh.boundary_normals(inner), -radial(inner))  # the hole's point to its centre
    square = l_shape_mesh(2)
    nodes = square.boundary_nodes()
    normal = dict(zip(map(tuple, square.nodes[nodes].tolist()), square.boundary_normals(nodes).tolist()))
    s = 2 ** -0.5
    for point, expected in (((0.0, 0.25), (-1, 0)), ((0.75, 0.0), (0, -1)), ((0.75, 0.5), (0, 1)),
                            ((0.0, 0.0), (-s, -s)), ((0.5, 0.5), (s, s)), ((0.5, 1.0), (s, s))):
        assert normal[point] == pytest.approx(expected, abs=1e-12), point
    with pytest.raises(ValueError, match="not on the boundary"):
        mesh.boundary_normals(torch.tensor([len(mesh.nodes) // 2 + 1]))  # a node of the middle ring


def test_ring_mesh_follows_its_curves_and_refuses_crossing_ones():
    outer = lambda a: 1 + 0.1 * torch.cos(3 * a)  # noqa: E731
    inner = lambda a: 0.3 + 0.05 * torch.sin(2 * a)  # noqa: E731
    mesh = ring_mesh(inner, outer, rings=3, sectors=24)
    for segment, curve in ((0, outer), (1, inner)):
        p = mesh.nodes[mesh.boundary_nodes(segment)]
        torch.testing.assert_close(p.norm(dim=1), curve(torch.atan2(p[:, 1], p[:, 0])))
    # the area is the polygon's: the sum over sectors of the two triangles' fans
    assert float(mesh.areas().sum()) == pytest.approx(math.pi * (1 + 0.005) - math.pi * (0.09 + 0.00125), rel=0.02)
    with pytest.raises(ValueError, match="expected 0 < r_in < r_out at every angle"):
        ring_mesh(lambda a: 0.5 + 0.6 * torch.cos(a), outer)


def test_the_l_shape_mesh_and_second_order_there():
    """The L-shape's mesh covers area 3/4 with the re-entrant corner's edges as segment 1; the
    solution e^{-alpha (a^2 + b^2) t} cos(a (x - 1/2)) cos(b (y - 1/2)), with zero normal
    derivative on those edges (Neumann) and its values elsewhere (Dirichlet), is reached at
    second order."""

    mesh = l_shape_mesh(2)
    assert float(mesh.areas().sum()) == pytest.approx(0.75) and mesh.edge_segment.bincount().tolist() == [12, 4]
    corner = mesh.nodes[mesh.boundary_nodes(1)]
    assert (((corner[:, 0] - 0.5).abs() < 1e-12) | ((corner[:, 1] - 0.5).abs() < 1e-12)).all()
    a, b = 2.0, 3.0

    def solution(x, t):
        return math.exp(-ALPHA * (a * a + b * b) * t) * torch.cos(a * (x[:, 0] - 0.5)) * torch.cos(b * (x[:, 1] - 0.5))

    errors, sizes = [], []
    for level in range(3):
        n = 4 * 2 ** level
        mesh = l_shape_mesh(n)
        u = heat_fem(mesh, solution(mesh.nodes, 0.0), ALPHA, 0.1, 2 * n, mesh.edge_segment == 0, g_dirichlet=solution)
        error = u - solution(mesh.nodes, 0.1)
        m, _ = mesh.matrices()
        errors.append(float((error @ m @ error).sqrt()))
        sizes.append(mesh.size())
    orders = [math.log(errors[i - 1] / errors[i]) / math.log(sizes[i - 1] / sizes[i]) for i in (1, 2)]
    assert min(orders) > 1.85, (errors, orders)
    with pytest.raises(ValueError, match="n: expected >= 1"):
        l_shape_mesh(0)


def test_recorded_frames_are_the_states_of_separate_runs():
    """``record_every`` keeps the state after every ``record_every`` steps of one run, as runs
    of ``record_every`` steps restarted from the last state give (data constant in time)."""
    mesh = annulus_mesh(rings=3, sectors=12)
    u0 = exact(mesh.nodes, 0.0)
    dirichlet = mesh.edge_segment == 0
    g = lambda x, t: torch.full((len(x),), 0.3, dtype=torch.float64)  # noqa: E731
    frames = heat_fem(mesh, u0, ALPHA, 0.06, 6, dirichlet, g_dirichlet=g, g_neumann=g, record_every=2)
    assert frames.shape == (3, len(mesh.nodes))
    u = u0
    for frame in frames:
        u = heat_fem(mesh, u, ALPHA, 0.02, 2, dirichlet, g_dirichlet=g, g_neumann=g)
        torch.testing.assert_close(frame, u, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(frames[-1], heat_fem(mesh, u0, ALPHA, 0.06, 6, dirichlet, g_dirichlet=g, g_neumann=g))
    with pytest.raises(ValueError, match="record_every: expected >= 0"):
        heat_fem(mesh, u0, ALPHA, 0.06, 6, dirichlet, record_every=-1)


def test_the_square_mesh_has_one_segment_per_side():
    mesh = square_mesh(4)
    assert len(mesh.nodes) == 25 and float(mesh.areas().sum()) == pytest.approx(1.0, rel=1e-12)
    t = mesh.triangles
    edges = torch.cat([t[:, [0, 1]], t[:, [1, 2]], t[:, [2, 0]]]).sort(1).values
    unique, count = edges.unique(dim=0, return_counts=True)
    assert torch.equal(unique[count == 1], mesh.boundary_edges.sort(1).values.unique(dim=0))
    for segment, (axis, value) in enumerate([(0, 0.0), (0, 1.0), (1, 0.0), (1, 1.0)]):
        nodes = mesh.boundary_nodes(segment)
        assert len(nodes) == 5 and (mesh.nodes[nodes, axis] == value).all()
        inside = nodes[(mesh.nodes[nodes, 1 - axis] > 0) & (mesh.nodes[nodes, 1 - axis] < 1)]  # not the corners
        normal = torch.zeros(2, dtype=torch.float64)
        normal[axis] = 1.0 if value == 1.0 else -1.0
        assert torch.allclose(mesh.boundary_normals(inside), normal.expand(len(inside), 2))
    with pytest.raises(ValueError, match="n: expected >= 1 cells per side"):
        square_mesh(0)
