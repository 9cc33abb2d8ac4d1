"""`GridCoordinates`: neuraloperator's grid embedding without state, so that a compiled FNO
compiles once (neuraloperator's caches its grid on the module at the first call, which fails
the compiled code's guard at the second)."""

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
