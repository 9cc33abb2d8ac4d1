import copy
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from gno_ext.layers import balance_losses
from gno_ext.models import (
    GNO,
    available_models,
    from_checkpoint,
    get_model,
    save_checkpoint,
)
from gno_ext.schema import BoundarySpec, Grid, PDEBatch
from tests.models._overfit import overfit_loss_ratio

REFERENCE = Path(__file__).parent / "data" / "gno_reference.safetensors"


def tiny(**kw):
    args = dict(latent=32, patch=8, depth=2, heads=4, mlp_ratio=2.0, n_kernels=3, gate_hidden=8)
    args.update(kw)
    return GNO(**args)


def bc_mixed(batch, values=(1.0, -2.0, 0.0, 0.5)):
    return BoundarySpec.from_types(["dirichlet", "neumann", "robin", "periodic"][:2] + ["dirichlet", "neumann"],
                                   list(values), batch_size=batch)


@pytest.mark.parametrize("ndim,shape", [(2, (32, 32)), (2, (64, 32)), (2, (16, 48)), (3, (16, 16, 16)), (3, (8, 16, 8))])
def test_shapes_in_2d_and_3d(ndim, shape):
    torch.manual_seed(0)
    model = tiny(ndim=ndim, patch=8 if ndim == 2 else 4, in_channels=2, n_params=2, field_channels=ndim)
    b = 3
    u = torch.randn(b, 1, 2, *shape)
    kinds = ["dirichlet", "neumann"] * ndim
    y = model(u, theta=torch.rand(b, 2), theta_field=torch.randn(b, ndim, *shape),
              bc=BoundarySpec.from_types(kinds, 1.0, batch_size=b))
    assert y.shape == (b, 1, 2, *shape)


def test_forward_accepts_a_batch_and_rolls_out():
    torch.manual_seed(1)
    model = tiny().eval()
    grid = Grid((32, 32))
    batch = PDEBatch(u_in=torch.randn(2, 1, 1, 32, 32), u_out=torch.randn(2, 1, 1, 32, 32), theta=torch.rand(2, 1),
                     bc=bc_mixed(2), grid=grid, dt=torch.ones(2))
    y = model(batch)
    assert torch.equal(y, model(batch.u_in, batch.theta, None, batch.bc, grid))
    roll = model.rollout(batch, 3)
    assert roll.shape == (2, 3, 1, 32, 32) and torch.equal(roll[:, :1], y)
    assert torch.equal(model.rollout(batch, np.int64(3)), roll)
    for steps in (0, 2.5, True, "3"):
        with pytest.raises(ValueError, match=f"steps: must be an integer >= 1, got {steps!r}"):
            model.rollout(batch, steps)
    with pytest.raises(TypeError, match="batch: expected a PDEBatch .*, got Tensor"):  # (was an AttributeError)
        model.rollout(batch.u_in, 3)


def test_every_parameter_gets_a_gradient_except_unselected_kernels():
    torch.manual_seed(2)
    model = tiny(field_channels=2)
    b = 8
    u = torch.randn(b, 1, 1, 32, 32)
    with balance_losses() as balance:
        y = model(u, theta=torch.linspace(0.1, 10, b)[:, None], theta_field=torch.randn(b, 2, 32, 32), bc=bc_mixed(b))
    assert len(balance) == len(model.blocks)  # one gate per block, each term in the graph
    (y.pow(2).mean() + 0.01 * torch.stack(balance).sum()).backward()
    banks = set()
    for blk in model.blocks:  # the kernels' weights are stacked: kernel k is slice k of each
        used = set(blk.mixture.last_routing.index.tolist())
        assert 0 < len(used) < 3  # some kernel unused, to check
        for name, p in blk.mixture.kernels.named_parameters():
            banks.add(id(p))
            for k in range(3):  # the static attention mixture gives unselected kernels zero gradient
                assert bool(p.grad[k].any()) == (k in used), (name, k, used)
    missing = [n for n, p in model.named_parameters() if id(p) not in banks and (p.grad is None or not p.grad.any())]
    assert missing == []


def test_batch_independence():
    torch.manual_seed(3)
    model = tiny(n_params=1).eval()
    u, theta = torch.randn(4, 1, 1, 32, 32), torch.rand(4, 1)
    bc = bc_mixed(4)
    y = model(u, theta=theta, bc=bc)
    u2 = u.clone()
    u2[1:] = torch.randn(3, 1, 1, 32, 32)
    theta2 = theta.clone()
    theta2[1:] = torch.rand(3, 1)
    y2 = model(u2, theta=theta2, bc=bc)
    assert torch.allclose(y[0], y2[0], atol=1e-6)


