"""How much of a dataset's frame-to-frame change lies beyond the Fourier modes a spectral layer keeps.

    python recipes/spectral_cut.py [--preset advection-param] [--size bench] [--modes 6 12 24]
                                   [--trajectories 16] [--split test]

A neuraloperator ``SpectralConv`` with ``n_modes=m`` acts on the frequencies ``-m//2 ... m - m//2 - 1``
of each axis but the last, and on ``0 ... m//2`` of the last (its real FFT); nothing else of the
field passes through its spectral weights. For frames ``u_{t-1} -> u_t`` of trajectories solved
afresh from the preset (spread evenly over the split), the script prints, per step ``t``, the mean
over the trajectories of

* ``above cut``: the nMSE of ``u_t`` projected onto the kept modes against ``u_t``, the share of
  the frame's variance beyond the cut;
* ``cut step``: the nMSE of ``u_{t-1} + P(u_t - u_{t-1})`` against ``u_t``, a step that is exact on
  the kept modes and leaves the rest of the field as it was;
* ``persistence``: the nMSE of ``u_{t-1}`` against ``u_t``.

A model built of spectral layers alone cannot beat ``cut step`` on a step that moves fine scales;
its pointwise path (the FNO's skip connections) can recover some of what lies beyond the cut. The
nMSE is the benchmark's: the squared error over the squared deviation of the target from its mean.
"""

from __future__ import annotations

import argparse

import torch
from torch import Tensor

from gno_ext.data.presets import get_preset
from gno_ext.data.simulate import simulate
from gno_ext.losses import nmse
from gno_ext.solvers.spectral import frequency_indices


def kept_modes_mask(shape: tuple[int, ...], n_modes: int) -> Tensor:
    """Boolean mask over ``torch.fft.rfftn`` of a field of spatial ``shape``: the modes a
    ``SpectralConv(n_modes=(n_modes,) * len(shape))`` keeps."""
    if n_modes < 1:
        raise ValueError(f"n_modes={n_modes}: must be at least 1")
    *first, last = frequency_indices(shape)
    mask = last <= n_modes // 2
    for freq in first:
        mask = mask & (freq >= -(n_modes // 2)) & (freq <= n_modes - n_modes // 2 - 1)
    # a real field's frequencies k and -k are one mode: in the columns of last frequency 0 (and
    # the last axis' Nyquist frequency), where the half spectrum holds both, the layer keeps the
    # pair when it keeps either of them
    for column in {0, shape[-1] // 2} if shape[-1] % 2 == 0 else {0}:
        plane = mirrored = mask[..., column]
        for dim, size in enumerate(shape[:-1]):
            mirrored = mirrored.index_select(dim, (-torch.arange(size)) % size)
        mask[..., column] = plane | mirrored
    return mask


def project(u: Tensor, n_modes: int, ndim: int = 2) -> Tensor:
    """``u`` (..., *S), ``ndim`` spatial axes last, with every Fourier mode that a
    ``SpectralConv(n_modes)`` drops set to zero."""
    shape = tuple(u.shape[-ndim:])
    dims = tuple(range(-ndim, 0))
    spectrum = torch.fft.rfftn(u, dim=dims)
    return torch.fft.irfftn(spectrum * kept_modes_mask(shape, n_modes), s=shape, dim=dims)


def cut_errors(u: Tensor, n_modes: int) -> dict[str, list[float]]:
    """Per step of the trajectories ``u`` (B, T, C, H, W): ``above cut``, ``cut step`` and
    ``persistence`` (see the module's docstring), each the mean over the batch."""
    if u.dim() != 5:
        raise ValueError(f"u: expected (B, T, C, H, W), got shape {tuple(u.shape)}")
    out: dict[str, list[float]] = {"above cut": [], "cut step": [], "persistence": []}
    for t in range(1, u.shape[1]):
        before, after = u[:, t - 1], u[:, t]
        out["above cut"].append(nmse(project(after, n_modes), after).mean().item())
        out["cut step"].append(nmse(before + project(after - before, n_modes), after).mean().item())
        out["persistence"].append(nmse(before, after).mean().item())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="advection-param")
    parser.add_argument("--size", default="bench")
    parser.add_argument("--split", default="test")
    parser.add_argument("--modes", type=int, nargs="+", default=[6, 12, 24])
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="steps printed (from the first frame)")
    args = parser.parse_args()
    preset = get_preset(args.preset)
    if preset.ndim != 2:
        raise SystemExit(f"{args.preset}: a {preset.ndim}-D preset; this script reads 2-D fields")
    trajectories = preset.trajectories(args.size, args.split)
    stride = max(len(trajectories) // args.trajectories, 1)
    chosen = trajectories[::stride][: args.trajectories]
    by_kind: dict[str, list] = {}
    for t in chosen:
        by_kind.setdefault(t.boundary, []).append(t)
    u = torch.cat([simulate(preset, group, args.size).u for group in by_kind.values()]).double()
    print(f"{args.preset} ({args.size}, {args.split}): {len(chosen)} trajectories, grid {tuple(u.shape[-2:])}")
    print("| modes | step | above cut | cut step | persistence |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n_modes in args.modes:
        errors = cut_errors(u[:, : args.steps + 1], n_modes)
        for t in range(len(errors["cut step"])):
            print(f"| {n_modes} | {t + 1} | {errors['above cut'][t]:.4f} | {errors['cut step'][t]:.4f} | "
                  f"{errors['persistence'][t]:.4f} |")


if __name__ == "__main__":
    main()
