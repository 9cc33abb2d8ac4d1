"""ViT baselines: ViT-k (implicit inference from k frames) and Concat (theta on the grid).

Both use the paper's backbone (Appendix E): patch embedding, fixed sin-cos positions, ``depth``
pre-norm transformer blocks, a linear projection of each token back to its patch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from gno_ext.layers.embeddings import (
    PatchEmbed,
    PatchProject,
    sincos_position,
    token_shape,
)
from gno_ext.models.base import SchemaModel, TransformerBlock
from gno_ext.models.registry import register_model
from gno_ext.schema import BoundarySpec, Grid, PDEBatch

__all__ = ["ViTBackbone", "ViT", "Concat"]


class ViTBackbone(nn.Module):
    """Patch embedding, transformer blocks and patch projection.

    Parameters
    ----------
    in_channels, out_channels, ndim : int
    latent, patch, depth, heads : int
    mlp_ratio : float
    """

    def __init__(self, in_channels: int, out_channels: int, ndim: int, latent: int = 256, patch: int = 16,
                 depth: int = 8, heads: int = 8, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.patch, self.latent = patch, latent
        self.embed = PatchEmbed(in_channels, latent, patch, ndim)
        self.blocks = nn.ModuleList(TransformerBlock(latent, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(latent)
        self.project = PatchProject(latent, out_channels, patch, ndim)

    def tokens(self, x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        """Embedded tokens with positions, and the token grid."""
        grid_tokens = token_shape(tuple(x.shape[2:]), self.patch)
        return self.embed(x) + sincos_position(grid_tokens, self.latent, x.device, x.dtype), grid_tokens

    def forward(self, x: Tensor) -> Tensor:
        """``(B, in_channels, *S) -> (B, out_channels, *S)``."""
        tokens, grid_tokens = self.tokens(x)
        for block in self.blocks:
            tokens = block(tokens)
        return self.project(self.norm(tokens), grid_tokens)


@register_model("vit")
class ViT(SchemaModel):
    """ViT-k: the implicit-inference baseline. The ``k = t_in`` input frames are stacked on
    channels; ``theta``, ``theta_field`` and the boundary conditions are **ignored** (the model
    must infer them from the frames).

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel` (``t_in`` is k: 2, 5 or 10 in the paper).
    latent, patch, depth, heads, mlp_ratio
        Backbone sizes (paper: 256, 16, 8, 8, 4).
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 2,
                 log_params: Sequence[bool] | None = None, latent: int = 256, patch: int = 16, depth: int = 8,
                 heads: int = 8, mlp_ratio: float = 4.0) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        self.backbone = ViTBackbone(t_in * in_channels, in_channels, ndim, latent, patch, depth, heads, mlp_ratio)

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """Next frame ``(B, 1, C, *S)`` from the k frames of ``u_in`` alone."""
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        return self.increment(u_in, self.backbone(self.normalized_input(u_in)))


@register_model("concat")
class Concat(SchemaModel):
    """Concat: the normalised ``theta`` broadcast over the grid and the field parameters
    ``theta_field`` concatenated with the input frames as extra channels, ViT backbone. The
    boundary conditions are **ignored**.

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel`.
    latent, patch, depth, heads, mlp_ratio
        Backbone sizes (paper: 256, 16, 8, 8, 4).
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 1,
                 log_params: Sequence[bool] | None = None, latent: int = 256, patch: int = 16, depth: int = 8,
                 heads: int = 8, mlp_ratio: float = 4.0) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        extra = n_params + field_channels
        self.backbone = ViTBackbone(t_in * in_channels + extra, in_channels, ndim, latent, patch, depth, heads,
                                    mlp_ratio)

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """Next frame ``(B, 1, C, *S)``."""
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        x = self.normalized_input(u_in)
        return self.increment(u_in, self.backbone(torch.cat([x, *self.parameter_channels(x, theta, theta_field)], 1)))