def test_different_parameters_route_to_different_kernels_and_change_the_output():
    torch.manual_seed(4)
    model = tiny(n_kernels=4, log_params=[True]).eval()
    model.param_norm.fit(torch.logspace(-2, 0, 50)[:, None])
    theta = torch.logspace(-2, 0, 64)[:, None]
    u = torch.randn(1, 1, 1, 32, 32).expand(64, -1, -1, -1, -1)
    y = model(u, theta=theta, bc=BoundarySpec.periodic(2, 64))
    routes = [set(blk.mixture.last_routing.index.tolist()) for blk in model.blocks]
    assert any(len(r) > 1 for r in routes)
    assert (y[0] - y[-1]).abs().max() > 1e-4


def test_changing_only_boundary_data_changes_the_output_near_that_boundary():
    torch.manual_seed(5)
    model = tiny().eval()
    u, theta = torch.randn(1, 1, 1, 32, 32), torch.rand(1, 1)
    base = model(u, theta=theta, bc=bc_mixed(1, (1.0, 0.0, 0.0, 0.0)))
    moved = model(u, theta=theta, bc=bc_mixed(1, (5.0, 0.0, 0.0, 0.0)))  # only the x- Dirichlet value
    near = (moved - base)[..., :8, :].abs().mean()  # the patch column at x-
    assert near > 1e-4
    ablated = tiny(boundary_transfer=False).eval()
    a = ablated(u, theta=theta, bc=bc_mixed(1, (1.0, 0.0, 0.0, 0.0)))
    assert torch.equal(a, ablated(u, theta=theta, bc=bc_mixed(1, (5.0, 0.0, 0.0, 0.0))))


def test_tiny_gno_overfits_a_handful_of_samples():
    torch.manual_seed(6)
    assert overfit_loss_ratio(tiny(latent=48, depth=2), steps=300, lr=2e-3) < 0.01


