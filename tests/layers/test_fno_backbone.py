"""What the FNO-backbone models change in neuraloperator's FNO: `GridCoordinates`, its grid
embedding without state, so that a compiled FNO compiles once (neuraloperator's caches its grid
on the module at the first call, which fails the compiled code's guard at the second); and the
option to keep its activations in the autocast type (``activations="autocast"``)."""

import pytest
import torch

pytest.importorskip("neuralop")

from neuralop.layers.embeddings import GridEmbeddingND  # noqa: E402
from neuralop.models import FNO  # noqa: E402

from gno_ext.layers import GridCoordinates, use_grid_coordinates  # noqa: E402
from gno_ext.models import get_model  # noqa: E402
from gno_ext.schema import BoundarySpec  # noqa: E402


@pytest.mark.parametrize("shape, bounds", [((2, 3, 8, 6), None), ((1, 2, 4, 6, 5), None),
                                           ((2, 1, 7, 4), [[-1.0, 1.0], [0.0, 2.5]])], ids=["2d", "3d", "bounds"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_coordinates_are_neuraloperators(shape, bounds, dtype):
    dim = len(shape) - 2
    bounds = bounds or [[0, 1]] * dim
    x = torch.randn(shape).to(dtype)
    theirs = GridEmbeddingND(shape[1], dim, bounds)(x)
    ours = GridCoordinates(shape[1], dim, bounds)
    assert ours.out_channels == shape[1] + dim
    out = ours(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, theirs, rtol=0, atol=0)


def test_it_keeps_no_state_and_names_a_wrong_input():
    emb = GridCoordinates(2, 2)
    before = dict(vars(emb))
    emb(torch.randn(1, 2, 4, 4))
    emb(torch.randn(1, 2, 8, 8))
    assert dict(vars(emb)) == before
    with pytest.raises(ValueError, match="2 spatial axes"):
        emb(torch.randn(1, 2, 4, 4, 4))
    with pytest.raises(ValueError, match="grid_boundaries"):
        GridCoordinates(2, 2, [[0, 1]])


def test_the_fno_models_use_it_and_load_neuraloperators_checkpoints():
    net = FNO((4, 4), 1, 1, 8, n_layers=1)
    state = net.state_dict()
    assert isinstance(use_grid_coordinates(net).positional_embedding, GridCoordinates)
    net.load_state_dict(state)  # no parameters or buffers: the same checkpoint
    for name, kwargs in [("fno", {}), ("gno_fno", {}), ("gated_fno", dict(n_modes=(4, 4), in_channels=1, out_channels=1))]:
        model = get_model(name, **({"n_params": 1, "n_modes": 4, "hidden_channels": 8, "n_layers": 1}
                                   if name != "gated_fno" else dict(kwargs, hidden_channels=8, n_params=1)))
        embeddings = [m for m in model.modules() if isinstance(m, (GridEmbeddingND, GridCoordinates))]
        assert embeddings and all(isinstance(m, GridCoordinates) for m in embeddings), name


def test_a_compiled_fno_compiles_once():
    """Two training steps of a compiled `fno`: no recompilation (dynamo's own backend, so that
    only the guards are tested, not inductor)."""
    torch._dynamo.reset()
    model = get_model("fno", n_params=1, n_modes=4, hidden_channels=8, n_layers=1)
    compiled = torch.compile(model, backend="eager")
    u, theta, bc = torch.randn(2, 1, 1, 16, 16), torch.rand(2, 1), BoundarySpec.periodic(2, batch_size=2)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            compiled(u, theta=theta, bc=bc).pow(2).mean().backward()


@pytest.mark.parametrize("name", ["fno", "gno_fno"])
def test_activations_in_the_autocast_type(name):
    """``activations="autocast"``: under autocast the blocks' spectral convolutions and channel-MLP
    skips return bf16 (float32 by default, as neuraloperator's do); the same weights give the
    same function within bf16's precision, exactly the same outside autocast, and the same
    checkpoint."""
    from gno_ext.layers.spectral import FullPrecisionSpectralConv, GatedSpectralConv

    kwargs = {"n_params": 1, "n_modes": 4, "hidden_channels": 8, "n_layers": 2}
    torch.manual_seed(0)
    plain = get_model(name, **kwargs)
    torch.manual_seed(0)
    kept = get_model(name, activations="autocast", **kwargs)
    assert plain.state_dict().keys() == kept.state_dict().keys()  # the same checkpoint layout
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), kept.parameters()))  # the same weights
    u, theta, bc = torch.randn(2, 1, 1, 16, 16), torch.rand(2, 1), BoundarySpec.periodic(2, batch_size=2)
    torch.testing.assert_close(kept(u, theta=theta, bc=bc), plain(u, theta=theta, bc=bc), rtol=0, atol=0)
    types = {}
    convs = (FullPrecisionSpectralConv, GatedSpectralConv)
    for label, model in (("plain", plain), ("kept", kept)):
        for module in model.net.fno_blocks.convs:
            module.register_forward_hook(lambda m, i, out, label=label: types.setdefault(label, set()).add(out.dtype))
        assert all(isinstance(m, convs) for m in model.net.fno_blocks.convs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_plain, y_kept = plain(u, theta=theta, bc=bc), kept(u, theta=theta, bc=bc)
    assert types == {"plain": {torch.float32}, "kept": {torch.bfloat16}}
    scale = y_plain.float().abs().max()
    torch.testing.assert_close(y_kept.float() / scale, y_plain.float() / scale, rtol=0, atol=3e-2)
    y_kept.float().pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in kept.net.fno_blocks.parameters()
               if p.requires_grad and p.grad is not None)
    with pytest.raises(ValueError, match="activations: expected one of float32, autocast, got 'bf16'"):
        get_model(name, activations="bf16", **kwargs)


