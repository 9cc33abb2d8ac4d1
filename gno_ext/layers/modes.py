r"""Fourier transforms restricted to the retained modes, as dense real matrix products.

A spectral convolution keeps a few modes of each axis (12 of 128, say) and discards the rest:
most of a full FFT's work, and of the zero-filled spectrum its inverse reads, is thrown away.
Here the forward transform computes the kept modes only, and the inverse builds the field from
them directly:

$$
\hat u_k = s \sum_{n=0}^{N-1} u_n\, e^{-2\pi i k n / N}, \qquad
u_n = s' \sum_{k \in K} c_k\, \hat u_k\, e^{2\pi i k n / N},
$$

one axis at a time: first the last axis (real to complex, the largest reduction), then the
others. Each axis is one matrix product whose operands hold the real and imaginary parts side
by side: the real signal times ``[cos | -sin]`` (``(N, 2m)``) on the last axis, and on a
complex axis ``[re | im]`` times the real form of the complex matrix, ``[[cos, -sin], [sin,
cos]]`` (``(2N, 2m)``; its transpose's counterpart for the inverse), rather than four products
with ``(N, m)`` blocks. The work is the same; the products are a quarter as many, and their
inner and outer sizes ``2m`` are multiples of 8 where ``m`` is a multiple of 4 (12, 16 modes),
which tensor-core matrix kernels want (with 12 modes an ``(N, 12)`` block left rows of 24
bytes, which took the slow unaligned kernels). The scales
$s, s'$ follow ``norm`` as in `torch.fft`, and on the last axis, the half-spectrum of a real
signal, $c_k = 2$ except at frequency 0 and the Nyquist frequency, as ``irfft`` counts them.
The products are ordinary matrix products of real tensors: under autocast they run in bf16 on
tensor cores, and ``torch.compile`` fuses the data movement around them (its GPU code has no
complex types). Spectra travel as real tensors whose last axis holds (real, imaginary).

The kept frequencies of an axis, in the order of neuraloperator's weights: the last axis
``0 .. m-1``; every other axis ``-(m // 2) .. m - m // 2 - 1`` (increasing, the order of the
``fftshift``-ed spectrum).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["kept_frequencies", "to_modes", "from_modes", "contract_modes"]

NORMS = ("forward", "backward", "ortho")


def kept_frequencies(kept: int, last: bool) -> list[int]:
    """The integer frequencies of ``kept`` retained modes of one axis (see the module's text)."""
    return list(range(kept)) if last else list(range(-(kept // 2), kept - kept // 2))


def _scale(n: int, norm: str, inverse: bool) -> float:
    if norm not in NORMS:
        raise ValueError(f"norm: expected one of {', '.join(NORMS)}, got {norm!r}")
    if norm == "ortho":
        return 1 / math.sqrt(n)
    return 1 / n if (norm == "forward") != inverse else 1.0


def _cos_sin(n: int, kept: int, last: bool, like: Tensor) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of ``2 pi k n / N`` for the ``kept`` frequencies ``k`` of an axis
    (`kept_frequencies`), shape ``(N, kept)``, on ``like``'s device, float64 for a float64
    ``like`` and float32 otherwise (autocast lowers the products where it is on). The product
    ``k n`` is reduced modulo ``N`` in integers first, so that the angle is exact to the type's
    precision. Made by device operations alone (no copy from the host), which a CUDA graph can
    capture."""
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    k = torch.arange(kept, device=like.device) - (0 if last else kept // 2)
    angle = (torch.outer(torch.arange(n, device=like.device), k) % n).to(dtype) * (2 * math.pi / n)
    return torch.cos(angle), torch.sin(angle)


def _complex_along(re: Tensor, im: Tensor, axis: int, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """``(re + i im)(cos + i sin)`` along ``axis``: the product of ``re + i im`` (the axis of
    length ``n``) with the complex ``(n, m)`` matrix ``cos + i sin``, whose axis becomes ``m``
    long. One real product: ``[re | im]`` times ``[[cos, sin], [-sin, cos]]``."""
    m = cos.shape[1]
    both = torch.cat([re.movedim(axis, -1), im.movedim(axis, -1)], -1)  # (..., 2n)
    out = both @ torch.cat([torch.cat([cos, sin], 1), torch.cat([-sin, cos], 1)], 0)  # (..., 2m)
    return out[..., :m].movedim(-1, axis), out[..., m:].movedim(-1, axis)


def to_modes(x: Tensor, kept: Sequence[int], norm: str = "forward") -> Tensor:
    """The retained modes of the real field ``x`` of shape ``(B, C, *S)``: what
    ``rfftn(x, norm=norm)`` holds at the kept frequencies of every axis (``kept[d]`` of axis
    ``d``, the last axis its first ``kept[-1]``), shape ``(B, C, *kept, 2)`` (real, imaginary).

    Each ``kept[d]`` may be at most ``S[d]`` (the last axis: ``S[-1] // 2 + 1``)."""
    sizes = x.shape[2:]
    _check_kept(sizes, kept)
    n, m = sizes[-1], kept[-1]
    cos, sin = _cos_sin(n, m, True, x)
    both = x @ (torch.cat([cos, -sin], 1) * _scale(n, norm, inverse=False))  # e^{-i theta} = cos - i sin
    re, im = both[..., :m], both[..., m:]
    for d in range(len(sizes) - 2, -1, -1):  # the other axes, complex to complex
        n, m = sizes[d], kept[d]
        cos, sin = _cos_sin(n, m, False, x)
        s = _scale(n, norm, inverse=False)
        re, im = _complex_along(re, im, 2 + d, cos * s, -sin * s)  # e^{-i theta} = cos - i sin
    return torch.stack([re, im], -1)


def from_modes(modes: Tensor, sizes: Sequence[int], norm: str = "forward") -> Tensor:
    """The real field of shape ``(B, C, *sizes)`` whose spectrum holds ``modes`` (``(B, C,
    *kept, 2)``, as `to_modes` gives them) at the kept frequencies and zero elsewhere: what
    ``irfftn`` of that zero-filled half-spectrum gives, with ``s=sizes`` and ``norm``."""
    kept = modes.shape[2:-1]
    _check_kept(sizes, kept)
    order = len(sizes)
    re, im = modes[..., 0], modes[..., 1]
    for d in range(order - 1):  # complex to complex along the other axes: e^{+i theta}
        n, m = sizes[d], kept[d]
        cos, sin = _cos_sin(n, m, False, modes)
        s = _scale(n, norm, inverse=True)
        re, im = _complex_along(re, im, 2 + d, cos.T * s, sin.T * s)  # (m, n): e^{+i theta}
    n, m = sizes[-1], kept[-1]
    cos, sin = _cos_sin(n, m, True, modes)
    # each kept frequency's weight in the real sum: 2 for a frequency standing for its conjugate too,
    # 1 for zero and for Nyquist, which are their own (made on the device: no host copy, capturable)
    k = torch.arange(m, device=modes.device)
    own = (k == 0) | (k == n // 2) if n % 2 == 0 else k == 0
    twice = 2 - own.to(cos.dtype)
    s = _scale(n, norm, inverse=True)
    # c_k Re((re + i im) e^{i theta}) = c_k (re cos - im sin)
    return torch.cat([re, im], -1) @ (torch.cat([cos.T * twice[:, None], -sin.T * twice[:, None]], 0) * s)


def contract_modes(modes: Tensor, weights: Tensor) -> Tensor:
    """Every kernel on every sample, mode by mode: ``out[b, k, o] = sum_i modes[b, i] *
    weights[k, i, o]`` in complex arithmetic, at each kept mode.

    Parameters
    ----------
    modes : Tensor, shape (B, I, *kept, 2)
    weights : Tensor, shape (K, I, O, *kept, 2)

    Returns
    -------
    Tensor, shape (B, K, O, *kept, 2)
    """
    batch, n_in = modes.shape[:2]
    k, _, n_out = weights.shape[:3]
    kept = modes.shape[2:-1]
    n_modes = math.prod(kept)
    x = modes.reshape(batch, n_in, n_modes, 2).permute(2, 0, 3, 1).reshape(n_modes, batch, 2 * n_in)  # [re | im]
    w = weights.reshape(k, n_in, n_out, n_modes, 2).permute(3, 1, 0, 2, 4)  # (modes, I, K, O, 2)
    wr, wi = w[..., 0].reshape(n_modes, n_in, k * n_out), w[..., 1].reshape(n_modes, n_in, k * n_out)
    # (xr + i xi)(wr + i wi) = (xr wr - xi wi) + i (xr wi + xi wr): one batched product over the modes
    block = torch.cat([torch.cat([wr, wi], 2), torch.cat([-wi, wr], 2)], 1)  # (modes, 2I, 2KO)
    out = torch.bmm(x, block).reshape(n_modes, batch, 2, k, n_out)  # (.., re/im, K, O)
    return out.permute(1, 3, 4, 0, 2).reshape(batch, k, n_out, *kept, 2)


def _check_kept(sizes: Sequence[int], kept: Sequence[int]) -> None:
    if len(sizes) != len(kept):
        raise ValueError(f"kept modes: {len(kept)} axes for a field of {len(sizes)} ({tuple(kept)} for {tuple(sizes)})")
    limits = [*sizes[:-1], sizes[-1] // 2 + 1]
    for d, (m, top) in enumerate(zip(kept, limits)):
        if not 1 <= m <= top:
            raise ValueError(f"kept modes of axis {d}: {m}, but a field of size {sizes[d]} has at most {top} "
                             f"({'a real half-spectrum' if d == len(sizes) - 1 else 'all its frequencies'})")
