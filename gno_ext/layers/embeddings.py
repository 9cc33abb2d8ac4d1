r"""Lifting and projection on patches, positional encodings and parameter embeddings."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gno_ext.checks import first_entry, may_read_device, require_at_least

__all__ = ["PatchEmbed", "PatchProject", "ConvRefine", "sincos_position", "ParameterNormalizer", "field_statistics", "token_shape",
           "GridCoordinates", "use_grid_coordinates"]


def token_shape(spatial: Sequence[int], patch: int) -> tuple[int, ...]:
    """Token grid of a field of shape ``spatial`` cut into ``patch``-sized cubes.

    Raises
    ------
    ValueError
        If an axis is not divisible by ``patch``.
    """
    if any(n % patch for n in spatial):
        raise ValueError(f"grid {tuple(spatial)} is not divisible by the patch size {patch}")
    return tuple(n // patch for n in spatial)


def _check_sizes(ndim: int, **sizes: int) -> None:
    if ndim not in (1, 2, 3):
        raise ValueError(f"ndim: expected 1, 2 or 3, got {ndim}")
    require_at_least(1, **sizes)


class PatchEmbed(nn.Module):
    r"""Lifting $\mathcal{E}$: non-overlapping patches to tokens (a strided convolution).

    The weights are those of the convolution (``proj``), applied as one matrix product on the
    flattened patches: the same result without the layout conversions and implicit-GEMM
    kernels of a convolution.

    Parameters
    ----------
    in_channels : int
    dim : int
        Token width.
    patch : int
        Patch side.
    ndim : int
        Spatial dimension (1, 2 or 3).
    """

    def __init__(self, in_channels: int, dim: int, patch: int, ndim: int) -> None:
        super().__init__()
        _check_sizes(ndim, in_channels=in_channels, dim=dim, patch=patch)
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[ndim]
        self.proj = conv(in_channels, dim, kernel_size=patch, stride=patch)
        self.patch, self.ndim = patch, ndim

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, *S)`` to tokens ``(B, N, D)`` with ``N = prod(S) / patch^d``."""
        if x.ndim != 2 + self.ndim or x.shape[1] != self.proj.in_channels:
            raise ValueError(f"x: expected shape (B, {self.proj.in_channels}, *S) with {self.ndim} spatial axes, "
                             f"got {tuple(x.shape)}")
        grid, p, d = token_shape(x.shape[2:], self.patch), self.patch, self.ndim
        b, c = x.shape[:2]
        # (B, C, g1, p1, .., gd, pd) -> (B, g1, .., gd, C, p1, .., pd): one row per patch
        perm = [0, *range(2, 2 + 2 * d, 2), 1, *range(3, 3 + 2 * d, 2)]
        patches = x.reshape(b, c, *[n for g in grid for n in (g, p)]).permute(perm).reshape(b, math.prod(grid), -1)
        return F.linear(patches, self.proj.weight.flatten(1), self.proj.bias)


class PatchProject(nn.Module):
    r"""Projection $\mathcal{Q}$: each token back to a patch of ``out_channels`` values."""

    def __init__(self, dim: int, out_channels: int, patch: int, ndim: int) -> None:
        super().__init__()
        _check_sizes(ndim, dim=dim, out_channels=out_channels, patch=patch)
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, out_channels * patch ** ndim)
        self.out_channels, self.patch, self.ndim = out_channels, patch, ndim

    def forward(self, tokens: Tensor, grid_tokens: Sequence[int]) -> Tensor:
        """Tokens ``(B, N, D)`` on the token grid ``grid_tokens`` to ``(B, C_out, *S)``."""
        if len(grid_tokens) != self.ndim or tokens.ndim != 3 or tokens.shape[1] != math.prod(grid_tokens):
            raise ValueError(f"tokens: expected shape (B, {math.prod(grid_tokens)}, D) on the {self.ndim}-D token grid "
                             f"{tuple(grid_tokens)}, got {tuple(tokens.shape)}")
        b, p, d = tokens.shape[0], self.patch, self.ndim
        y = self.proj(self.norm(tokens)).view(b, *grid_tokens, self.out_channels, *([p] * d))
        # (B, g1, .., gd, C, p1, .., pd) -> (B, C, g1, p1, .., gd, pd)
        perm = [0, d + 1] + [i for a in range(d) for i in (1 + a, d + 2 + a)]
        return y.permute(perm).reshape(b, self.out_channels, *[g * p for g in grid_tokens])


