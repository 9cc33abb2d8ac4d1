"""`gno_ext.layers.fold`: the boundary tokens' projection and norm folded into the kernels'
key/value weights compute the same keys and values (float64), in every layer that takes them,
and the GNO block folds where that saves work."""

import pytest
import torch
from torch import nn

from gno_ext.layers import AttentionKernel, AttentionKernelBank
from gno_ext.layers.fold import ALIGN, ContextRows, context_rows_kv, fold_projection, fold_saves


def _perturbed(*modules):
    """Parameters away from their initialisation (norm gains at 1, biases at 0)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for m in modules:
            for p in m.parameters():
                p.add_(0.3 * torch.randn_like(p))


@pytest.mark.parametrize("proj_bias,affine,kv_bias", [(True, True, True), (False, True, False), (True, False, True)])
def test_folded_rows_give_the_keys_and_values_of_the_normalised_projection(proj_bias, affine, kv_bias):
    torch.manual_seed(0)
    width, dim, k, b, m = 12, 40, 3, 5, 7
    out = nn.Linear(width, dim, bias=proj_bias).double()
    norm = nn.LayerNorm(dim, elementwise_affine=affine).double()
    _perturbed(out, norm)
    weight = torch.randn(k, dim, 2 * dim, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(k, 2 * dim, dtype=torch.float64, requires_grad=True) if kv_bias else None
    s = torch.randn(b, m, width, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([2, 0, 2, 1, 0])
    folded = fold_projection(s, out, norm, weight, bias)
    assert folded.rows.shape == (b, m, 16) and folded.rows.shape[-1] % ALIGN == 0  # 13 padded to 16
    assert folded.weight.shape == (k, 16, 2 * dim) and folded.bias.shape == (k, 2 * dim)
    assert not folded.rows[..., width + 1:].any() and not folded.weight[:, width + 1:].any()
    got = context_rows_kv(folded, index)
    want = torch.bmm(norm(out(s)), weight[index]) + (0 if bias is None else bias[index][:, None])
    assert torch.allclose(got, want, atol=1e-12, rtol=1e-12), (got - want).abs().max()
    # gradients of everything the keys and values depend on
    leaves = [s, weight, *out.parameters(), *norm.parameters()] + ([bias] if kv_bias else [])
    probe = torch.randn_like(want)
    for g, r in zip(torch.autograd.grad((got * probe).sum(), leaves), torch.autograd.grad((want * probe).sum(), leaves)):
        assert torch.allclose(g, r, atol=1e-10, rtol=1e-10), (g - r).abs().max()


def test_fold_checks_its_shapes_and_the_single_kernel_needs_no_index():
    out, norm = nn.Linear(8, 16), nn.LayerNorm(16)
    with pytest.raises(ValueError, match=r"state: expected width 8"):
        fold_projection(torch.zeros(2, 3, 9), out, norm, torch.zeros(1, 16, 32), None)
    with pytest.raises(ValueError, match=r"weights \(K, 16, E\)"):
        fold_projection(torch.zeros(2, 3, 8), out, norm, torch.zeros(1, 12, 32), None)
    folded = fold_projection(torch.randn(2, 3, 8), out, norm, torch.randn(1, 16, 32), None)
    assert torch.equal(context_rows_kv(folded), context_rows_kv(folded, torch.zeros(2, dtype=torch.long)))
    with pytest.raises(ValueError, match="index: needed for 2 kernels"):
        context_rows_kv(ContextRows(folded.rows, folded.weight.expand(2, -1, -1), folded.bias.expand(2, -1)))


def test_fold_pays_from_a_batch_size_on():
    """The folded weights cost a fixed amount per call: folding pays from about 11 samples at
    the paper size (32 boundary tokens), from 6 at the trl grid's 64, and never pays less with
    more samples."""
    first = lambda tokens, k: next(b for b in range(1, 1000) if fold_saves(b, tokens, 64, 256, k))
    assert first(32, 4) == 11 and first(64, 4) == 6 and first(32, 1) == 3
    assert all(fold_saves(b, 32, 64, 256, 4) for b in range(11, 300))


@pytest.mark.parametrize("chunk", [1, 2])
def test_bank_and_single_kernel_take_context_rows_as_more_context_tokens(chunk):
    """The bank (chunked products, one sample or two per weight group) and a single
    `AttentionKernel` give, with ``context_rows``, what they give with the rows' keys and
    values as context tokens of their own; gradients included (float64)."""
    torch.manual_seed(2)
    dim, width, k, b = 32, 8, 3, 6
    bank = AttentionKernelBank(k, dim, 4).double()
    out, norm = nn.Linear(width, dim).double(), nn.LayerNorm(dim).double()
    _perturbed(bank, out, norm)
    x = torch.randn(b, 10, dim, dtype=torch.float64, requires_grad=True)
    theta = torch.randn(b, 1, dim, dtype=torch.float64)
    s = torch.randn(b, 5, width, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 2, 2, 0, 0, 2])  # kernel 1 unused
    leaves = [x, s, *bank.parameters(), *out.parameters(), *norm.parameters()]
    folded = bank(x, index, theta, chunk=chunk, context_rows=fold_projection(s, out, norm, bank.kv_weight, bank.kv_bias))
    plain = bank(x, index, torch.cat([theta, norm(out(s))], 1), chunk=chunk)
    assert torch.allclose(folded, plain, atol=1e-12), (folded - plain).abs().max()
    grads = [torch.autograd.grad(y.square().sum(), leaves, allow_unused=True) for y in (folded, plain)]
    for g, r in zip(*grads):
        assert (g is None) == (r is None) and (g is None or torch.allclose(g, r, atol=1e-10))
    single = AttentionKernel(dim, 4).double()
    rows = fold_projection(s, out, norm, single.kv.weight.t()[None], single.kv.bias[None])
    assert torch.allclose(single(x, theta, context_rows=rows), single(x, torch.cat([theta, norm(out(s))], 1)),
                          atol=1e-12)
    with pytest.raises(ValueError, match=r"context_rows.weight: expected shape \(1, 16, 64\), got \(1, 8, 64\)"):
        single(x, theta, context_rows=ContextRows(rows.rows, rows.weight[:, :8], rows.bias))
    with pytest.raises(ValueError, match=r"context_rows.rows: expected shape \(6, M, r\)"):
        bank(x, index, theta, context_rows=ContextRows(rows.rows[:2], rows.weight, rows.bias))
