r"""Losses and metrics: nMSE, relative L2, group DRO and the training curriculum.

Group DRO with the log-sum-exp relaxation (the paper's objective):

$$
\mathcal{L}_{\text{DRO}} = \frac{1}{\tau} \log\Big(\frac{1}{|G|} \sum_{g \in G}
\exp\big(\tau\, \bar\ell_g\big)\Big), \qquad \bar\ell_g = \frac{1}{|g|}\sum_{i \in g} \ell_i,
$$

over the groups $G$ present in the batch. It lies between the mean and the maximum of the group
means, tends to the mean as $\tau \to 0$ and to the worst group as $\tau \to \infty$. Its gradient
weighs group $g$ by $\mathrm{softmax}_g(\tau \bar\ell)$.

The paper gives no $\tau$, and the formula is not scale-free: with normalised MSEs of $10^{-3}$ and
$\tau = 1$ the exponents differ by $10^{-3}$, so the objective equals the mean to a fraction of a
percent and every group weighs the same. With ``temperature="relative"`` the temperature is
measured in units of the current mean group loss
$\bar\ell = \frac{1}{|G|}\sum_g \bar\ell_g$ (held constant in the gradient):
$\tau_{\text{eff}} = \tau / \bar\ell$, so that a group whose loss is $r$ times the mean weighs
$e^{\tau (r - 1)}$ times a group at the mean, whatever the losses' scale.
``temperature="absolute"`` is the paper's formula as written, and the training loop's default:
the forms that weigh groups apart have not yet lowered the worst group's rollout error beyond
what separates two runs (the results' ``dro`` table).

The log-sum-exp weighs only the groups of one batch. Where every batch holds one boundary
configuration (the paper's Algorithm 1, `gno_ext.training.CurriculumBatchSampler`), groups that
differ by configuration never meet in a batch, and the batch objective cannot favour the worse
configuration: with groups by configuration alone it is the plain mean. `RunningGroupLosses`
keeps an estimate of every group's loss across batches (online group DRO, in the manner of
Sagawa et al., 2020): a batch's groups are then weighed by the same softmax, of their running
losses among all groups seen, so a configuration whose loss stays high gets larger steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gno_ext.checks import first_entry, is_integer, is_integer_dtype, may_read_device

__all__ = ["mse_per_sample", "nmse", "relative_l2", "group_sums", "dro_from_group_sums", "dro_group_weights",
           "group_dro_loss", "RunningGroupLosses", "bin_parameters", "Curriculum", "TEMPERATURES", "DRO_WEIGHTS"]

TEMPERATURES = ("relative", "absolute")
"""How the DRO temperature ``tau`` is read: ``"relative"``, in units of the inverse mean group
loss (scale-free); ``"absolute"``, in units of the inverse loss (the paper's formula as written)."""


def _check_pair(pred: Tensor, target: Tensor) -> None:
    if pred.shape != target.shape:
        raise ValueError(f"pred and target shapes differ: {tuple(pred.shape)} vs {tuple(target.shape)}")
    if pred.ndim < 2:
        raise ValueError(f"expected a batch (B, ...), got shape {tuple(pred.shape)}")


def mse_per_sample(pred: Tensor, target: Tensor) -> Tensor:
    """Mean squared error of each sample, shape ``(B,)``."""
    _check_pair(pred, target)
    return (pred - target).pow(2).flatten(1).mean(1)


def nmse(pred: Tensor, target: Tensor, eps: float = 1e-12) -> Tensor:
    r"""Normalised MSE per sample, $\|\hat u - u\|^2 / \|u - \bar u\|^2$, shape ``(B,)``.

    Sums run over every non-batch axis (a whole rollout: time, channels, space), $\bar u$ is the
    sample's mean over those axes.
    """
    _check_pair(pred, target)
    err = (pred - target).pow(2).flatten(1).sum(1)
    centred = target.flatten(1)
    var = (centred - centred.mean(1, keepdim=True)).pow(2).sum(1)
    return err / var.clamp_min(eps)


def relative_l2(pred: Tensor, target: Tensor, eps: float = 1e-12) -> Tensor:
    r"""Relative L2 error per sample, $\|\hat u - u\| / \|u\|$, shape ``(B,)``."""
    _check_pair(pred, target)
    return (pred - target).flatten(1).norm(dim=1) / target.flatten(1).norm(dim=1).clamp_min(eps)


def _host_checks(t: Tensor) -> bool:
    """Whether input checks that read tensor values may run: on CPU tensors, where
    `may_read_device` allows it (not under `torch.compile`). On a GPU each read would make the
    host wait for the device before it can queue the backward pass, so the training objective
    reads nothing there."""
    return t.device.type == "cpu" and may_read_device()


def group_sums(per_sample_loss: Tensor, groups: Tensor, n_groups: int | None = None) -> tuple[Tensor, Tensor]:
    """Per-group loss sums and sample counts, each of shape ``(n_groups,)``.

    These are what processes all-reduce before `dro_from_group_sums`, so that ``N`` processes
    optimise the objective of one process over the global batch. With ``n_groups`` given, no
    value is read on the host (group ids are checked on CPU tensors only); without it, the
    number of groups is read from ``groups``.
    """
    if per_sample_loss.ndim != 1 or groups.shape != per_sample_loss.shape:
        raise ValueError(f"per_sample_loss and groups: expected matching shapes (B,), got "
                         f"{tuple(per_sample_loss.shape)} and {tuple(groups.shape)}")
    if not is_integer_dtype(groups.dtype):
        raise ValueError(f"groups: expected integer group ids, got {groups.dtype}")
    if groups.numel() and (n_groups is None or _host_checks(groups)) and groups.min() < 0:
        raise ValueError("groups: ids must be >= 0")
    n = int(n_groups if n_groups is not None else (int(groups.max()) + 1 if groups.numel() else 0))
    if groups.numel() and _host_checks(groups) and groups.max() >= n:
        raise ValueError(f"groups: ids must be < n_groups = {n}, got {int(groups.max())}")
    sums = per_sample_loss.new_zeros(n).index_add(0, groups, per_sample_loss)
    counts = per_sample_loss.new_zeros(n).index_add(0, groups, torch.ones_like(per_sample_loss))
    return sums, counts


def _check_tau(tau: float, temperature: str = "absolute") -> None:
    if not (tau > 0 and math.isfinite(tau)):
        raise ValueError(f"tau: must be positive and finite, got {tau} (the objective tends to the worst group's "
                         "mean as tau grows; a large finite tau approaches it)")
    if temperature not in TEMPERATURES:
        raise ValueError(f"temperature: expected one of {', '.join(TEMPERATURES)}, got {temperature!r}")


def _group_means(sums: Tensor, counts: Tensor, tau: float,
                 temperature: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | float]:
    """The present groups' mask and count, their means (0 where absent), their mean, and the
    effective temperature (``tau``, or for ``"relative"`` a tensor: ``tau`` over the detached
    mean; no tensor is made from a number, which a CUDA graph's capture would refuse)."""
    _check_tau(tau, temperature)
    present = counts > 0
    if _host_checks(counts) and not present.any():
        raise ValueError("group DRO: no group has a sample")
    n = present.sum().to(sums.dtype)
    means = torch.where(present, sums / counts.clamp_min(1), 0)
    centre = means.sum() / n
    tau_eff: Tensor | float = tau
    if temperature == "relative":  # (a mean of 0: every group at 0, the deviations are 0 too)
        tau_eff = tau / centre.detach().clamp_min(torch.finfo(sums.dtype).tiny)
    return present, n, means, centre, tau_eff


def dro_from_group_sums(sums: Tensor, counts: Tensor, tau: float, temperature: str = "absolute") -> Tensor:
    """Log-sum-exp group DRO from group sums and counts; empty groups are left out of ``|G|``.

    Computed with masks, not by selecting the present groups, so that no value is read on the
    host (on a GPU the training step is queued without waiting; a CUDA graph can capture it).
    Where every deviation ``tau * (mean_g - centre)`` is below 1 in magnitude, the log of the
    mean of exponentials is taken through ``expm1``/``log1p``, free of the cancellation of
    ``logsumexp - log |G|``; otherwise through ``logsumexp``. With no group present the result
    is NaN (on CPU tensors, an error). ``temperature``: see `TEMPERATURES` (the module's text).
    """
    present, n, means, centre, tau_eff = _group_means(sums, counts, tau, temperature)
    dev = torch.where(present, tau_eff * (means - centre), 0)
    # both forms are computed and one is kept: the other's inputs are kept finite (clamped,
    # masked with -inf for logsumexp only), so that it passes no NaN into the gradient
    near = torch.log1p(torch.where(present, torch.expm1(dev.clamp(-1, 1)), 0).sum() / n)
    far = torch.logsumexp(torch.where(present, dev, -math.inf), 0) - torch.log(n)
    return centre + torch.where(dev.abs().amax() < 1, near, far) / tau_eff


@torch.no_grad()
def dro_group_weights(sums: Tensor, counts: Tensor, tau: float, temperature: str = "absolute") -> Tensor:
    r"""The weight of each group in the gradient of `dro_from_group_sums`, in units of the
    plain mean's: $|G|\,\partial \mathcal{L} / \partial \bar\ell_g$, ``|G| * softmax(tau_eff * means)``
    over the present groups, 0 for the absent ones. All ones is the plain mean over groups; the
    largest and smallest present weights tell how much the objective favours the worst groups.
    Reads no value on the host."""
    present, n, means, _, tau_eff = _group_means(sums, counts, tau, temperature)
    logits = torch.where(present, tau_eff * means, -math.inf)
    return torch.where(present, torch.softmax(logits, 0) * n, 0)


def group_dro_loss(per_sample_loss: Tensor, groups: Tensor, tau: float, temperature: str = "absolute") -> Tensor:
    r"""Group DRO loss of one batch (see the module docstring).

    Parameters
    ----------
    per_sample_loss : Tensor, shape (B,)
        Per-sample losses $\ell_i$ (e.g. `mse_per_sample`).
    groups : Tensor, shape (B,), long
        Group id of each sample.
    tau : float
        Temperature, positive and finite.
    temperature : {"absolute", "relative"}
        ``"absolute"`` (default): the paper's formula, ``tau`` in units of the inverse loss;
        ``"relative"``: ``tau`` divided by the batch's mean group loss (held constant in the
        gradient), the same emphasis on the worst groups at any loss scale.
    """
    sums, counts = group_sums(per_sample_loss, groups)
    return dro_from_group_sums(sums, counts, tau, temperature)


DRO_WEIGHTS = ("batch", "running")
"""Which group losses the DRO weights come from: ``"batch"``, the groups of the batch (the
log-sum-exp of `dro_from_group_sums`); ``"running"``, every group's running loss across batches
(`RunningGroupLosses`)."""


class RunningGroupLosses:
    r"""Every group's loss as a running estimate across batches, and the DRO weights it gives.

    `update` moves the estimate of each group present in a batch towards the batch's mean loss
    of that group, $\hat\ell_g \leftarrow (1 - r)\,\hat\ell_g + r\,\bar\ell_g$ (its first
    batch sets it), and leaves the others. `weights` is ``dro_group_weights`` of the estimates
    over the groups seen so far: ``|G| softmax(tau_eff * hat_l)``, mean 1 over them. The loss of a
    batch is then ``sum_i w_{g(i)} l_i / B``: the plain mean where every weight is 1.

    The state lives in two device tensors updated in place, so a step that uses it can be
    captured in a CUDA graph (`tensors` names them, for a capture to restore after its warm-up
    runs), and it round-trips through a checkpoint (`state_dict`). Under data parallelism pass
    the global batch's sums and counts, so every process keeps the same estimate.

    Parameters
    ----------
    n_groups : int
    rate : float
        The weight ``r`` of a batch in a group's estimate, in (0, 1].
    device : torch.device or str, optional
    """

    def __init__(self, n_groups: int, rate: float = 0.1, device: torch.device | str | None = None) -> None:
        if not is_integer(n_groups) or n_groups < 1:
            raise ValueError(f"n_groups: must be an integer >= 1, got {n_groups!r}")
        if not 0 < rate <= 1:
            raise ValueError(f"trainer.dro.rate: must lie in (0, 1], got {rate}")
        self.rate = float(rate)
        self.loss = torch.zeros(n_groups, device=device)
        self.seen = torch.zeros(n_groups, device=device)  # 1 for a group with an estimate (float: one dtype to save)

    def tensors(self) -> list[Tensor]:
        """The state, updated in place."""
        return [self.loss, self.seen]

    @torch.no_grad()
    def update(self, sums: Tensor, counts: Tensor) -> None:
        """Fold in one batch's group loss sums and counts (shape ``(n_groups,)``). Reads nothing
        on the host."""
        present = counts > 0
        means = sums.float() / counts.clamp_min(1)
        moved = torch.where(self.seen > 0, torch.lerp(self.loss, means, self.rate), means)
        self.loss.copy_(torch.where(present, moved, self.loss))
        self.seen.copy_(torch.where(present, 1.0, self.seen))

    def weights(self, tau: float, temperature: str = "relative") -> Tensor:
        """Each group's DRO weight from the estimates: mean 1 over the groups seen, 0 for the
        others (`dro_group_weights` with the estimates as one-sample groups)."""
        return dro_group_weights(self.loss, self.seen, tau, temperature)

    def state_dict(self) -> dict[str, list[float]]:
        return {"loss": self.loss.tolist(), "seen": self.seen.tolist()}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        """Restore `state_dict`'s lists; a list of another length raises a `ValueError`."""
        for name, t in (("loss", self.loss), ("seen", self.seen)):
            values = state[name]
            if len(values) != t.numel():
                raise ValueError(f"running DRO group losses: the checkpoint holds {len(values)} groups' {name}, "
                                 f"this run has {t.numel()} groups")
            t.copy_(torch.tensor(values, dtype=t.dtype))


def bin_parameters(theta: Tensor, edges: Sequence[Sequence[float]], boundary_type: Tensor | None = None,
                   n_boundary_types: int = 6) -> Tensor:
    """Group ids from continuous parameters: one bin per parameter, combined, per boundary type.

    On CPU tensors (outside `torch.compile`) a non-finite parameter or a boundary-type id
    outside ``[0, n_boundary_types)`` raises a `ValueError` that names it; GPU tensors are
    not read on the host.

    Parameters
    ----------
    theta : Tensor, shape (B, P)
        Raw parameters.
    edges : sequence of sequences of float, length P
        Increasing bin edges per parameter (values outside go to the first or last bin);
        ``len(edges[p]) - 1`` bins for parameter ``p``. Use log-spaced edges for parameters
        that span decades.
    boundary_type : Tensor, shape (B,), optional
        A boundary-type id per sample (e.g. the type of face 0): groups are then separate per
        type, as in the paper's curriculum.
    n_boundary_types : int
        Number of boundary-type ids.

    Returns
    -------
    Tensor, shape (B,), long
    """
    if theta.ndim != 2 or theta.shape[1] != len(edges):
        raise ValueError(f"theta: expected shape (B, {len(edges)}) to match edges, got {tuple(theta.shape)}")
    if theta.numel() and _host_checks(theta) and not torch.isfinite(theta).all():
        raise ValueError(f"{first_entry('theta', theta, ~torch.isfinite(theta))}: parameters must be finite to be binned")
    if boundary_type is not None and boundary_type.numel() and _host_checks(boundary_type) and (
            boundary_type.min() < 0 or boundary_type.max() >= n_boundary_types):
        raise ValueError(f"boundary_type: ids must lie in [0, n_boundary_types = {n_boundary_types}), got "
                         f"{int(boundary_type.min())} to {int(boundary_type.max())}")
    group = torch.zeros(theta.shape[0], dtype=torch.long, device=theta.device)
    for p, e in enumerate(edges):
        e_t = torch.as_tensor(e, dtype=theta.dtype, device=theta.device)
        if e_t.numel() < 2 or not (e_t[1:] > e_t[:-1]).all():  # (also where an edge is NaN)
            raise ValueError(f"edges[{p}]: expected at least two increasing edges, got {list(e)}")
        n_bins = e_t.numel() - 1
        idx = (torch.bucketize(theta[:, p].contiguous(), e_t[1:-1], right=True)).clamp(0, n_bins - 1)
        group = group * n_bins + idx
    if boundary_type is not None:
        group = boundary_type.long() * int(math.prod(len(e) - 1 for e in edges)) + group
    return group


@dataclass
class Curriculum:
    """The paper's two-stage curriculum (Algorithm 1): the objective of each epoch.

    For ``warmup_epochs`` epochs the loss is the plain mean of the per-sample losses (MSE),
    then group DRO with temperature ``tau``, read as ``temperature`` says (default
    ``"absolute"``, the paper's formula as written, as the training loop's
    ``trainer.dro.temperature``; ``"relative"``: in units of the inverse mean group loss). The
    training loop runs this object (from
    ``trainer.curriculum`` and ``trainer.dro``); its batches, each of one boundary
    configuration visited in turn, come from `gno_ext.training.CurriculumBatchSampler`, and on
    several processes it computes `loss` over the global batch
    (`gno_ext.training.objective.global_objective`, equal to `loss` in one process).

    Parameters
    ----------
    warmup_epochs : int
        ``P`` (paper: 70 of 100).
    tau : float
        DRO temperature.
    temperature : {"relative", "absolute"}
        How ``tau`` is read (`TEMPERATURES`).
    """

    warmup_epochs: int
    tau: float = 1.0
    temperature: str = "absolute"

    def __post_init__(self) -> None:
        if not is_integer(self.warmup_epochs) or self.warmup_epochs < 0:
            raise ValueError(f"warmup_epochs: must be an integer >= 0, got {self.warmup_epochs!r}")
        _check_tau(self.tau, self.temperature)

    def uses_dro(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` (counted from 0) trains with group DRO."""
        return epoch >= self.warmup_epochs

    def loss(self, per_sample_loss: Tensor, groups: Tensor, epoch: int) -> Tensor:
        """The objective of epoch ``epoch`` for one batch (in one process)."""
        if self.uses_dro(epoch):
            return group_dro_loss(per_sample_loss, groups, self.tau, self.temperature)
        return per_sample_loss.mean()
