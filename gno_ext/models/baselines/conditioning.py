r"""The conditioning variants of the GNO paper's Appendix G, from one parametrised ViT.

A condition vector $c$ (an MLP of the normalised ``theta``, the field parameters' mean and RMS
and the boundary summary: per face the type and the mean data) enters the tokens $x$ by

* ``film``: $x \leftarrow x \odot (1 + \gamma(c)) + \beta(c)$;
* ``pos``: $x \leftarrow x + W c$, like a positional embedding;
* ``proj``: $x \leftarrow W [x; c]$, concatenation then projection;
* ``token``: $c$ as an extra token of the sequence (dropped again after the block);

either once after the patch embedding (``where="encoder"``) or before every attention layer
(``where="layers"``): 4 x 2 = 8 models.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from gno_ext.models.base import SchemaModel
from gno_ext.models.baselines.vit import ViTBackbone
from gno_ext.models.registry import register_model
from gno_ext.schema import BoundarySpec, Grid, PDEBatch

__all__ = ["Conditioner", "ConditionedViT", "METHODS", "PLACES"]

METHODS = ("film", "pos", "proj", "token")
PLACES = ("encoder", "layers")


class Conditioner(nn.Module):
    """Apply condition ``c`` (B, D) to tokens ``x`` (B, N, D) by one of `METHODS`."""

    def __init__(self, method: str, dim: int) -> None:
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
        self.method = method
        out = {"film": 2 * dim, "pos": dim, "proj": dim, "token": dim}[method]
        self.map = nn.Linear(2 * dim if method == "proj" else dim, out)

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        if self.method == "film":
            gamma, beta = self.map(c)[:, None].chunk(2, -1)
            return x * (1 + gamma) + beta
        if self.method == "pos":
            return x + self.map(c)[:, None]
        if self.method == "proj":
            return self.map(torch.cat([x, c[:, None].expand_as(x)], -1))
        return torch.cat([self.map(c)[:, None], x], 1)  # token: prepended


@register_model("conditioned_vit")
class ConditionedViT(SchemaModel):
    """ViT conditioned on ``theta``, ``theta_field`` (pooled) and the boundary summary by FiLM,
    Pos, Proj or Token, at the encoder or before every attention layer.

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel`.
    method : {"film", "pos", "proj", "token"}
    where : {"encoder", "layers"}
    latent, patch, depth, heads, mlp_ratio
        Backbone sizes (paper: 256, 16, 8, 8, 4).
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 1,
                 log_params: Sequence[bool] | None = None, method: str = "film", where: str = "encoder",
                 latent: int = 256, patch: int = 16, depth: int = 8, heads: int = 8, mlp_ratio: float = 4.0) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        if where not in PLACES:
            raise ValueError(f"where: expected one of {PLACES}, got {where!r}")
        self.method, self.where = method, where
        self.backbone = ViTBackbone(t_in * in_channels, in_channels, ndim, latent, patch, depth, heads, mlp_ratio)
        self.encode = self.condition_encoder(latent)
        self.conditioners = nn.ModuleList(Conditioner(method, latent) for _ in range(depth if where == "layers" else 1))

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """Next frame ``(B, 1, C, *S)``."""
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        x = self.normalized_input(u_in)
        tokens, grid_tokens = self.backbone.tokens(x)
        c = self.encode(self.condition(theta, theta_field, bc, x.shape[0], x.dtype))
        n = tokens.shape[1]
        for k, block in enumerate(self.backbone.blocks):
            if self.where == "layers" or k == 0:
                tokens = self.conditioners[k if self.where == "layers" else 0](tokens, c)
            tokens = block(tokens)
            if self.method == "token" and self.where == "layers":
                tokens = tokens[:, -n:]  # the condition token is re-made before each layer
        tokens = tokens[:, -n:]
        return self.increment(u_in, self.backbone.project(self.backbone.norm(tokens), grid_tokens))
