r"""Per-axis Laplacians with boundary conditions, and their eigen-decompositions.

On a cell-centred grid a face condition $a u + b\,\partial_n u = g$ is imposed through a
ghost cell beyond the face, linear in the first interior cell:

$$
u_{\text{ghost}} = r\, u_0 + s\, g, \qquad
r = \frac{b/h - a/2}{b/h + a/2}, \qquad s = \frac{1}{b/h + a/2},
$$

which is second-order accurate (Dirichlet: ``r = -1, s = 2``; Neumann: ``r = 1, s = h``).
The 1-D operator is then the symmetric matrix ``(tridiag(1, -2, 1) + r_lo e_0 e_0^T +
r_hi e_{N-1} e_{N-1}^T) / h^2`` plus a source ``s g / h^2`` in the boundary cells. Periodic
axes use the Fourier spectral second derivative instead (exact for band-limited data).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from gno_ext.schema import BCType, BoundarySpec, Grid, face_view


def ghost_coefficients(bc: BoundarySpec, grid: Grid) -> tuple[Tensor, Tensor]:
    """Ghost-cell coefficients ``r, s`` of every face, each of shape ``(B, F)`` (float64).

    Periodic faces get ``r = s = 0`` (they are never used).

    Raises
    ------
    ValueError
        For Robin coefficients with ``b/h + a/2 = 0`` or ``a * b < 0`` (a growing, ill-posed
        problem).
    """
    ab = bc.robin_coeffs().double()
    a, b = ab[..., 0], ab[..., 1]
    h = torch.tensor([grid.spacing[f // 2] for f in range(grid.n_faces)], dtype=torch.float64,
                     device=ab.device)
    periodic = bc.kind == BCType.PERIODIC
    if ((a * b < 0) & ~periodic).any():
        raise ValueError("bc.coeffs: Robin coefficients with a*b < 0 make the problem ill-posed "
                         "(the boundary feeds heat in proportion to u); use a*b >= 0")
    den = b / h + a / 2
    if ((den.abs() < 1e-12) & ~periodic).any():
        raise ValueError("bc.coeffs: Robin coefficients give b/h + a/2 = 0 on this grid")
    den = torch.where(periodic, torch.ones_like(den), den)
    r = torch.where(periodic, torch.zeros_like(den), (b / h - a / 2) / den)
    s = torch.where(periodic, torch.zeros_like(den), 1.0 / den)
    return r, s


def laplacian_matrix_1d(n: int, h: float, r_lo: float, r_hi: float, periodic: bool) -> Tensor:
    """The 1-D second-derivative matrix of one axis, shape ``(n, n)``, float64, symmetric."""
    if periodic:
        k = torch.fft.fftfreq(n, d=h / (2 * torch.pi), dtype=torch.float64)
        eye = torch.eye(n, dtype=torch.float64)
        d2 = torch.fft.ifft(-(k ** 2)[:, None] * torch.fft.fft(eye, dim=0), dim=0).real
        return 0.5 * (d2 + d2.T)
    main = torch.full((n,), -2.0, dtype=torch.float64)
    main[0] += r_lo
    main[-1] += r_hi
    off = torch.ones(n - 1, dtype=torch.float64)
    return (torch.diag(main) + torch.diag(off, 1) + torch.diag(off, -1)) / h ** 2


@functools.lru_cache(maxsize=64)
def _eigh(n: int, h: float, r_lo: float, r_hi: float, periodic: bool) -> tuple[Tensor, Tensor]:
    """Cached eigen-decomposition of `laplacian_matrix_1d` (float64, CPU)."""
    return torch.linalg.eigh(laplacian_matrix_1d(n, h, r_lo, r_hi, periodic))


class AxisEigenbasis:
    """Eigen-decomposition ``A = Q diag(lam) Q^T`` of each sample's operator on one axis.

    Only the distinct operators of the batch are decomposed (``U`` of them, usually one);
    samples index into them, and a batch that shares one operator is transformed with a
    single matrix product.

    Attributes
    ----------
    q : Tensor, shape (U, N, N)
        Orthonormal eigenvectors (columns) of each distinct operator.
    lam : Tensor, shape (B, N)
        Eigenvalues of each sample's operator (all <= 0 for admissible conditions).
    index : Tensor, shape (B,)
        Which of the ``U`` operators each sample uses.
    """

    def __init__(self, grid: Grid, axis: int, r: Tensor, periodic: Tensor, dtype: torch.dtype,
                 device: torch.device) -> None:
        n, h = grid.shape[axis], grid.spacing[axis]
        key = torch.stack([r[:, 2 * axis], r[:, 2 * axis + 1], periodic[:, 2 * axis].double()], 1)
        uniq, inverse = torch.unique(key.cpu(), dim=0, return_inverse=True)
        qs, lams = [], []
        for r_lo, r_hi, per in uniq.tolist():
            lam, q = _eigh(n, h, r_lo, r_hi, bool(per))
            qs.append(q)
            lams.append(lam)
        self.q = torch.stack(qs).to(device=device, dtype=dtype)
        self.index = inverse.to(device)
        self.lam = torch.stack(lams).to(device=device, dtype=dtype)[self.index]

    def transform(self, u: Tensor, axis: int, inverse: bool = False, repeat: int = 1) -> Tensor:
        """Apply ``Q^T`` (or ``Q`` if ``inverse``) along spatial ``axis`` of ``u`` (B * repeat, *S).

        ``repeat`` consecutive rows of ``u`` share a sample's operator (e.g. channels).
        """
        q = self.q.transpose(1, 2) if inverse else self.q
        moved = u.movedim(axis + 1, -1)
        if q.shape[0] == 1:
            out = moved @ q[0]  # u_hat_k = sum_i u_i Q_ik: one GEMM for the whole batch
        else:
            mats = q[self.index.repeat_interleave(repeat)]
            shape = moved.shape
            out = torch.bmm(moved.reshape(shape[0], -1, shape[-1]), mats).reshape(shape)
        return out.movedim(-1, axis + 1)


def boundary_source(bc: BoundarySpec, grid: Grid, s: Tensor, values: Tensor) -> Tensor:
    """The source ``s g / h^2`` in the boundary cells, shape ``(B, *S)``.

    ``values`` (shape ``(B, F, N_face)``) is the data at the current time.
    """
    src = torch.zeros(len(bc), *grid.shape, dtype=values.dtype, device=values.device)
    for face in range(grid.n_faces):
        if (bc.kind[:, face] == BCType.PERIODIC).all():
            continue
        axis = face // 2
        g = face_view(values, face, grid)
        coef = (s[:, face] / grid.spacing[axis] ** 2).to(src.dtype)
        index = [slice(None)] * (grid.ndim + 1)
        index[axis + 1] = 0 if face % 2 == 0 else grid.shape[axis] - 1
        src[tuple(index)] += coef.view(-1, *([1] * (grid.ndim - 1))) * g
    return src


class FDLaplacian:
    """Second-order finite-difference Laplacian of ``(B, C, *S)`` fields with ghost cells.

    The stencil is applied with periodic wrap-around on every axis; in the boundary layers of
    non-periodic faces the wrapped neighbour is then replaced by the ghost value
    ``r u_0 + s g``. Coefficients are prepared once per solve.

    Parameters
    ----------
    grid : Grid
    bc : BoundarySpec
        Batched spec.
    r, s : Tensor, shape (B, F)
        Ghost coefficients from `ghost_coefficients`.
    """

    def __init__(self, grid: Grid, bc: BoundarySpec, r: Tensor, s: Tensor) -> None:
        self.grid = grid
        dtype = bc.values.dtype
        view = (-1, 1) + (1,) * (grid.ndim - 1)
        self.faces = []
        for face in range(grid.n_faces):
            bounded = bc.kind[:, face] != BCType.PERIODIC
            if not bounded.any():
                continue
            # On periodic rows r = s = 0 and the mask removes the wrapped value: no correction.
            self.faces.append((face, r[:, face].to(dtype).view(view), s[:, face].to(dtype).view(view),
                               bounded.to(dtype).view(view)))

    def __call__(self, u: Tensor, values: Tensor) -> Tensor:
        """Laplacian of ``u`` with boundary data ``values`` (B, F, N_face)."""
        grid = self.grid
        out = torch.zeros_like(u)
        for axis, h in enumerate(grid.spacing):
            dim = axis + 2
            out += (u.roll(1, dim) + u.roll(-1, dim) - 2 * u) / h ** 2
        for face, r, s, bounded in self.faces:
            axis = face // 2
            dim, n = axis + 2, grid.shape[axis]
            lo = face % 2 == 0
            edge = u.select(dim, 0 if lo else n - 1)
            wrapped = u.select(dim, n - 1 if lo else 0)
            g = face_view(values, face, grid).unsqueeze(1)
            ghost = r * edge + s * g
            out.select(dim, 0 if lo else n - 1).add_(bounded * (ghost - wrapped) / grid.spacing[axis] ** 2)
        return out
