import pytest
import torch
from torch import nn

from gno_ext.layers import AttentionKernel, GatedKernelMixture, ParameterGate, route_all


class Counting(nn.Module):
    """Wraps a kernel and records the batch sizes it was called with."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel, self.calls = kernel, []

    def forward(self, x, **kw):
        self.calls.append(x.shape[0])
        return self.kernel(x, **kw)


def test_routing_outputs():
    torch.manual_seed(0)
    gate = ParameterGate(2, 4)
    r = gate(torch.randn(16, 2))
    assert r.probs.shape == (16, 4) and torch.allclose(r.probs.sum(1), torch.ones(16))
    assert torch.equal(r.index, r.probs.argmax(1))
    assert torch.equal(r.weight, torch.ones(16))  # exactly one in the forward pass
    assert 1.0 - 1e-6 <= r.balance_loss.item() <= 4.0 + 1e-6
    with pytest.raises(ValueError, match=r"theta: expected shape \(B, 2\)"):
        gate(torch.randn(3, 3))


def test_layers_reject_sizes_that_build_an_empty_or_broken_module():
    from gno_ext.layers import BoundaryTransfer

    cases = [(lambda: ParameterGate(0, 2), "n_params: the gate needs at least one input, got 0"),
             (lambda: ParameterGate(1, 0), "n_kernels: must be >= 1, got 0"),
             (lambda: ParameterGate(1, 2, hidden=0), "hidden: must be >= 1, got 0"),
             (lambda: ParameterGate(1, 2, noise_std=-0.1), "noise_std: must be >= 0, got -0.1"),
             (lambda: BoundaryTransfer(64, 2, width=0), "width: must be >= 1, got 0"),  # was: the default width
             (lambda: BoundaryTransfer(64, 2, hidden_ratio=0.01), "hidden_ratio: the MLP needs at least one unit")]
    for build, match in cases:
        with pytest.raises(ValueError, match=match):
            build()


def test_kernels_whose_outputs_differ_in_shape_are_named():
    """User kernels must agree on the output shape per sample; where a batch runs two that do
    not, the error names each kernel's shape (not a bare size mismatch of a concatenation)."""
    from gno_ext.layers import dispatch
    from gno_ext.layers.gate import Routing

    kernels = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 5)]
    index = torch.tensor([0, 1, 0, 1])
    routing = Routing(torch.full((4, 2), 0.5), index, torch.ones(4), torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"one shape per sample, got \{0: \(3, 4\), 1: \(3, 5\)\}"):
        dispatch(kernels, routing, torch.randn(4, 3, 4))


@pytest.mark.parametrize("attention", [False, True])
def test_mixture_names_a_theta_that_does_not_fit_x(attention):
    """(A theta of fewer samples than x cut the batch to theta's size; None was an
    AttributeError deep inside.)"""
    kernels = [AttentionKernel(8, 2) if attention else torch.nn.Linear(8, 8) for _ in range(3)]
    mix = GatedKernelMixture(kernels, ParameterGate(2, 3))
    x = torch.randn(5, 4, 8)
    assert mix(x, torch.rand(5, 2)).shape == x.shape
    for b in (4, 6):
        with pytest.raises(ValueError, match=f"theta: batch size {b} does not match x's 5"):
            mix(x, torch.rand(b, 2))
        with pytest.raises(ValueError, match=f"routing: batch size {b} does not match x's 5"):
            mix(x, None, routing=mix.gate(torch.rand(b, 2)))
    with pytest.raises(ValueError, match=r"theta: the gate needs the parameters, shape \(B, 2\), or pass routing="):
        mix(x, None)


def test_balance_loss_is_k_when_all_samples_pick_one_kernel():
    gate = ParameterGate(1, 4)
    with torch.no_grad():
        gate.score[-1].bias.copy_(torch.tensor([50.0, 0, 0, 0]))
    assert torch.isclose(gate(torch.randn(32, 1)).balance_loss, torch.tensor(4.0), atol=1e-3)


