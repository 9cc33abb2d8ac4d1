"""Every shipped YAML composes, and every recipe's model is instantiated on its data and runs."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from gno_ext.models import get_model, model_class
from gno_ext.training.recipe_data import (
    data_spec,
    model_kwargs_from_data,
    open_split,
    prepare_data,
)
from gno_ext.training.loop import _fetch, _validate
from gno_ext.training.problem import problem_for

from .conftest import load_train_module

train_py = load_train_module()
RECIPES = train_py.available("recipe")
MODELS = train_py.available("model")


def _data_overrides(recipe: str, trl_root, pdebench_root, custom_file) -> list[str]:
    if recipe == "trl":
        return [f"data.root={trl_root}"]
    if recipe == "custom":
        return [f"data.root={custom_file}"]
    if recipe.startswith("pdebench-"):
        return [f"data.root={pdebench_root}"]
    return []


def _instantiate(cfg: dict, autocast: bool = False) -> None:
    """Build the recipe's model on its data and run it on two samples; with ``autocast``, under
    bf16 autocast (as on a GPU with trainer.precision=auto), backward included."""
    prepare_data(cfg["data"], progress=False)
    ds = open_split(cfg["data"], "train", cfg["data"]["n_steps_input"], 1)
    spec = data_spec(ds, cfg["data"]["log_params"])
    kwargs = model_kwargs_from_data(model_class(cfg["model"]["name"]), spec, cfg["model"]["kwargs"])
    model = get_model(cfg["model"]["name"], **kwargs)
    problem = problem_for(cfg["data"])
    batch = _fetch(ds, [0, len(ds) - 1], problem)
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        out = problem.predict(model, batch)
    assert out.shape == problem.target(batch).shape
    assert torch.isfinite(out).all()
    if autocast and out.requires_grad:  # (persistence has nothing to differentiate)
        out.float().square().mean().backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_recipe_list_matches_design():
    expected = {"heat-param", "heat-bc", "heat-joint", "advection-param", "advection-bc", "advection-joint",
                "advection-ood", "advection-3d", "burgers-param", "ns-param", "trl"}
    assert expected <= set(RECIPES)
    assert any(r.startswith("pdebench-") for r in RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_composes_and_instantiates(recipe, trl_root, pdebench_root, custom_file):
    cfg = train_py.compose(recipe, ["size=smoke", *_data_overrides(recipe, trl_root, pdebench_root, custom_file)])
    assert cfg["recipe"]["name"] == recipe
    assert cfg["size"] == "smoke" and cfg["trainer"]["epochs"] == 2
    if cfg["data"]["kind"] == "generated":
        assert cfg["data"]["preset"] == recipe and cfg["data"]["size"] == "smoke"
    _instantiate(cfg)


def _recipe_for(model: str) -> str:
    """The recipe a model config is tried on: heat-bc, or heat-mesh for a model of meshes."""
    name = train_py.compose("heat-bc", [f"model={model}"])["model"]["name"]
    return "heat-mesh" if getattr(model_class(name), "data_kind", "grid") == "mesh" else "heat-bc"


@pytest.mark.parametrize("model", MODELS)
def test_model_configs_instantiate(model):
    # smoke trajectories have 6 frames: ViT-10 needs 11, so it is built on the small data
    size = "size=small" if model == "vit-10" else "size=smoke"
    cfg = train_py.compose(_recipe_for(model), [size, f"model={model}"])
    if model.startswith("vit-"):
        assert cfg["data"]["n_steps_input"] == int(model.split("-")[1])
    _instantiate(cfg)


@pytest.mark.parametrize("model", [m for m in MODELS if m != "vit-10"])
def test_model_configs_run_under_bf16_autocast(model):
    """Mixed types under autocast (float32 norms beside bf16 products) are every model's own
    business: forward and backward run. The MoE baseline failed here once (index_add of a
    float32 expert output into a bf16 sum)."""
    _instantiate(train_py.compose(_recipe_for(model), ["size=smoke", f"model={model}"]), autocast=True)


@pytest.mark.parametrize("model", ["gno", "fno", "gated_fno"])
def test_3d_models_run_under_bf16_autocast(model):
    """The same on the 3-D advection recipe (six faces, 3-D Fourier transforms)."""
    _instantiate(train_py.compose("advection-3d", ["size=smoke", f"model={model}"]), autocast=True)


@pytest.mark.parametrize("size", train_py.available("size"))
def test_sizes_compose(size):
    cfg = train_py.compose("heat-joint", [f"size={size}", "model=gno"])
    assert cfg["size"] == size == cfg["data"]["size"]
    assert cfg["model"]["kwargs"]["latent"] == cfg["backbone"]["latent"]
    default = train_py.compose("heat-joint", [f"size={size}"])["model"]  # the recommended GNO, on the FNO
    assert default["name"] == "gno_fno" and default["kwargs"]["soft_routing"] is True
    assert (default["kwargs"]["n_modes"], default["kwargs"]["hidden_channels"]) == \
        (cfg["backbone"]["modes"], cfg["backbone"]["width"])
    if size == "paper":  # the paper's Appendix E backbone
        assert (cfg["backbone"]["latent"], cfg["backbone"]["patch"], cfg["backbone"]["depth"],
                cfg["backbone"]["heads"]) == (256, 16, 8, 8)
        assert cfg["trainer"]["epochs"] == 100 and cfg["trainer"]["curriculum"]["warmup_fraction"] == 0.7


def test_recipe_specifics():
    ns = train_py.compose("ns-param", ["size=smoke"])
    assert ns["eval"]["steps"] == 50 and ns["model"]["kwargs"]["n_kernels"] == 3
    trl = train_py.compose("trl", [])
    assert trl["data"]["kind"] == "the_well" and trl["data"]["name"] == "turbulent_radiative_layer_2D"
    assert trl["backbone"]["patch"] == 16
    over = train_py.compose("heat-param", ["size=smoke", "trainer.epochs=7", "model.kwargs.n_kernels=2"])
    assert over["trainer"]["epochs"] == 7 and over["model"]["kwargs"]["n_kernels"] == 2


def test_sizes_come_from_data_not_yaml(cache):
    cfg = train_py.compose("advection-param", ["size=smoke"])
    prepare_data(cfg["data"], progress=False)
    spec = data_spec(open_split(cfg["data"], "train", 1, 1))
    assert (spec.channels, spec.field_channels, spec.n_params, spec.ndim) == (1, 2, 1, 2)
    kwargs = model_kwargs_from_data(model_class("gno"), spec, {"latent": 16})
    assert (kwargs["in_channels"], kwargs["field_channels"], kwargs["n_params"], kwargs["ndim"]) == (1, 2, 1, 2)
    assert kwargs["latent"] == 16
    with pytest.raises(ValueError, match="in_channels=3 contradicts the data"):
        model_kwargs_from_data(model_class("gno"), spec, {"in_channels": 3})


def test_bad_recipe_and_arguments(train_module):
    with pytest.raises(SystemExit, match=r"--recipe .heat-nonexistent.: unknown; did you mean heat-joint\? \(available: "):
        train_module.compose("heat-nonexistent", [])
    with pytest.raises(SystemExit):
        train_module.parse(["--recipe", "heat-param", "--epochs", "3"])  # overrides are key=value
    with pytest.raises(SystemExit, match="data.preset"):
        train_module.compose("heat-param", ["data.preset=???"])


def test_generated_split_in_memory_only_when_small(cache):
    cfg = train_py.compose("heat-param", ["size=smoke"])
    prepare_data(cfg["data"], progress=False)
    assert open_split(cfg["data"], "train", 1, 1)._memory is not None  # a few kB: in memory
    small_limit = {**cfg["data"], "in_memory_limit_gb": 1e-9}
    ds = open_split(small_limit, "train", 1, 1)
    assert ds._memory is None  # over the limit: read from the files
    assert torch.equal(ds[3].u_in, open_split(cfg["data"], "train", 1, 1)[3].u_in)


def test_the_recipes_page_names_every_recipe_model_and_size():
    page = (Path(train_py.__file__).resolve().parent.parent / "docs" / "recipes" / "index.md").read_text()
    for group, names in (("recipe", RECIPES), ("model", MODELS), ("size", train_py.available("size"))):
        missing = [n for n in names if f"`{n}`" not in page]
        assert not missing, f"docs/recipes/index.md does not name the {group}s {missing}"


def test_validation_in_chunks_scores_the_same_windows():
    """trainer.val_batch_size only splits the validation's forward passes: the windows (batch_size
    x val_batches of them, spread over the split) and their mean nMSE are those of one pass per
    batch, within float32 summation order; a chunk that does not divide the batch too."""
    cfg = train_py.compose("heat-param", ["size=smoke", "model=fno"])
    prepare_data(cfg["data"], progress=False)
    ds = open_split(cfg["data"], "valid", cfg["data"]["n_steps_input"], 1)
    spec = data_spec(ds, cfg["data"]["log_params"])
    torch.manual_seed(0)
    model = get_model("fno", **model_kwargs_from_data(model_class("fno"), spec, cfg["model"]["kwargs"]))
    problem = problem_for(cfg["data"])
    assert len(ds) > 8  # the validation picks 8 of the split's windows
    args = (model, ds, problem, torch.device("cpu"), 4, 2, 0, 1, contextlib.nullcontext)
    whole = _validate(*args)
    assert whole > 0
    seen: list[int] = []
    model.register_forward_hook(lambda module, inputs, output: seen.append(len(output)))
    for chunk in (1, 3, 4):
        seen.clear()
        assert _validate(*args, chunk) == pytest.approx(whole, rel=1e-5)
        assert max(seen) == chunk and sum(seen) == 8  # the forwards took `chunk` windows at most, 8 in all
    # fewer windows (another batch size) give another mean: the chunks above kept the windows
    assert _validate(model, ds, problem, torch.device("cpu"), 2, 1, 0, 1, contextlib.nullcontext) != pytest.approx(
        whole, rel=1e-5)
