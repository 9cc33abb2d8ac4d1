r"""A gated mixture of neuraloperator ``SpectralConv`` kernels, usable as ``conv_module``.

neuraloperator's ``FNOBlocks`` builds its convolutions as
``conv_module(in_channels, out_channels, n_modes, **kwargs)`` and calls them as
``conv(x, output_shape=...)``, with no room for the PDE parameters. `GatedSpectralConv` is
built the same way and reads $\theta$ from a context that its owner sets for the duration of
a forward pass: `GatedFNO` does so itself; with your own ``FNOBlocks`` use `condition_on`::

    blocks = FNOBlocks(32, 32, (12, 12), conv_module=partial(GatedSpectralConv, n_params=2))
    with condition_on(blocks, theta):
        y = blocks(x, 0)

Requires the optional dependency ``neuraloperator`` (``pip install gno-ext[neuralop]``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from neuralop.layers.base_spectral_conv import BaseSpectralConv
from neuralop.layers.spectral_convolution import SpectralConv
from torch import Tensor, nn

from gno_ext.layers.gate import ParameterGate
from gno_ext.layers.mixture import dispatch
from gno_ext.layers.modes import contract_modes, from_modes, to_modes

__all__ = ["ACTIVATIONS", "FullPrecisionSpectralConv", "GatedSpectralConv", "TRANSFORMS", "checkpoint_blocks",
           "condition_on", "keep_autocast_type", "with_activations"]

TRANSFORMS = ("dft", "fft")
"""How a spectral convolution of this package reaches its retained modes: ``"dft"`` (default),
the kept modes only, by dense matrix products (`gno_ext.layers.modes`); ``"fft"``, the full
FFT and its zero-filled inverse, as neuraloperator's ``SpectralConv`` does."""


ACTIVATIONS = ("float32", "autocast")
"""The type of an FNO's activations between its layers under autocast (a model argument
``activations``): ``"float32"`` (default), what neuraloperator's blocks give (their spectral
convolutions and channel-MLP skips return float32, which promotes every sum after them), or
``"autocast"``, the autocast type (bf16), as the layers of a transformer under autocast
(`keep_autocast_type`)."""


def _autocast_output(module: nn.Module, inputs: Any, out: Any) -> Any:
    """A forward hook: ``out`` in the autocast type where autocast is on (else unchanged)."""
    if isinstance(out, Tensor) and out.is_floating_point() and torch.is_autocast_enabled(out.device.type):
        return out.to(torch.get_autocast_dtype(out.device.type))
    return None


def keep_autocast_type(net: nn.Module) -> nn.Module:
    """Keep a neuraloperator ``FNO``'s activations in the autocast type under autocast
    (``activations="autocast"``, `ACTIVATIONS`): each block's spectral convolution and channel-MLP skip
    return it (forward hooks) instead of float32, so that the sums, GELUs and their gradients
    between them move half the bytes. Outside autocast nothing changes, nor do the parameters or
    the checkpoints. Returns ``net``."""
    blocks = net.fno_blocks
    for layer in range(blocks.n_layers):
        blocks.convs[layer].register_forward_hook(_autocast_output)
        if blocks.channel_mlp_skips is not None:
            blocks.channel_mlp_skips[layer].register_forward_hook(_autocast_output)
    return net


