r"""The GNO on neuraloperator's FNO backbone: parameter-gated spectral kernels and the boundary
transfer operator in every layer of an ``FNO``.

The method's two parts, moved from the ViT backbone of `GNO` to a grid backbone:

* **The gate and the kernel mixture.** Each Fourier layer holds ``K`` spectral kernels
  (`GatedSpectralConv`); a `ParameterGate` on the normalised parameters (and the mean and RMS
  of each field-parameter channel, as in `GNO`) selects one per sample, and only that kernel's
  weights act on the sample (with ``soft_routing``, the kernels are mixed by the gate's
  probabilities instead: a variant, not the paper's form).
* **The boundary transfer operator.** Before each Fourier layer, the latent field's cells along
  each face are averaged over segments of ``boundary_patch`` cells; with the boundary
  description of each segment (type, face, data at the input and target times, Robin
  coefficients, position) they go through `BoundaryTransfer`, which returns one latent
  Dirichlet vector $h_\ell$ per segment. On the ViT, these vectors are keys and values of
  the attention kernels. A grid backbone has no tokens to attend to, so here they are
  written into the latent field as its boundary layer: each segment's vector is added to
  the cells of its segment and to the ``boundary_depth`` cells behind them along the face's
  normal, weighted by a learnt profile over the depth (initialised to decay as $e^{-d}$).
  The Fourier layer that follows spreads this boundary information over the domain.

The model also receives what neuraloperator's FNO baseline (`fno`) receives: the input frames,
the normalised parameters broadcast as channels and the field parameters, so that with one
kernel and no boundary transfer it is that FNO without its boundary channels (the ablations).
With ``parameter_channels=False`` it reads the parameters through its gates alone, as
`GatedFNO` does (an ablation that separates the gate from those input channels).
With ``domain_padding`` > 0 the latent field is padded with zeros on every side before the
Fourier layers and cropped after them (neuraloperator's domain padding), so that the Fourier
transform does not join opposite faces; the boundary layer is written at the faces of the
physical domain, inside the padding.
Shapes are static and nothing is read on the host during a forward or backward pass, so the
training step can be captured in a CUDA graph (``trainer.capture=true``).

Requires the optional dependency ``neuraloperator``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gno_ext.layers.boundary import BoundaryTransfer, boundary_features
from gno_ext.layers.spectral import GatedSpectralConv, condition_on
from gno_ext.models.base import SchemaModel, neuralop_fno
from gno_ext.models.registry import register_model
from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch

__all__ = ["GNOFNO", "BoundaryLayer"]


class BoundaryLayer(nn.Module):
    r"""The boundary transfer operator on a grid: face cells in, a boundary layer out.

    Parameters
    ----------
    channels : int
        Channels of the latent field.
    ndim : int
        Spatial dimensions.
    patch : int
        Cells per boundary segment along each face axis (one `BoundaryTransfer` token each).
    depth : int
        Cells behind the face that the segment's vector is written into.
    periodic : bool
        Write a layer at periodic faces too (default). False writes none there: a periodic
        face is no boundary, only where the grid's indexing wraps around, and a layer written
        along it marks a line of the domain as special where the problem has none.
    """

    def __init__(self, channels: int, ndim: int, patch: int, depth: int, periodic: bool = True) -> None:
        super().__init__()
        for name, value in (("patch", patch), ("depth", depth)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"boundary_{name}: must be an integer >= 1, got {value!r}")
        self.ndim, self.patch, self.depth, self.periodic = ndim, patch, depth, periodic
        self.transfer = BoundaryTransfer(channels, ndim)
        self.profile = nn.Parameter(torch.exp(-torch.arange(depth, dtype=torch.float32)))

    def face_cells(self, h: Tensor) -> Tensor:
        """The latent state next to each boundary segment, ``(B, M, C)``, in the order of
        `boundary_features`: face by face, segments row-major over the face's axes."""
        out = []
        for face in range(2 * self.ndim):
            axis = face // 2
            layer = h.select(2 + axis, 0 if face % 2 == 0 else h.shape[2 + axis] - 1)  # (B, C, *face)
            if self.ndim == 1:  # a point: one token
                out.append(layer[:, None])
                continue
            out.append(_pool(layer, self.patch).flatten(2).transpose(1, 2))
        return torch.cat(out, 1)

    def forward(self, h: Tensor, features: tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
        """The boundary layer to add to ``h`` (B, C, *S), from the `boundary_features` of the batch."""
        tokens = self.transfer(features, self.face_cells(h))  # (B, M, C)
        if not self.periodic:  # no layer at periodic faces (a mask: the shapes stay static)
            tokens = tokens * (features[1] != BCType.PERIODIC).unsqueeze(-1).to(tokens.dtype)  # kinds (B, M)
        sizes = h.shape[2:]
        profile = self.profile.to(h.dtype)
        layer = h.new_zeros(h.shape)
        start = 0
        for face in range(2 * self.ndim):
            axis = face // 2
            other = [n for a, n in enumerate(sizes) if a != axis]
            segments = [n // self.patch for n in other]  # none in 1-D: a face is a point
            count = math.prod(segments)
            vec = tokens[:, start:start + count].transpose(1, 2).reshape(h.shape[0], h.shape[1], *segments)
            start += count
            for a in range(self.ndim - 1):  # each segment's vector over its cells
                vec = vec.repeat_interleave(self.patch, dim=2 + a)
            depth = min(self.depth, sizes[axis])
            weights = profile[:depth] if face % 2 == 0 else profile[:depth].flip(0)
            slab = vec.unsqueeze(2 + axis) * weights.view(*([1] * (2 + axis)), depth, *([1] * (self.ndim - 1 - axis)))
            pad = [0, 0] * self.ndim  # F.pad lists the last axis first
            pad[2 * (self.ndim - 1 - axis) + (1 if face % 2 == 0 else 0)] = sizes[axis] - depth
            layer = layer + F.pad(slab, pad)
        return layer


def _pool(layer: Tensor, patch: int) -> Tensor:
    """Average over ``patch`` cells along each face axis of ``layer`` (B, C, *face)."""
    return F.avg_pool1d(layer, patch) if layer.ndim == 3 else F.avg_pool2d(layer, patch)


@register_model("gno_fno")
class GNOFNO(SchemaModel):
    r"""The GNO on neuraloperator's FNO: gated spectral kernels and the boundary transfer
    operator in every Fourier layer (see the module's description).

    Parameters
    ----------
    in_channels, n_params, field_channels, ndim, t_in, log_params
        As `SchemaModel` (read from the data by the recipes).
    n_modes : int
        Fourier modes kept on each axis.
    hidden_channels, n_layers : int
        FNO width and number of Fourier layers.
    n_kernels : int
        Spectral kernels per layer; 1 disables the mixture (ablation).
    gate_hidden : int
        Hidden width of each gate's score MLP.
    boundary_transfer : bool
        False disables the boundary operator (ablation).
    boundary_patch : int
        Cells per boundary segment (each grid axis must be divisible by it).
    boundary_depth : int
        Cells behind a face that its boundary layer reaches.
    parameter_channels : bool
        Give the FNO the parameters and field parameters as input channels (default); False
        leaves them to the gates alone (ablation; needs ``n_kernels`` > 1 to see them at all).
    domain_padding : float
        Fraction of each axis's cells added as zeros on both sides of the latent field for the
        Fourier layers (0, the default: none). For non-periodic boundaries.
    shared_kernel : bool
        Each layer's kernels as a shared kernel plus a residual per kernel, the residuals starting
        at zero (`GatedSpectralConv`'s ``shared_kernel``). Default False.
    periodic_boundary_layer : bool
        Write the boundary layer at periodic faces too (default True). False leaves periodic
        faces alone (`BoundaryLayer`'s ``periodic``): on a periodic domain the model is then
        the FNO with the gated kernels.
    soft_routing : bool
        Mix each layer's kernels by the gate's probabilities instead of selecting one per
        sample (`GatedSpectralConv`'s ``soft_routing``): each sample's kernel is then a smooth
        function of its parameters. Default False: the paper's hard choice.
    fourier : {"dft", "fft"}
        The spectral convolutions' transforms (`gno_ext.layers.spectral.TRANSFORMS`): the
        retained modes alone (default) or the full FFT.
    activations : {"float32", "autocast"}
        The activations' type between the layers under autocast (`gno_ext.layers.spectral.ACTIVATIONS`):
        float32 as neuraloperator's blocks give it (default), or the autocast type.
    checkpoint_blocks : bool
        Recompute the FNO's blocks in the backward pass instead of keeping their activations
        (`gno_ext.layers.spectral.checkpoint_blocks`): less GPU memory for a second forward pass
        of each block, the same values and gradients. Default False.
    """

    def __init__(self, in_channels: int = 1, n_params: int = 1, field_channels: int = 0, ndim: int = 2, t_in: int = 1,
                 log_params: Sequence[bool] | None = None, n_modes: int = 12, hidden_channels: int = 64,
                 n_layers: int = 4, n_kernels: int = 4, gate_hidden: int = 32, boundary_transfer: bool = True,
                 boundary_patch: int = 16, boundary_depth: int = 4, parameter_channels: bool = True,
                 domain_padding: float = 0.0, shared_kernel: bool = False,
                 periodic_boundary_layer: bool = True, soft_routing: bool = False, fourier: str = "dft",
                 activations: str = "float32", checkpoint_blocks: bool = False) -> None:
        super().__init__(in_channels, n_params, field_channels, ndim, t_in, log_params)
        for name, value, least in (("n_modes", n_modes, 1), ("hidden_channels", hidden_channels, 1),
                                   ("n_layers", n_layers, 1), ("n_kernels", n_kernels, 1), ("gate_hidden", gate_hidden, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name}: must be an integer >= {least}, got {value!r}")
        if isinstance(domain_padding, bool) or not isinstance(domain_padding, (int, float)) \
                or not 0 <= domain_padding < 1:
            raise ValueError(f"domain_padding: must be a fraction in [0, 1), got {domain_padding!r}")
        self.domain_padding = float(domain_padding)
        self.gate_inputs = n_params + 2 * field_channels
        if n_kernels > 1 and self.gate_inputs == 0:
            raise ValueError(f"n_kernels={n_kernels}: the gate needs parameters (n_params or field_channels > 0)")
        self.n_kernels, self.boundary_patch, self.shared_kernel = n_kernels, boundary_patch, bool(shared_kernel)
        self.periodic_boundary_layer, self.soft_routing = bool(periodic_boundary_layer), bool(soft_routing)
        self.takes_parameter_channels = parameter_channels
        conv = functools.partial(GatedSpectralConv, n_kernels=n_kernels, n_params=max(self.gate_inputs, 1),
                                 gate_hidden=gate_hidden, shared_kernel=shared_kernel, soft_routing=soft_routing,
                                 fourier=fourier)
        channels = t_in * in_channels + (n_params + field_channels if parameter_channels else 0)
        self.net = neuralop_fno(ndim, n_modes, channels, in_channels, hidden_channels, n_layers,
                                activations=activations, conv_module=conv, checkpoint_blocks=checkpoint_blocks)
        self.boundary = nn.ModuleList(BoundaryLayer(hidden_channels, ndim, boundary_patch, boundary_depth,
                                                    periodic_boundary_layer)
                                      for _ in range(n_layers)) if boundary_transfer else None

    def forward(self, u_in: Tensor | PDEBatch, theta: Tensor | None = None, theta_field: Tensor | None = None,
                bc: BoundarySpec | None = None, grid: Grid | None = None) -> Tensor:
        """Next frame ``(B, 1, C, *S)``.

        Parameters
        ----------
        u_in : Tensor, shape (B, T_in, C, *S), or PDEBatch
        theta : Tensor, shape (B, n_params)
        theta_field : Tensor, shape (B, field_channels, *S), optional
        bc : BoundarySpec, optional
            ``values[:, :, 0]`` is read as the data at the input time and ``values[:, :, -1]``
            as the data at the target time. Default: all faces periodic.
        grid : Grid, optional
        """
        u_in, theta, theta_field, bc, grid = self.inputs(u_in, theta, theta_field, bc, grid)
        x = self.normalized_input(u_in)
        h = torch.cat([x, *self.parameter_channels(x, theta, theta_field)], 1) if self.takes_parameter_channels else x
        features = None
        if self.boundary is not None:
            bad = [n for n in grid.shape if n % self.boundary_patch]
            if bad:
                raise ValueError(f"grid {grid.shape}: every axis must be divisible by boundary_patch="
                                 f"{self.boundary_patch} (the boundary segments)")
            features = boundary_features(bc, grid, self.boundary_patch, self.u_std.mean())
        net = self.net
        # the gates read the normalised parameters and each field channel's mean and RMS, as the GNO's
        gate_input = self.condition(theta, theta_field, bc, x.shape[0], x.dtype, use_boundary=False)
        with condition_on(net, gate_input):
            if net.positional_embedding is not None:
                h = net.positional_embedding(h)
            h = net.lifting(h)
            pads = [round(self.domain_padding * n) for n in h.shape[2:]]
            pad = [p for n in reversed(pads) for p in (n, n)]  # F.pad lists the last axis first
            inside = (Ellipsis, *(slice(p, p + n) for p, n in zip(pads, h.shape[2:])))
            grow = functools.partial(F.pad, pad=pad) if any(pads) else (lambda t: t)  # no copy unpadded
            h = grow(h)
            for layer in range(net.n_layers):
                if features is not None:
                    h = h + grow(self.boundary[layer](h[inside], features))
                h = net.fno_blocks(h, layer)
            delta = net.projection(h[inside])
        return self.increment(u_in, delta)

    def routing_index(self) -> list[Tensor]:
        """Each layer's selected kernel per sample in the latest forward pass."""
        return [m.last_routing.index for m in self.modules() if isinstance(m, GatedSpectralConv)
                and m.last_routing is not None]

    def extra_repr(self) -> str:
        return (f"n_kernels={self.n_kernels}, boundary_transfer={self.boundary is not None}, "
                f"domain_padding={self.domain_padding}, shared_kernel={self.shared_kernel}, "
                f"periodic_boundary_layer={self.periodic_boundary_layer}, soft_routing={self.soft_routing}")
