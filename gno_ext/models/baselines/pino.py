r"""PINO: an FNO trained with the data loss plus the residual of the known equation.

As the GNO paper's Appendix M uses it: the network sees only the input frames; the PDE
parameters enter **only the loss**, through the residual of the equation between the last input
frame $u^n$ and the prediction $u^{n+1}$ (Crank-Nicolson in time, central differences in
space, on the cells whose stencil stays inside the box; periodic axes wrap):

* heat: $r = (u^{n+1} - u^n)/\Delta t - \alpha\, \Delta \bar u$,
* advection: $r = (u^{n+1} - u^n)/\Delta t + v \cdot \nabla \bar u$,

with $\bar u = (u^n + u^{n+1})/2$; `PINO.physics_loss` returns the mean of
$(r\, \Delta t / \sigma_u)^2$ (the residual in units of the field's scale per step), which the
recipes add with weight ``model.physics_weight``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from gno_ext.models.base import SchemaModel, neuralop_fno
from gno_ext.models.registry import register_model
from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch

__all__ = ["PINO"]

EQUATIONS = ("heat", "advection")


def _derivative(u: Tensor, axis: int, h: float, periodic: Tensor, order: int) -> Tensor:
    """Central first or second difference along spatial ``axis`` of ``u`` (B, C, *S). The
    stencil wraps around for the samples whose ``periodic`` (B,) is true; for the others the two
    boundary layers are NaN (masked by the caller). Chosen per sample on the device, with no
    value read on the host, so that a training step with the physics loss can be captured."""
    dim = 2 + axis
    up, down = u.roll(-1, dim), u.roll(1, dim)
    n = u.shape[dim]
    cells = torch.arange(n, device=u.device).view(*([1] * dim), n, *([1] * (u.ndim - dim - 1)))
    open_axis = ~periodic.view(-1, *([1] * (u.ndim - 1)))
    up = torch.where(open_axis & (cells == n - 1), float("nan"), up)  # a number: no copy to the device
    down = torch.where(open_axis & (cells == 0), float("nan"), down)
    return (up - down) / (2 * h) if order == 1 else (up - 2 * u + down) / (h * h)


@register_model("pino")
class PINO(SchemaModel):
    """FNO (neuraloperator) on the input frames, with a physics-informed loss term.

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel`.
    equation : {"heat", "advection"}
        The equation of the residual. For heat ``theta[:, 0]`` is the diffusivity; for
        advection ``theta_field`` is the velocity.
    n_modes, hidden_channels, n_layers : int
        FNO sizes.
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 1,
                 log_params: Sequence[bool] | None = None, equation: str | None = "heat", n_modes: int = 12,
                 hidden_channels: int = 64, n_layers: int = 4) -> None:
        if equation not in EQUATIONS:
            raise ValueError(f"pino: equation must be one of {EQUATIONS} (the residuals implemented), got {equation!r}")
        if equation == "advection" and field_channels != ndim:
            raise ValueError(f"pino: advection needs the velocity as theta_field ({ndim} channels), got {field_channels}")
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        self.equation = equation
        self.net = neuralop_fno(ndim, n_modes, t_in * in_channels, in_channels, hidden_channels, n_layers)

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """Next frame ``(B, 1, C, *S)`` from the input frames (``theta`` etc. are not inputs)."""
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        return self.increment(u_in, self.net(self.normalized_input(u_in)))

    def residual(self, batch: PDEBatch, pred: Tensor) -> Tensor:
        """The equation's residual between ``batch.u_in[:, -1]`` and ``pred`` (B, 1, C, *S),
        NaN where the stencil leaves the box."""
        u0, u1 = batch.u_in[:, -1].float(), pred[:, 0].float()
        dt = batch.dt.float().view(-1, *([1] * (u0.ndim - 1)))
        mid = 0.5 * (u0 + u1)
        spacing = batch.grid.spacing
        periodic = [(batch.bc.kind[:, 2 * a : 2 * a + 2] == BCType.PERIODIC).all(1) for a in range(self.ndim)]
        if self.equation == "heat":
            lap = sum(_derivative(mid, a, spacing[a], periodic[a], 2) for a in range(self.ndim))
            alpha = batch.theta[:, :1].float().view(-1, *([1] * (u0.ndim - 1)))
            return (u1 - u0) / dt - alpha * lap
        v = batch.theta_field.float()
        transport = sum(v[:, a : a + 1] * _derivative(mid, a, spacing[a], periodic[a], 1) for a in range(self.ndim))
        return (u1 - u0) / dt + transport

    def physics_loss(self, batch: PDEBatch, pred: Tensor) -> Tensor:
        """Mean squared residual in field units per step (see the module docstring)."""
        r = self.residual(batch, pred) * batch.dt.float().view(-1, *([1] * (pred.ndim - 2)))
        r = r / self.u_std.view(1, -1, *([1] * self.ndim))
        valid = torch.isfinite(r)
        return torch.where(valid, r, 0).pow(2).sum() / valid.sum().clamp_min(1)
