r"""GatedFNO: neuraloperator's FNO whose spectral convolutions are parameter-gated mixtures.

A subclass of ``neuralop.models.FNO`` built with ``conv_module=GatedSpectralConv``: it
registers with neuraloperator's model registry (``GatedFNO``) as well as ours
(``gated_fno``), and works with neuraloperator's ``Trainer``, which calls
``model(**sample)`` (``theta`` is read from the sample; other keys such as ``y`` are ignored).

Requires the optional dependency ``neuraloperator``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from neuralop.models import FNO
from torch import Tensor

from gno_ext.layers.embeddings import ParameterNormalizer, use_grid_coordinates
from gno_ext.layers.gate import gate_input
from gno_ext.layers.spectral import GatedSpectralConv, condition_on, with_activations
from gno_ext.layers.spectral import checkpoint_blocks as recompute_blocks
from gno_ext.models.registry import register_model

__all__ = ["GatedFNO"]


@register_model("gated_fno")
class GatedFNO(FNO, name="GatedFNO"):
    r"""FNO with ``K`` spectral kernels per layer, one selected per sample from $\theta$.

    Parameters
    ----------
    n_modes : sequence of int
        Fourier modes kept per axis.
    in_channels, out_channels, hidden_channels : int
        As for ``FNO``.
    n_params : int
        Number of scalar parameters in ``theta``.
    n_kernels : int
        Spectral kernels per layer ``K``.
    gate_hidden : int
        Hidden width of each gate.
    log_params : sequence of bool, optional
        Parameters normalised on a log scale.
    activations : {"float32", "autocast"}
        The activations' type between the layers under autocast (`gno_ext.layers.spectral.ACTIVATIONS`):
        float32 as neuraloperator's blocks return them, or the autocast type (about a third
        less activation memory; the same weights and checkpoints).
    checkpoint_blocks : bool
        Recompute the FNO's blocks in the backward pass instead of keeping their activations
        (`gno_ext.layers.spectral.checkpoint_blocks`): less GPU memory for a second forward pass
        of each block, the same values and gradients. Default False.
    **fno_kwargs
        Any other ``FNO`` argument (``n_layers``, ``positional_embedding``, ...).

    Examples
    --------
    >>> model = GatedFNO(n_modes=(8, 8), in_channels=1, out_channels=1, hidden_channels=16, n_params=1)
    >>> model(torch.randn(2, 1, 32, 32), theta=torch.rand(2, 1)).shape
    torch.Size([2, 1, 32, 32])
    """

    def __init__(self, n_modes: Sequence[int], in_channels: int, out_channels: int, hidden_channels: int,
                 n_params: int = 1, n_kernels: int = 4, gate_hidden: int = 32,
                 log_params: Sequence[bool] | None = None, activations: str = "float32",
                 checkpoint_blocks: bool = False, **fno_kwargs: Any) -> None:
        if "conv_module" in fno_kwargs:
            raise ValueError("conv_module: GatedFNO sets it (GatedSpectralConv); use FNO for another module")
        conv = functools.partial(GatedSpectralConv, n_kernels=n_kernels, n_params=n_params, gate_hidden=gate_hidden)
        super().__init__(tuple(n_modes), in_channels, out_channels, hidden_channels, conv_module=conv, **fno_kwargs)
        use_grid_coordinates(self)  # the same coordinates, not cached on the module (compiled once)
        with_activations(self, activations)
        recompute_blocks(self, checkpoint_blocks)
        self.param_norm = ParameterNormalizer(n_params, log_params)

    @staticmethod
    def data_kwargs(spec: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments completed from a recipe's data (`gno_ext.training.recipe_data.DataSpec`):
        the input frames stacked on channels, the channels, the parameters, and ``n_modes``
        given as one integer repeated over the spatial axes."""
        out = dict(kwargs)
        modes = out.get("n_modes", 12)
        out["n_modes"] = [int(modes)] * spec.ndim if isinstance(modes, int) else list(modes)
        out.update(in_channels=spec.t_in * spec.channels, out_channels=spec.channels, n_params=spec.n_params)
        out.setdefault("log_params", list(spec.log_params))
        return out

    @torch.no_grad()
    def fit_normalization(self, u: Tensor, theta: Tensor | None = None) -> GatedFNO:
        """Set the parameter normalisation from training parameters ``theta`` (N, P)."""
        if theta is not None:
            self.param_norm.fit(theta)
        return self

    def forward(self, x: Tensor, output_shape: Any = None, *, theta: Tensor, **kwargs: Any) -> Tensor:
        """Apply the FNO with every gated convolution routed by ``theta``.

        Parameters
        ----------
        x : Tensor, shape (B, in_channels, *S) or (B, T_in, C, *S)
            As for ``FNO.forward``; or the schema's input frames (as the recipes pass them): they
            are stacked on channels and the output is the next frame ``(B, 1, out_channels, *S)``,
            predicted as an increment over the last input frame when ``out_channels == C``.
        output_shape : optional
            As for ``FNO.forward``.
        theta : Tensor, shape (B, n_params)
            Raw physical parameters (normalised inside).
        **kwargs
            Ignored (neuraloperator's ``Trainer`` passes the whole sample, ``y`` included).
        """
        if x.ndim == self.n_dim + 3:  # schema input (B, T_in, C, *S)
            with condition_on(self, gate_input(self.param_norm(theta), None, self.n_dim).to(x.dtype)):
                out = super().forward(x.flatten(1, 2), output_shape=output_shape)[:, None]
            return x[:, -1:] + out if out.shape[2] == x.shape[2] else out
        with condition_on(self, gate_input(self.param_norm(theta), None, self.n_dim).to(x.dtype)):
            return super().forward(x, output_shape=output_shape)

    # neuraloperator's BaseModel saves with torch.save and loads with torch.load(weights_only=False),
    # which runs whatever code a crafted file holds. These three keep its signatures and use the
    # project's checkpoint format instead (safetensors and JSON, gno_ext.models.registry).
    def save_checkpoint(self, save_folder: str | Path, save_name: str = "model") -> Path:
        """Write the model to ``save_folder/save_name/`` (``model.safetensors``, ``config.json``)."""
        from gno_ext.models.registry import save_checkpoint

        return save_checkpoint(self, Path(save_folder) / save_name)

    @classmethod
    def from_checkpoint(cls, save_folder: str | Path, save_name: str = "model", map_location: Any = None) -> GatedFNO:
        """Rebuild a model that `save_checkpoint` wrote; nothing is unpickled (neuraloperator's
        ``*_metadata.pkl`` and ``*_state_dict.pt`` files are refused)."""
        from gno_ext.models.registry import from_checkpoint

        folder = _checkpoint_folder(save_folder, save_name)
        model = from_checkpoint(folder, device=str(map_location or "cpu"))
        if not isinstance(model, cls):
            raise ValueError(f"{folder}: holds a {type(model).__name__}, not a {cls.__name__}")
        return model

    def load_checkpoint(self, save_folder: str | Path, save_name: str = "model", map_location: Any = None) -> None:
        """Load the weights that `save_checkpoint` wrote into this model (safetensors only)."""
        from gno_ext.models.registry import WEIGHTS_FILE, load_weights

        folder = _checkpoint_folder(save_folder, save_name)
        load_weights(self, folder / WEIGHTS_FILE, f"this {type(self).__name__}", str(map_location or "cpu"))

def _checkpoint_folder(save_folder: str | Path, save_name: str) -> Path:
    folder = Path(save_folder) / save_name
    pickled = [p.name for p in Path(save_folder).glob(f"{save_name}_*") if p.suffix in (".pt", ".pkl")]
    if not folder.is_dir() and pickled:
        raise ValueError(f"{save_folder}: {', '.join(sorted(pickled))} is neuraloperator's pickle format, which can "
                         "run code when loaded and is not read here; GatedFNO checkpoints are safetensors and JSON "
                         f"(GatedFNO.save_checkpoint writes {folder}/)")
    return folder