def test_gated_fno_keeps_its_activations_in_the_autocast_type():
    """`gated_fno` takes ``activations`` too (the 3-D table's FNO rows need it to fit a GPU): its
    gated spectral convolutions return bf16 under autocast, the function is the same outside it."""
    kwargs = {"n_modes": (4, 4), "in_channels": 1, "out_channels": 1, "hidden_channels": 8, "n_layers": 2,
              "n_params": 1}
    torch.manual_seed(0)
    plain = get_model("gated_fno", **kwargs)
    torch.manual_seed(0)
    kept = get_model("gated_fno", activations="autocast", **kwargs)
    x, theta = torch.randn(2, 1, 16, 16), torch.rand(2, 1)
    torch.testing.assert_close(kept(x, theta=theta), plain(x, theta=theta), rtol=0, atol=0)
    types = {}
    for label, model in (("plain", plain), ("kept", kept)):
        for module in model.fno_blocks.convs:
            module.register_forward_hook(lambda m, i, out, label=label: types.setdefault(label, set()).add(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_plain, y_kept = plain(x, theta=theta), kept(x, theta=theta)
    assert types == {"plain": {torch.float32}, "kept": {torch.bfloat16}}
    scale = y_plain.float().abs().max()
    torch.testing.assert_close(y_kept.float() / scale, y_plain.float() / scale, rtol=0, atol=3e-2)
    with pytest.raises(ValueError, match="activations: expected one of"):
        get_model("gated_fno", activations="half", **kwargs)


def test_autocast_activations_save_less_memory():
    bench = pytest.importorskip("tests._recipes").load_recipe("bench_model")
    plain, kept = (bench.memory("fno", 1, (32, 32), 1, "cpu", kind) for kind in ("float32", "autocast"))
    assert kept["saved_gib_per_sample"] < 0.8 * plain["saved_gib_per_sample"]


@pytest.mark.parametrize("name, extra", [("fno", {}), ("gno_fno", {}), ("gno_fno", {"soft_routing": True}),
                                         ("gated_fno", {})], ids=["fno", "gno_fno", "gno_fno_soft", "gated_fno"])
def test_checkpointed_blocks_give_the_same_values_and_gradients(name, extra):
    """``checkpoint_blocks=True`` recomputes each FNO block in the backward pass: the same output
    and the same gradients of every parameter (the gated kernels' conditioning reaches the
    recomputation, which runs after the forward pass has closed it), and the same checkpoint."""
    if name == "gated_fno":
        kwargs = {"n_modes": (4, 4), "in_channels": 1, "out_channels": 1, "hidden_channels": 8, "n_layers": 2,
                  "n_params": 1, **extra}
    else:
        kwargs = {"n_params": 1, "n_modes": 4, "hidden_channels": 8, "n_layers": 2, **extra}
    torch.manual_seed(0)
    plain = get_model(name, **kwargs)
    torch.manual_seed(0)
    recomputed = get_model(name, checkpoint_blocks=True, **kwargs)
    assert plain.state_dict().keys() == recomputed.state_dict().keys()
    u, theta = torch.randn(3, 1, 1, 16, 16), torch.rand(3, 1) * 2
    call = (lambda m: m(u[:, 0], theta=theta)) if name == "gated_fno" else \
        (lambda m: m(u, theta=theta, bc=BoundarySpec.periodic(2, batch_size=3)))
    outputs = []
    for model in (plain, recomputed):
        y = call(model)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        outputs.append(y.detach())
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    grads = [(n, p.grad, q.grad) for (n, p), q in zip(plain.named_parameters(), recomputed.parameters())]
    assert any(g is not None and g.abs().sum() > 0 for _, g, _ in grads)
    for n, g, h in grads:
        assert (g is None) == (h is None), n
        if g is not None:
            torch.testing.assert_close(h, g, rtol=1e-6, atol=1e-7, msg=n)
    with torch.no_grad():  # without grad the blocks run as before
        torch.testing.assert_close(call(recomputed), outputs[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="checkpoint_blocks: expected true or false"):
        get_model(name, checkpoint_blocks="yes", **kwargs)


def test_checkpoint_blocks_on_a_users_fno_with_gated_kernels():
    """The layer as the models page shows it: a plain neuraloperator ``FNO`` with
    `GatedSpectralConv`s, conditioned by `condition_on`, recomputed by `checkpoint_blocks`:
    the same loss and gradients as without."""
    from functools import partial

    from gno_ext.layers import GatedSpectralConv, checkpoint_blocks, condition_on

    theta, x, y = torch.rand(2, 2), torch.randn(2, 1, 8, 8, 8), torch.randn(2, 1, 8, 8, 8)
    grads, losses = [], []
    for recompute in (False, True):
        torch.manual_seed(0)
        fno = FNO((4, 4, 4), 1, 1, 8, conv_module=partial(GatedSpectralConv, n_params=2))
        fno = checkpoint_blocks(fno) if recompute else fno
        with condition_on(fno, theta):
            loss = (fno(x) - y).pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad for p in fno.parameters()])
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=0)
    for g, h in zip(*grads):
        assert (g is None) == (h is None)
        if g is not None:
            torch.testing.assert_close(h, g, rtol=1e-6, atol=1e-7)