@pytest.mark.parametrize("training", [False, True])
def test_one_kernel_routing_is_the_general_formulas_with_zero_gradients(training):
    """A gate of one kernel (the single-kernel ablation) skips the softmax and arg-max over one
    score: its routing must still be what the general formulas give (probability 1, kernel 0,
    weight 1, balance term 1), with the gate's parameters in the graph and a zero gradient, as
    the softmax of one score is constant, alone or evaluated together by `route_all`."""
    torch.manual_seed(3)
    gates = [ParameterGate(2, 1, hidden=8, noise_std=0.5).train(training) for _ in range(2)]
    theta = torch.randn(6, 2)
    scores = gates[0].score(theta)
    probs = scores.softmax(-1)
    for routing in [gates[0](theta), *route_all(gates, theta)]:
        assert torch.equal(routing.probs, probs) and routing.probs.dtype == torch.float32
        assert torch.equal(routing.index, torch.zeros(6, dtype=torch.long))
        assert torch.equal(routing.weight, torch.ones(6))
        assert torch.equal(routing.balance_loss, torch.tensor(1.0))
        assert routing.balance_loss.shape == ()
        for g in gates:
            g.zero_grad(set_to_none=True)
        (routing.probs.sum() + 3 * routing.weight.sum() + routing.balance_loss).backward(retain_graph=True)
        used = [p.grad for p in gates[0].parameters()]
        assert all(g is not None and torch.count_nonzero(g) == 0 for g in used)
    # the general formula's gradient, for comparison: zero up to rounding
    (probs.sum() + 3 * probs[:, 0].sum()).backward()
    assert all(p.grad.abs().max() < 1e-6 for p in gates[0].parameters())


def test_route_all_equals_each_gate_with_gradients():
    """Several gates evaluated together give each gate's own routing, and each gate's
    parameters the gradient of its own routing."""
    torch.manual_seed(8)
    gates = [ParameterGate(2, 4, hidden=8) for _ in range(3)]
    theta = torch.randn(10, 2)
    together = route_all(gates, theta)
    probe = torch.randn(3, 10, 4)
    sum((r.probs * w).sum() + r.weight.sum() + r.balance_loss for r, w in zip(together, probe)).backward()
    grads = [p.grad.clone() for g in gates for p in g.parameters()]
    for g in gates:
        g.zero_grad()
    alone = [g(theta) for g in gates]
    sum((r.probs * w).sum() + r.weight.sum() + r.balance_loss for r, w in zip(alone, probe)).backward()
    assert len({tuple(r.index.tolist()) for r in alone}) > 1  # the gates differ
    for a, b in zip(together, alone):
        assert torch.equal(a.index, b.index)
        assert torch.allclose(a.probs, b.probs, atol=1e-6) and torch.allclose(a.balance_loss, b.balance_loss)
        assert torch.equal(a.weight, torch.ones(10))
    for g, p in zip(grads, (p for g in gates for p in g.parameters())):
        assert torch.allclose(g, p.grad, atol=1e-5)
    with pytest.raises(ValueError, match=r"theta: expected shape \(B, 2\)"):
        route_all(gates, torch.randn(10, 3))


def test_route_all_draws_training_noise_for_each_gate():
    gates = [ParameterGate(1, 4, noise_std=0.0), ParameterGate(1, 4, noise_std=100.0)]
    theta = torch.zeros(64, 1)  # one input: without noise every sample picks the same kernel
    quiet, noisy = route_all(gates, theta)
    assert len(set(quiet.index.tolist())) == 1 and len(set(noisy.index.tolist())) > 1
    for g in gates:
        g.eval()
    assert all(len(set(r.index.tolist())) == 1 for r in route_all(gates, theta))


def test_route_all_with_one_noise_level_adds_it_as_a_number():
    """Gates with one noise level (the usual case) scale the draws by a number, no tensor made
    from the host: the same routing as the scores plus the scaled draws."""
    torch.manual_seed(3)
    gates = [ParameterGate(1, 4, noise_std=50.0) for _ in range(2)]
    theta = torch.zeros(64, 1)
    with torch.no_grad():
        scores = torch.stack([g.score(theta) for g in gates])
    torch.manual_seed(0)
    want = (scores + 50.0 * torch.randn_like(scores)).argmax(-1)
    torch.manual_seed(0)
    got = route_all(gates, theta)
    assert all(torch.equal(r.index, w) for r, w in zip(got, want))
    assert not torch.equal(got[0].index, got[1].index)  # a draw of its own for each gate


