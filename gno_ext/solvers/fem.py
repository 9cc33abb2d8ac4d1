r"""The heat equation on irregular 2-D domains by linear finite elements, for the mesh datasets.

$$
\partial_t u = \alpha\,\Delta u \ \text{in}\ \Omega, \qquad u = g_D \ \text{on}\ \Gamma_D, \qquad
\partial_n u = g_N \ \text{on}\ \Gamma_N,
$$

on a triangulation of $\Omega$ (`TriangleMesh`) with P1 (piecewise linear) elements: mass
matrix $M$, stiffness matrix $K$ and the Neumann load $b_i = \int_{\Gamma_N} g_N \phi_i\, ds$
(the boundary data interpolated linearly along each boundary edge). Time stepping is
Crank-Nicolson,

$$
(M + \tfrac{\Delta t}{2}\alpha K)\, u^{n+1} = (M - \tfrac{\Delta t}{2}\alpha K)\, u^n
+ \tfrac{\Delta t}{2}\alpha\,(b^n + b^{n+1}),
$$

with the Dirichlet nodes' rows replaced by $u_i^{n+1} = g_D(x_i, t^{n+1})$; second order in
space (in $L^2$) and time. The matrix is factorised once per run and the steps are triangular
solves. The matrices are dense: the method is meant for the meshes of the datasets (up to a few
thousand nodes), not for large problems.

Why a finite-element mesh rather than a point set: the P1 discretisation is exact for the
geometry's piecewise-linear boundary, has a clean weak form for Neumann data and a known
convergence order, which the tests measure against an exact solution on an annulus.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TriangleMesh", "annulus_mesh", "heat_fem", "l_shape_mesh", "ring_mesh", "square_mesh"]


@dataclass
class TriangleMesh:
    """A triangulation of a 2-D domain.

    Attributes
    ----------
    nodes : Tensor, shape (N, 2)
    triangles : Tensor, shape (T, 3), long
        Node ids of each triangle, counter-clockwise.
    boundary_edges : Tensor, shape (E, 2), long
        The boundary's edges (node ids), each once.
    edge_segment : Tensor, shape (E,), long
        The boundary segment of each edge (``0..S-1``).
    """

    nodes: Tensor
    triangles: Tensor
    boundary_edges: Tensor
    edge_segment: Tensor

    def __post_init__(self) -> None:
        _check_mesh(self)

    def areas(self) -> Tensor:
        a, b, c = (self.nodes[self.triangles[:, k]] for k in range(3))
        return 0.5 * ((b - a)[:, 0] * (c - a)[:, 1] - (b - a)[:, 1] * (c - a)[:, 0])

    def boundary_nodes(self, segment: int | None = None) -> Tensor:
        """The node ids on the boundary (on ``segment`` only, if given), sorted."""
        edges = self.boundary_edges if segment is None else self.boundary_edges[self.edge_segment == segment]
        return edges.flatten().unique()

    @property
    def n_segments(self) -> int:
        """The number of boundary segments (``edge_segment`` runs from 0 to this minus one)."""
        return int(self.edge_segment.max()) + 1

    def directed_edges(self) -> Tensor:
        """Every triangle's three edges in its counter-clockwise order (the inside on the left),
        shape (3 T, 2): an interior edge appears twice, once each way."""
        t = self.triangles
        return torch.cat([t[:, [0, 1]], t[:, [1, 2]], t[:, [2, 0]]])

    def outer_edges(self) -> Tensor:
        """The triangulation's boundary edges (those of one triangle only), each directed with
        the inside on its left, shape (E, 2)."""
        directed = self.directed_edges()
        _, inverse, count = directed.sort(1).values.unique(dim=0, return_inverse=True, return_counts=True)
        return directed[count[inverse] == 1]

    def boundary_normals(self, nodes: Tensor | None = None) -> Tensor:
        """Outward unit normals at boundary nodes (default: `boundary_nodes`), shape (M, 2): the
        sum of the outward normals of the node's boundary edges, weighted by their lengths (at a
        corner, the bisector of its two edges' normals)."""
        nodes = self.boundary_nodes() if nodes is None else nodes
        outer = self.outer_edges()
        d = self.nodes[outer[:, 1]] - self.nodes[outer[:, 0]]
        normal = torch.stack([d[:, 1], -d[:, 0]], 1)  # the right of the edge, times its length
        total = torch.zeros_like(self.nodes)
        total.index_add_(0, outer[:, 0], normal)
        total.index_add_(0, outer[:, 1], normal)
        picked = total[nodes]
        length = picked.norm(dim=1, keepdim=True)
        if (length == 0).any():
            raise ValueError("boundary_normals: a node given is not on the boundary")
        return picked / length

    def size(self) -> float:
        """The mesh size: the longest edge."""
        edges = self.directed_edges()
        return float((self.nodes[edges[:, 0]] - self.nodes[edges[:, 1]]).norm(dim=1).max())

    def matrices(self) -> tuple[Tensor, Tensor]:
        """The P1 mass and stiffness matrices ``(M, K)``, dense ``(N, N)``."""
        n, t = len(self.nodes), self.triangles
        area = self.areas()
        p = self.nodes[t]  # (T, 3, 2)
        # gradients of the barycentric coordinates: rotate the opposite edge by 90 degrees
        opposite = p[:, [2, 0, 1]] - p[:, [1, 2, 0]]  # (T, 3, 2): edge opposite each vertex
        grad = torch.stack([-opposite[..., 1], opposite[..., 0]], -1) / (2 * area[:, None, None])
        local_k = area[:, None, None] * grad @ grad.transpose(1, 2)
        local_m = area[:, None, None] / 12 * (torch.ones(3, 3, dtype=p.dtype) + torch.eye(3, dtype=p.dtype))
        rows, cols = t[:, :, None].expand(-1, 3, 3), t[:, None, :].expand(-1, 3, 3)
        m = torch.zeros(n, n, dtype=p.dtype).index_put_((rows.flatten(), cols.flatten()), local_m.flatten(),
                                                        accumulate=True)
        k = torch.zeros(n, n, dtype=p.dtype).index_put_((rows.flatten(), cols.flatten()), local_k.flatten(),
                                                        accumulate=True)
        return m, k

    def boundary_load(self, values: Tensor, segment_mask: Tensor) -> Tensor:
        r"""$b_i = \int g\,\phi_i\,ds$ over the boundary edges selected by ``segment_mask`` (E,),
        for ``values`` (N,) of $g$ at the nodes, linear along each edge."""
        edges = self.boundary_edges[segment_mask]
        length = (self.nodes[edges[:, 0]] - self.nodes[edges[:, 1]]).norm(dim=1)
        ga, gb = values[edges[:, 0]], values[edges[:, 1]]
        load = torch.zeros(len(self.nodes), dtype=values.dtype)
        load.index_add_(0, edges[:, 0], length / 6 * (2 * ga + gb))
        load.index_add_(0, edges[:, 1], length / 6 * (ga + 2 * gb))
        return load


