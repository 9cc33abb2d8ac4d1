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


class AxisEigenbasis:
    """Eigen-decomposition ``A = Q diag(lam) Q^T`` of each sample's operator on one axis.

    Samples that share the operator (the usual case) share one decomposition.

    Attributes
    ----------
    q : Tensor, shape (B, N, N)
        Orthonormal eigenvectors (columns) per sample.
    lam : Tensor, shape (B, N)
        Eigenvalues per sample (all <= 0 for admissible conditions).
    """

    def __init__(self, grid: Grid, axis: int, r: Tensor, periodic: Tensor, dtype: torch.dtype,
                 device: torch.device) -> None:
        n, h = grid.shape[axis], grid.spacing[axis]
        key = torch.stack([r[:, 2 * axis], r[:, 2 * axis + 1], periodic[:, 2 * axis].double()], 1)
        uniq, inverse = torch.unique(key.cpu(), dim=0, return_inverse=True)
        qs, lams = [], []
        for r_lo, r_hi, per in uniq.tolist():
            lam, q = torch.linalg.eigh(laplacian_matrix_1d(n, h, r_lo, r_hi, bool(per)))
            qs.append(q)
            lams.append(lam)
        self.q = torch.stack(qs)[inverse].to(device=device, dtype=dtype)
        self.lam = torch.stack(lams)[inverse].to(device=device, dtype=dtype)


def apply_along_axis(u: Tensor, mat: Tensor, axis: int) -> Tensor:
    """Contract spatial axis ``axis`` of ``u`` (B, *S) with per-sample ``mat`` (B, N, M)."""
    moved = u.movedim(axis + 1, -1)
    shape = moved.shape
    out = torch.bmm(moved.reshape(shape[0], -1, shape[-1]), mat)
    return out.reshape(*shape[:-1], mat.shape[-1]).movedim(-1, axis + 1)


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


def fd_laplacian(u: Tensor, grid: Grid, r: Tensor, s: Tensor, bc_values: Tensor, bc: BoundarySpec) -> Tensor:
    """Second-order finite-difference Laplacian of ``u`` (B, C, *S) with ghost cells.

    Periodic axes wrap around; other faces use ``ghost = r u_0 + s g`` with ``g`` taken from
    ``bc_values`` (B, F, N_face).
    """
    periodic = bc.kind == BCType.PERIODIC
    out = torch.zeros_like(u)
    for axis in range(grid.ndim):
        dim = axis + 2
        h2 = grid.spacing[axis] ** 2
        n = u.shape[dim]
        first, last = u.narrow(dim, 0, 1), u.narrow(dim, n - 1, 1)
        shape = (-1, 1) + (1,) * grid.ndim

        def ghost(face: int, inner: Tensor) -> Tensor:
            g = face_view(bc_values, face, grid).unsqueeze(1).unsqueeze(dim)
            per = periodic[:, face].view(shape)
            wrap = last if face % 2 == 0 else first
            lin = r[:, face].to(u.dtype).view(shape) * inner + s[:, face].to(u.dtype).view(shape) * g
            return torch.where(per, wrap, lin)

        padded = torch.cat([ghost(2 * axis, first), u, ghost(2 * axis + 1, last)], dim)
        out = out + (padded.narrow(dim, 0, n) - 2 * u + padded.narrow(dim, 2, n)) / h2
    return out