def test_only_selected_kernels_run_once_each_and_output_is_the_selected_kernel():
    torch.manual_seed(1)
    kernels = [Counting(nn.Linear(6, 6)) for _ in range(4)]
    mix = GatedKernelMixture(kernels, ParameterGate(1, 4))
    x, theta = torch.randn(20, 6), torch.linspace(-3, 3, 20)[:, None]
    y = mix(x, theta)
    index = mix.last_routing.index
    for k, kernel in enumerate(kernels):
        n_k = int((index == k).sum())
        assert kernel.calls == ([n_k] if n_k else [])
        sel = index == k
        if n_k:
            assert torch.allclose(y[sel], kernel.kernel(x[sel]), atol=1e-6, rtol=0)  # BLAS blocking only


def test_gradients_reach_selected_kernels_and_the_gate_but_not_unselected_kernels():
    torch.manual_seed(2)
    kernels = [nn.Linear(4, 4) for _ in range(3)]
    gate = ParameterGate(1, 3)
    gate.score = nn.Linear(1, 3)  # scores (-theta, -100, theta): kernel 0 for theta < 0, 2 for theta > 0
    with torch.no_grad():
        gate.score.weight.copy_(torch.tensor([[-1.0], [0.0], [1.0]]))
        gate.score.bias.copy_(torch.tensor([0.0, -100.0, 0.0]))
    mix = GatedKernelMixture(kernels, gate)
    theta = torch.cat([torch.full((4, 1), -5.0), torch.full((4, 1), 5.0)])
    mix(torch.randn(8, 4), theta).pow(2).sum().backward()
    used = set(mix.last_routing.index.tolist())
    assert 1 not in used and len(used) == 2
    for k, kernel in enumerate(kernels):
        assert (kernel.weight.grad is not None) == (k in used)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gate.parameters())


def test_kernel_keyword_tensors_are_split_with_the_batch():
    torch.manual_seed(3)
    kernels = [AttentionKernel(8, 2) for _ in range(2)]
    mix = GatedKernelMixture(kernels, ParameterGate(1, 2)).eval()
    x, ctx = torch.randn(6, 5, 8), torch.randn(6, 3, 8)
    theta = torch.linspace(-4, 4, 6)[:, None]
    y = mix(x, theta, context=ctx)
    for i in range(6):
        k = int(mix.last_routing.index[i])
        assert torch.allclose(y[i], kernels[k](x[i : i + 1], ctx[i : i + 1])[0], atol=1e-6)