def _check_mesh(mesh: TriangleMesh) -> None:
    """A triangulation the solvers can use, or a `ValueError` that names the first node,
    triangle or edge that is wrong: finite node positions, every node in a triangle, node ids in
    range, triangles counter-clockwise with a positive area, no edge shared by more than two
    triangles, and boundary edges that are exactly the triangulation's outer edges."""
    nodes, triangles, edges, segment = mesh.nodes, mesh.triangles, mesh.boundary_edges, mesh.edge_segment
    if nodes.ndim != 2 or nodes.shape[1] != 2 or not nodes.is_floating_point():
        raise ValueError(f"nodes: expected a floating tensor of shape (N, 2), got {nodes.dtype} {tuple(nodes.shape)}")
    if triangles.ndim != 2 or triangles.shape[1] != 3 or triangles.is_floating_point() or len(triangles) == 0:
        raise ValueError(f"triangles: expected an integer tensor of shape (T, 3), T >= 1, got {triangles.dtype} "
                         f"{tuple(triangles.shape)}")
    bad = ~torch.isfinite(nodes).all(1)
    if bad.any():
        k = int(bad.nonzero()[0])
        raise ValueError(f"nodes: node {k} is at {nodes[k].tolist()}, not a finite position")
    out = (triangles < 0) | (triangles >= len(nodes))
    if out.any():
        k = int(out.any(1).nonzero()[0])
        raise ValueError(f"triangles: triangle {k} has nodes {triangles[k].tolist()}; node ids lie in [0, {len(nodes)})")
    unused = torch.ones(len(nodes), dtype=torch.bool)
    unused[triangles.flatten()] = False
    if unused.any():
        k = int(unused.nonzero()[0])
        raise ValueError(f"nodes: node {k} (at {nodes[k].tolist()}) belongs to no triangle; remove it (the "
                         "solvers' matrices would be singular)")
    area = mesh.areas()
    flat = area <= 0
    if flat.any():
        k = int(flat.nonzero()[0])
        what = "zero area (degenerate)" if float(area[k]) == 0 else "negative area (clockwise)"
        raise ValueError(f"triangles: triangle {k} (nodes {triangles[k].tolist()}) has {what}, {float(area[k]):.3g}; "
                         "every triangle must be counter-clockwise with a positive area")
    undirected, count = mesh.directed_edges().sort(1).values.unique(dim=0, return_counts=True)
    if (count > 2).any():
        k = int((count > 2).nonzero()[0])
        raise ValueError(f"triangles: the edge between nodes {undirected[k].tolist()} belongs to {int(count[k])} "
                         "triangles (at most two: the triangles overlap)")
    if edges.ndim != 2 or edges.shape[1] != 2 or segment.shape != (len(edges),):
        raise ValueError(f"boundary_edges, edge_segment: expected shapes (E, 2) and (E,), got {tuple(edges.shape)} "
                         f"and {tuple(segment.shape)}")
    if len(segment) and segment.min() < 0:
        raise ValueError(f"edge_segment: boundary edge {int((segment < 0).nonzero()[0])} has segment "
                         f"{int(segment.min())}; segments are numbered from 0")
    outer = {tuple(e) for e in mesh.outer_edges().sort(1).values.tolist()}
    given = [tuple(e) for e in edges.sort(1).values.tolist()]
    stray = next((k for k, e in enumerate(given) if e not in outer), None)
    if stray is not None:
        raise ValueError(f"boundary_edges: edge {stray} (nodes {list(given[stray])}) is not an outer edge of the "
                         "triangulation (an edge of exactly one triangle)")
    missing = sorted(outer - set(given))
    if missing:
        raise ValueError(f"boundary_edges: the outer edge between nodes {list(missing[0])} is missing ({len(missing)} "
                         "missing): every boundary edge needs its segment, and so its condition")


