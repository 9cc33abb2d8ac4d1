"""FlatParameters: the parameters as views of flat buffers, stepped by the optimizer as one."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gno_ext.models import GNO, from_checkpoint, save_checkpoint
from gno_ext.training import FlatParameters
from gno_ext.training.setup import param_groups


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 2))


def _groups(model: nn.Module) -> list[dict]:
    return [{"params": [p for p in model.parameters() if p.ndim == 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0, "lr": 3e-3}]


def test_steps_match_an_optimizer_over_the_parameters():
    """Five AdamW steps with two groups (their own weight decay and learning rate) and gradient
    clipping give the weights of the same steps over the parameters themselves."""
    model, ref = _model(), _model()
    flat = FlatParameters(_groups(model))
    opt = torch.optim.AdamW(flat.param_groups, lr=1e-2)
    opt_ref = torch.optim.AdamW(_groups(ref), lr=1e-2)
    assert [len(g["params"]) for g in opt.param_groups] == [1, 1]
    for _ in range(5):
        x = torch.randn(16, 4)
        model(x).square().mean().backward()
        flat.gather_grads()
        norm = nn.utils.clip_grad_norm_(flat.parameters(), 0.05)
        assert all(p.grad is None for p in model.parameters())  # moved: the next backward starts afresh
        opt.step()
        opt.zero_grad(set_to_none=True)
        ref(x).square().mean().backward()
        norm_ref = nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        opt_ref.step()
        ref.zero_grad(set_to_none=True)
        torch.testing.assert_close(norm, norm_ref)
    moved = False
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)
        moved |= not torch.equal(p, _model().state_dict()[name])
    assert moved


def test_parameters_are_views_in_group_order():
    model = _model()
    flat = FlatParameters(_groups(model))
    decay, no_decay = (g["params"][0] for g in flat.param_groups)
    assert decay.numel() == 4 * 8 + 8 * 2 and no_decay.numel() == 8 + 8 + 8 + 2
    with torch.no_grad():
        decay.zero_()
    assert all(not p.any() for p in model.parameters() if p.ndim == 2)
    assert model[0].bias.abs().sum() > 0
    # gradients land in the buffer in the same order, and missing ones are zeros
    model[0].weight.grad = torch.ones_like(model[0].weight)
    model[3].weight.grad = torch.full_like(model[3].weight, 2.0)
    model[0].bias.grad = torch.full_like(model[0].bias, 3.0)
    flat.gather_grads()
    assert torch.equal(decay.grad, torch.cat([torch.ones(32), torch.full((16,), 2.0)]))
    assert torch.equal(no_decay.grad, torch.cat([torch.full((8,), 3.0), torch.zeros(18)]))
    # a second step: a gradient missing now is zero again, not the last step's; a
    # non-contiguous gradient lands in the parameter's own order
    model[3].weight.grad = torch.arange(16.0).view(8, 2).t()
    model[3].bias.grad = torch.full_like(model[3].bias, 4.0)
    flat.gather_grads()
    assert torch.equal(decay.grad, torch.cat([torch.zeros(32), torch.arange(16.0).view(8, 2).t().reshape(-1)]))
    assert torch.equal(no_decay.grad, torch.cat([torch.zeros(24), torch.full((2,), 4.0)]))


def test_the_gradient_buffers_stay_the_same_tensors():
    """zero_grad(set_to_none=True) on the optimizer drops the buffers' gradients; gather_grads
    gives the same tensors back (a captured step must read the same memory every time)."""
    model = _model()
    flat = FlatParameters(model.parameters())
    opt = torch.optim.SGD(flat.param_groups, lr=0.1)
    (buffer,) = flat.parameters()
    grad = buffer.grad
    model(torch.randn(3, 4)).sum().backward()
    opt.zero_grad(set_to_none=True)
    assert buffer.grad is None
    flat.gather_grads()
    assert buffer.grad is grad and grad.abs().sum() > 0


def test_one_buffer_per_dtype():
    model = _model()
    model[3].double()
    flat = FlatParameters(model.parameters())
    dtypes = sorted(str(p.dtype) for p in flat.param_groups[0]["params"])
    assert dtypes == ["torch.float32", "torch.float64"]
    model[3](model[:3](torch.randn(2, 4)).double()).sum().backward()
    flat.gather_grads()
    assert all(p.grad.abs().sum() > 0 for p in flat.parameters())


def test_bad_input_is_named():
    model = _model()
    with pytest.raises(ValueError, match="no parameters"):
        FlatParameters([])
    with pytest.raises(ValueError, match="parameter 0 of group 0 is not a torch.nn.Parameter"):
        FlatParameters([torch.zeros(3)])
    model[0].weight.requires_grad_(False)
    with pytest.raises(ValueError, match="parameter 0 of group 0 .*shape \\(8, 4\\)"):
        FlatParameters(model.parameters())
    model[0].weight.requires_grad_(True)
    with pytest.raises(ValueError, match="parameter 0 of group 1 .*appears more than once"):
        FlatParameters([{"params": [model[0].weight]}, {"params": [model[0].weight]}])


def test_a_model_moved_afterwards_is_an_error():
    model = _model()
    flat = FlatParameters(model.parameters())
    model.double()
    model(torch.randn(2, 4, dtype=torch.float64)).sum().backward()
    with pytest.raises(RuntimeError, match=r"no longer lies in its flat buffer.*\.to, \.cuda"):
        flat.gather_grads()


def test_checkpoint_of_a_flattened_gno_round_trips(tmp_path):
    """The state dict's tensors share one storage; the checkpoint writer copies what safetensors
    would refuse, and the model rebuilt from it is the same."""
    model = GNO(latent=32, patch=8, depth=2, heads=4, n_kernels=3)
    before = copy.deepcopy(model.state_dict())
    FlatParameters(param_groups(model, 0.1))
    assert len({p.untyped_storage().data_ptr() for p in model.parameters()}) == 2
    save_checkpoint(model, tmp_path / "ckpt")
    again = from_checkpoint(tmp_path / "ckpt")
    for key, value in again.state_dict().items():
        assert torch.equal(value, before[key]), key
