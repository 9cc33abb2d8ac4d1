"""A GNO layer inside your own FNO: neuraloperator's FNO whose spectral convolutions are the GNO's
parameter-gated kernels, trained on heat trajectories across diffusivities and compared with the
same FNO reading the diffusivity as an input channel.

    python examples/gated_kernels_in_your_fno.py [--steps 300]
"""

from __future__ import annotations

import argparse
import functools

import torch
from neuralop.models import FNO

from gno_ext import BoundarySpec, Grid
from gno_ext.layers import GatedSpectralConv, condition_on
from gno_ext.losses import nmse
from gno_ext.solvers import gaussian_random_field, solve_heat


def heat_pairs(n: int, seed: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` pairs (u at t = 0.002, u at t = 0.004) of periodic heat flows, diffusivity in [0.1, 1]."""
    grid = Grid((size, size))
    g = torch.Generator().manual_seed(seed)
    alpha = 0.1 + 0.9 * torch.rand(n, generator=g)
    u0 = gaussian_random_field(grid, seeds=range(seed * 1000, seed * 1000 + n))
    bc = BoundarySpec.from_types(["periodic"] * 4, [0.0] * 4, batch_size=n)
    u = solve_heat(u0, alpha, bc, times=[0.002, 0.004], grid=grid)  # (n, 2, 1, S, S)
    return u[:, 0], u[:, 1], alpha[:, None]


def train(model: torch.nn.Module, forward, data, steps: int) -> float:
    """Adam on the next-frame MSE; returns the test nMSE (``forward(model, x, theta)``)."""
    (x, y, theta), (xt, yt, thetat) = data
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        idx = torch.randint(0, len(x), (16,), generator=torch.Generator().manual_seed(step))
        loss = (forward(model, x[idx], theta[idx]) - y[idx]).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(nmse(forward(model, xt, thetat), yt).mean())


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    data = heat_pairs(128, seed=1), heat_pairs(32, seed=2)

    # your FNO, its spectral convolutions replaced by banks of 4 kernels mixed by a gate on theta
    gated = FNO((8, 8), in_channels=1, out_channels=1, hidden_channels=24, n_layers=3,
                conv_module=functools.partial(GatedSpectralConv, n_kernels=4, n_params=1, soft_routing=True))

    def gated_forward(model, x, theta):
        with condition_on(model, (theta - 0.55) / 0.26):  # the gate reads the normalised diffusivity
            return model(x)

    # the same FNO with the diffusivity as a second input channel, for comparison
    plain = FNO((8, 8), in_channels=2, out_channels=1, hidden_channels=24, n_layers=3)

    def plain_forward(model, x, theta):
        return model(torch.cat([x, theta[:, :, None, None].expand_as(x)], 1))

    errors = {"gated kernels": train(gated, gated_forward, data, args.steps),
              "theta as a channel": train(plain, plain_forward, data, args.steps)}
    for name, error in errors.items():
        print(f"{name}: test nMSE {error:.3e}")
    return errors


if __name__ == "__main__":
    main()
