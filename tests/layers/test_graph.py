"""`gno_ext.layers.graph`: the kernels on graphs against dense definitions, equivariance in node
order, independence of the graphs in a batch, routing by theta per graph."""

import math

import pytest
import torch

pytest.importorskip("torch_geometric")

from gno_ext.layers import ParameterGate  # noqa: E402
from gno_ext.layers.graph import GraphAttentionKernel, GraphKernelIntegral, GraphKernelMixture  # noqa: E402

DIM = 8


def radius_edges(pos, r):
    """Edges j -> i between distinct nodes closer than r (what torch-geometric's radius_graph
    gives, without its compiled extension)."""
    close = (torch.cdist(pos, pos) < r) & ~torch.eye(len(pos), dtype=torch.bool)
    dst, src = close.nonzero().unbind(1)
    return torch.stack([src, dst])


def graph(n, seed, n_context=3):
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, 2, generator=g)
    return dict(x=torch.randn(n, DIM, generator=g), pos=pos, edge_index=radius_edges(pos, 0.5),
                context=torch.randn(n_context, DIM, generator=g))


def batched(*graphs):
    """The graphs concatenated as torch-geometric batches them."""
    xs, pos, edges, batch, ctx, ctx_batch, offset = [], [], [], [], [], [], 0
    for b, gr in enumerate(graphs):
        n = gr["x"].shape[0]
        xs.append(gr["x"]), pos.append(gr["pos"]), edges.append(gr["edge_index"] + offset)
        batch.append(torch.full((n,), b)), ctx.append(gr["context"])
        ctx_batch.append(torch.full((gr["context"].shape[0],), b))
        offset += n
    return dict(x=torch.cat(xs), pos=torch.cat(pos), edge_index=torch.cat(edges, 1), batch=torch.cat(batch),
                context=torch.cat(ctx), context_batch=torch.cat(ctx_batch))


