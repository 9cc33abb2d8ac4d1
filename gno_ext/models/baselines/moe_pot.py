r"""MoE-POT-style mixture of experts (Wang et al., 2025), over the ViT backbone.

Every block's MLP is a sparse mixture: a router on each token's **latent state** picks the top 2 of
4 experts (weights: softmax over the two chosen logits), plus a shared expert every token uses. A
Switch-style load-balance loss $E \sum_e f_e P_e$ ($f_e$ the share of routing slots given to expert
$e$, $P_e$ its mean router probability) keeps the experts in use. Like ViT-k it conditions on
nothing but the input frames: routing comes from the state, not from ``theta`` or the boundary
conditions (ignored). Implemented from the paper's description.

Two dispatches compute the same function. ``"sparse"`` runs each expert on the tokens that chose it
(gathered by expert): the fewest operations, but the gathered sizes depend on the data, so the step
breaks ``torch.compile``'s graph and cannot be captured in a CUDA graph. ``"dense"`` (the default)
runs every expert on every token and weights the outputs, zero for the experts a token did not
choose: static shapes, one compiled graph and no host synchronisation (what a CUDA-graph capture
needs), for twice the expert operations at top-2 of 4. Unchosen experts then get exact-zero
gradients instead of none, which changes the optimizer's step only for an expert that no token of a
whole batch chose.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from gno_ext.layers.gate import record_balance_loss
from gno_ext.layers.routing import one_hot
from gno_ext.models.base import SchemaModel
from gno_ext.models.baselines.vit import ViTBackbone
from gno_ext.models.registry import register_model
from gno_ext.schema import BoundarySpec, Grid, PDEBatch

__all__ = ["MoEMLP", "MoEPOT"]


def _mlp(dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class MoEMLP(nn.Module):
    """Top-``k`` mixture of ``n_experts`` MLPs routed per token, plus a shared expert;
    ``dispatch`` is ``"dense"`` or ``"sparse"`` (module docstring)."""

    def __init__(self, dim: int, hidden: int, n_experts: int = 4, top_k: int = 2, dispatch: str = "dense") -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k: expected 1..{n_experts}, got {top_k}")
        if dispatch not in ("dense", "sparse"):
            raise ValueError(f"dispatch: expected 'dense' or 'sparse', got {dispatch!r}")
        # sparse: an expert that no token chose gets no gradient (DDP: find_unused_parameters)
        self.dispatches = dispatch == "sparse"
        self.top_k, self.n_experts = top_k, n_experts
        self.router = nn.Linear(dim, n_experts)
        self.experts = nn.ModuleList(_mlp(dim, hidden) for _ in range(n_experts))
        self.shared = _mlp(dim, hidden)
        self.last_index: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        logits = self.router(flat).float()
        top, index = logits.topk(self.top_k, -1)
        weight = top.softmax(-1).to(x.dtype)
        chosen = one_hot(index, self.n_experts, torch.float32)  # (tokens, k, experts); no host sync
        out = self.shared(flat)
        # each expert's weighted output is added in the shared expert's type (under autocast x,
        # after a norm, is float32 and the products bf16), expert by expert in both dispatches
        if self.dispatches:
            for e, expert in enumerate(self.experts):
                rows, slot = torch.nonzero(index == e, as_tuple=True)
                if rows.numel():
                    out = out.index_add(0, rows, (expert(flat[rows]) * weight[rows, slot, None]).to(out.dtype))
        else:  # every token's weight for every expert, zero where it did not choose it
            dense = (chosen * weight[..., None]).sum(1).to(weight.dtype)
            for e, expert in enumerate(self.experts):
                out = out + (expert(flat) * dense[:, e, None]).to(out.dtype)
        probs = logits.softmax(-1)
        share = chosen.sum(1).mean(0) / self.top_k
        record_balance_loss(self.n_experts * (share * probs.mean(0)).sum())  # (gno_ext.layers.balance_losses)
        self.last_index = index.view(*shape[:-1], self.top_k)
        return out.view(shape)


@register_model("moe_pot")
class MoEPOT(SchemaModel):
    """ViT whose block MLPs are top-2-of-4 mixtures routed by the latent state, with a shared
    expert; ``theta``, ``theta_field`` and the boundary conditions are ignored.

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel`.
    latent, patch, depth, heads, mlp_ratio
        Backbone sizes (paper: 256, 16, 8, 8, 4).
    n_experts, top_k : int
        4 and 2.
    dispatch : {"dense", "sparse"}
        How the experts run (module docstring): the same function; ``"dense"`` has static shapes
        and compiles into one graph.
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 1,
                 log_params: Sequence[bool] | None = None, latent: int = 256, patch: int = 16, depth: int = 8,
                 heads: int = 8, mlp_ratio: float = 4.0, n_experts: int = 4, top_k: int = 2,
                 dispatch: str = "dense") -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        self.backbone = ViTBackbone(t_in * in_channels, in_channels, ndim, latent, patch, depth, heads, mlp_ratio)
        for block in self.backbone.blocks:
            block.mlp = MoEMLP(latent, int(mlp_ratio * latent), n_experts, top_k, dispatch)

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """Next frame ``(B, 1, C, *S)`` from the input frames alone."""
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        return self.increment(u_in, self.backbone(self.normalized_input(u_in)))