def with_activations(net: nn.Module, activations: str) -> nn.Module:
    """``net`` (a neuraloperator ``FNO``) with its activations' type ``activations`` (`ACTIVATIONS`)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations: expected one of {', '.join(ACTIVATIONS)}, got {activations!r}")
    return keep_autocast_type(net) if activations == "autocast" else net


def checkpoint_blocks(net: nn.Module, enabled: bool = True) -> nn.Module:
    """Recompute each block of a neuraloperator ``FNO`` (``net.fno_blocks``, called once per layer)
    in the backward pass instead of keeping its activations: activation checkpointing
    (``torch.utils.checkpoint``, non-reentrant). A training step then keeps each block's input
    alone, at the cost of a second forward pass of every block; the values and gradients are the
    same. Where grad is off (validation, rollouts) the blocks run as before. The conditioning of
    gated convolutions (`condition_on`, set around the forward pass) is handed to the
    recomputation, which runs after that block has closed. For large grids (3-D) whose activations
    do not fit the GPU at the batch wanted. ``enabled=False`` leaves ``net`` as it is (a model's
    ``checkpoint_blocks`` argument passed through). Returns ``net``."""
    from torch.utils.checkpoint import checkpoint

    if not isinstance(enabled, bool):
        raise ValueError(f"checkpoint_blocks: expected true or false, got {enabled!r}")
    if not enabled:
        return net
    blocks = net.fno_blocks
    forward = blocks.forward
    convs = [m for m in blocks.modules() if isinstance(m, GatedSpectralConv)]

    def run(x: Tensor, index: int, output_shape: Any, theta: Tensor | None) -> Tensor:
        before = [conv.theta for conv in convs]
        for conv in convs:
            conv.theta = theta
        try:
            return forward(x, index, output_shape=output_shape)
        finally:
            for conv, value in zip(convs, before):
                conv.theta = value

    def checkpointed(x: Tensor, index: int = 0, output_shape: Any = None) -> Tensor:
        if not torch.is_grad_enabled():
            return forward(x, index, output_shape=output_shape)
        theta = convs[0].theta if convs else None
        return checkpoint(run, x, index, output_shape, theta, use_reentrant=False)

    blocks.forward = checkpointed
    return net


class FullPrecisionSpectralConv(SpectralConv):
    """neuraloperator's ``SpectralConv`` (the same weights and function), with its transforms
    restricted to the retained modes, and usable under autocast.

    ``fourier="dft"`` (default) computes the retained modes alone and the output from them
    by matrix products (`gno_ext.layers.modes`) instead of a full FFT and the inverse of a
    zero-filled spectrum: most of an FFT's work is discarded when 12 of 128 modes are kept.
    Under autocast the transforms run in its type (bf16 on tensor cores), the contraction with
    the weights in float32; without autocast everything is float32. It applies where the output
    has the input's size; elsewhere (resolution scaling, another ``output_shape``, complex
    data, separable kernels, ``fno_block_precision`` other than ``"full"``, and an odd size on an
    axis but the last, where ``SpectralConv`` shifts its spectrum back with ``fftshift`` rather
    than its inverse and so offsets its frequencies by one) the layer takes the FFT path, as with
    ``fourier="fft"``, and computes what ``SpectralConv`` computes.

    On the FFT path, with its default ``fno_block_precision="full"`` it takes a bf16 or float16
    input in float32: cuFFT has no bf16 transform (``RuntimeError: Unsupported dtype
    BFloat16``) and float16 ones only for power-of-two sizes. The transforms and the spectral
    product then run in float32 (complex64), as ``"full"`` means; the output is float32, and the
    layers after it return to the autocast type. ``"half"`` and ``"mixed"`` keep neuraloperator's
    own handling. The FNO-based models of this package build their convolutions from it.
    """

    def __init__(self, *args: Any, fourier: str = "dft", **kwargs: Any) -> None:
        if fourier not in TRANSFORMS:
            raise ValueError(f"fourier: expected one of {', '.join(TRANSFORMS)}, got {fourier!r}")
        super().__init__(*args, **kwargs)
        self.fourier = fourier

    def forward(self, x: Tensor, output_shape: Any = None) -> Tensor:
        if takes_dft(self, x, output_shape):
            weights = torch.view_as_real(self.weight.to_tensor())[(slice(None),) * 2 + kept_slices(self, x)]
            modes = to_modes(x, weights.shape[2:-1], self.fft_norm)
            y = from_modes(contract_in_float32(modes, weights[None])[:, 0], list(x.shape[2:]), self.fft_norm)
            return y if self.bias is None else y + self.bias
        if self.fno_block_precision == "full" and x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return super().forward(x, output_shape=output_shape)


def _output_sizes(conv: SpectralConv, sizes: Any, output_shape: Any) -> list[int]:
    """The output's sizes: ``output_shape``, or the input's scaled by the resolution factor."""
    if output_shape is not None:
        return list(output_shape)
    if conv.resolution_scaling_factor is not None:
        return [round(s * r) for s, r in zip(sizes, conv.resolution_scaling_factor)]
    return list(sizes)


def takes_dft(conv: SpectralConv, x: Tensor, output_shape: Any = None) -> bool:
    """Whether ``conv`` (a `FullPrecisionSpectralConv`) computes ``x`` through the kept modes
    alone (``fourier="dft"`` and a case it covers: see the class)."""
    return (getattr(conv, "fourier", "fft") == "dft" and not conv.separable and not conv.complex_data
            and conv.fno_block_precision == "full" and all(n % 2 == 0 for n in x.shape[2:-1])
            and _output_sizes(conv, x.shape[2:], output_shape) == list(x.shape[2:]))


def kept_slices(conv: SpectralConv, x: Tensor) -> tuple[slice, ...]:
    """The slices of ``conv``'s weights' mode axes that an input ``x`` uses: all of them, or
    where ``x`` has fewer frequencies than ``max_n_modes`` those closest to frequency 0, as
    ``SpectralConv`` picks them."""
    sizes = x.shape[2:]
    fft_size = [*sizes[:-1], sizes[-1] // 2 + 1]
    starts = [top - min(size, n) for size, n, top in zip(fft_size, conv.n_modes, conv.max_n_modes)]
    cut = [slice(a // 2, -a // 2) if a else slice(None) for a in starts[:-1]]  # (-a // 2: SpectralConv's rounding)
    cut.append(slice(None, -starts[-1]) if starts[-1] else slice(None))
    return tuple(cut)


def _float32(device: torch.device) -> Any:
    """A block in float32 whatever autocast says (where autocast exists for the device)."""
    return torch.autocast(device.type, enabled=False) if device.type in ("cpu", "cuda") else contextlib.nullcontext()


def contract_in_float32(modes: Tensor, weights: Tensor, index: Tensor | None = None,
                        probs: Tensor | None = None) -> Tensor:
    """`contract_modes` in float32 whatever autocast says (the products are small, and the
    kernels' weights are float32): ``(B, K, O, *kept, 2)``; with ``probs`` (B, K) each sample's
    probability-weighted sum of the kernels' results, else with ``index`` (B,) its kernel's
    result, ``(B, O, *kept, 2)`` (as `GatedSpectralConv._sample_parameters` picks)."""
    with _float32(modes.device):
        every = contract_modes(modes.float(), weights.float())
        if probs is not None:
            return torch.einsum("bk,bk...->b...", probs.float(), every)
        return every if index is None else every[torch.arange(every.shape[0], device=every.device), index]


class GatedSpectralConv(BaseSpectralConv):
    r"""``K`` ``SpectralConv`` kernels selected per sample by a `ParameterGate` on $\theta$.

    The input's retained modes are computed once for the whole batch (by the kernels'
    transforms, `FullPrecisionSpectralConv`) and contracted with every kernel's weights, a few
    small products per mode; each sample keeps its own kernel's result (a gather, so only the
    selected kernel's weights enter a sample's output and gradient), and one inverse transform
    follows. The shapes are static and nothing is read on the host, so the layer compiles into
    CUDA graphs and a training step with it can be captured. It computes what each sample's
    ``SpectralConv`` computes (tested against running the kernels one by one, gradients
    included). Separable and complex-data kernels run one by one instead (`dispatch`, which
    reads the kernels' sample counts on the host); so does ``static = False``.

    Parameters
    ----------
    in_channels, out_channels : int
    n_modes : int or tuple of int
        As for ``SpectralConv``.
    n_kernels : int
        Number of spectral kernels ``K``.
    n_params : int
        Size of the (normalised) $\theta$ the gate reads.
    gate_hidden : int
        Hidden width of the gate's score MLP.
    shared_kernel : bool
        Write kernel ``k`` as $W_0 + W_k$: a kernel $W_0$ shared by all samples plus a residual
        $W_k$ per kernel, the residuals starting at zero (so the layer starts as one
        ``SpectralConv``). The same family of ``K`` kernels, parametrised so that every sample
        trains $W_0$, where each residual trains on the samples routed to it alone. Needs dense
        kernels (no factorisation). Default False: ``K`` independent kernels, the paper's form.
    soft_routing : bool
        Mix the kernels instead of choosing one: sample ``b`` is convolved with
        $\sum_k \tilde g_k(\theta_b) W_k$ (and the same mixture of the biases), a smooth function
        of $\theta$, so that every kernel trains on every sample in proportion to its gate
        probability and the gate learns from the loss directly (no straight-through value).
        The convolution is linear in its weights, so this equals the gate-weighted sum of the
        kernels' outputs; the gathered path sums the kernels' results per mode with the
        probabilities where the hard choice gathers one, at the same cost. Default False: the
        paper's hard arg-max.
    fourier : {"dft", "fft"}
        The kernels' transforms (`FullPrecisionSpectralConv`, `TRANSFORMS`).
    **spectral_kwargs
        Passed to every ``SpectralConv`` (``FNOBlocks`` passes its factorisation, precision...).
    """

    static = True  # the gathered-weight path where the kernels allow it (see the class docstring)

    def __init__(self, in_channels: int, out_channels: int, n_modes: Any, n_kernels: int = 4,
                 n_params: int = 1, gate_hidden: int = 32, shared_kernel: bool = False,
                 soft_routing: bool = False, fourier: str = "dft", **spectral_kwargs: Any) -> None:
        super().__init__(device=spectral_kwargs.get("device"))
        make = functools.partial(FullPrecisionSpectralConv, in_channels, out_channels, n_modes, fourier=fourier)
        self.shared = None
        if shared_kernel:
            if str(spectral_kwargs.get("factorization") or "dense").lower() != "dense":
                raise ValueError(f"shared_kernel: needs dense kernels, got factorization="
                                 f"{spectral_kwargs['factorization']!r} (zero factors would not train)")
            self.shared = make(**spectral_kwargs)
            spectral_kwargs = {**spectral_kwargs, "init_std": 0.0}  # the residuals (weights, bias) start at zero
        self.kernels = nn.ModuleList(make(**spectral_kwargs) for _ in range(n_kernels))
        self.gate = ParameterGate(n_params, n_kernels, gate_hidden)
        self.soft_routing = bool(soft_routing)
        self.theta: Tensor | None = None
        self.last_routing = None

    @property
    def takes_static_path(self) -> bool:
        """Whether `forward` takes the gathered-weight path (else it dispatches kernel by kernel)."""
        first = self.kernels[0]
        return self.static and not first.separable and not first.complex_data and first.fno_block_precision == "full"

    @property
    def dispatches(self) -> bool:
        """Whether a step can leave a kernel without a gradient (DDP then needs
        ``find_unused_parameters``, `gno_ext.layers.mixture.has_dispatch`): the kernel-by-kernel
        dispatch can, when a batch selects no sample for a kernel; the static path keeps every
        kernel in the graph (a kernel no sample selected gets a zero gradient), and so does the soft
        mixture on either path (every kernel acts on every sample)."""
        return not self.takes_static_path and not self.soft_routing

    @property
    def n_modes(self) -> Any:
        return self.kernels[0].n_modes

    @n_modes.setter
    def n_modes(self, n_modes: Any) -> None:
        for kernel in self.kernels:
            kernel.n_modes = n_modes

    def transform(self, x: Tensor, output_shape: Any = None) -> Tensor:
        """Resampling of the skip connection (identical for all kernels)."""
        return self.kernels[0].transform(x, output_shape=output_shape)

    def forward(self, x: Tensor, output_shape: Any = None) -> Tensor:
        """Apply each sample's selected spectral kernel to ``x`` of shape ``(B, C, *S)``."""
        if self.theta is None:
            raise RuntimeError("GatedSpectralConv: no theta set; call it inside condition_on(module, theta) "
                               "or through GatedFNO(x, theta=...)")
        if self.theta.shape[0] != x.shape[0]:
            raise ValueError(f"theta: batch size {self.theta.shape[0]} does not match x's {x.shape[0]}")
        routing = self.gate(self.theta)
        self.last_routing = routing
        if self.takes_static_path:
            y = self._gathered(x, routing.index, output_shape, routing.probs if self.soft_routing else None)
            return y if self.soft_routing else y * _per_sample(routing.weight, x.ndim)
        if self.soft_routing:  # every kernel on every sample, weighted by its probability
            y = sum(kernel(x, output_shape=output_shape) * _per_sample(routing.probs[:, k], x.ndim)
                    for k, kernel in enumerate(self.kernels))
            # the spectral convolution is linear in its weights and bias, and the probabilities sum to 1
            return y if self.shared is None else y + self.shared(x, output_shape=output_shape)
        y = dispatch(self.kernels, routing, x, output_shape=output_shape)
        if self.shared is not None:  # the spectral convolution is linear in its weights and bias
            y = y + self.shared(x, output_shape=output_shape) * _per_sample(routing.weight, x.ndim)
        return y

    @staticmethod
    def _sample_parameters(stacked: Tensor, index: Tensor, probs: Tensor | None) -> Tensor:
        """Each sample's kernel parameters from the kernels' ``stacked`` ones ``(K, ...)``: those
        of kernel ``index[b]`` (a gather), or where ``probs`` (B, K) is given their weighted sum."""
        if probs is None:
            return stacked.index_select(0, index)
        with torch.autocast(stacked.device.type, enabled=False):  # in the weights' type (float32), as the gather
            mixed = probs.to(stacked.dtype) @ stacked.flatten(1)
        return mixed.view(probs.shape[0], *stacked.shape[1:])

    def _gathered(self, x: Tensor, index: Tensor, output_shape: Any = None, probs: Tensor | None = None) -> Tensor:
        """Every sample through kernel ``index[b]`` (or, where ``probs`` is given, through the
        ``probs[b]``-weighted sum of the kernels): the steps of ``SpectralConv.forward`` (its
        transforms, mode selection and bias) with the contraction done per sample.

        The input's retained modes are contracted with every kernel (``K`` small products per
        mode, `gno_ext.layers.modes.contract_modes`), and each sample keeps its kernel's result
        (a gather: only that kernel's weights reach its gradient) or the ``probs``-weighted sum
        of them, which the linearity of the convolution makes the convolution with the mixed
        kernel. No per-sample copy of the weights is formed.

        The modes are reached by the kept-mode transforms (``fourier="dft"``, the kernels'
        default, `FullPrecisionSpectralConv`) or by the full FFT. On the FFT path the data move
        (slicing, the shift, the scatter into the output's spectrum) on real views of the complex
        tensors: inductor's GPU code generation has no complex types."""
        first = self.kernels[0]
        sizes = list(x.shape[2:])
        cut = kept_slices(first, x)
        weights = torch.stack([torch.view_as_real(k.weight.to_tensor()) for k in self.kernels])
        if self.shared is not None:  # W_0 + W_k, added once per kernel
            weights = weights + torch.view_as_real(self.shared.weight.to_tensor())
        weights = weights[(slice(None),) * 3 + cut]  # (K, in, out, *modes, 2)
        kept = weights.shape[3:-1]
        dft = takes_dft(first, x, output_shape)
        if dft:
            modes = to_modes(x, kept, first.fft_norm)
        else:
            modes, region, fft_size = _fft_modes(first, x, kept)
        product = contract_in_float32(modes, weights, index, probs)
        if dft:
            y = from_modes(product, sizes, first.fft_norm)
        else:
            y = _fft_field(first, product, region, fft_size, _output_sizes(first, sizes, output_shape))
        if first.bias is not None:
            bias = torch.stack([k.bias for k in self.kernels])
            y = y + self._sample_parameters(bias if self.shared is None else bias + self.shared.bias, index, probs)
        return y


def _fft_modes(conv: SpectralConv, x: Tensor, kept: Any) -> tuple[Tensor, tuple[slice, ...], list[int]]:
    """The retained modes of ``x`` by the full FFT, as ``SpectralConv`` takes them (``(B, C,
    *kept, 2)``), with the region of the shifted spectrum they fill and its size."""
    if x.dtype in (torch.bfloat16, torch.float16):  # cuFFT has no bf16 transform (FullPrecisionSpectralConv)
        x = x.float()
    sizes = x.shape[2:]
    dims = list(range(-conv.order, 0))
    fft_size = [*sizes[:-1], sizes[-1] // 2 + 1]
    spectrum = torch.view_as_real(torch.fft.rfftn(x, norm=conv.fft_norm, dim=dims))
    if conv.order > 1:
        spectrum = torch.fft.fftshift(spectrum, dim=[d - 1 for d in dims[:-1]])  # (the real view's axes)
    # the retained modes, centred on frequency 0 after the shift, as SpectralConv picks them
    modes = [slice(size // 2 - n // 2, size // 2 + n // 2 + n % 2) for size, n in zip(fft_size[:-1], kept[:-1])]
    region = (slice(None), slice(None), *modes, slice(None, kept[-1]))
    return spectrum[region], region, fft_size


def _fft_field(conv: SpectralConv, modes: Tensor, region: tuple[slice, ...], fft_size: list[int],
               sizes: list[int]) -> Tensor:
    """The field of the retained ``modes`` by the inverse FFT of the zero-filled spectrum."""
    dims = list(range(-conv.order, 0))
    out = modes.new_zeros(modes.shape[0], modes.shape[1], *fft_size, 2)
    out[region] = modes
    if conv.order > 1:
        out = torch.fft.fftshift(out, dim=[d - 1 for d in dims[:-1]])
    return torch.fft.irfftn(torch.view_as_complex(out), s=sizes, dim=dims, norm=conv.fft_norm)


def _per_sample(weight: Tensor, ndim: int) -> Tensor:
    """The gate's straight-through value (B,) shaped to scale a ``(B, C, *S)`` output."""
    return weight.view(-1, *([1] * (ndim - 1)))


@contextlib.contextmanager
def condition_on(module: nn.Module, theta: Tensor) -> Iterator[None]:
    """Set ``theta`` (B, n_params) on every `GatedSpectralConv` inside ``module`` for a block."""
    convs = [m for m in module.modules() if isinstance(m, GatedSpectralConv)]
    for conv in convs:
        conv.theta = theta
    try:
        yield
    finally:
        for conv in convs:
            conv.theta = None