def annulus_mesh(r_in: float = 0.3, r_out: float = 1.0, rings: int = 8, sectors: int = 32) -> TriangleMesh:
    """A triangulation of the annulus ``r_in < r < r_out``: ``rings`` layers of ``sectors``
    quadrilaterals, each cut in two; the outer circle is segment 0, the hole's rim segment 1."""
    if not 0 < r_in < r_out:
        raise ValueError(f"radii: expected 0 < r_in < r_out, got {r_in}, {r_out}")
    return ring_mesh(lambda a: torch.full_like(a, r_in), lambda a: torch.full_like(a, r_out), rings, sectors)


def ring_mesh(r_in: Callable[[Tensor], Tensor], r_out: Callable[[Tensor], Tensor], rings: int = 8,
              sectors: int = 32) -> TriangleMesh:
    """A triangulation of the star-shaped ring ``r_in(a) < r < r_out(a)`` (polar angle ``a``):
    ``rings`` layers of ``sectors`` quadrilaterals between the two curves, each cut in two; the
    outer curve is segment 0, the hole's rim segment 1. ``r_in`` and ``r_out`` map angles (a
    float64 tensor) to radii with ``0 < r_in < r_out``."""
    if rings < 1 or sectors < 3:
        raise ValueError(f"rings >= 1 and sectors >= 3 expected, got {rings}, {sectors}")
    angle = torch.arange(sectors, dtype=torch.float64) * (2 * math.pi / sectors)
    inner, outer = r_in(angle).double(), r_out(angle).double()
    if not ((0 < inner) & (inner < outer)).all():
        raise ValueError(f"radii: expected 0 < r_in < r_out at every angle, got r_in in [{float(inner.min()):.3g}, "
                         f"{float(inner.max()):.3g}] and r_out in [{float(outer.min()):.3g}, {float(outer.max()):.3g}]")
    fraction = torch.linspace(0, 1, rings + 1, dtype=torch.float64)[:, None]
    radius = inner + fraction * (outer - inner)  # (rings + 1, sectors)
    nodes = torch.stack([radius * angle.cos(), radius * angle.sin()], -1).reshape(-1, 2)
    ring, sector = torch.meshgrid(torch.arange(rings), torch.arange(sectors), indexing="ij")
    a = ring * sectors + sector
    b = ring * sectors + (sector + 1) % sectors
    c, d = a + sectors, b + sectors  # the next ring out
    triangles = torch.cat([torch.stack([a, d, b], -1).reshape(-1, 3), torch.stack([a, c, d], -1).reshape(-1, 3)])
    j = torch.arange(sectors)
    outer_edges = torch.stack([rings * sectors + j, rings * sectors + (j + 1) % sectors], 1)
    inner_edges = torch.stack([j, (j + 1) % sectors], 1)
    return TriangleMesh(nodes, triangles, torch.cat([outer_edges, inner_edges]),
                        torch.cat([torch.zeros(sectors), torch.ones(sectors)]).long())


