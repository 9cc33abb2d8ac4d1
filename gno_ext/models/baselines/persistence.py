r"""Persistence: the last input frame copied forward, $\hat u^{n+1} = u^n$.

The reference every table needs: a model that has learnt nothing. A trained model whose
rollout error is not well below persistence's has not learnt the dynamics. It has no weights,
so the recipes skip training and only evaluate it.
"""

from __future__ import annotations

from torch import Tensor

from gno_ext.models.base import SchemaModel
from gno_ext.models.registry import register_model
from gno_ext.schema import BoundarySpec, Grid, PDEBatch

__all__ = ["Persistence"]


@register_model("persistence")
class Persistence(SchemaModel):
    """The last input frame as the prediction of the next.

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel` (checked against the inputs, otherwise unused).
    """

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """``u_in[:, -1:]``, shape ``(B, 1, C, *S)``."""
        u_in, *_ = self.inputs(u_in, theta, theta_field, bc, grid)
        return u_in[:, -1:]