def test_gate_learns_to_route_two_regimes_to_two_kernels():
    torch.manual_seed(4)

    class Scale(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.s = s

        def forward(self, x):
            return self.s * x

    mix = GatedKernelMixture([Scale(1.0), Scale(-1.0)], ParameterGate(1, 2, hidden=16))
    opt = torch.optim.Adam(mix.gate.parameters(), lr=1e-2)
    for _ in range(300):
        theta = torch.rand(64, 1) * 2 - 1
        x = torch.randn(64, 3)
        target = torch.where(theta < 0, x, -x)  # regime theta < 0 -> kernel 0, else kernel 1
        loss = (mix(x, theta) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    theta = torch.linspace(-1, 1, 41)[:, None]
    index = mix.gate(theta).index
    far = theta[:, 0].abs() > 0.1
    assert torch.equal(index[far], (theta[far, 0] > 0).long())


def test_mismatched_kernel_count():
    with pytest.raises(ValueError, match="chooses among 3 kernels, got 2"):
        GatedKernelMixture([nn.Identity(), nn.Identity()], ParameterGate(1, 3))


def test_attention_kernel_uses_context_and_is_batch_independent():
    torch.manual_seed(5)
    att = AttentionKernel(16, 4)
    x, ctx = torch.randn(3, 7, 16), torch.randn(3, 2, 16)
    y = att(x, ctx)
    assert y.shape == (3, 7, 16)
    assert not torch.allclose(y, att(x, ctx + 1.0))
    assert torch.allclose(y[0], att(x[:1], ctx[:1])[0], atol=1e-6)
    with pytest.raises(ValueError, match="not divisible"):
        AttentionKernel(10, 3)
    with pytest.raises(ValueError, match="heads: must be >= 1, got 0"):  # (was a ZeroDivisionError)
        AttentionKernel(16, 0)


def test_attention_kernels_name_tokens_of_the_wrong_shape():
    from gno_ext.layers.attention import AttentionKernelBank

    att, bank, index = AttentionKernel(16, 4), AttentionKernelBank(2, 16, 4), torch.tensor([0, 1, 0])
    x = torch.randn(3, 7, 16)
    cases = [(dict(x=torch.randn(3, 7, 12)), r"x: expected shape \(3, N, 16\), got \(3, 7, 12\)"),
             (dict(x=x, context=torch.randn(2, 5, 16)), r"context: expected shape \(3, M, 16\) like x, got \(2, 5, 16\)"),
             (dict(x=x, context=torch.randn(3, 5, 8)), r"context: expected shape \(3, M, 16\) like x, got \(3, 5, 8\)")]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            att(**kwargs)
        with pytest.raises(ValueError, match=match):
            bank(index=index, **kwargs)
    with pytest.raises(ValueError, match=r"index: expected integer kernel ids of shape \(4,\), one per sample of x, "
                                         r"got torch.int64 of shape \(3,\)"):
        bank(torch.randn(4, 7, 16), index)  # one kernel index per sample


def test_static_attention_mixture_equals_dispatch_with_gradients():
    from gno_ext.layers import dispatch

    torch.manual_seed(6)
    kernels = [AttentionKernel(16, 4) for _ in range(3)]
    mix = GatedKernelMixture(kernels, ParameterGate(1, 3))
    assert mix.stacked
    x, ctx, theta = torch.randn(9, 5, 16), torch.randn(9, 2, 16), torch.linspace(-5, 5, 9)[:, None]
    routing = mix.gate(theta)
    fast = mix(x, None, routing=routing, context=ctx)
    fast.square().sum().backward()
    fast_grads = [p.grad.clone() for p in mix.parameters()]
    mix.zero_grad()
    slow = dispatch(mix.kernels, mix.gate(theta), x, context=ctx)
    slow.square().sum().backward()
    assert torch.allclose(fast, slow, atol=1e-5)
    for g_fast, p in zip(fast_grads, mix.parameters()):
        assert torch.allclose(g_fast, p.grad if p.grad is not None else torch.zeros_like(g_fast), atol=1e-4)


@pytest.mark.parametrize("batch,chunk", [(7, 1), (7, 2), (40, 4), (40, 8)])
def test_chunked_attention_mixture_equals_each_samples_kernel_with_gradients(batch, chunk):
    """Grouped in chunks by kernel (one kernel chosen by no sample), each sample still gets
    exactly its own kernel's output, and each kernel the gradient of its own samples."""
    from gno_ext.layers import mixed_attention

    torch.manual_seed(7)
    kernels = [AttentionKernel(16, 4) for _ in range(4)]
    x, ctx = torch.randn(batch, 5, 16, requires_grad=True), torch.randn(batch, 3, 16)
    index = torch.randint(0, 3, (batch,))  # kernel 3 unused
    y = mixed_attention(kernels, index, x, ctx, chunk=chunk)
    weights = torch.randn_like(y)
    (y * weights).sum().backward()
    got = [[p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in k.parameters()] for k in kernels]
    gx = x.grad.clone()
    for k in kernels:
        k.zero_grad()
    x.grad = None
    ref = torch.cat([kernels[int(i)](x[j:j + 1], ctx[j:j + 1]) for j, i in enumerate(index)])
    (ref * weights).sum().backward()
    assert torch.allclose(y, ref, atol=1e-5)
    assert torch.allclose(gx, x.grad, atol=1e-5)
    for k, grads in zip(kernels, got):
        for g, p in zip(grads, k.parameters()):
            assert torch.allclose(g, p.grad if p.grad is not None else torch.zeros_like(g), atol=1e-4)
    assert all(g.abs().max() == 0 for g in got[3])


def test_chunk_zero_takes_the_chunked_products_where_the_gathered_ones_could_run(monkeypatch):
    """``chunk=None`` takes the gathered-weight products where they can run; ``chunk=0`` the
    chunked products at their default size, with the same result."""
    from gno_ext.layers import AttentionKernelBank, _gathered

    torch.manual_seed(8)
    bank = AttentionKernelBank(3, 16, 4)
    x, ctx, index = torch.randn(9, 5, 16), torch.randn(9, 3, 16), torch.tensor([0, 2, 2, 1, 0, 0, 1, 2, 2])
    want = bank(x, index, ctx, chunk=None)  # on the CPU: chunked
    calls = []

    def gathered(t, index, weight, bias=None, plan=None):
        calls.append(t.shape)
        return torch.einsum("bti,bio->bto", t, weight[index]) + (0 if bias is None else bias[index][:, None])

    monkeypatch.setattr(_gathered, "usable", lambda x: True)
    monkeypatch.setattr(_gathered, "run_plan", lambda index, n_kernels: None)
    monkeypatch.setattr(_gathered, "gathered_linear", gathered)
    assert torch.allclose(bank(x, index, ctx, chunk=0), want, atol=1e-6) and calls == []
    assert torch.allclose(bank(x, index, ctx, chunk=None), want, atol=1e-5) and len(calls) == 3


def test_chunk_plan_groups_samples_of_one_kernel_per_chunk():
    from gno_ext.layers.attention import chunk_plan, default_chunk

    index = torch.tensor([2, 0, 2, 2, 1, 2, 0])
    slot, chunk_kernel = chunk_plan(index, 3, 2)
    assert len(set(slot.tolist())) == len(index)  # distinct rows
    assert chunk_kernel.shape == ((7 + 3 * (2 - 1)) // 2,)
    assert torch.equal(chunk_kernel[slot // 2], index)  # each sample sits in a chunk of its kernel
    assert default_chunk(32, 4) == 1 and default_chunk(256, 4) == 4 and default_chunk(1024, 4) == 16


@pytest.mark.parametrize("chunk", [1, 4])
def test_kernel_bank_equals_its_kernels_with_gradients(chunk):
    """Stacked weights give each sample its kernel's output, and slice k of each stacked
    parameter the gradient of kernel k (zero for the unused kernel)."""
    from gno_ext.layers import AttentionKernelBank, mixed_attention

    torch.manual_seed(10)
    bank = AttentionKernelBank(4, 16, 4)
    kernels = [bank.kernel(k) for k in range(4)]
    x, ctx = torch.randn(20, 5, 16), torch.randn(20, 3, 16)
    index = torch.randint(0, 3, (20,))
    index[index == 1] = 3  # kernel 1 unused
    probe = torch.randn(20, 5, 16)
    y = bank(x, index, ctx, chunk=chunk)
    (y * probe).sum().backward()
    ref = mixed_attention(kernels, index, x, ctx, chunk=chunk)
    (ref * probe).sum().backward()
    per_sample = torch.cat([kernels[int(i)](x[j:j + 1], ctx[j:j + 1]) for j, i in enumerate(index)])
    assert torch.allclose(y, ref, atol=1e-6) and torch.allclose(y, per_sample, atol=1e-5)
    for k, kernel in enumerate(kernels):
        for name in ("q", "kv", "out"):
            lin = getattr(kernel, name)
            assert torch.allclose(getattr(bank, f"{name}_weight").grad[k], lin.weight.grad.t(), atol=1e-5)
            assert torch.allclose(getattr(bank, f"{name}_bias").grad[k], lin.bias.grad, atol=1e-5)
    assert not bank.q_weight.grad[1].any() and not bank.out_bias.grad[1].any()


def test_row_move_is_a_gather_both_ways():
    """The chunk layout's row moves: padding rows are zero, the gradient is the inverse
    gather (checked numerically), and the backward pass runs no scatter (``index_add``)."""
    from gno_ext.layers.attention import _MoveRows
    from tests._dispatch import RecordOps

    x = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    sample_of = torch.tensor([1, 3, 0, 3, 2, 3])  # six rows, three of them padding (3)
    slot = torch.tensor([2, 0, 4])
    padded = _MoveRows.apply(x, sample_of, slot)
    assert torch.equal(padded[[0, 2, 4]], x[[1, 0, 2]]) and not padded[[1, 3, 5]].any()
    assert torch.equal(_MoveRows.apply(padded, slot, sample_of), x)
    assert torch.autograd.gradcheck(lambda t: _MoveRows.apply(t, sample_of, slot), (x,))
    assert torch.autograd.gradcheck(lambda t: _MoveRows.apply(t, slot, sample_of),
                                    (torch.randn(6, 2, 4, dtype=torch.float64, requires_grad=True),))

    y = _MoveRows.apply(_MoveRows.apply(x, sample_of, slot), slot, sample_of)
    with RecordOps() as ops:
        y.sum().backward()
    assert "index_select" in " ".join(ops.names) and not any("index_add" in n or "scatter" in n for n in ops.names)


@pytest.mark.slow
def test_chunked_kernel_bank_compiles_into_one_graph_with_gradients():
    """The chunked path (row moves, products, attention) traces with ``fullgraph=True``, and
    the compiled forward and backward passes match eager mode."""
    from gno_ext.layers import AttentionKernelBank

    torch.manual_seed(13)
    bank = AttentionKernelBank(3, 16, 4)
    x, ctx = torch.randn(12, 5, 16, requires_grad=True), torch.randn(12, 2, 16)
    index = torch.tensor([0, 2, 2, 1, 0, 2, 2, 2, 1, 0, 2, 1])
    probe = torch.randn(12, 5, 16)
    grads = []
    for fn in (bank, torch.compile(bank, backend="aot_eager", fullgraph=True)):
        x.grad = None
        bank.zero_grad()
        y = fn(x, index, ctx, chunk=2)
        (y * probe).sum().backward()
        grads.append((y.detach(), x.grad.clone(), bank.kv_weight.grad.clone()))
    for eager, compiled in zip(*grads):
        assert torch.allclose(eager, compiled, atol=1e-5)


def test_kernel_ids_of_the_bank_and_mixed_attention_must_be_one_integer_per_sample():
    """(Float ids gave an output without a word; an index of another length was reported as
    a wrong x. The ids' range is not checked: that would read the device.)"""
    from gno_ext.layers.attention import AttentionKernelBank, mixed_attention

    torch.manual_seed(0)
    bank, x = AttentionKernelBank(2, 16, 2), torch.randn(3, 5, 16)
    kernels = [bank.kernel(k) for k in range(2)]
    assert bank(x, torch.tensor([0, 1, 1])).shape == x.shape
    for run in (bank, lambda x, index: mixed_attention(kernels, index, x)):
        for index, match in [(torch.tensor([0, 1]), r"of shape \(3,\), one per sample of x, got torch.int64 of shape \(2,\)"),
                             (torch.tensor([0.0, 1.0, 1.0]), r"of shape \(3,\), one per sample of x, got torch.float32"),
                             (torch.tensor([[0], [1], [1]]), r"of shape \(3,\), one per sample of x, got torch.int64 "
                                                             r"of shape \(3, 1\)")]:
            with pytest.raises(ValueError, match="index: .*" + match):
                run(x, index)


def test_kernel_bank_initialises_and_loads_like_separate_kernels():
    from gno_ext.layers import AttentionKernelBank

    torch.manual_seed(11)
    bank = AttentionKernelBank(3, 16, 4)
    torch.manual_seed(11)
    kernels = [AttentionKernel(16, 4) for _ in range(3)]
    for k, kernel in enumerate(kernels):
        own = bank.kernel(k).state_dict().values()
        assert all(torch.equal(a, b) for a, b in zip(own, kernel.state_dict().values()))
    # the state dict of three separate kernels (e.g. an older checkpoint) loads strictly
    old = {f"{k}.{key}": value + 1.0 for k, kernel in enumerate(kernels) for key, value in kernel.state_dict().items()}
    bank.load_state_dict(old)
    assert torch.equal(bank.kv_weight[2], kernels[2].kv.weight.t() + 1.0)
    assert torch.equal(bank.out_bias[0], kernels[0].out.bias + 1.0)
    assert sum(p.numel() for p in bank.parameters()) == sum(p.numel() for k in kernels for p in k.parameters())
    assert len(list(bank.parameters())) == 6
    with pytest.raises(ValueError, match="n_kernels: must be >= 1, got 0"):
        AttentionKernelBank(0, 16, 4)


def test_single_kernel_bank_is_the_plain_kernel_with_gradients():
    """With K = 1 the bank runs plain products (no grouping) and equals its one kernel."""
    from gno_ext.layers import AttentionKernelBank

    torch.manual_seed(15)
    bank = AttentionKernelBank(1, 16, 4)
    kernel = bank.kernel(0)
    x, ctx = torch.randn(6, 5, 16), torch.randn(6, 2, 16)
    probe = torch.randn(6, 5, 16)
    y = bank(x, torch.zeros(6, dtype=torch.long), ctx, chunk=2)
    (y * probe).sum().backward()
    ref = kernel(x, ctx)
    (ref * probe).sum().backward()
    assert torch.allclose(y, ref, atol=1e-6)
    assert torch.allclose(bank.kv_weight.grad[0], kernel.kv.weight.grad.t(), atol=1e-5)
    assert torch.allclose(bank.out_bias.grad[0], kernel.out.bias.grad, atol=1e-5)


def _strategies():
    """Each fast strategy of the mixture as ``(kernels, run(index, x, context))``."""
    from gno_ext.layers import AttentionKernel, GatedSpectralConv, Routing, dispatch, mixed_attention

    def attention():
        return [AttentionKernel(16, 4) for _ in range(3)]

    def by_dispatch(kernels, index, x, ctx):
        probs = torch.nn.functional.one_hot(index, len(kernels)).float()
        routing = Routing(probs, index, torch.ones(len(index)), torch.zeros(()))
        return dispatch(kernels, routing, x, context=ctx)

    yield "dispatch", attention(), by_dispatch
    for chunk in (1, 3):
        yield f"chunked-{chunk}", attention(), lambda k, i, x, c, chunk=chunk: mixed_attention(k, i, x, c, chunk=chunk)
    conv = GatedSpectralConv(3, 3, (4, 4), n_kernels=3, n_params=1)
    yield "spectral-gathered", list(conv.kernels), lambda k, i, x, c: conv._gathered(x, i)


@pytest.mark.parametrize("name", [s[0] for s in _strategies()])
def test_every_strategy_equals_the_reference_mixture(name):
    """`reference_mixture` (one sample at a time) is the definition: each fast strategy gives
    its output and the same gradients for the input and every kernel's parameters (zero or
    none for a kernel no sample selects)."""
    from gno_ext.layers import reference_mixture

    torch.manual_seed(21)
    _, kernels, run = next(s for s in _strategies() if s[0] == name)
    spectral = name.startswith("spectral")
    x = torch.randn(7, 3, 8, 8) if spectral else torch.randn(7, 5, 16)
    x.requires_grad_(True)
    ctx = None if spectral else torch.randn(7, 2, 16)
    index = torch.tensor([2, 0, 2, 2, 0, 2, 0])  # kernel 1 unused
    params = [p for k in kernels for p in k.parameters()]
    probe = torch.randn_like(run(kernels, index, x, ctx))

    def grads(y):
        return torch.autograd.grad((y * probe).sum(), [x, *params], allow_unused=True)

    fast = run(kernels, index, x, ctx)
    ref = reference_mixture(kernels, index, x) if spectral else reference_mixture(kernels, index, x, context=ctx)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads(fast), grads(ref)):
        torch.testing.assert_close(torch.zeros_like(r) if g is None and r is not None else g,
                                   torch.zeros_like(g) if r is None and g is not None else r, rtol=1e-5, atol=1e-5)


def test_the_strategy_is_chosen_apart_from_the_strategies(monkeypatch):
    """`mixture_strategy` picks the strategy that `mixed_attention` runs: one kernel takes plain
    products; the gathered kernels where they run unless a chunk is asked for; else one-hot
    weights per sample in small batches and groups of samples in large ones."""
    from gno_ext.layers import _gathered, attention

    small, large = torch.zeros(8, 5, 16), torch.zeros(1024, 5, 16)
    assert attention.mixture_strategy(1, large) == ("single", 0)
    assert attention.mixture_strategy(4, small) == ("per-sample", 1)
    assert attention.mixture_strategy(4, large) == ("chunked", 16)  # 1024 / (16 x 4)
    assert attention.mixture_strategy(4, small, chunk=3) == ("chunked", 3)
    monkeypatch.setattr(_gathered, "usable", lambda x: True)  # as on a GPU with Triton
    assert attention.mixture_strategy(4, small) == ("gathered", 0)
    assert attention.mixture_strategy(4, small, chunk=2) == ("chunked", 2)
    ran = []
    monkeypatch.setattr(attention, "_grouped", lambda *args: ran.append(args[5]) or args[3])
    monkeypatch.setattr(attention, "mixture_strategy", lambda n, x, chunk: ("chunked", 5))
    kernels = [attention.AttentionKernel(16, 4) for _ in range(2)]
    attention.mixed_attention(kernels, torch.zeros(8, dtype=torch.long), small)
    assert ran == [5]  # mixed_attention runs what the choice says


def test_route_all_evaluates_a_changed_gate_on_its_own():
    """The batched evaluation of several gates assumes Linear, activation, Linear of one shape and
    one activation; a gate whose MLP was changed must still get its own routing (it used to be
    computed with the first gate's activation, or fail on a deeper MLP)."""
    from gno_ext.layers import route_all

    torch.manual_seed(3)
    theta = torch.randn(9, 2)
    for change in (lambda s: s.__setitem__(1, nn.Tanh()),
                   lambda s: s.__setitem__(1, nn.GELU(approximate="tanh")),
                   lambda s: s.insert(2, nn.Linear(8, 8))):
        gates = [ParameterGate(2, 3, hidden=8) for _ in range(3)]
        change(gates[2].score)
        for got, gate in zip(route_all(gates, theta), gates):
            want = gate(theta)
            assert torch.equal(got.index, want.index) and torch.allclose(got.probs, want.probs, atol=1e-6)
    same = [ParameterGate(2, 3, hidden=8) for _ in range(3)]  # the batched path: still equal
    for got, gate in zip(route_all(same, theta), same):
        assert torch.allclose(got.probs, gate(theta).probs, atol=1e-6)


def test_boundary_operator_takes_the_fused_kernels_only_in_their_form():
    """The fused boundary kernels read the MLP's layers by position with the exact GELU: an
    operator whose MLP was changed is no longer of their form, and takes the PyTorch path."""
    from gno_ext.layers import BoundaryTransfer

    assert BoundaryTransfer(64, 2).has_fused_form()
    for change in (lambda m: m.mlp.__setitem__(2, nn.Tanh()),
                   lambda m: m.mlp.__setitem__(2, nn.GELU(approximate="tanh")),
                   lambda m: m.mlp.append(nn.GELU()),
                   lambda m: setattr(m, "norm", nn.Identity())):
        op = BoundaryTransfer(64, 2)
        change(op)
        assert not op.has_fused_form()


def test_balance_losses_collects_every_gates_term_once_and_nests():
    """The load-balance terms reach the loss through `balance_losses`: each gate that runs in the
    block hands over its term once (also through `route_all`, batched or not), a nested block
    takes its own gates' terms, and outside any block nothing is kept."""
    from gno_ext.layers import balance_losses, route_all

    torch.manual_seed(4)
    gates, theta = [ParameterGate(2, 3, hidden=8) for _ in range(3)], torch.randn(5, 2)
    gates[0](theta)  # outside a block: nothing is recorded, nothing fails
    with balance_losses() as outer:
        first = gates[0](theta)
        with balance_losses() as inner:
            batched = route_all(gates, theta)
        gates[2].score[1] = nn.Tanh()  # no longer stackable: route_all runs the gates one by one
        with balance_losses() as single:
            one_by_one = route_all(gates, theta)
    assert [t is r.balance_loss for t, r in zip(inner, batched)] == [True] * 3
    assert [t is r.balance_loss for t, r in zip(single, one_by_one)] == [True] * 3
    assert len(outer) == 1 and outer[0] is first.balance_loss and outer[0].requires_grad


def test_balance_losses_are_collected_from_a_compiled_model():
    """`torch.compile` (one graph, no break) appends the same terms as the eager model."""
    from gno_ext.layers import balance_losses

    class TwoGates(nn.Module):
        def __init__(self):
            super().__init__()
            self.gates = nn.ModuleList(ParameterGate(2, 3, hidden=8) for _ in range(2))

        def forward(self, theta):
            return sum(g(theta).weight for g in self.gates)

    torch.manual_seed(5)
    model, theta = TwoGates(), torch.randn(6, 2)
    with balance_losses() as eager:
        model(theta)
    with balance_losses() as compiled:
        torch.compile(model, fullgraph=True)(theta)
    assert len(compiled) == 2 and all(torch.allclose(c, e) for c, e in zip(compiled, eager))


def test_the_gates_input_has_one_definition():
    """`gate_input`: the normalised parameters, then each field channel's mean and RMS; the
    baselines' condition without the boundary (what ``gno_fno``'s gates read) is the same."""
    from gno_ext.layers.gate import gate_input
    from gno_ext.models import get_model

    torch.manual_seed(6)
    theta, field = torch.randn(3, 2), torch.randn(3, 2, 8, 8)
    want = torch.cat([theta, field.mean((2, 3)), field.pow(2).mean((2, 3)).sqrt()], 1)
    assert torch.equal(gate_input(theta, field, 2), want)
    assert torch.equal(gate_input(theta, None, 2), theta) and gate_input(None, None, 2) is None
    fno = get_model("fno", n_params=2, field_channels=2, n_modes=4, hidden_channels=8, n_layers=1)
    got = fno.condition(theta, field, None, 3, torch.float32, use_boundary=False)
    assert torch.equal(got, gate_input(fno.param_norm(theta), field, 2))