def dense_attention(kernel, x, edge_index, batch, context, context_batch, pos=None):
    """Node by node: softmax over the sources of its edges and its graph's context tokens (with
    ``kernel.offset``: the offset's MLP added to the neighbours' keys and values)."""
    h = kernel.heads
    q, kv, kvc = kernel.q(x), kernel.kv(x), kernel.kv(context)
    out = []
    for i in range(x.shape[0]):
        src = edge_index[0, edge_index[1] == i]
        near = kv[src]
        if kernel.offset is not None:
            offset = pos[src] - pos[i]
            near = near + kernel.offset(torch.cat([offset, offset.norm(dim=1, keepdim=True)], 1))
        keys = torch.cat([near, kvc[context_batch == batch[i]]])
        k, v = keys.view(-1, 2, h, DIM // h).unbind(1)
        score = (q[i].view(h, -1) * k).sum(-1) / math.sqrt(DIM // h)  # (keys, H)
        out.append((score.softmax(0)[..., None] * v).sum(0).reshape(-1) if len(keys) else torch.zeros(DIM))
    return kernel.out(torch.stack(out))


def dense_integral(kernel, x, edge_index, pos):
    out = []
    for i in range(x.shape[0]):
        src = edge_index[0, edge_index[1] == i]
        offset = pos[src] - pos[i]
        phi = kernel.kernel(torch.cat([offset, offset.norm(dim=1, keepdim=True)], 1))
        out.append((phi * kernel.value(x[src])).mean(0) if len(src) else torch.zeros(DIM))
    return torch.stack(out)


def test_the_attention_kernel_is_the_softmax_over_neighbours_and_context():
    torch.manual_seed(0)
    kernel = GraphAttentionKernel(DIM, heads=2)
    b = batched(graph(9, 1), graph(6, 2, n_context=1), graph(4, 3, n_context=0))
    b["edge_index"] = b["edge_index"][:, b["edge_index"][1] != 0]  # node 0: context only
    got = kernel(b["x"], b["edge_index"], b["batch"], b["pos"], b["context"], b["context_batch"])
    want = dense_attention(kernel, b["x"], b["edge_index"], b["batch"], b["context"], b["context_batch"])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    alone = kernel(b["x"], b["edge_index"], b["batch"])  # no context at all
    no_ctx = dense_attention(kernel, b["x"], b["edge_index"], b["batch"], b["context"][:0], b["context_batch"][:0])
    torch.testing.assert_close(alone, no_ctx, rtol=1e-5, atol=1e-5)


def test_the_attention_kernel_with_offsets_adds_them_to_the_neighbours_keys_and_values():
    torch.manual_seed(1)
    kernel = GraphAttentionKernel(DIM, heads=2, ndim=2)
    b = batched(graph(9, 1), graph(6, 2, n_context=1))
    got = kernel(b["x"], b["edge_index"], b["batch"], b["pos"], b["context"], b["context_batch"])
    want = dense_attention(kernel, b["x"], b["edge_index"], b["batch"], b["context"], b["context_batch"], b["pos"])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # offsets, not positions: a shift of every node changes nothing, a reflection does
    shifted = kernel(b["x"], b["edge_index"], b["batch"], b["pos"] + 3.0, b["context"], b["context_batch"])
    torch.testing.assert_close(shifted, got, rtol=1e-4, atol=1e-5)
    flipped = kernel(b["x"], b["edge_index"], b["batch"], -b["pos"], b["context"], b["context_batch"])
    assert (flipped - got).abs().max() > 1e-3
    with pytest.raises(ValueError, match=r"pos: expected shape \(15, 2\), got None"):
        kernel(b["x"], b["edge_index"], b["batch"])


def test_the_kernel_integral_is_the_mean_over_the_neighbourhood():
    torch.manual_seed(0)
    kernel = GraphKernelIntegral(DIM, ndim=2, hidden=16)
    b = batched(graph(9, 1), graph(6, 2))
    got = kernel(b["x"], b["edge_index"], b["batch"], b["pos"])
    torch.testing.assert_close(got, dense_integral(kernel, b["x"], b["edge_index"], b["pos"]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"pos: expected shape \(15, 2\), got None"):
        kernel(b["x"], b["edge_index"], b["batch"])


def mixture(seed=0, soft_routing=False):
    torch.manual_seed(seed)
    kernels = [GraphAttentionKernel(DIM, 2), GraphKernelIntegral(DIM, 2, 16), GraphAttentionKernel(DIM, 4, ndim=2)]
    return GraphKernelMixture(kernels, ParameterGate(1, 3, hidden=8), soft_routing)


def run(module, b, theta=None):
    args = (b["x"], b["edge_index"], b["batch"], b["pos"], b["context"], b["context_batch"])
    return module(b["x"], theta, *args[1:]) if theta is not None else module(*args)


@pytest.mark.parametrize("which", ["attention", "attention-offsets", "integral", "mixture", "soft-mixture"])
def test_equivariant_in_node_order_and_each_graph_independent_of_its_batch(which):
    torch.manual_seed(3)
    module = {"attention": lambda: GraphAttentionKernel(DIM, 2),
              "attention-offsets": lambda: GraphAttentionKernel(DIM, 2, ndim=2),
              "integral": lambda: GraphKernelIntegral(DIM, 2, 16), "mixture": mixture,
              "soft-mixture": lambda: mixture(soft_routing=True)}[which]()
    theta = torch.tensor([[0.3], [-2.0]]) if which.endswith("mixture") else None
    a, c = graph(9, 1), graph(7, 2)
    b = batched(a, c)
    y = run(module, b, theta)
    perm = torch.randperm(b["x"].shape[0])
    inverse = torch.argsort(perm)
    shuffled = {**b, "x": b["x"][perm], "pos": b["pos"][perm], "batch": b["batch"][perm],
                "edge_index": inverse[b["edge_index"]]}
    torch.testing.assert_close(run(module, shuffled, theta), y[perm], rtol=1e-5, atol=1e-5)
    alone = run(module, batched(a), None if theta is None else theta[:1])
    torch.testing.assert_close(alone, y[:9], rtol=1e-5, atol=1e-5)


def test_each_graph_runs_only_its_selected_kernel():
    model = mixture(seed=4)
    a, c, d = graph(9, 1), graph(7, 2), graph(5, 3)
    b = batched(a, c, d)
    theta = torch.tensor([[-3.0], [0.0], [3.0]])
    y = run(model, b, theta)
    index = model.last_routing.index
    for g, gr in enumerate((a, c, d)):  # each graph's output is its own kernel's, on the graph alone
        one = batched(gr)
        want = model.kernels[int(index[g])](one["x"], one["edge_index"], one["batch"], one["pos"], one["context"],
                                             one["context_batch"])
        torch.testing.assert_close(y[b["batch"] == g], want, rtol=1e-5, atol=1e-5)
    y.square().sum().backward()
    used = set(index.tolist())
    for k, kernel in enumerate(model.kernels):
        grads = [p.grad for p in kernel.parameters()]
        assert all(g is not None for g in grads) if k in used else all(g is None for g in grads), k
    assert model.gate.score[0].weight.grad is not None  # the gate learns through the straight-through value


def test_the_soft_mixture_is_the_probability_weighted_sum_of_every_kernel():
    model = mixture(seed=6, soft_routing=True)
    a, c = graph(9, 1), graph(7, 2)
    b = batched(a, c)
    theta = torch.tensor([[-3.0], [2.0]])
    y = run(model, b, theta)
    probs = model.gate(theta).probs
    args = (b["edge_index"], b["batch"], b["pos"], b["context"], b["context_batch"])
    want = sum(kernel(b["x"], *args) * probs[b["batch"], k, None] for k, kernel in enumerate(model.kernels))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(probs[0], probs[1])  # each graph has its own weights
    y.square().sum().backward()
    for kernel in model.kernels:  # every kernel trains on every graph, and the gate through the mixture
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in kernel.parameters())
    assert model.gate.score[0].weight.grad.abs().sum() > 0


def test_the_gate_routes_graphs_by_theta():
    """Trained on the routing alone (kernels frozen), the gate sends theta < 0 to one kernel and
    theta > 0 to another: the graphs' outputs then follow their parameters."""
    torch.manual_seed(5)
    model = mixture(seed=5)
    for p in model.kernels.parameters():
        p.requires_grad_(False)
    graphs = [graph(6, s, n_context=2) for s in range(8)]
    b = batched(*graphs)
    theta = torch.linspace(-2, 2, 8)[:, None]
    target_kernel = (theta[:, 0] > 0).long() * 2  # kernel 0 below zero, kernel 2 above
    opt = torch.optim.Adam(model.gate.parameters(), lr=0.05)
    for _ in range(150):
        routing = model.gate(theta)
        loss = torch.nn.functional.nll_loss(routing.probs.clamp_min(1e-9).log(), target_kernel)
        opt.zero_grad()
        loss.backward()
        opt.step()
    run(model, b, theta)
    assert torch.equal(model.last_routing.index, target_kernel)


def boundary_of(sample_kwargs):
    """The boundary attributes of a `tests.test_mesh.disk_with_hole` sample."""
    return {k: sample_kwargs[k] for k in ("boundary_index", "boundary_kind", "boundary_values", "boundary_normal",
                                          "boundary_segment", "boundary_coeffs")}


def transfer_batch(samples):
    """Latent states and boundary attributes of several samples, concatenated (boundary nodes
    offset by the nodes before, segments not)."""
    out, offset = {"x": [], "pos": [], "batch": [], "boundary_index": []}, 0
    rest = {k: [] for k in ("boundary_kind", "boundary_values", "boundary_normal", "boundary_segment")}
    for b, s in enumerate(samples):
        n = s["pos"].shape[0]
        out["x"].append(s["latent"]), out["pos"].append(s["pos"]), out["batch"].append(torch.full((n,), b))
        out["boundary_index"].append(s["boundary_index"] + offset)
        for k in rest:
            rest[k].append(s[k])
        offset += n
    return {k: torch.cat(v) for k, v in {**out, **rest}.items()}


def test_the_boundary_transfer_gives_one_token_per_segment_of_each_graph():
    from gno_ext.layers.graph import GraphBoundaryTransfer
    from tests.test_mesh import disk_with_hole

    torch.manual_seed(7)
    op = GraphBoundaryTransfer(DIM, ndim=2, hidden=16)
    a, c = disk_with_hole(seed=1), disk_with_hole(n_outer=8, n_inner=4, n_inside=9, seed=2)
    c["boundary_segment"] = torch.zeros_like(c["boundary_segment"])  # one segment: all Dirichlet
    c["boundary_kind"] = torch.full_like(c["boundary_kind"], 1)
    for s in (a, c):
        s["latent"] = torch.randn(s["pos"].shape[0], DIM)
    both = transfer_batch([a, c])
    tokens, token_batch = op(**both)
    assert tokens.shape == (3, DIM) and token_batch.tolist() == [0, 0, 1]  # 2 segments, then 1
    for g, s in enumerate((a, c)):  # each graph's tokens as computed on it alone
        alone, _ = op(**transfer_batch([s]))
        torch.testing.assert_close(tokens[token_batch == g], alone, rtol=1e-5, atol=1e-5)
    # the order of the boundary nodes does not matter
    perm = torch.randperm(both["boundary_index"].shape[0])
    shuffled = {k: (v[perm] if k.startswith("boundary") else v) for k, v in both.items()}
    torch.testing.assert_close(op(**shuffled)[0], tokens, rtol=1e-5, atol=1e-5)
    # new data on the hole's rim (segment 1 of graph 0) change that segment's token only
    changed = {**both, "boundary_values": both["boundary_values"].clone()}
    rim = (both["boundary_segment"] == 1) & (both["batch"][both["boundary_index"]] == 0)
    changed["boundary_values"][rim] += 1.0
    moved = (op(**changed)[0] - tokens).abs().amax(1)
    assert moved[1] > 1e-4 and moved[0] == 0 and moved[2] == 0
    # and it learns: gradients reach the MLP and the latent state at the boundary nodes
    latent = both["x"].clone().requires_grad_(True)
    op(**{**both, "x": latent})[0].square().sum().backward()
    assert latent.grad[both["boundary_index"]].abs().sum() > 0
    interior = torch.ones(latent.shape[0], dtype=torch.bool)
    interior[both["boundary_index"]] = False
    assert latent.grad[interior].abs().sum() == 0 and op.mlp[0].weight.grad is not None
    # the per-node vectors (`describe`) are what the segments average (`pool`)
    keys = ("x", "pos", "boundary_index", "boundary_kind", "boundary_values", "boundary_normal")
    per_node = op.describe(**{k: both[k] for k in keys})
    assert per_node.shape == (both["boundary_index"].shape[0], DIM)
    pooled, pooled_batch = op.pool(per_node, both["batch"], both["boundary_index"], both["boundary_segment"])
    torch.testing.assert_close(pooled, tokens)
    assert torch.equal(pooled_batch, token_batch)
    first = (both["boundary_segment"] == 0) & (both["batch"][both["boundary_index"]] == 0)
    torch.testing.assert_close(tokens[0], per_node[first].mean(0))


def test_the_boundary_transfer_reads_robin_coefficients_as_the_grid_does():
    """Coefficients count only at Robin nodes; elsewhere the type sets them (Dirichlet (1, 0),
    Neumann (0, 1)), the rule of `BoundarySpec.robin_coeffs`."""
    from gno_ext.layers.graph import GraphBoundaryTransfer
    from tests.test_mesh import disk_with_hole

    torch.manual_seed(8)
    op = GraphBoundaryTransfer(DIM, ndim=2, hidden=16)
    s = disk_with_hole(seed=1, robin=True)  # Dirichlet outside, Robin on the hole's rim
    s["latent"] = torch.randn(s["pos"].shape[0], DIM)
    both = transfer_batch([s])
    coeffs = s["boundary_coeffs"].clone()
    tokens, _ = op(**both, boundary_coeffs=coeffs)
    off_robin = coeffs.clone()
    off_robin[s["boundary_kind"] == 1] = 7.0  # on the Dirichlet nodes: ignored
    torch.testing.assert_close(op(**both, boundary_coeffs=off_robin)[0], tokens)
    on_robin = coeffs.clone()
    on_robin[s["boundary_kind"] == 3] = 7.0
    assert not torch.allclose(op(**both, boundary_coeffs=on_robin)[0][1], tokens[1])
