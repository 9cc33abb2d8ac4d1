r"""Unisolver-style conditioning (Zhou et al., 2025), over the ViT backbone.

Conditions enter every transformer block by adaptive layer-norm modulation:
$h = \mathrm{LN}(x)(1 + s) + b$ before the attention and the MLP, and their outputs scaled by
$(1 + g)$ before the residual sum, where $(s, b, g)$ come from a linear map of the condition that
is **initialised to zero**, so the model starts as the unconditioned backbone. Domain-wise
conditions (scalar ``theta``, the boundary types and data) form one vector per sample;
point-wise conditions (field parameters $v(x)$) are patch-embedded into one vector per token.
Implemented from the paper's description.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from gno_ext.layers.embeddings import PatchEmbed
from gno_ext.models.base import SchemaModel
from gno_ext.models.baselines.vit import ViTBackbone
from gno_ext.models.registry import register_model
from gno_ext.schema import BoundarySpec, Grid, PDEBatch

__all__ = ["Unisolver"]


@register_model("unisolver")
class Unisolver(SchemaModel):
    """ViT with zero-initialised adaptive-layer-norm conditioning on ``theta``, the boundary
    conditions (domain-wise) and ``theta_field`` (point-wise).

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
        self.backbone = ViTBackbone(t_in * in_channels, in_channels, ndim, latent, patch, depth, heads, mlp_ratio)
        self.domain = self.condition_encoder(latent)
        self.point = PatchEmbed(field_channels, latent, patch, ndim) if field_channels else None
        self.modulations = nn.ModuleList(nn.Linear(latent, 6 * latent) for _ in range(depth))
        for m in self.modulations:  # zero-initialised: the model starts as the plain backbone
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """Next frame ``(B, 1, C, *S)``."""
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        x = self.normalized_input(u_in)
        tokens, grid_tokens = self.backbone.tokens(x)
        cond = self.domain(self.condition(theta, theta_field, bc, x.shape[0], x.dtype))[:, None]
        if self.point is not None:
            cond = cond + self.point(theta_field.to(x.dtype))
        cond = nn.functional.gelu(cond)
        for block, mod in zip(self.backbone.blocks, self.modulations):
            s1, b1, g1, s2, b2, g2 = mod(cond).chunk(6, -1)
            tokens = tokens + (1 + g1) * block.attention(block.norm1(tokens) * (1 + s1) + b1)
            tokens = tokens + (1 + g2) * block.mlp(block.norm2(tokens) * (1 + s2) + b2)
        return self.increment(u_in, self.backbone.project(self.backbone.norm(tokens), grid_tokens))
