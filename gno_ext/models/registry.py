"""Models by name, and checkpoints that rebuild a model from the file alone.

A checkpoint is a folder holding ``model.safetensors`` (weights and buffers) and
``config.json`` (the registered name and the constructor arguments). Loading never unpickles
anything: JSON and safetensors only.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from gno_ext._files import written_whole_folder

__all__ = ["register_model", "get_model", "model_class", "available_models", "save_checkpoint", "from_checkpoint"]

_MODELS: dict[str, type[nn.Module]] = {}
_LAZY: dict[str, Callable[[], None]] = {}
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
LAYER_COUNTS = ("depth", "n_layers", "num_layers", "layers", "n_blocks")  # constructor arguments that count layers


def register_model(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: register a model under ``name`` and record its constructor arguments.

    After ``__init__`` the instance carries ``model_config = {"name": ..., "kwargs": {...}}``
    (every argument, defaults included), which `save_checkpoint` writes.
    """
    def decorate(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _MODELS:
            raise ValueError(f"a model named {name!r} is already registered ({_MODELS[name].__name__})")
        init = cls.__init__
        sig = inspect.signature(init)

        @functools.wraps(init)
        def wrapped(self: nn.Module, *args: Any, **kwargs: Any) -> None:
            bound = sig.bind(self, *args, **kwargs)
            bound.apply_defaults()
            config: dict[str, Any] = {}
            for key, value in list(bound.arguments.items())[1:]:
                if sig.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
                    config.update(value)
                elif sig.parameters[key].kind is not inspect.Parameter.VAR_POSITIONAL:
                    config[key] = value
            init(self, *args, **kwargs)
            self.model_config = {"name": name, "kwargs": config}

        cls.__init__ = wrapped
        _MODELS[name] = cls
        return cls
    return decorate


class MissingDependencyError(ImportError):
    """A model needs an optional package that is not installed (the message says how to get it)."""


def register_lazy(name: str, loader: Callable[[], None]) -> None:
    """Declare a model whose module is imported on first use (optional dependencies)."""
    _LAZY[name] = loader


def available_models() -> list[str]:
    """Names accepted by `get_model`."""
    return sorted(set(_MODELS) | set(_LAZY))


def model_class(name: str) -> type[nn.Module]:
    """The class registered as ``name`` (importing a lazily registered one)."""
    if name not in _MODELS and name in _LAZY:
        _LAZY[name]()
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    return _MODELS[name]


def get_model(name: str, **kwargs: Any) -> nn.Module:
    """Build the model registered as ``name`` with ``kwargs``.

    Raises
    ------
    KeyError
        If no model has that name; the message lists the available ones.
    ValueError
        If a keyword is not an argument of the model (`check_model_kwargs`).
    """
    check_model_kwargs(name, kwargs)
    return model_class(name)(**kwargs)


def check_model_kwargs(name: str, kwargs: Mapping[str, Any], prefix: str = "") -> None:
    """Raise a `ValueError` naming the first of ``kwargs`` that the model ``name`` does not take
    (``prefix`` + the keyword, e.g. ``model.kwargs.bogus``), with the closest argument or the list
    of them; a model that takes ``**kwargs`` accepts any."""
    params = inspect.signature(model_class(name).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    names = [k for k, p in params.items() if k != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for key in kwargs:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {prefix}{close[0]}?" if close else f"its arguments: {', '.join(names)}"
            raise ValueError(f"{prefix}{key}: not an argument of the model {name!r}; {hint}")


def _tensor_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of the state dict, contiguous, with shared storage copied (safetensors
    refuses aliases). Non-tensor entries (neuraloperator adds ``_metadata``) are left out:
    the constructor arguments travel in ``config.json``."""
    state, seen = {}, set()
    for key, value in model.state_dict().items():
        if not torch.is_tensor(value):
            continue
        value = value.detach().contiguous()
        ptr = value.untyped_storage().data_ptr()
        state[key] = value.clone() if ptr in seen else value
        seen.add(ptr)
    return state


def write_model_files(model: nn.Module, folder: Path, extra: dict[str, Any] | None = None) -> None:
    """Write the weights of ``model`` and its configuration (``model_config`` with ``extra``)
    into the existing ``folder`` (``model.safetensors`` and ``config.json``)."""
    config = getattr(model, "model_config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} was not built through the model registry: no model_config")
    try:
        text = json.dumps({**config, "extra": extra or {}}, indent=1)
    except TypeError as err:
        raise ValueError(f"model_config of {config['name']!r} is not JSON-serialisable: {err}") from err
    safetensors.torch.save_file(_tensor_state(model), str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(text)


def save_checkpoint(model: nn.Module, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` to the folder ``path`` atomically.

    The folder is written under a temporary name and renamed into place, so an interrupted
    save never leaves a folder that looks complete, and a failed one (a full disk raises
    `gno_ext._files.DiskFull`) leaves nothing. An existing checkpoint at ``path`` (a folder
    holding only what this function writes) is replaced; anything else there (a file, a run
    folder, a training checkpoint with its optimizer state) is left as it is and the save
    raises `FileExistsError`.

    Parameters
    ----------
    model : nn.Module
        A model built through the registry (it has ``model_config``).
    path : str or Path
        Destination folder.
    extra : dict, optional
        JSON-serialisable metadata stored beside the config (e.g. the training step).
    """
    path = Path(path)
    if path.exists():
        held = sorted(p.name for p in path.iterdir()) if path.is_dir() else None
        if held is None or not set(held) <= {CONFIG_FILE, WEIGHTS_FILE}:
            what = "a file" if held is None else f"a folder holding {', '.join(held[:4])}{', ...' if len(held) > 4 else ''}"
            raise FileExistsError(f"{path}: is {what}, not a model checkpoint; not replaced (remove it or save "
                                  "elsewhere)")
    with written_whole_folder(path) as tmp:
        write_model_files(model, tmp, extra)
    return path


def from_checkpoint(path: str | Path, device: str = "cpu") -> nn.Module:
    """Rebuild a model from a folder written by `save_checkpoint` (no other input needed).

    A folder that is not a complete checkpoint raises an error that names the file at fault:
    `FileNotFoundError` for a missing file, `ValueError` for a ``config.json`` that is not
    JSON or lacks ``name`` or ``kwargs``, for weights that safetensors cannot read, and for
    weights that do not fit the model the config describes.
    """
    path = Path(path)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path}: not a checkpoint folder (missing {name})")
    config_file, weights_file = path / CONFIG_FILE, path / WEIGHTS_FILE
    try:
        config = json.loads(config_file.read_text())
    except ValueError as err:  # JSONDecodeError, or text that is not UTF-8
        raise ValueError(f"{config_file}: not valid JSON ({err})") from err
    if not (isinstance(config, dict) and isinstance(config.get("name"), str) and isinstance(config.get("kwargs"), dict)):
        raise ValueError(f"{config_file}: expected an object with a model 'name' (string) and its 'kwargs' (object)")
    _check_shapes(config, config_file, weights_file)  # before a model of any size is allocated
    model = get_model(config["name"], **config["kwargs"])
    load_weights(model, weights_file, f"the {config['name']!r} model of {config_file}", device)
    return model.to(device)


def _check_shapes(config: dict[str, Any], config_file: Path, weights_file: Path) -> None:
    """Compare the tensors the config describes (the model built on the meta device, which
    allocates nothing) with those in the weights file's header, so that a config that does not
    belong to the weights (``latent=16384``: gigabytes) is refused before it is built."""
    try:
        with safetensors.safe_open(str(weights_file), "pt") as f:
            stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as err:  # safetensors raises its own error type for a damaged file
        raise ValueError(f"{weights_file}: cannot be read as safetensors ({err})") from err
    # a layer count beyond the file's tensor count cannot fit it (each layer has weights): refused
    # before even the skeleton is built, which takes a minute at depth=10000
    for key, value in config["kwargs"].items():
        if key in LAYER_COUNTS and isinstance(value, int) and value > len(stored):
            raise ValueError(f"{config_file}: {key}={value} layers, but {weights_file} holds {len(stored)} tensors; "
                             "nothing was built")
    try:
        with torch.device("meta"):
            skeleton = get_model(config["name"], **config["kwargs"])
    except (NotImplementedError, RuntimeError):  # a constructor that computes with its tensors
        return                                   # (none of ours): checked when the weights load
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items() if torch.is_tensor(v)}
    if expected == stored:
        return
    missing, unexpected = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
    shapes = [f"{k}: {stored[k]} in the file, {expected[k]} from the config" for k in sorted(set(expected) & set(stored))
              if expected[k] != stored[k]]
    detail = "; ".join([*shapes[:3], *([f"missing {missing[:3]}"] if missing else []),
                        *([f"unexpected {unexpected[:3]}"] if unexpected else [])])
    raise ValueError(f"{weights_file}: does not fit the {config['name']!r} model that {config_file} describes "
                     f"({detail}); nothing was built")


def load_weights(module: nn.Module, file: str | Path, what: str = "the model", device: str = "cpu") -> None:
    """Load a safetensors file into ``module`` (strict), with errors that name ``file``: a
    `ValueError` where safetensors cannot read it or where it does not fit ``module``
    (``what`` names the module in that message)."""
    try:
        state = safetensors.torch.load_file(str(file), device=device)
    except Exception as err:  # safetensors raises its own error type for a damaged file
        raise ValueError(f"{file}: cannot be read as safetensors ({err})") from err
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{file}: does not fit {what}: {err}") from err
