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


class _Payload:
    """Unpickling this creates ``marker``: the code a crafted checkpoint would run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def test_neuraloperators_loaders_use_the_safe_format_and_never_unpickle(tmp_path):
    """(Before, GatedFNO inherited neuraloperator's from_checkpoint/load_checkpoint, which load with
    torch.load(weights_only=False): a crafted checkpoint ran code.)"""
    model = GatedFNO(n_modes=(4, 4), in_channels=1, out_channels=1, hidden_channels=8, n_params=1)
    written = model.save_checkpoint(tmp_path, "gfno")
    assert sorted(p.name for p in written.iterdir()) == ["config.json", "model.safetensors"]
    again = GatedFNO.from_checkpoint(tmp_path, "gfno")
    x, theta = torch.randn(2, 1, 16, 16), torch.rand(2, 1)
    torch.testing.assert_close(again(x, theta=theta), model(x, theta=theta))
    other = GatedFNO(n_modes=(4, 4), in_channels=1, out_channels=1, hidden_channels=8, n_params=1)
    other.load_checkpoint(tmp_path, "gfno")
    torch.testing.assert_close(other(x, theta=theta), model(x, theta=theta))

    # neuraloperator's own layout, with a payload in both files: refused, and nothing runs
    marker = tmp_path / "code-ran"
    evil = tmp_path / "evil"
    evil.mkdir()
    torch.save(_Payload(marker), evil / "model_metadata.pkl")
    torch.save(_Payload(marker), evil / "model_state_dict.pt")
    for load in (lambda: GatedFNO.from_checkpoint(evil, "model"), lambda: other.load_checkpoint(evil, "model")):
        with pytest.raises(ValueError, match=r"model_metadata.pkl, model_state_dict.pt is neuraloperator's pickle "
                                             r"format, which can run code"):
            load()
    assert not marker.exists()
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        GatedFNO.from_checkpoint(tmp_path, "nothing-here")
