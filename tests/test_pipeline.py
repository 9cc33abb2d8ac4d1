"""The pieces fit together: generated data -> adapter -> DataLoader -> GNO -> group DRO -> step."""

import torch

from gno_ext import collate
from gno_ext.adapters import open_dataset
from gno_ext.data import generate
from gno_ext.layers import balance_losses
from gno_ext.losses import Curriculum, bin_parameters, mse_per_sample
from gno_ext.models import GNO


def test_generated_heat_joint_trains_a_tiny_gno(tmp_path):
    torch.manual_seed(0)
    root = generate("heat-joint", "smoke", tmp_path, device="cpu", progress=False, splits=("train",))
    ds = open_dataset("custom", root, split="train", n_steps_input=1, n_steps_output=1, in_memory=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=10, shuffle=True, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(0))
    first = next(iter(loader))
    model = GNO(in_channels=1, n_params=1, log_params=[True], latent=32, patch=8, depth=2, heads=4, n_kernels=2)
    model.fit_normalization(first.u_in, first.theta)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    curriculum = Curriculum(warmup_epochs=2, tau=1.0)
    losses = []
    for epoch in range(6):
        for batch in loader:
            groups = bin_parameters(batch.theta, [[0.01, 0.1, 1.0]], boundary_type=batch.bc.kind[:, 0])
            with balance_losses() as balance:
                per_sample = mse_per_sample(model(batch), batch.u_out)
            assert len(balance) == 2  # one gate per block
            loss = curriculum.loss(per_sample, groups, epoch) + 0.01 * torch.stack(balance).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(per_sample.mean().item())
    assert losses[-1] < 0.5 * losses[0]
    rollout = model.rollout(first, 3)
    assert rollout.shape == (len(first), 3, 1, 16, 16) and torch.isfinite(rollout).all()
