r"""The parameter gate: a score MLP over PDE parameters with a hard arg-max choice.

$$
\tilde g_k(\theta) = \operatorname{softmax}_k s_k(\theta), \qquad
g_k(\theta) = [k = \arg\max_j \tilde g_j(\theta)] .
$$

Gradient path through the hard choice (straight-through): the selected kernel's output is
multiplied by $w = (\tilde g_{k^*} - \operatorname{sg}(\tilde g_{k^*})) + 1$, which is exactly 1
in the forward pass (so a sample's output *is* its kernel's output) and has derivative 1 with
respect to $\tilde g_{k^*}$ in the backward pass, so the score MLP learns to raise the
probability of kernels that lower the loss and to lower it for those that do not.

Guards against collapse onto one kernel: the Switch-Transformer load-balance term
$K \sum_k f_k P_k$ (``f_k``: fraction of the batch routed to ``k``; ``P_k``: mean probability of
``k``; equal to 1 for a uniform load), returned with every routing for the training loss, and
optional Gaussian noise on the scores during training.

The load-balance terms reach the training loss explicitly: the forward pass runs inside
`balance_losses`, which collects the term of every gate (and router) that runs within it::

    with balance_losses() as terms:
        y = model(u, theta=theta, bc=bc)
    loss = mse(y, target) + 0.01 * torch.stack(terms).sum()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gno_ext.checks import require_at_least
from gno_ext.layers.routing import one_hot

__all__ = ["ParameterGate", "Routing", "balance_losses", "gate_input", "plan_all", "record_balance_loss", "route_all"]

_COLLECTORS: list[list[Tensor]] = []  # the lists of the open `balance_losses` blocks, innermost last


@contextlib.contextmanager
def balance_losses() -> Iterator[list[Tensor]]:
    """Collect the load-balance terms (0-d tensors, in the graph) of every gate and router that
    runs within the block, in the order they run, into the list it yields. Outside such a block
    the gates record nothing. Blocks nest: a term goes to the innermost one. Works in compiled
    models (the compiled code appends the same terms) and in steps captured in CUDA graphs (the
    terms are computed inside the graph)."""
    terms: list[Tensor] = []
    _COLLECTORS.append(terms)
    try:
        yield terms
    finally:
        _COLLECTORS.pop()


def record_balance_loss(term: Tensor) -> None:
    """Hand a load-balance term to the innermost open `balance_losses` block, if any (for
    routers of one's own; `ParameterGate` and `route_all` do it themselves)."""
    if _COLLECTORS:
        _COLLECTORS[-1].append(term)


@dataclass
class Routing:
    """The gate's decision for a batch.

    Attributes
    ----------
    probs : Tensor, shape (B, K)
        Softmax probabilities $\\tilde g$.
    index : Tensor, shape (B,), long
        Selected kernel per sample.
    weight : Tensor, shape (B,)
        Straight-through gate value of the selected kernel (exactly 1 in the forward pass).
    balance_loss : Tensor, shape ()
        Load-balance term (1 for a uniform load, ``K`` when all samples pick one kernel), also
        handed to the open `balance_losses` block.
    """

    probs: Tensor
    index: Tensor
    weight: Tensor
    balance_loss: Tensor
    plan: tuple[Tensor, list[int], Tensor] | None = None

    def make_plan(self, counts: list[int] | None = None) -> tuple[Tensor, list[int], Tensor]:
        """Order of the batch by kernel: ``(perm, counts, inverse)``.

        ``perm`` sorts samples by selected kernel, ``counts[k]`` is the number of samples of
        kernel ``k`` (a host list: the one synchronisation of a dispatch; pass ``counts`` to
        reuse a list fetched for several routings at once) and ``inverse`` undoes ``perm``.
        """
        if self.plan is None:
            if counts is None:
                counts = torch.bincount(self.index, minlength=self.probs.shape[1]).tolist()
            perm = torch.argsort(self.index, stable=True)
            self.plan = (perm, counts, torch.argsort(perm))
        return self.plan


class ParameterGate(nn.Module):
    r"""Score MLP $s(\theta)$ with softmax probabilities and a hard arg-max.

    Parameters
    ----------
    n_params : int
        Size of the (normalised) parameter vector the gate reads.
    n_kernels : int
        Number of kernels ``K`` to choose from.
    hidden : int
        Hidden width of the score MLP (paper: 32).
    noise_std : float
        Standard deviation of Gaussian noise added to the scores in training mode only.

    Examples
    --------
    >>> gate = ParameterGate(n_params=1, n_kernels=4)
    >>> routing = gate(torch.rand(8, 1))
    >>> routing.probs.shape, routing.index.shape
    (torch.Size([8, 4]), torch.Size([8]))
    """

    def __init__(self, n_params: int, n_kernels: int, hidden: int = 32, noise_std: float = 0.0) -> None:
        super().__init__()
        if n_params < 1:
            raise ValueError(f"n_params: the gate needs at least one input, got {n_params}")
        require_at_least(1, n_kernels=n_kernels, hidden=hidden)
        require_at_least(0, noise_std=noise_std)
        self.n_params, self.n_kernels, self.noise_std = n_params, n_kernels, noise_std
        self.score = nn.Sequential(nn.Linear(n_params, hidden), nn.GELU(), nn.Linear(hidden, n_kernels))

    def forward(self, theta: Tensor) -> Routing:
        r"""Route a batch.

        Parameters
        ----------
        theta : Tensor, shape (B, n_params)
            Normalised parameters (and pooled field features, if any).
        """
        _check_input(theta, self.n_params)
        return _route(self.score(theta), [self])[0]


def gate_input(theta: Tensor | None, theta_field: Tensor | None, ndim: int) -> Tensor | None:
    """What the gates of gno_ext's models read: the normalised parameters ``theta`` (B, P), then
    the mean and the RMS over space of each field-parameter channel of ``theta_field``
    (B, F, *S), as ``(B, P + 2 F)``; None where there is neither. One definition for every gated
    model (the GNO, `GatedFNO`, ``gno_fno``), so that their gates see the same input."""
    parts = [] if theta is None else [theta]
    if theta_field is not None:
        dims = tuple(range(2, 2 + ndim))
        parts += [theta_field.mean(dims), theta_field.pow(2).mean(dims).sqrt()]
    return torch.cat(parts, 1) if parts else None


def _check_input(theta: Tensor, n_params: int) -> None:
    if theta.ndim != 2 or theta.shape[1] != n_params:
        raise ValueError(f"theta: expected shape (B, {n_params}), got {tuple(theta.shape)}")


def _route(scores: Tensor, gates: Sequence[ParameterGate]) -> list[Routing]:
    """Routings from the scores ``(L, B, K)`` (or ``(B, K)`` for one gate) of ``L`` gates."""
    scores = scores.view(len(gates), *scores.shape[-2:])
    k = scores.shape[-1]
    if k == 1:
        probs, index, weight, balance = _one_kernel(scores)
    else:
        probs = scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(-1)  # float32 or float64
        choice = scores
        noise = [g.noise_std if g.training else 0.0 for g in gates]
        if any(noise):  # one level for all gates (the usual case) as a number: no host-to-device copy
            level = noise[0] if len(set(noise)) == 1 else scores.new_tensor(noise)[:, None, None]
            choice = scores + level * torch.randn_like(scores)
        index = choice.argmax(-1)
        picked = probs.gather(-1, index[..., None]).squeeze(-1)
        weight = (picked - picked.detach()) + 1.0  # exactly 1 (1 + p - p can round to 1 - 2^-24)
        # one_hot instead of bincount: no device-to-host synchronisation
        load = one_hot(index, k, probs.dtype).mean(-2)
        balance = k * (load * probs.mean(-2)).sum(-1)
    routings = [Routing(*parts) for parts in zip(probs, index, weight, balance)]
    for routing in routings:
        record_balance_loss(routing.balance_loss)
    return routings


def _one_kernel(scores: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`_route`'s ``probs, index, weight, balance`` for gates of one kernel (the single-kernel
    ablation), without a softmax, arg-max or mean over the one score: every sample takes kernel 0
    with probability exactly 1, its weight is 1 and the balance term 1, as the general formulas
    give them. Their gradient is zero there too (the softmax of one score is a constant); the
    score MLP stays in the graph with that zero gradient, so DDP sees the gate's parameters used.
    (Inductor's GPU code for the general path's fused softmax, arg-max and mean over a length-one
    reduction failed to compile in Triton's ``make_ttgir`` pass, torch 2.11, H200.)"""
    probs = (scores - scores.detach()).to(torch.promote_types(scores.dtype, torch.float32)) * 0.0 + 1.0
    weight = probs[..., 0]
    return probs, torch.zeros_like(weight, dtype=torch.long), weight, weight[..., 0]


def route_all(gates: Sequence[ParameterGate], theta: Tensor) -> list[Routing]:
    """The routings of several gates over one input, e.g. one gate per GNO block.

    Gates of one shape evaluate their score MLPs together, as two batched matrix products
    (instead of two small products per gate), and route together; the result equals
    ``[gate(theta) for gate in gates]`` (the training noise, if any, is drawn once for all).
    """
    if not _stackable(gates):
        return [g(theta) for g in gates]
    first = gates[0]
    _check_input(theta, first.n_params)
    stack = lambda i, name: torch.stack([getattr(g.score[i], name) for g in gates])
    x = theta.expand(len(gates), *theta.shape)
    hidden = first.score[1](torch.baddbmm(stack(0, "bias")[:, None], x, stack(0, "weight").transpose(1, 2)))
    scores = torch.baddbmm(stack(2, "bias")[:, None], hidden, stack(2, "weight").transpose(1, 2))
    return _route(scores, gates)


def _stackable(gates: Sequence[ParameterGate]) -> bool:
    """Whether the batched evaluation of `route_all` computes these gates' scores: two or more
    score MLPs that are all Linear, one parameter-free activation, Linear, of one shape and one
    activation. A gate whose MLP was changed (another activation, depth or shape) is evaluated
    on its own instead of being computed as if it were the first one."""
    def form(gate: ParameterGate) -> tuple | None:
        s = gate.score
        if not (isinstance(s, nn.Sequential) and len(s) == 3 and isinstance(s[0], nn.Linear)
                and isinstance(s[2], nn.Linear) and s[0].bias is not None and s[2].bias is not None
                and not any(True for _ in s[1].parameters())):
            return None
        return s[0].weight.shape, s[2].weight.shape, type(s[1]), repr(s[1])

    forms = {form(g) for g in gates}
    return len(gates) > 1 and None not in forms and len(forms) == 1


def plan_all(routings: list[Routing]) -> None:
    """Make the dispatch plans of several routings with a single device-to-host transfer."""
    if not routings:
        return
    k = routings[0].probs.shape[1]
    offsets = torch.arange(len(routings), device=routings[0].index.device)[:, None] * k
    flat = (torch.stack([r.index for r in routings]) + offsets).flatten()
    counts = torch.bincount(flat, minlength=len(routings) * k).view(len(routings), k).tolist()
    for routing, c in zip(routings, counts):
        routing.make_plan(c)