def l_shape_mesh(n: int = 8) -> TriangleMesh:
    """A triangulation of the L-shaped domain ``[0, 1]^2`` without ``(0.5, 1] x (0.5, 1]``: ``n``
    cells per half side, each square cut in two. Segment 0 is the four edges on the axes and
    the far sides (``x = 0``, ``y = 0``, ``x = 1`` for ``y <= 0.5``, ``y = 1`` for ``x <= 0.5``),
    segment 1 the two edges of the re-entrant corner (``x = 0.5`` for ``y >= 0.5`` and
    ``y = 0.5`` for ``x >= 0.5``)."""
    if n < 1:
        raise ValueError(f"n: expected >= 1 cells per half side, got {n}")
    m = 2 * n  # cells per side of the unit square
    ij = torch.cartesian_prod(torch.arange(m + 1), torch.arange(m + 1))  # (i along x, j along y)
    keep = ~((ij[:, 0] > n) & (ij[:, 1] > n))
    ids = torch.full((m + 1, m + 1), -1, dtype=torch.long)
    ids[ij[keep, 0], ij[keep, 1]] = torch.arange(int(keep.sum()))
    nodes = ij[keep].double() / m
    triangles = []
    for i in range(m):
        for j in range(m):
            if i >= n and j >= n:
                continue  # the removed quarter
            a, b, c, d = ids[i, j], ids[i + 1, j], ids[i + 1, j + 1], ids[i, j + 1]
            triangles += [[a, b, c], [a, c, d]]
    triangles = torch.tensor(triangles)
    t = triangles
    edges = torch.cat([t[:, [0, 1]], t[:, [1, 2]], t[:, [2, 0]]])
    unique, count = edges.sort(1).values.unique(dim=0, return_counts=True)
    boundary = unique[count == 1]
    mid = nodes[boundary].mean(1)
    corner = ((mid[:, 0] - 0.5).abs() < 1e-12) & (mid[:, 1] > 0.5) | ((mid[:, 1] - 0.5).abs() < 1e-12) & (mid[:, 0] > 0.5)
    return TriangleMesh(nodes, triangles, boundary, corner.long())


