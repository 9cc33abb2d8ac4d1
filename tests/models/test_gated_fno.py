import pytest
import torch

pytest.importorskip("neuralop")

from neuralop.models.base_model import BaseModel  # noqa: E402
from neuralop.training import Trainer  # noqa: E402

from gno_ext.models import GatedFNO, from_checkpoint, get_model, save_checkpoint  # noqa: E402


class ThetaData(torch.utils.data.Dataset):
    """y = x scaled by a theta-dependent factor: the gate must read theta."""

    def __init__(self, n=16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 1, 16, 16, generator=g)
        self.theta = torch.rand(n, 1, generator=g) * 2 - 1
        self.y = torch.where(self.theta[:, :, None, None] > 0, 2.0, -1.0) * self.x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i], "theta": self.theta[i]}


def mse(out, y=None, **kwargs):
    return (out - y).pow(2).mean()


def test_registers_with_neuraloperator_and_with_gno_ext():
    assert BaseModel._models["gatedfno"] is GatedFNO
    model = get_model("gated_fno", n_modes=(6, 6), in_channels=1, out_channels=1, hidden_channels=8)
    assert isinstance(model, GatedFNO)


def test_trains_with_neuraloperator_trainer_and_round_trips_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = GatedFNO(n_modes=(6, 6), in_channels=1, out_channels=1, hidden_channels=8, n_params=1, n_kernels=2,
                     n_layers=2)
    loader = torch.utils.data.DataLoader(ThetaData(), batch_size=8)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model=model, n_epochs=3, device="cpu", verbose=False)
    trainer.train(train_loader=loader, test_loaders={}, optimizer=opt,
                  scheduler=torch.optim.lr_scheduler.StepLR(opt, 10), training_loss=mse, eval_losses={})
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    save_checkpoint(model, tmp_path / "ckpt")
    loaded = from_checkpoint(tmp_path / "ckpt")
    x, theta = torch.randn(3, 1, 16, 16), torch.rand(3, 1)
    model.eval(), loaded.eval()
    assert torch.equal(model(x, theta=theta), loaded(x, theta=theta))


def test_forward_ignores_extra_sample_keys_and_requires_theta():
    model = GatedFNO(n_modes=(4, 4), in_channels=1, out_channels=1, hidden_channels=8)
    x = torch.randn(2, 1, 16, 16)
    assert model(x, theta=torch.rand(2, 1), y=x).shape == (2, 1, 16, 16)
    with pytest.raises(TypeError):
        model(x)