def test_tiny_gno_learns_a_parameter_scaled_shift_in_3d():
    """In 3-D (16³ cells, tokens of 4³ cells) the model learns the parameter-scaled one-cell shift
    of the overfit samples: its loss ends below half of what the best prediction blind to theta
    (the shift scaled by theta's mean) leaves. (Slower than in 2-D: the bound takes about 600
    steps here.)"""
    torch.manual_seed(6)
    model = tiny(latent=48, depth=2, ndim=3, patch=4)
    u = torch.randn(4, 1, 1, 16, 16, 16)
    theta = torch.tensor([[0.1], [0.2], [0.8], [0.9]])
    shift = 0.3 * torch.roll(u, 1, -1)
    target = u + shift * theta.view(4, 1, 1, 1, 1, 1)
    blind = (target - (u + shift * theta.mean())).pow(2).mean().item()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    bc = BoundarySpec.periodic(3, 4)
    for _ in range(600):
        loss = (model(u, theta=theta, bc=bc) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * blind


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(7)
    model = tiny(n_params=2, log_params=[True, False]).eval()
    model.fit_normalization(torch.randn(10, 1, 1, 32, 32) * 3 + 1, torch.rand(10, 2) + 0.1)
    path = save_checkpoint(model, tmp_path / "step_10", extra={"step": 10})
    loaded = from_checkpoint(path).eval()
    assert loaded.model_config == model.model_config
    u, theta, bc = torch.randn(2, 1, 1, 32, 32), torch.rand(2, 2) + 0.1, bc_mixed(2)
    assert torch.equal(model(u, theta=theta, bc=bc), loaded(u, theta=theta, bc=bc))
    assert torch.equal(loaded.u_std, model.u_std)
    save_checkpoint(model, path)  # overwriting keeps one complete folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_10"]
    # anything else at the path is left alone (a file was moved aside, a folder deleted)
    (tmp_path / "notes.txt").write_text("mine")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0")
    trained = tmp_path / "trained"
    save_checkpoint(model, trained)
    (trained / "training_state.pt").write_bytes(b"optimizer")
    for target, what in [(tmp_path / "notes.txt", "a file"), (run, "a folder holding checkpoints, config.yaml"),
                         (trained, "a folder holding config.json, model.safetensors, training_state.pt")]:
        with pytest.raises(FileExistsError, match=f"is {what}, not a model checkpoint; not replaced"):
            save_checkpoint(model, target)
    assert (tmp_path / "notes.txt").read_text() == "mine" and (run / "config.yaml").is_file()
    assert (trained / "training_state.pt").read_bytes() == b"optimizer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "run", "step_10", "trained"]  # no temporaries
    with pytest.raises(FileNotFoundError, match="missing config.json"):
        from_checkpoint(tmp_path)


def test_a_damaged_checkpoint_names_the_file_at_fault(tmp_path):
    path = save_checkpoint(tiny(), tmp_path / "ckpt")
    config, weights = path / "config.json", path / "model.safetensors"
    text, data = config.read_text(), weights.read_bytes()
    damaged = [(config, "{bad json", r"config.json: not valid JSON"),
               (config, '{"name": "gno"}', r"config.json: expected an object with a model 'name'"),
               (config, text.replace('"depth": 2', '"depth": 3'), r"model.safetensors: does not fit the 'gno' model"),
               (weights, data[: len(data) // 2], r"model.safetensors: cannot be read as safetensors")]
    for file, content, match in damaged:
        file.write_bytes(content.encode() if isinstance(content, str) else content)
        with pytest.raises(ValueError, match=match):
            from_checkpoint(path)
        config.write_text(text)
        weights.write_bytes(data)
    assert isinstance(from_checkpoint(path), GNO)  # restored: it loads again


def test_a_config_that_does_not_fit_its_weights_is_refused_before_the_model_is_built(tmp_path, monkeypatch):
    """(Before, the model of config.json was built first: latent=16384 allocated gigabytes before
    the weights' shapes were compared.)"""
    import json

    import gno_ext.models.registry as registry

    path = save_checkpoint(tiny(), tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    config["kwargs"]["latent"] = 16384
    (path / "config.json").write_text(json.dumps(config))
    built, build = [], registry.get_model
    monkeypatch.setattr(registry, "get_model", lambda *a, **k: built.append(torch.get_default_device().type)
                        or build(*a, **k))
    with pytest.raises(ValueError, match=r"model.safetensors: does not fit the 'gno' model that .*config.json describes "
                                         r"\(.*: \(16,\) in the file, \(4096,\) from the config.*\); nothing was built"):
        from_checkpoint(path)
    assert built == ["meta"]  # only the skeleton, which allocates nothing
    # a layer count beyond the file's tensors: refused before even the skeleton (a minute at depth=10000)
    config["kwargs"]["latent"], config["kwargs"]["depth"] = 16, 10_000
    (path / "config.json").write_text(json.dumps(config))
    built.clear()
    with pytest.raises(ValueError, match=r"config.json: depth=10000 layers, but .*model.safetensors holds \d+ tensors"):
        from_checkpoint(path)
    assert built == []


def test_registry():
    assert {"gno", "gated_fno"} <= set(available_models())
    assert isinstance(get_model("gno", latent=32, patch=8, depth=1, heads=4), GNO)
    with pytest.raises(KeyError, match="unknown model 'gnoo'; available: .*gno"):
        get_model("gnoo")
    # a keyword the model does not take: one line naming it (before: Python's TypeError)
    with pytest.raises(ValueError, match="dpeth: not an argument of the model 'gno'; did you mean depth"):
        get_model("gno", dpeth=2)


def test_paper_defaults():
    model = GNO()
    assert len(model.blocks) == 8 and model.patch == 16
    blk = model.blocks[0]
    assert len(blk.mixture.kernels) == 4 and blk.mixture.kernels.heads == 8
    assert blk.mixture.gate.score[0].out_features == 32
    assert blk.mlp[0].out_features == 4 * 256


def test_bad_input():
    model = tiny()
    with pytest.raises(ValueError, match=r"u_in: expected shape \(B, 1, 1, \*S\)"):
        model(torch.randn(2, 1, 32, 32), theta=torch.rand(2, 1))
    with pytest.raises(ValueError, match=r"theta: expected shape \(2, 1\), got None"):
        model(torch.randn(2, 1, 1, 32, 32))
    with pytest.raises(ValueError, match="not divisible by the patch size 8"):
        model(torch.randn(2, 1, 1, 30, 32), theta=torch.rand(2, 1))
    with pytest.raises(ValueError, match="needs something to gate on"):
        GNO(n_params=0, n_kernels=2)
    for kwargs, match in [(dict(ndim=4), "ndim: expected 1, 2 or 3, got 4"), (dict(patch=0), "patch: must be >= 1"),
                          (dict(n_kernels=0), "n_kernels: must be >= 1"),
                          (dict(latent="256"), "latent: expected a number >= 1, got '256'"),  # (was a TypeError on <)
                          (dict(heads=None), "heads: expected a number >= 1, got None"), (dict(heads=0), "heads: must be >= 1"),
                          (dict(out_channels=0), "out_channels: must be >= 1"),
                          (dict(n_params=-1), "n_params: must be >= 0"),
                          (dict(mlp_ratio=0.1), "mlp_ratio: the MLP needs at least one unit, got 0.1 at latent 8")]:
        with pytest.raises(ValueError, match=match):
            GNO(**{"latent": 8, "patch": 4, "depth": 1, "heads": 2, **kwargs})


@pytest.mark.parametrize("name", ["gno", "vit"])  # the GNO and a baseline share the input checks
def test_a_boundary_or_grid_that_does_not_fit_the_input_is_named(name):
    """A boundary spec, grid or parameter field that does not fit ``u_in`` gets a `ValueError`
    naming it (before, some ran silently: extra faces ignored, longer face data cut; a field on
    another grid failed inside the model); a spec without a batch axis applies to every
    sample."""
    from gno_ext.models import get_model

    torch.manual_seed(3)
    model = tiny() if name == "gno" else get_model("vit", in_channels=1, n_params=1, ndim=2, t_in=1, latent=32, patch=8,
                                                    depth=1, heads=2)
    u, theta = torch.randn(2, 1, 1, 32, 32), torch.rand(2, 1)
    one = BoundarySpec.from_types(["dirichlet", "neumann", "dirichlet", "neumann"], [1.0, -2.0, 0.0, 0.5])
    torch.testing.assert_close(model(u, theta=theta, bc=one), model(u, theta=theta, bc=one.expand(2)))
    cases = [
        (dict(bc=one.expand(3)), r"bc: batch size 3 does not match u_in's 2"),
        (dict(bc=BoundarySpec.from_types(["dirichlet"] * 6, batch_size=2)), r"6 faces do not fit a 2-D grid"),
        (dict(bc=BoundarySpec(torch.ones(2, 4, dtype=torch.long), torch.zeros(2, 4, 1, 64))),
         r"N_face must be 1 or 32 for grid \(32, 32\), got 64"),
        (dict(grid=Grid((64, 64))), r"grid: shape \(64, 64\) does not match u_in's spatial shape \(32, 32\)"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            model(u, theta=theta, **kwargs)
    field_model = tiny(field_channels=2) if name == "gno" else get_model(
        "vit", in_channels=1, n_params=1, field_channels=2, ndim=2, t_in=1, latent=32, patch=8, depth=1, heads=2)
    for field in (torch.randn(2, 2, 16, 16), torch.randn(2, 2, 32, 32, 1)):  # another grid, an extra axis
        with pytest.raises(ValueError, match=r"theta_field: expected shape \(2, 2, 32, 32\)"):
            field_model(u, theta=theta, theta_field=field)


def reference_case():
    torch.manual_seed(1234)
    model = tiny(n_params=1).eval()
    g = torch.Generator().manual_seed(99)
    u = torch.randn(2, 1, 1, 16, 16, generator=g)
    theta = torch.rand(2, 1, generator=g)
    with torch.no_grad():
        return model(u, theta=theta, bc=bc_mixed(2))


def test_committed_reference_output():
    expected = safetensors.torch.load_file(REFERENCE)["output"]
    assert torch.allclose(reference_case(), expected, atol=1e-5, rtol=1e-4)


if __name__ == "__main__":  # regenerate after an intended change of the model
    safetensors.torch.save_file({"output": reference_case()}, REFERENCE)


def test_boundary_description_is_the_sum_of_its_embeddings():
    """`BoundaryTransfer.describe` computes the four input terms as one product; it must equal
    the embeddings and projections applied one by one, for every boundary type and in 3-D."""
    from gno_ext.layers import BoundaryTransfer, boundary_features
    from gno_ext.schema import BCType

    torch.manual_seed(3)
    block = BoundaryTransfer(32, 3)
    kinds = torch.tensor([[int(t) for t in BCType], [int(t) for t in reversed(BCType)]])
    bc = BoundarySpec(kinds, torch.randn(2, 6, 2, 1), coeffs=torch.rand(2, 6, 2) + 0.5)
    feats = boundary_features(bc, Grid((8, 8, 8)), 4)
    data, kind, face, position = feats
    ref = (block.type_embedding(kind) + block.face_embedding(face) + block.data(data.float())
           + block.position(position.float()))
    assert torch.allclose(block.describe(feats, torch.float32), ref, atol=1e-6)
    assert kind.unique().numel() == len(BCType)


@pytest.mark.slow
def test_gno_compiles_into_one_graph():
    """`torch.compile(fullgraph=True)` traces the whole forward pass, boundary features of every
    type included (a graph break would split CUDA graphs and run that part eagerly), with the
    eager result, and a new boundary value does not recompile."""
    torch.manual_seed(9)
    model = tiny().eval()
    kind = torch.tensor([[1, 2, 3, 5], [4, 3, 2, 1]])
    coeffs = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.5], [1.0, 1.0]]).expand(2, 4, 2)
    specs = [BoundarySpec(kind, torch.full((2, 4, 2, 1), v), coeffs) for v in (1.0, -3.0)]
    u, theta = torch.randn(2, 1, 1, 32, 32), torch.rand(2, 1)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for bc in specs:
            assert torch.allclose(compiled(u, theta=theta, bc=bc), model(u, theta=theta, bc=bc), atol=1e-5)


def test_loads_a_state_dict_with_the_kernels_stored_separately():
    """Checkpoints from before the kernel weights were stacked (one AttentionKernel per kernel)
    load strictly and give the same output."""
    torch.manual_seed(12)
    model = tiny().eval()
    old = {}
    for key, value in model.state_dict().items():
        if ".mixture.kernels." not in key:
            old[key] = value
            continue
        prefix, name = key.rsplit(".", 1)  # e.g. blocks.0.mixture.kernels . q_weight
        proj, part = name.rsplit("_", 1)
        for k in range(value.shape[0]):
            old[f"{prefix}.{k}.{proj}.{part}"] = value[k].t() if part == "weight" else value[k]
    fresh = tiny().eval()
    fresh.load_state_dict(old)
    u, theta = torch.randn(2, 1, 1, 32, 32), torch.rand(2, 1)
    assert torch.equal(fresh(u, theta=theta, bc=bc_mixed(2)), model(u, theta=theta, bc=bc_mixed(2)))


@pytest.mark.parametrize("chunk", [None, 2])
def test_training_step_does_not_wait_for_the_device(chunk):
    """Eager forward and backward passes read no device value on the host (each read is a
    synchronisation on a GPU), except the one input check of the log-scale parameters."""
    from tests._dispatch import RecordOps

    torch.manual_seed(14)
    model = tiny(log_params=[True])
    for block in model.blocks:
        block.mixture.chunk = chunk
    u, theta, bc = torch.randn(6, 1, 1, 32, 32), torch.linspace(0.1, 2.0, 6)[:, None], bc_mixed(6)
    with RecordOps() as ops:
        model(u, theta=theta, bc=bc).square().mean().backward()
    assert ops.host_reads == 1


def test_one_hot_matches_torch():
    from gno_ext.layers.routing import one_hot

    index = torch.tensor([[2, 0], [1, 2]])
    assert torch.equal(one_hot(index, 4), torch.nn.functional.one_hot(index, 4))
    assert one_hot(index, 3, torch.float32).dtype == torch.float32


def test_operand_type_follows_autocast_and_leaves_float64_alone():
    """The kernels' operand type is what autocast gives a product: the autocast type for
    float32 and 16-bit inputs; float64 and integers as they are (autocast does not cast them,
    so they stay off the Triton kernels, which accumulate in float32)."""
    from gno_ext.kernels.precision import KERNEL_TYPES, operand_type

    assert [operand_type(t, "cpu") for t in (torch.float32, torch.float64, torch.bfloat16)] == [
        torch.float32, torch.float64, torch.bfloat16]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert [operand_type(t, "cpu") for t in (torch.float32, torch.float16, torch.float64, torch.long)] == [
            torch.bfloat16, torch.bfloat16, torch.float64, torch.long]
        assert (torch.ones(2, 2, dtype=torch.float64) @ torch.ones(2, 2, dtype=torch.float64)).dtype == torch.float64
    assert torch.float64 not in KERNEL_TYPES



def run_in_own_process(source: str, marker: str, timeout: float) -> None:
    """Run ``source`` in a Python process of its own, from the repository root (so that it can
    import the tests' helpers), and assert that it printed ``marker``."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=timeout,
                          cwd=Path(__file__).parents[2])
    assert marker in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]


TF32_SETTINGS = """
import torch
from gno_ext.kernels.precision import tf32_allowed, tf32_products


def check_tf32_products(before):
    # tf32_products sets either value within its block and restores before after it, also
    # when the block raises
    for allowed in (True, False):
        with tf32_products(allowed):
            assert tf32_allowed() == allowed
        assert tf32_allowed() == before
    try:
        with tf32_products(not before):
            raise KeyError
    except KeyError:
        pass
    assert tf32_allowed() == before


assert tf32_allowed() is False  # PyTorch's default
check_tf32_products(False)
torch.backends.cuda.matmul.allow_tf32 = True
assert tf32_allowed()
torch.backends.cuda.matmul.allow_tf32 = False
assert not tf32_allowed()
torch.set_float32_matmul_precision("high")
assert tf32_allowed()
torch.set_float32_matmul_precision("highest")
assert not tf32_allowed()
# the newer setting: PyTorch then refuses to read allow_tf32, even under torch.compile
torch.backends.cuda.matmul.fp32_precision = "tf32"
try:
    torch.backends.cuda.matmul.allow_tf32
except RuntimeError:
    pass
else:
    raise AssertionError("allow_tf32 was readable: the check below checks nothing")
assert tf32_allowed()
check_tf32_products(True)  # through the newer setting (the older one would raise)
compiled = torch.compile(lambda x: x * (2.0 if tf32_allowed() else 3.0), fullgraph=True)
assert compiled(torch.ones(1)).item() == 2.0
torch.backends.cuda.matmul.fp32_precision = "ieee"
assert not tf32_allowed() and compiled(torch.ones(1)).item() == 3.0  # recompiled on the change
torch.backends.fp32_precision = "tf32"  # the global setting: the matmul's own "ieee" still wins
assert not tf32_allowed()
torch.backends.cuda.matmul.fp32_precision = "none"  # unset: the global setting applies
assert tf32_allowed() and compiled(torch.ones(1)).item() == 2.0
check_tf32_products(True)
print("tf32 settings followed")
"""


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="PyTorch without fp32_precision")
@pytest.mark.slow
def test_tf32_allowed_follows_both_of_pytorchs_settings():
    """`tf32_allowed` (which picks the kernels' float32 product precision and the float32
    attention path) follows ``allow_tf32``, `torch.set_float32_matmul_precision` and the newer
    ``fp32_precision`` settings, does not fail where PyTorch refuses the older read, and is a
    constant that `torch.compile` recompiles when a setting changes; `tf32_products` sets and
    restores whichever setting is in use. In a process of its own:
    the newer setting would make every later read of ``allow_tf32`` fail."""
    run_in_own_process(TF32_SETTINGS, "tf32 settings followed", timeout=300)


def test_a_float64_model_computes_in_float64():
    """A float64 GNO computes in float64 in both passes: no product, reduction, softmax or
    sine of its forward and backward passes gives a float32 or 16-bit result (the position
    encoding and the gate's softmax, which run in float32 for lower types, included). Only the
    float32 boundary data given is pooled in its own type before it is cast."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    arithmetic = {"mm", "addmm", "bmm", "mul", "sin", "cos", "_softmax", "_softmax_backward_data", "mean", "sum",
                  "gather", "scatter_add", "native_layer_norm", "gelu", "convolution", "sub"}

    class LowPrecision(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in arithmetic and any(isinstance(t, torch.Tensor) and t.dtype != torch.float64
                                          and t.is_floating_point() for t in tree_leaves(out)):
                self.ops.add(name)
            return out

    torch.manual_seed(7)
    model = tiny(latent=64).double()
    u = torch.randn(6, 1, 1, 32, 32, dtype=torch.float64)
    theta = torch.linspace(0.1, 2.0, 6, dtype=torch.float64)[:, None]
    with LowPrecision() as seen:
        model(u, theta=theta, bc=bc_mixed(6)).square().mean().backward()
    assert not seen.ops, seen.ops
    with LowPrecision() as seen:  # the check sees float32 work where there is some
        tiny(latent=64)(u.float(), theta=theta.float(), bc=bc_mixed(6)).square().mean()
    assert {"mm", "sin", "_softmax"} <= seen.ops or {"addmm", "sin", "_softmax"} <= seen.ops, seen.ops


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_float64_model_takes_the_exact_pytorch_paths():
    """In float64 on a GPU the GNO runs its PyTorch paths (the Triton kernels accumulate in
    float32, and autocast leaves float64 alone): its output and gradients equal the same
    model's on the CPU to float64 rounding."""
    torch.manual_seed(7)
    model = tiny(latent=64).double()
    u = torch.randn(6, 1, 1, 32, 32, dtype=torch.float64)
    theta = torch.linspace(0.1, 2.0, 6, dtype=torch.float64)[:, None]
    bc = bc_mixed(6)
    runs = []
    for device in ("cpu", "cuda"):
        model.to(device)
        model.zero_grad()
        y = model(u.to(device), theta=theta.to(device), bc=bc.to(device))
        y.square().mean().backward()
        # copies: moving the model moves the gradients that it holds
        runs.append([y.detach().cpu()] + [p.grad.cpu().clone() for p in model.parameters() if p.grad is not None])
    assert len(runs[0]) == len(runs[1]) > 2
    for a, b in zip(*runs):
        assert a.dtype == b.dtype == torch.float64
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_autocast_step_is_within_rounding_of_float64():
    """Under the recipes' two autocast types, bf16 and fp16, a GNO on a GPU (its Triton
    kernels: attention, gathered products and boundary operator) gives the float64 model's
    output and gradients to within that type's rounding: below 3e-2 in bf16, and closer still
    in fp16, which keeps three more bits. The routing is the float64 model's in both."""
    torch.manual_seed(11)
    model = tiny(latent=64).cuda()
    u = torch.randn(6, 1, 1, 32, 32, device="cuda")
    theta = torch.linspace(0.1, 2.0, 6, device="cuda")[:, None]
    bc = bc_mixed(6).to("cuda")

    def run(net, dtype):
        net.zero_grad()
        own = next(net.parameters()).dtype
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            y = net(u.to(own), theta=theta.to(own), bc=bc)
        y.double().square().mean().backward()
        routes = [blk.mixture.last_routing.index.tolist() for blk in net.blocks]
        grads = torch.cat([p.grad.double().flatten() for p in net.parameters() if p.grad is not None])
        return y.detach().double(), grads, routes

    y64, g64, routes64 = run(copy.deepcopy(model).double(), None)
    errors = {}
    from gno_ext.layers import _gathered

    edge = torch.empty(6, 16, 64, device="cuda")
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cuda", dtype=dtype):  # the kernels run
            assert model.blocks[0].boundary.fusable(edge) and _gathered.usable(edge)
        y, g, routes = run(model, dtype)
        assert routes == routes64, dtype
        errors[dtype] = [((y - y64).norm() / y64.norm()).item(), ((g - g64).norm() / g64.norm()).item()]
    assert all(e < 3e-2 for e in errors[torch.bfloat16]), errors
    assert all(h < b / 2 for h, b in zip(errors[torch.float16], errors[torch.bfloat16])), errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_inference_mode_runs_the_kernels_and_training_goes_on():
    """Under ``torch.inference_mode`` (as evaluation code often runs) the GNO on a GPU, eager
    and compiled, gives what it gives under ``no_grad``, with its Triton kernels; a training
    step afterwards still gets every gradient (nothing made in inference mode is kept)."""
    from gno_ext.layers import embeddings

    embeddings._FREQUENCIES.clear()  # made first inside inference mode below
    torch.manual_seed(12)
    model = tiny(latent=64).cuda()
    u = torch.randn(6, 1, 1, 32, 32, device="cuda")
    theta = torch.linspace(0.1, 2.0, 6, device="cuda")[:, None]
    bc = bc_mixed(6).to("cuda")
    compiled = torch.compile(model)
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        eager, traced = model(u, theta=theta, bc=bc), compiled(u, theta=theta, bc=bc)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        want = model(u, theta=theta, bc=bc)
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        assert model.blocks[0].boundary.fusable(torch.empty(6, 16, 64, device="cuda"))
    assert eager.is_inference() and torch.equal(eager, want)
    assert ((traced.float() - want.float()).norm() / want.float().norm()) < 1e-2
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(u, theta=theta, bc=bc).float().square().mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.blocks[0].boundary.parameters())


NEWER_TF32_SETTING_ON_A_GPU = """
import copy
import torch
from gno_ext.layers import attention
from tests.models.test_gno import bc_mixed, tiny

torch.backends.cuda.matmul.fp32_precision = "ieee"  # from here on allow_tf32 cannot be read
torch.manual_seed(14)
model = tiny(latent=64).cuda()
u, theta, bc = (torch.randn(6, 1, 1, 32, 32, device="cuda"), torch.linspace(0.1, 2.0, 6, device="cuda")[:, None],
                bc_mixed(6).to("cuda"))


def run(net, params):
    own = params[0].dtype
    net.zero_grad()
    y = net(u.to(own), theta=theta.to(own), bc=bc)
    y.double().square().mean().backward()
    return y.detach().double(), torch.cat([p.grad.double().flatten() for p in params if p.grad is not None])


reference = copy.deepcopy(model).double()
y64, g64 = run(reference, list(reference.parameters()))
q, kv = torch.zeros(6, 16, 4, 16, device="cuda"), torch.zeros(6, 33, 2, 4, 16, device="cuda")
compiled = torch.compile(model)
errors = {}
for precision in ("ieee", "tf32"):
    torch.backends.cuda.matmul.fp32_precision = precision
    fits = attention._kernels.float32_fits(16, 0)
    assert attention.tokens_fusable(q, kv) == (precision == "tf32" and fits), precision
    for name, net in (("eager", model), ("compiled", compiled)):
        y, g = run(net, list(model.parameters()))
        errors[precision, name] = [((y - y64).norm() / y64.norm()).item(), ((g - g64).norm() / g64.norm()).item()]
print(errors)
assert all(e < 2e-5 for key, es in errors.items() if key[0] == "ieee" for e in es), errors
assert all(e < 2e-2 for es in errors.values() for e in es), errors
assert all(max(es) > 5e-5 for key, es in errors.items() if key[0] == "tf32"), errors  # TF32 did run
print("newer setting followed")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_kernels_follow_the_newer_tf32_setting():
    """A float32 GNO on a GPU, where the program sets TF32 with PyTorch's newer
    ``fp32_precision`` setting (which makes the older flag unreadable): with ``"ieee"`` its
    Triton kernels and the rest of the step give the float64 model's output and gradients to
    float32 rounding, with ``"tf32"`` to TF32 rounding (and not better: TF32 ran), eager and
    compiled, and float32 attention takes the kernels only with ``"tf32"``. In a process of
    its own, as the newer setting stays in force."""
    run_in_own_process(NEWER_TF32_SETTING_ON_A_GPU, "newer setting followed", timeout=600)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("compiled", [False, True])
def test_gpu_model_on_a_second_device_runs_its_kernels_there(compiled):
    """A GNO on ``cuda:1`` while ``cuda:0`` is current (a notebook's ``model.to("cuda:1")``)
    runs its Triton kernels on its own device, eager and compiled: the output and gradients
    equal those of the same model on ``cuda:0`` (compiled: to a few bf16 roundings, as two
    compilations of one model on two GPUs of one kind gave outputs one bf16 step apart in 10
    of 4096 elements on two H200s). Without `_on_device` the eager case fails; the compiled
    one passes, as inductor's generated code sets the device of every launch itself."""
    torch.manual_seed(13)
    model = tiny(latent=64)
    u, theta, bc = torch.randn(6, 1, 1, 32, 32), torch.linspace(0.1, 2.0, 6)[:, None], bc_mixed(6)
    runs = []
    for device in ("cuda:0", "cuda:1"):
        assert torch.cuda.current_device() == 0
        net = copy.deepcopy(model).to(device)
        net = torch.compile(net) if compiled else net
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert net.blocks[0].boundary.fusable(torch.empty(6, 16, 64, device=device))
            y = net(u.to(device), theta=theta.to(device), bc=bc.to(device))
        y.float().square().mean().backward()
        runs.append([y.float().cpu()] + [p.grad.cpu() for p in net.parameters() if p.grad is not None])
    assert len(runs[0]) == len(runs[1]) > 2
    for a, b in zip(*runs):
        if compiled:
            assert (b - a).norm() <= 1e-3 * a.norm()
        else:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_conv_decoder_starts_as_the_papers_and_learns():
    """decoder="conv" is the paper's patch projection plus a correction that starts at zero: at
    initialisation the two models agree exactly; a training step moves the correction."""
    torch.manual_seed(11)
    linear = tiny().eval()
    torch.manual_seed(11)
    conv = tiny(decoder="conv")
    u, theta, bc = torch.randn(2, 1, 1, 32, 32), torch.rand(2, 1), bc_mixed(2)
    assert torch.equal(linear(u, theta=theta, bc=bc), conv.eval()(u, theta=theta, bc=bc))
    conv.train()
    opt = torch.optim.SGD(conv.refine.parameters(), lr=0.1)
    (conv(u, theta=theta, bc=bc) - u).pow(2).mean().backward()
    assert conv.refine.out.weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(linear(u, theta=theta, bc=bc), conv.eval()(u, theta=theta, bc=bc))
    with pytest.raises(ValueError, match="decoder: expected 'linear' or 'conv', got 'deconv'"):
        tiny(decoder="deconv")