def square_mesh(n: int = 8) -> TriangleMesh:
    """A triangulation of the unit square: ``n`` cells per side, each cut in two along its
    diagonal. Its four sides are segments 0 to 3: ``x = 0``, ``x = 1``, ``y = 0``, ``y = 1`` (the
    faces of a grid in the same order); a corner node lies on two."""
    if n < 1:
        raise ValueError(f"n: expected >= 1 cells per side, got {n}")
    ij = torch.cartesian_prod(torch.arange(n + 1), torch.arange(n + 1))  # node id i * (n + 1) + j, i along x
    nodes = ij.double() / n
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    a = (i * (n + 1) + j).flatten()
    b, c, d = a + n + 1, a + n + 2, a + 1  # (i + 1, j), (i + 1, j + 1), (i, j + 1)
    triangles = torch.cat([torch.stack([a, b, c], 1), torch.stack([a, c, d], 1)])
    k = torch.arange(n)
    sides = [torch.stack([k, k + 1], 1),  # x = 0: i = 0
             torch.stack([n * (n + 1) + k, n * (n + 1) + k + 1], 1),  # x = 1
             torch.stack([k * (n + 1), (k + 1) * (n + 1)], 1),  # y = 0: j = 0
             torch.stack([k * (n + 1) + n, (k + 1) * (n + 1) + n], 1)]  # y = 1
    return TriangleMesh(nodes, triangles, torch.cat(sides), torch.arange(4).repeat_interleave(n))


def heat_fem(mesh: TriangleMesh, u0: Tensor, alpha: float, t_end: float, steps: int, dirichlet: Tensor,
             neumann: Tensor | None = None, g_dirichlet: Callable[[Tensor, float], Tensor] | None = None,
             g_neumann: Callable[[Tensor, float], Tensor] | None = None, record_every: int = 0) -> Tensor:
    """The heat equation from ``u0`` (N,) to ``t_end`` in ``steps`` Crank-Nicolson steps.

    Parameters
    ----------
    mesh : TriangleMesh
    u0 : Tensor, shape (N,)
    alpha : float
        Diffusivity.
    t_end : float
    steps : int
    dirichlet : Tensor, shape (E,), bool
        The boundary edges with a Dirichlet condition (their nodes are Dirichlet nodes).
    neumann : Tensor, shape (E,), bool, optional
        The boundary edges with a Neumann condition (default: the others).
    g_dirichlet, g_neumann : callable, optional
        ``g(nodes (N, 2), t) -> (N,)``: the data (zero where not given); ``g_neumann`` is the
        outward normal derivative.
    record_every : int
        If positive, also keep the state after every ``record_every`` steps (the frames of a
        trajectory, from one factorisation).

    Returns
    -------
    Tensor, shape (N,), or (steps // record_every, N) with ``record_every``
        ``u`` at ``t_end``, or at every ``record_every`` steps.
    """
    if not (alpha > 0 and t_end > 0 and steps >= 1):
        raise ValueError(f"alpha, t_end > 0 and steps >= 1 expected, got {alpha}, {t_end}, {steps}")
    if record_every < 0:
        raise ValueError(f"record_every: expected >= 0, got {record_every}")
    neumann = ~dirichlet if neumann is None else neumann
    m, k = mesh.matrices()
    dt = t_end / steps
    lhs, rhs_matrix = m + 0.5 * dt * alpha * k, m - 0.5 * dt * alpha * k
    fixed = mesh.boundary_edges[dirichlet].flatten().unique()
    lhs[fixed] = 0.0
    lhs[fixed, fixed] = 1.0
    factor = torch.linalg.lu_factor(lhs)
    zero = torch.zeros(len(mesh.nodes), dtype=u0.dtype)

    def load(t: float) -> Tensor:
        return mesh.boundary_load(g_neumann(mesh.nodes, t), neumann) if g_neumann is not None else zero

    u, before, recorded = u0.to(torch.float64), load(0.0), []
    for n in range(steps):
        t = (n + 1) * dt
        after = load(t)
        rhs = rhs_matrix @ u + 0.5 * dt * alpha * (before + after)
        rhs[fixed] = g_dirichlet(mesh.nodes, t)[fixed] if g_dirichlet is not None else 0.0
        u = torch.linalg.lu_solve(*factor, rhs[:, None])[:, 0]
        before = after
        if record_every and (n + 1) % record_every == 0:
            recorded.append(u)
    return torch.stack(recorded) if record_every else u
