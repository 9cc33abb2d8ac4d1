"""The tiny overfit that the GNO's tests share: four samples, a parameter-dependent target."""

import torch

from gno_ext.schema import BoundarySpec


def overfit_loss_ratio(model: torch.nn.Module, steps: int, lr: float) -> float:
    """Train ``model`` on four 16 x 16 samples whose target shifts the field by an amount set by
    theta; the final loss over the first."""
    u = torch.randn(4, 1, 1, 16, 16)
    theta = torch.tensor([[0.1], [0.2], [0.8], [0.9]])
    target = u + 0.3 * torch.roll(u, 1, -1) * theta[:, :, None, None, None]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    bc = BoundarySpec.periodic(2, 4)
    first = None
    for _ in range(steps):
        loss = (model(u, theta=theta, bc=bc) - target).pow(2).mean()
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item() / first


def mesh_loss_ratio(model: torch.nn.Module, batch, steps: int, lr: float) -> float:
    """Fit the mesh model's normalisation to ``batch`` (a torch-geometric batch of mesh samples),
    train it there with Adam for ``steps`` steps on the next frame; the last loss over the first."""
    model.fit_normalization(torch.cat([batch.u_in, batch.u_out], 1), batch.theta)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = (model(batch) - batch.u_out).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses[-1] / losses[0]
