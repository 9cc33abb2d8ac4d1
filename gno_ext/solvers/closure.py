r"""Ghost cells at a bounded face of a hyperbolic problem: WENO-type extrapolation.

A fifth-order upwind scheme reads three ghost cells beyond each face. Their values come from a
polynomial in the distance $s$ from the face, counted inward in cells: interior cell $j$
($j = 0$ at the face) sits at $s = j + 1/2$, ghost cell $k$ ($k = 1$ nearest) at
$s = -(k - 1/2)$. Three closures:

* ``"dirichlet"`` (inflow, data $g$): $p(0) = g$, $p(s_j) = u_j$;
* ``"neumann"`` (inflow, flux $q = \partial u / \partial n$, outward normal):
  $p'(0) = -h q$, $p(s_j) = u_j$;
* ``"outflow"`` (no data: a hyperbolic equation takes none where the flow leaves):
  $p(s_j) = u_j$.

One polynomial of high degree is accurate where the solution is smooth, but it overshoots
where it is not — at $t = 0$ a boundary value rarely matches the initial condition, and
extrapolating through that jump puts ghost values many times the jump outside the face. So,
as in the WENO extrapolation of Tan & Shu (J. Comput. Phys. 229, 2010), the ghost values are a
weighted sum of the candidates of degree $0 \dots r$ (Neumann: $1 \dots r$), each the
polynomial through the data and the nearest cells. With linear weights
$d_k = h^{r - k}$ for the lower degrees and the rest for degree $r$, and smoothness indicators

$$
\beta_k = \sum_{l \ge 1} \int_{-1}^{0} \left(\frac{d^l p_k}{d s^l}\right)^2 ds
\quad(\beta = h^2 \text{ for the lowest candidate}),
\qquad
\omega_k = \frac{\alpha_k}{\sum_m \alpha_m},\quad \alpha_k = \frac{d_k}{(\epsilon + \beta_k)^2},
$$

the top degree dominates on smooth data (ghost values to $O(h^{r+1})$, degree $r = 3$ here)
and the constant (or, for Neumann, linear) candidate on a jump.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["CLOSURES", "ClosureWeights", "closure_weights", "extrapolate"]

CLOSURES = ("dirichlet", "neumann", "outflow")
EPSILON = 1e-6


@dataclass(frozen=True)
class ClosureWeights:
    """Precomputed candidates of one closure at one cell size.

    The closure's inputs are a vector ``v`` of length ``degree + 1``: ``(d, u_0, ...,
    u_{degree - 1})`` for ``"dirichlet"`` (``d = g``) and ``"neumann"`` (``d = h q``), ``(u_0,
    ..., u_degree)`` for ``"outflow"``. Each candidate reads a prefix of ``v``.

    Attributes
    ----------
    ghost : Tensor, shape (K, N_ghost, degree + 1)
        Ghost values of candidate ``k`` are ``ghost[k] @ v``.
    smoothness : Tensor, shape (K, degree + 1, degree + 1)
        Its indicator is ``v @ smoothness[k] @ v``; `extrapolate` adds ``h^2`` to the lowest
        candidate's (zero for a constant).
    linear : Tensor, shape (K,)
        The linear weights ``h^(K - 1 - k)``, the rest for the top degree.
    h : float
        Cell size normal to the face.
    lowest_degree : int
        Degree of candidate 0 (0, or 1 for Neumann).
    """

    ghost: Tensor
    smoothness: Tensor
    linear: Tensor
    h: float
    lowest_degree: int
    # ghost and smoothness laid out as (degree + 1, K * ...) matrices once, for `extrapolate`
    products: tuple[Tensor, Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        k, n_ghost, m = self.ghost.shape
        object.__setattr__(self, "products", (self.ghost.permute(2, 0, 1).reshape(m, k * n_ghost),
                                              self.smoothness.permute(1, 0, 2).reshape(m, k * m)))

    def to(self, dtype: torch.dtype, device: torch.device | str) -> ClosureWeights:
        """A copy on ``device`` in ``dtype``."""
        move = lambda t: t.to(dtype=dtype, device=device)
        return ClosureWeights(move(self.ghost), move(self.smoothness), move(self.linear), self.h, self.lowest_degree)


def _candidate(kind: str, degree: int, n_inputs: int, n_ghost: int) -> tuple[Tensor, Tensor]:
    """Ghost weights (n_ghost, n_inputs) and smoothness form (n_inputs, n_inputs) of one degree."""
    powers = torch.arange(degree + 1, dtype=torch.float64)
    n_cells = degree + 1 if kind == "outflow" else degree
    rows = [(torch.arange(n_cells, dtype=torch.float64)[:, None] + 0.5) ** powers]
    if kind == "dirichlet":
        rows.insert(0, (powers == 0).double()[None])  # p(0) = g
    elif kind == "neumann":
        rows.insert(0, (powers == 1).double()[None])  # p'(0) = -h q: the sign is applied below
    to_coeffs = torch.linalg.inv(torch.cat(rows))  # monomial coefficients from the conditions
    if kind == "neumann":
        to_coeffs[:, 0] *= -1
    at_ghosts = (0.5 - torch.arange(1, n_ghost + 1, dtype=torch.float64)[:, None]) ** powers
    # Gram matrix of the derivatives of the monomials over s in [-1, 0]:
    # int s^(i-l) s^(j-l) ds with the falling-factorial factors of d^l/ds^l
    gram = torch.zeros(degree + 1, degree + 1, dtype=torch.float64)
    for order in range(1, degree + 1):
        for i in range(order, degree + 1):
            for j in range(order, degree + 1):
                e = i + j - 2 * order + 1
                gram[i, j] += math.perm(i, order) * math.perm(j, order) * (-1.0) ** (e + 1) / e  # int_{-1}^0 s^(e-1) ds
    ghost = torch.zeros(n_ghost, n_inputs, dtype=torch.float64)
    smooth = torch.zeros(n_inputs, n_inputs, dtype=torch.float64)
    used = to_coeffs.shape[1]
    ghost[:, :used] = at_ghosts @ to_coeffs
    smooth[:used, :used] = to_coeffs.T @ gram @ to_coeffs
    return ghost, smooth


def closure_weights(kind: str, h: float, degree: int = 3, n_ghost: int = 3) -> ClosureWeights:
    """The candidates of closure ``kind`` up to ``degree`` for cells of size ``h`` normal to the
    face (see the module docstring), in float64."""
    if kind not in CLOSURES:
        raise ValueError(f"kind: expected one of {CLOSURES}, got {kind!r}")
    if degree < 1:
        raise ValueError(f"degree: must be at least 1, got {degree}")
    lowest = 1 if kind == "neumann" else 0
    parts = [_candidate(kind, k, degree + 1, n_ghost) for k in range(lowest, degree + 1)]
    n = len(parts)
    linear = [h ** (n - 1 - k) for k in range(n - 1)]
    linear.append(1.0 - sum(linear))
    return ClosureWeights(torch.stack([g for g, _ in parts]), torch.stack([s for _, s in parts]),
                          torch.tensor(linear, dtype=torch.float64), float(h), lowest)


def extrapolate(inputs: Tensor, weights: ClosureWeights) -> Tensor:
    """Ghost values of one closure.

    Parameters
    ----------
    inputs : Tensor, shape (..., degree + 1)
        The closure's input vector (see `ClosureWeights`) at every face point.
    weights : ClosureWeights
        On the device and in the dtype of ``inputs``.

    Returns
    -------
    Tensor, shape (..., N_ghost)
        Nearest ghost first.
    """
    k, n_ghost, m = weights.ghost.shape
    # matrix products on a (points, m) matrix: this runs at every stage on every bounded face
    flat = inputs.reshape(-1, m)
    ghost, smoothness = weights.products
    candidates = (flat @ ghost).view(-1, k, n_ghost)
    quad = (flat @ smoothness).view(-1, k, m)
    beta = (quad * flat.unsqueeze(1)).sum(-1)
    beta[:, 0] += weights.h ** 2
    alpha = weights.linear / (EPSILON + beta) ** 2
    omega = alpha / alpha.sum(-1, keepdim=True)
    return (omega.unsqueeze(-1) * candidates).sum(1).view(*inputs.shape[:-1], n_ghost)
