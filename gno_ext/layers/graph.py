r"""Kernels on graphs, and their parameter-gated mixture, for irregular domains (`gno_ext.mesh`).

The nodes of a batch of graphs are concatenated (torch-geometric's layout): features ``x``
(N, D), positions ``pos`` (N, d), directed edges ``edge_index`` (2, E) from source ``j`` to
target ``i`` (neighbourhoods, e.g. from ``torch_geometric.nn.radius_graph``), and ``batch``
(N,), each node's graph. Context tokens (a graph's latent boundary tokens) come as ``context``
(M, D) with ``context_batch`` (M,).

Two kernels, both the integral of the GNO's kernel layer over a neighbourhood:

* `GraphAttentionKernel`: each node attends over its neighbours *and* its graph's context
  tokens, one softmax over both (the grid `AttentionKernel`'s domain and context tokens);
* `GraphKernelIntegral`: $(\mathcal K v)(x_i) = \frac{1}{|N(i)|}\sum_{j \in N(i)} \phi(x_j - x_i)
  \odot W v_j$, a kernel integral over the neighbourhood whose kernel is an MLP of the offset
  (diagonal in the channels after the mixing ``W``), as in graph kernel networks.

`GraphBoundaryTransfer` turns each boundary segment of a graph into one latent token, the
context of the attention kernel.

`GraphKernelMixture` routes each *graph* by its $\theta$ (`ParameterGate`) and runs each kernel
only on the subgraph of the graphs that selected it. All of them are equivariant to the order
of the nodes and treat each graph independently of the others in its batch (tested).

Requires torch-geometric (``pip install gno-ext[mesh]``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch_geometric.utils import scatter, subgraph

from gno_ext.checks import require_at_least
from gno_ext.layers.gate import ParameterGate, Routing
from gno_ext.layers.routing import one_hot
from gno_ext.schema import BCType, robin_coefficients

__all__ = ["GraphAttentionKernel", "GraphBoundaryTransfer", "GraphKernelIntegral", "GraphKernelMixture"]


class GraphAttentionKernel(nn.Module):
    """Multi-head attention of each node over its neighbours and its graph's context tokens.

    For node ``i`` of graph ``g`` the keys and values are those of the sources of its edges and
    of the context tokens of ``g``; one softmax spans both. A node without neighbours or context
    gets zero from the attention (its output is the output projection's bias).

    Parameters
    ----------
    dim : int
        Feature width ``D``.
    heads : int
        Attention heads (``D`` must be divisible by it).
    ndim : int, optional
        With it, the attention over the neighbours reads their offsets: an MLP of the offset
        $x_j - x_i$ (and its length) is added to the key and to the value of edge $j \to i$,
        as in point transformers. Without offsets the weights depend on the features alone,
        and a difference stencil (a Laplacian, a gradient) must be read off absolute
        positions. ``pos`` is then required.
    """

    def __init__(self, dim: int, heads: int = 4, ndim: int | None = None) -> None:
        super().__init__()
        require_at_least(1, dim=dim, heads=heads)
        if dim % heads:
            raise ValueError(f"dim={dim}: must be divisible by heads={heads}")
        self.dim, self.heads, self.ndim = dim, heads, ndim
        self.q, self.kv, self.out = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.offset = None
        if ndim is not None:
            require_at_least(1, ndim=ndim)
            self.offset = nn.Sequential(nn.Linear(ndim + 1, dim), nn.GELU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor, pos: Tensor | None = None,
                context: Tensor | None = None, context_batch: Tensor | None = None,
                n_graphs: int | None = None) -> Tensor:
        """``n_graphs``: the batch's graph count, given when every graph has the same number of
        context tokens (sorted by graph, as `GraphBoundaryTransfer.pool` with ``sizes`` makes
        them): nothing is then read from the device (static shapes, capturable)."""
        n, h = x.shape[0], self.heads
        q = self.q(x).view(n, h, -1)
        k, v = self.kv(x).view(n, 2, h, -1).unbind(1)
        scale = 1 / math.sqrt(q.shape[-1])
        src, dst = edge_index
        # rows gathered with index_select: its gradient adds them (index_add); indexing's sorts the indices first
        k_edge, v_edge = k.index_select(0, src), v.index_select(0, src)
        if self.offset is not None:
            offsets = _offsets(pos, edge_index, self.ndim, n).to(x.dtype)
            k_off, v_off = self.offset(offsets).view(-1, 2, h, q.shape[-1]).unbind(1)
            k_edge, v_edge = k_edge + k_off, v_edge + v_off
        edge_score = (q.index_select(0, dst) * k_edge).sum(-1) * scale  # (E, H)
        top = scatter(edge_score.detach(), dst, 0, dim_size=n, reduce="max")  # (N, H); 0 where a node has no edge
        has_edge = scatter(torch.ones_like(dst, dtype=x.dtype), dst, 0, dim_size=n, reduce="sum")[:, None] > 0
        top = torch.where(has_edge, top, torch.full_like(top, -math.inf))
        if context is not None:
            # the context tokens of each node's graph, padded to the graph with the most
            kc, vc = self.kv(context).view(-1, 2, h, q.shape[-1]).unbind(1)
            slots, mask = (_dense_context(context_batch, int(batch.max()) + 1 if n else 0) if n_graphs is None
                           else _even_context(context.shape[0], n_graphs, context.device))
            kc, vc = kc[slots], vc[slots]  # (B, Mmax, H, dh)
            ctx_score = (q[:, None] * kc.index_select(0, batch)).sum(-1) * scale  # (N, Mmax, H)
            ctx_score = ctx_score.masked_fill(~mask[batch][..., None], -math.inf)
            top = torch.maximum(top, ctx_score.amax(1))
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()  # (any shift: exact)
        edge_weight = (edge_score - top.index_select(0, dst)).exp()  # (E, H)
        total = scatter(edge_weight, dst, 0, dim_size=n, reduce="sum")
        summed = scatter(edge_weight[..., None] * v_edge, dst, 0, dim_size=n, reduce="sum")  # (N, H, dh)
        if context is not None:
            ctx_weight = (ctx_score - top[:, None]).exp()  # masked slots: exp(-inf) = 0
            total = total + ctx_weight.sum(1)
            summed = summed + (ctx_weight[..., None] * vc.index_select(0, batch)).sum(1)
        attended = summed / total.clamp_min(torch.finfo(total.dtype).tiny)[..., None]
        return self.out(attended.reshape(n, self.dim))


class GraphKernelIntegral(nn.Module):
    r"""$(\mathcal K v)(x_i) = \operatorname{mean}_{j \in N(i)} \phi(x_j - x_i) \odot W v_j$.

    Parameters
    ----------
    dim : int
        Feature width ``D``.
    ndim : int
        Dimension of the positions (2 or 3).
    hidden : int
        Hidden width of the kernel MLP $\phi$ (offset and its length in, ``D`` weights out).
    """

    def __init__(self, dim: int, ndim: int = 2, hidden: int = 64) -> None:
        super().__init__()
        require_at_least(1, dim=dim, ndim=ndim, hidden=hidden)
        self.ndim = ndim
        self.value = nn.Linear(dim, dim)
        self.kernel = nn.Sequential(nn.Linear(ndim + 1, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor, pos: Tensor | None = None,
                context: Tensor | None = None, context_batch: Tensor | None = None,
                n_graphs: int | None = None) -> Tensor:
        """(``context``, ``context_batch`` and ``n_graphs`` are not read: the signature of
        `GraphAttentionKernel`.)"""
        src, dst = edge_index
        phi = self.kernel(_offsets(pos, edge_index, self.ndim, x.shape[0]).to(x.dtype))
        return scatter(phi * self.value(x).index_select(0, src), dst, 0, dim_size=x.shape[0], reduce="mean")


class GraphKernelMixture(nn.Module):
    """``K`` graph kernels behind a `ParameterGate`: each graph's $\\theta$ selects one kernel,
    which runs on that graph alone (or, with ``soft_routing``, all of them, mixed).

    Each kernel runs once, on the subgraph of the graphs that selected it (their nodes, the
    edges among them, their context tokens); unselected kernels do not run. The output is
    scaled by the gate's straight-through value (exactly 1 in the forward pass), so the gate
    learns. Choosing the subgraphs reads the routing on the host; a padded batch (``n_graphs``
    given, `gno_ext.mesh.pad_meshes`) runs every kernel and keeps each node's own instead, which
    reads nothing there (capturable).

    Parameters
    ----------
    kernels : sequence of nn.Module
        Kernels with the signature of `GraphAttentionKernel`.
    gate : ParameterGate
    soft_routing : bool
        Every kernel on every graph, their outputs weighted by the graph's gate probabilities
        $\\tilde g_k(\\theta)$: a kernel that varies smoothly with $\\theta$, every kernel trained
        on every graph, the gate trained by the loss directly (the grid's `GatedSpectralConv`
        ``soft_routing``). Costs ``K`` kernel evaluations instead of one.
    """

    def __init__(self, kernels: Sequence[nn.Module], gate: ParameterGate, soft_routing: bool = False) -> None:
        super().__init__()
        if len(kernels) != gate.n_kernels:
            raise ValueError(f"kernels: the gate chooses among {gate.n_kernels}, got {len(kernels)} kernels")
        self.kernels, self.gate, self.soft_routing = nn.ModuleList(kernels), gate, bool(soft_routing)
        self.last_routing: Routing | None = None

    def forward(self, x: Tensor, theta: Tensor, edge_index: Tensor, batch: Tensor, pos: Tensor | None = None,
                context: Tensor | None = None, context_batch: Tensor | None = None,
                n_graphs: int | None = None) -> Tensor:
        """Each node through its graph's kernel; ``theta`` (B, n_params): one row per graph.
        ``n_graphs`` (static shapes, see `GraphAttentionKernel`): the hard routing then runs
        every kernel on every graph and keeps each node's own kernel's result (the same output
        and gradients, ``K`` times the work, nothing read on the host)."""
        routing = self.gate(theta)
        self.last_routing = routing

        def run(kernel: nn.Module) -> Tensor:  # on the whole batch
            return kernel(x, edge_index, batch, pos, context, context_batch, n_graphs=n_graphs)

        if self.soft_routing:
            probs = routing.probs.index_select(0, batch)  # (N, K)
            return sum(run(kernel) * probs[:, k].to(x.dtype).view(-1, *([1] * (x.ndim - 1)))
                       for k, kernel in enumerate(self.kernels))
        node_kernel = routing.index[batch]
        if n_graphs is not None:
            every = torch.stack([run(kernel) for kernel in self.kernels], 1)  # (N, K, ...)
            # each node's own kernel's result by gather (its gradient scatters; indexing's sorts the indices)
            own = node_kernel.view(-1, 1, *([1] * (every.ndim - 2))).expand(-1, 1, *every.shape[2:])
            out = every.gather(1, own).squeeze(1)
            return out * routing.weight.index_select(0, batch).to(out.dtype).view(-1, *([1] * (out.ndim - 1)))
        out = None
        for k in node_kernel.unique().tolist():
            nodes = (node_kernel == k).nonzero().squeeze(1)
            sub_edges, _ = subgraph(nodes, edge_index, relabel_nodes=True, num_nodes=x.shape[0])
            ctx = cb = None
            if context is not None:
                keep = routing.index[context_batch] == k
                ctx, cb = context[keep], context_batch[keep]
            y = self.kernels[k](x[nodes], sub_edges, batch[nodes], None if pos is None else pos[nodes], ctx, cb)
            out = y.new_zeros(x.shape[0], *y.shape[1:]) if out is None else out
            out = out.index_copy(0, nodes, y)
        return out * routing.weight.index_select(0, batch).to(out.dtype).view(-1, *([1] * (out.ndim - 1)))


def _offsets(pos: Tensor | None, edge_index: Tensor, ndim: int, n: int) -> Tensor:
    """Each edge's offset ``pos[j] - pos[i]`` and its length, ``(E, ndim + 1)``; ``pos`` checked."""
    if pos is None or pos.shape != (n, ndim):
        raise ValueError(f"pos: expected shape ({n}, {ndim}), got {None if pos is None else tuple(pos.shape)}")
    src, dst = edge_index
    offset = pos[src] - pos[dst]
    return torch.cat([offset, offset.norm(dim=1, keepdim=True)], 1)


def _dense_context(context_batch: Tensor, n_graphs: int) -> tuple[Tensor, Tensor]:
    """For ``context_batch`` (M,), sorted by graph: ``slots`` (B, Mmax), each graph's token
    indices padded (with 0), and ``mask`` (B, Mmax), true at real tokens."""
    counts = torch.bincount(context_batch, minlength=n_graphs)
    if context_batch.numel() > 1 and (context_batch[1:] < context_batch[:-1]).any():
        raise ValueError("context_batch: the context tokens must be sorted by graph (as torch-geometric batches)")
    width = int(counts.max()) if counts.numel() else 0
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(width, device=context_batch.device)
    mask = slot[None] < counts[:, None]
    return torch.where(mask, starts[:, None] + slot[None], torch.zeros_like(mask, dtype=torch.long)), mask


def _even_context(n_tokens: int, n_graphs: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """`_dense_context` of ``n_tokens`` tokens sorted by graph, the same number for each of
    ``n_graphs`` graphs, from the sizes alone (nothing read from the device)."""
    if n_graphs < 1 or n_tokens % n_graphs:
        raise ValueError(f"context: {n_tokens} tokens cannot be the same number for each of {n_graphs} graphs")
    slots = torch.arange(n_tokens, device=device).view(n_graphs, n_tokens // n_graphs)
    return slots, torch.ones_like(slots, dtype=torch.bool)


class GraphBoundaryTransfer(nn.Module):
    r"""The boundary transfer operator on a graph: each boundary *segment* becomes one latent
    token (the latent Dirichlet representation $h_\ell$ of the paper, one per segment instead of
    one per boundary patch of a box), for any number of boundary nodes and segments per graph.

    Every boundary node is described by its condition type (one-hot), its data at the first and
    last boundary time (divided by ``scale``), its outward normal, its Robin coefficients and its
    position, together with the latent state at that node (layer-normed); an MLP maps each node
    to a vector, and the nodes of a segment are averaged into the segment's token. The tokens
    come sorted by graph, as `GraphAttentionKernel`'s ``context`` expects.

    Parameters
    ----------
    dim : int
        Latent width ``D``.
    ndim : int
        Dimension of the positions (2 or 3).
    hidden : int
        Hidden width of the MLP.
    """

    N_TYPES = len(BCType)

    def __init__(self, dim: int, ndim: int = 2, hidden: int = 128) -> None:
        super().__init__()
        require_at_least(1, dim=dim, ndim=ndim, hidden=hidden)
        self.ndim = ndim
        self.norm = nn.LayerNorm(dim)
        described = self.N_TYPES + 2 + ndim + 2 + ndim
        self.mlp = nn.Sequential(nn.Linear(described + dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor, pos: Tensor, batch: Tensor, boundary_index: Tensor, boundary_kind: Tensor,
                boundary_values: Tensor, boundary_normal: Tensor, boundary_segment: Tensor,
                boundary_coeffs: Tensor | None = None, scale: float | Tensor = 1.0) -> tuple[Tensor, Tensor]:
        """Returns ``(tokens (S_total, D), token_batch (S_total,))``: one token per segment of each
        graph, ordered by graph, then segment."""
        per_node = self.describe(x, pos, boundary_index, boundary_kind, boundary_values, boundary_normal,
                                 boundary_coeffs, scale)
        return self.pool(per_node, batch, boundary_index, boundary_segment)

    def describe(self, x: Tensor, pos: Tensor, boundary_index: Tensor, boundary_kind: Tensor,
                 boundary_values: Tensor, boundary_normal: Tensor, boundary_coeffs: Tensor | None = None,
                 scale: float | Tensor = 1.0) -> Tensor:
        """Each boundary node's vector ``(M, D)``, before the segments' averages: what a model
        can also add to the boundary nodes themselves."""
        kind = one_hot(boundary_kind, self.N_TYPES, x.dtype)
        values = boundary_values.to(x.dtype) / scale
        data = torch.stack([values[:, 0], values[:, -1]], 1)
        coeffs = robin_coefficients(boundary_kind, boundary_coeffs, x.dtype)  # the grid's rule, per node
        described = torch.cat([kind, data, boundary_normal.to(x.dtype), coeffs,
                               pos.index_select(0, boundary_index).to(x.dtype),
                               self.norm(x.index_select(0, boundary_index))], 1)
        return self.mlp(described)

    def pool(self, per_node: Tensor, batch: Tensor, boundary_index: Tensor, boundary_segment: Tensor,
             sizes: tuple[int, int] | None = None) -> tuple[Tensor, Tensor]:
        """The segments' tokens and their graphs from the nodes' vectors (`describe`'s result).
        ``sizes``: ``(graphs, segments)`` where every graph has every segment (a padded batch,
        `gno_ext.mesh.PaddedMeshes`): ``graphs * segments`` tokens from the sizes alone, nothing
        read from the device; otherwise the segments present, found on the device."""
        graph = batch[boundary_index]
        if sizes is not None:
            n_graphs, n_segments = sizes
            token = graph * n_segments + boundary_segment
            tokens = scatter(per_node, token, 0, dim_size=n_graphs * n_segments, reduce="mean")
            return tokens, torch.arange(n_graphs, device=graph.device).repeat_interleave(n_segments)
        key = graph * (int(boundary_segment.max()) + 1 if boundary_segment.numel() else 1) + boundary_segment
        keys, token = torch.unique(key, return_inverse=True)  # sorted: by graph, then segment
        tokens = scatter(per_node, token, 0, dim_size=keys.numel(), reduce="mean")
        token_batch = scatter(graph, token, 0, dim_size=keys.numel(), reduce="max")
        return tokens, token_batch
