r"""The generalized boundary transfer operator $\mathcal{T}_\lambda(\mathcal{B}, v_\ell) \to h_\ell$.

Every face of the box is cut into patches aligned with the token grid. Each boundary patch
becomes one token built from

* the boundary type (a learned embedding per `BCType`) and the face (a learned embedding),
* its data: the mean over the patch of the data at the input time and at the target time,
  and the Robin coefficients ``(a, b)`` (Dirichlet ``(1, 0)``, Neumann ``(0, 1)``),
* its position along the face,
* the layer's latent state next to the boundary (the adjacent token of $v_\ell$).

A light single-head self-attention over these tokens (plus an MLP) mixes faces and types and
returns $h_\ell$: latent *Dirichlet* tokens, one per boundary patch, that the kernels use as
context. Any number of faces (1-D, 2-D, 3-D boxes) and every boundary type are accepted.

On a CUDA device with Triton the operator runs as fused kernels
(`gno_ext.kernels.boundary`: one for the forward pass, two for the backward pass)
instead of about forty small PyTorch kernels per block; elsewhere, and for sizes the kernels do
not take, it runs the same computation in PyTorch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gno_ext.checks import require_at_least
from gno_ext.kernels import load
from gno_ext.kernels.precision import operand_type
from gno_ext.layers.attention import attend
from gno_ext.layers.routing import one_hot
from gno_ext.schema import BCType, BoundarySpec, Grid, face_view

__all__ = ["BoundaryTransfer", "boundary_features"]

# the Triton operators (`gno_ext.kernels.boundary`) where a GPU and Triton are present, else None
# (the PyTorch path runs): loaded on import, since they must exist before torch.compile traces
# a model
_kernels = load("boundary") if torch.cuda.is_available() else None

N_DATA_FEATURES = 4  # data now, data at target time, a, b


def boundary_features(bc: BoundarySpec, grid: Grid, patch: int, scale: Tensor | float = 1.0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-boundary-patch inputs of `BoundaryTransfer`.

    Parameters
    ----------
    bc : BoundarySpec
        Batched spec. ``values[:, :, 0]`` is taken as the data at the input time and
        ``values[:, :, -1]`` as the data at the target time.
    grid : Grid
    patch : int
        Patch side (the grid must be divisible by it).
    scale : float or Tensor
        Data are divided by it (the field scale of the model).

    Returns
    -------
    data : Tensor, shape (B, M, 4)
        ``(g_now, g_target, a, b)`` per boundary patch.
    kind : Tensor, shape (B, M), long
    face : Tensor, shape (M,), long
    position : Tensor, shape (M, max(d - 1, 1))
        Patch centre along the face, in ``[0, 1]``.
    """
    d = grid.ndim
    tokens = [n // patch for n in grid.shape]
    coeffs = bc.robin_coeffs()
    datas, kinds, faces, positions = [], [], [], []
    for f in range(grid.n_faces):
        axis = f // 2
        other = [a for a in range(d) if a != axis]
        pooled = []
        for t in (0, -1):
            g = face_view(bc.values[:, :, t, :], f, grid)  # (B, *face_shape)
            if d > 1:
                g = F.avg_pool1d(g[:, None], patch)[:, 0] if d == 2 else F.avg_pool2d(g[:, None], patch)[:, 0]
            pooled.append(g.reshape(g.shape[0], -1) / scale)
        n_tok = pooled[0].shape[1]
        ab = coeffs[:, f, None, :].expand(-1, n_tok, 2)
        datas.append(torch.cat([pooled[0][..., None], pooled[1][..., None], ab], -1))
        kinds.append(bc.kind[:, f, None].expand(-1, n_tok))
        faces.append(torch.full((n_tok,), f, dtype=torch.long, device=bc.kind.device))
        if other:
            axes = [(torch.arange(tokens[a], device=bc.kind.device) + 0.5) / tokens[a] for a in other]
            pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(other))
        else:
            pos = torch.zeros(1, 1, device=bc.kind.device)
        positions.append(pos)
    return torch.cat(datas, 1), torch.cat(kinds, 1), torch.cat(faces), torch.cat(positions)