class ConvRefine(nn.Module):
    r"""A convolutional correction of a patch-wise projection: two small convolutions at full
    resolution that see the projected field and the input frames, added to the projection.

    `PatchProject` draws each patch from its token alone, so neighbouring patches need not join
    smoothly and the fine scales inside a patch come from one linear map. This module lets every
    output value depend on its neighbours (across patch edges too) and on the input at full
    resolution. Its last convolution starts at zero: at initialisation the output is the
    projection unchanged. Edges are padded by replication.

    Parameters
    ----------
    channels : int
        Channels of the projected field (and of the output).
    context_channels : int
        Channels of the full-resolution input it also reads (the input frames).
    hidden : int
        Channels of the hidden convolution.
    ndim : int
    kernel : int
        Convolution size (odd).
    """

    def __init__(self, channels: int, context_channels: int, hidden: int, ndim: int, kernel: int = 3) -> None:
        super().__init__()
        _check_sizes(ndim, channels=channels, hidden=hidden, kernel=kernel)
        require_at_least(0, context_channels=context_channels)
        if kernel % 2 == 0:
            raise ValueError(f"kernel: must be odd (a centred convolution), got {kernel}")
        conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[ndim - 1]
        pad = dict(padding=kernel // 2, padding_mode="replicate")
        self.mix = conv(channels + context_channels, hidden, kernel, **pad)
        self.out = conv(hidden, channels, kernel, **pad)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, field: Tensor, context: Tensor) -> Tensor:
        """``field`` (B, C, *S) corrected, from it and ``context`` (B, C_ctx, *S)."""
        h = F.gelu(self.mix(torch.cat([field, context.to(field.dtype)], 1)))
        return field + self.out(h)


_FREQUENCIES: dict[tuple[int, str, torch.dtype], Tensor] = {}  # eager mode: (count, device, type) -> frequencies


def _frequencies(n_freq: int, device: torch.device | None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Angular frequencies of `sincos_position`: wavelengths from the domain size down to 1/64
    of it, geometrically spaced.

    They are computed from Python floats, so that `torch.compile` takes them as constants
    (from `torch.logspace` it generated a float64 power for every element of the fused kernel
    that used the encoding: 0.19 ms of a paper-size GNO training step at batch 256 on an H100).
    In eager mode the tensor is made once per device and kept: a CUDA graph capture cannot
    copy from the host, and each call saves a copy."""
    make = lambda: torch.tensor([2 * math.pi * 64 ** (i / max(n_freq - 1, 1)) for i in range(n_freq)], device=device,
                                dtype=dtype)
    if torch.compiler.is_compiling():
        return make()
    key = (n_freq, str(torch.device(device or "cpu")), dtype)
    if key not in _FREQUENCIES:
        _FREQUENCIES[key] = make()
    return _FREQUENCIES[key]


def sincos_position(grid_tokens: Sequence[int], dim: int, device: torch.device | None = None,
                    dtype: torch.dtype = torch.float32) -> Tensor:
    """Fixed sine-cosine encoding of token positions in ``[0, 1)^d``, shape ``(N, dim)``.

    Positions are relative to the domain, so the same encoding serves any resolution. It is
    computed in float32 (float64 for ``dtype`` float64) and returned in ``dtype``. In
    eager mode it can be captured in a CUDA graph once it has run outside one on the same
    device (`gno_ext.training.capture_step` runs warm-up steps first).
    """
    d = len(grid_tokens)
    n_freq = math.ceil(dim / (2 * d))
    work = torch.promote_types(dtype, torch.float32)  # float32, or float64 for a float64 model
    freqs = _frequencies(n_freq, device, work)
    axes = [(torch.arange(g, device=device, dtype=work) + 0.5) / g for g in grid_tokens]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, d)
    angles = coords[:, :, None] * freqs
    enc = torch.cat([angles.sin(), angles.cos()], -1).reshape(coords.shape[0], -1)
    return enc[:, :dim].to(dtype)


class GridCoordinates(nn.Module):
    """The coordinates of a regular grid appended as channels: what neuraloperator's
    ``GridEmbeddingND`` computes (on each axis ``start + (stop - start) i / n``, ``i < n``),
    made afresh on the input's device and in its type at every call instead of cached on the
    module at the first.

    A module that changes its own attributes in its forward pass makes ``torch.compile``
    compile the model a second time (the guard on the cached grid fails at the second call:
    about a minute at the start of a GPU run) and puts a copy from the host in the step, which
    a CUDA graph cannot hold; this one has no state. No parameters or buffers: checkpoints of
    either module load into the other.

    Parameters
    ----------
    in_channels : int
        Channels of the input (the output has ``in_channels + dim``).
    dim : int
        Spatial axes.
    grid_boundaries : sequence of (start, stop)
        Each axis's coordinate range (neuraloperator's default: ``[0, 1]`` on every axis).
    """

    def __init__(self, in_channels: int, dim: int = 2, grid_boundaries: Sequence[Sequence[float]] | None = None
                 ) -> None:
        super().__init__()
        require_at_least(1, dim=dim)
        bounds = [(0.0, 1.0)] * dim if grid_boundaries is None else [tuple(b) for b in grid_boundaries]
        if len(bounds) != dim or any(len(b) != 2 for b in bounds):
            raise ValueError(f"grid_boundaries: expected {dim} pairs (start, stop), got {grid_boundaries!r}")
        self.in_channels, self.dim, self.grid_boundaries = in_channels, dim, bounds

    @property
    def out_channels(self) -> int:
        return self.in_channels + self.dim

    def forward(self, data: Tensor) -> Tensor:
        """``data`` (B, C, *S) with the ``dim`` coordinate channels after its own."""
        sizes = data.shape[2:]
        if len(sizes) != self.dim:
            raise ValueError(f"data: expected (B, C) and {self.dim} spatial axes, got shape {tuple(data.shape)}")
        axes = [torch.linspace(start, stop, n + 1, device=data.device)[:-1].to(data.dtype)
                for n, (start, stop) in zip(sizes, self.grid_boundaries)]
        coords = torch.stack(torch.meshgrid(*axes, indexing="ij"))  # (dim, *S)
        return torch.cat([data, coords.expand(data.shape[0], *coords.shape)], 1)


def use_grid_coordinates(net: nn.Module) -> nn.Module:
    """Give a neuraloperator model (an ``FNO``) whose ``positional_embedding`` is a
    ``GridEmbeddingND`` the equivalent `GridCoordinates` instead; returns ``net``."""
    from neuralop.layers.embeddings import GridEmbeddingND

    old = getattr(net, "positional_embedding", None)
    if isinstance(old, GridEmbeddingND):
        net.positional_embedding = GridCoordinates(old.in_channels, old.dim, old.grid_boundaries)
    return net


@torch.no_grad()
def field_statistics(u: Tensor, channels: int, ndim: int) -> tuple[Tensor, Tensor]:
    """Per-channel mean and standard deviation (at least 1e-6) of field samples, for a model's
    input normalisation.

    Parameters
    ----------
    u : Tensor, shape (N, T, C, *S) or (N, C, *S)
        Samples: the channels are the axis before the ``ndim`` spatial ones.
    channels : int
        ``C``.
    ndim : int
        Spatial dimension.

    Returns
    -------
    mean, std : Tensor, shape (C,)

    Raises
    ------
    ValueError
        Naming the shape where the channel axis does not hold ``C`` channels, and (outside
        `torch.compile`) the first entry that is not finite, which would make every
        statistic, and so every prediction, NaN.
    """
    axis = u.ndim - ndim - 1
    if axis < 1 or u.shape[axis] != channels:
        raise ValueError(f"u: expected {channels} channel(s) at axis {-ndim - 1}, after a sample axis, "
                         f"got shape {tuple(u.shape)}")
    if may_read_device():
        bad = ~torch.isfinite(u)
        if bad.any():
            raise ValueError(f"{first_entry('u', u, bad)}: field samples must be finite ({int(bad.sum())} entries are not)")
    flat = u.transpose(0, axis).reshape(channels, -1)
    return flat.mean(1), flat.std(1).clamp_min(1e-6)


class ParameterNormalizer(nn.Module):
    r"""Affine normalisation of raw physical parameters, optionally on a log scale.

    $\tilde\theta_i = (f_i(\theta_i) - \mu_i) / \sigma_i$ with $f_i = \log$ for parameters
    marked ``log_scale`` (positive quantities such as a diffusivity or viscosity spanning
    decades) and the identity otherwise. ``mu`` and ``sigma`` are buffers (saved with the
    model), set by `fit` from training data. Outside `torch.compile` and CUDA graph capture,
    `forward` and `fit` raise a `ValueError` that names the entry (``theta[i, j] = value``)
    where a parameter is not finite or a log-scaled one is not positive.

    Parameters
    ----------
    n_params : int
    log_scale : sequence of bool, optional
        Per parameter; default all False.
    """

    def __init__(self, n_params: int, log_scale: Sequence[bool] | None = None) -> None:
        super().__init__()
        log_scale = list(log_scale) if log_scale is not None else [False] * n_params
        if len(log_scale) != n_params:
            raise ValueError(f"log_scale: expected {n_params} flags, got {len(log_scale)}")
        self.n_params = n_params
        self.register_buffer("log_scale", torch.tensor(log_scale, dtype=torch.bool))
        self.register_buffer("mu", torch.zeros(n_params))
        self.register_buffer("sigma", torch.ones(n_params))

    def _transform(self, theta: Tensor) -> Tensor:
        if may_read_device():  # one device read: a NaN parameter would silently give a NaN model
            bad = ~torch.isfinite(theta) | ((theta <= 0) & self.log_scale)
            if bad.any():
                why = ("parameters must be finite" if not torch.isfinite(theta[bad][0])
                       else "a log-scaled parameter must be positive")
                raise ValueError(f"{first_entry('theta', theta, bad)}: {why}")
        theta = torch.where(self.log_scale, theta.clamp_min(1e-30).log(), theta)
        return theta

    @torch.no_grad()
    def fit(self, theta: Tensor) -> ParameterNormalizer:
        """Set ``mu`` and ``sigma`` from samples ``theta`` of shape ``(N, n_params)``."""
        t = self._transform(theta.to(self.mu))
        self.mu.copy_(t.mean(0))
        self.sigma.copy_(t.std(0, unbiased=False).clamp_min(1e-6) if len(t) > 1 else torch.ones_like(self.mu))
        return self

    def forward(self, theta: Tensor) -> Tensor:
        """Normalise ``theta`` of shape ``(B, n_params)``."""
        if theta.ndim != 2 or theta.shape[1] != self.n_params:
            raise ValueError(f"theta: expected shape (B, {self.n_params}), got {tuple(theta.shape)}")
        return (self._transform(theta.to(self.mu)) - self.mu) / self.sigma