def edge_tokens(tokens: Tensor, grid_tokens: Sequence[int]) -> Tensor:
    """Latent tokens adjacent to each boundary patch, in the order of `boundary_features`.

    ``tokens`` (B, N, D) on the token grid ``grid_tokens``; returns ``(B, M, D)``.
    """
    b, _, dim = tokens.shape
    grid = tokens.view(b, *grid_tokens, dim)
    out = []
    for f in range(2 * len(grid_tokens)):
        axis = f // 2
        layer = grid.select(axis + 1, 0 if f % 2 == 0 else grid_tokens[axis] - 1)
        out.append(layer.reshape(b, -1, dim))
    return torch.cat(out, 1)


class BoundaryTransfer(nn.Module):
    """Boundary description and near-boundary latent state to latent Dirichlet tokens.

    The operator is light: it works at width ``width`` (default ``dim / 4``) and projects to
    ``dim`` at the end, so it costs about one ``dim x dim`` product per boundary token.

    Parameters
    ----------
    dim : int
        Token width ``D`` of the model.
    ndim : int
        Spatial dimension of the box.
    width : int, optional
        Inner width of the attention and MLP (default ``max(dim // 4, 16)``).
    hidden_ratio : float
        Width of the MLP after the attention, relative to ``width``.

    Attributes
    ----------
    fused : bool
        Run the fused kernels where they can (default True): a CUDA tensor, Triton installed,
        ``width`` and the MLP width powers of two (up to 128 and 256; in float32, without
        autocast, ``width`` up to 64: at 128 the kernels would need more shared memory than
        some GPUs allow), at most 32 boundary
        tokens per sample, 64 at inner width 64 with MLP width 128 (the default operator of a
        256-wide model; `gno_ext.kernels.boundary.max_tokens`). Set it to False on
        an instance for the PyTorch path everywhere. Both paths compute the same function
        (tests compare them, gradients included) and both are deterministic.
    """

    fused: bool = True

    def __init__(self, dim: int, ndim: int, width: int | None = None, hidden_ratio: float = 2.0) -> None:
        super().__init__()
        w = width if width is not None else max(dim // 4, 16)
        require_at_least(1, dim=dim, ndim=ndim, width=w)
        if int(hidden_ratio * w) < 1:
            raise ValueError(f"hidden_ratio: the MLP needs at least one unit, got {hidden_ratio} at width {w}")
        self.ndim = ndim
        self.type_embedding = nn.Embedding(len(BCType), w)
        self.face_embedding = nn.Embedding(2 * ndim, w)
        self.data = nn.Linear(N_DATA_FEATURES, w)
        self.position = nn.Linear(max(ndim - 1, 1), w)
        self.state = nn.Linear(dim, w)
        self.norm = nn.LayerNorm(w)
        self.qkv = nn.Linear(w, 3 * w)
        self.attn_out = nn.Linear(w, w)
        self.mlp = nn.Sequential(nn.LayerNorm(w), nn.Linear(w, int(hidden_ratio * w)), nn.GELU(),
                                 nn.Linear(int(hidden_ratio * w), w))
        self.out = nn.Linear(w, dim)

    def describe(self, features: tuple[Tensor, Tensor, Tensor, Tensor], dtype: torch.dtype) -> Tensor:
        """The boundary description part of the tokens: type embedding + face embedding + data
        and position projections, ``(B, M, width)``.

        An embedding is a linear map of a one-hot code, so the four terms are one product of
        ``[onehot(type), onehot(face), data, position]`` with the four weights stacked: one
        matrix product forward and backward (no scatter-add of embedding gradients). The inputs
        are padded with zeros to a multiple of 8 so that the product runs on aligned (fast) GEMM
        kernels.
        """
        data, kind, face, position = features
        b, m = kind.shape
        inputs = torch.cat([one_hot(kind, len(BCType)), one_hot(face, 2 * self.ndim).expand(b, m, -1),
                            data, position.expand(b, m, -1)], -1).to(dtype)
        weight = torch.cat([self.type_embedding.weight, self.face_embedding.weight, self.data.weight.t(),
                            self.position.weight.t()])
        pad = -inputs.shape[-1] % 8
        return F.linear(F.pad(inputs, (0, pad)), F.pad(weight, (0, 0, 0, pad)).t(), self.data.bias + self.position.bias)

    def forward(self, features: tuple[Tensor, Tensor, Tensor, Tensor], state: Tensor) -> Tensor:
        """Latent Dirichlet tokens.

        Parameters
        ----------
        features : tuple
            From `boundary_features` (computed once per forward pass of the model).
        state : Tensor, shape (B, M, D)
            Latent tokens next to each boundary patch (`edge_tokens` of $v_\\ell$).

        Returns
        -------
        Tensor, shape (B, M, D)
        """
        desc = self.describe(features, state.dtype)
        if self.fusable(state):
            return self.forward_fused(desc, state)
        return self.forward_unfused(desc, state)

    def has_fused_form(self) -> bool:
        """Whether the operator is still the one the fused kernels compute: they read the
        layers by position and hard-code the exact GELU, so a changed MLP (another activation,
        another depth) or norm must take the PyTorch path rather than be computed wrongly."""
        mlp = self.mlp
        return (isinstance(self.norm, nn.LayerNorm) and isinstance(mlp, nn.Sequential) and len(mlp) == 4
                and isinstance(mlp[0], nn.LayerNorm) and isinstance(mlp[1], nn.Linear)
                and type(mlp[2]) is nn.GELU and mlp[2].approximate == "none" and isinstance(mlp[3], nn.Linear)
                and all(isinstance(m, nn.Linear) and m.bias is not None
                        for m in (self.state, self.qkv, self.attn_out, mlp[1], mlp[3], self.out)))

    def fusable(self, state: Tensor) -> bool:
        """Whether `forward` takes the fused kernels for this ``state`` (see `fused`), with
        operands of the autocast type under autocast, else of ``state``'s type."""
        if not (self.fused and state.is_cuda and _kernels is not None and self.has_fused_form()):
            return False
        return _kernels.supported(self.norm.normalized_shape[0], self.mlp[1].out_features, state.shape[1],
                                  operand_type(state.dtype, "cuda"))

    def forward_unfused(self, desc: Tensor, state: Tensor) -> Tensor:
        """The operator in PyTorch, from the description ``desc`` (`describe`, (B, M, width))."""
        x = desc + self.state(state)
        q, k, v = self.qkv(self.norm(x)).chunk(3, -1)
        attn = attend(q[:, None], k[:, None], v[:, None])[:, 0]
        x = x + self.attn_out(attn)
        return self.out(x + self.mlp(x))

    def forward_fused(self, desc: Tensor, state: Tensor) -> Tensor:
        """The operator as the fused Triton kernels (`gno_ext.kernels.boundary`), from
        the description ``desc``. Under autocast the products run in the autocast type."""
        if _kernels is None:
            raise RuntimeError("BoundaryTransfer.forward_fused: the Triton operators are not loaded (they need Triton "
                               "and a CUDA device, or Triton's interpreter)")
        device = state.device.type
        dtype = operand_type(state.dtype, device)
        fc1, fc2 = self.mlp[1], self.mlp[3]
        # the weights as they are: the operator casts them, and returns their gradients unrounded
        ws, wqkv, wo, w1, w2, wout = (m.weight for m in (self.state, self.qkv, self.attn_out, fc1, fc2, self.out))
        with torch.autocast(device, enabled=False):
            y, _ = _kernels.boundary_transfer(
                desc.to(dtype).contiguous(), state.to(dtype).contiguous(), ws, self.state.bias,
                self.norm.weight, self.norm.bias, wqkv, self.qkv.bias, wo, self.attn_out.bias,
                self.mlp[0].weight, self.mlp[0].bias, w1, fc1.bias, w2, fc2.bias, wout, self.out.bias,
                self.norm.eps, self.mlp[0].eps)
        return y
