"""Under `torch.compile`, each Triton kernel writes only its outputs, as torch sees it.

For a user-defined Triton kernel, torch works out which pointer arguments the kernel writes by
walking its Triton IR backwards from every store (`torch._higher_order_ops.triton_kernel_wrap`).
A store's address that passes through a `@triton.jit` helper taking pointers (an offset returned
by a helper that also loads) makes every pointer given to that helper count as written. The
compiled model then copies those inputs before each launch: after such a refactoring of the
attention kernels, their compiled forward plus backward pass was slower than the eager one on
an H100, and the GPU test that compares them with SDPA eager and compiled
(``test_token_attention.py``) failed to compile: its inputs, leaves that require gradients,
counted as written in place.

Here every operator is called on CPU tensors with its launches recorded instead of run, and
torch's analysis (for an H100 target, no GPU needed) must find exactly the kernel's outputs
written. An analysis that fails counts every tensor as written, so it fails this test too.
"""

import importlib
import itertools
import logging
from importlib.util import find_spec

import pytest
import torch

from tests.layers import _targets

pytestmark = pytest.mark.skipif(find_spec("triton") is None, reason="Triton is not installed")

# kernel -> the pointer arguments it writes
OUTPUTS = {
    "_token_attention_forward": {"o_ptr", "lse_ptr"},
    "_token_attention_backward": {"dq_ptr", "dkv_ptr"},
    "_token_attention_backward_keys": {"dq_ptr", "dkv_ptr"},
    "_gathered_mm_kernel": {"y_ptr"},
    "_grouped_wgrad_kernel": {"dw_ptr", "dbias_ptr"},
    "_boundary_forward_kernel": {"y_ptr", "saved_ptr"},
    "_boundary_backward_kernel": {"dstate_ptr", "grads_ptr", "sums_ptr"},
    "_boundary_wgrad_kernel": {"out_ptr"},
}
MODULES = ("gathered", "attention", "boundary")
# flags under which a kernel leaves one of its outputs unwritten (the attention's split backward pass)
SKIPPED_WHEN_OFF = {"WRITE_DQ": "dq_ptr", "WRITE_KV": "dkv_ptr"}


def expected_writes(name: str, kwargs: dict) -> set[str]:
    """The outputs that kernel ``name`` writes when launched with ``kwargs``."""
    return OUTPUTS[name] - {out for flag, out in SKIPPED_WHEN_OFF.items() if kwargs.get(flag) is False}


@pytest.fixture
def launches():
    """The launches of the kernel modules' operators, ``(kernel, args, kwargs)``, recorded
    instead of run (`tests.layers._targets.recording`)."""
    with _targets.recording(*(importlib.import_module(f"gno_ext.kernels.{name}") for name in MODULES)) as recorded:
        yield recorded


@pytest.fixture
def target(monkeypatch):
    """An H100 as Triton's target where there is no GPU (the analysis compiles to Triton IR)."""
    import triton

    if torch.cuda.is_available():
        return
    from triton.backends.compiler import GPUTarget

    class _Driver:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    if not hasattr(triton.runtime.driver, "_active"):
        pytest.skip(f"Triton {triton.__version__}: no driver setting that this test knows")
    monkeypatch.setattr(triton.runtime.driver, "_active", _Driver())


def written(kernel, kwargs: dict) -> set[str]:
    """The arguments of ``kernel`` that torch's analysis finds written."""
    from torch._higher_order_ops import triton_kernel_wrap as wrap

    if hasattr(wrap, "identify_accessed_tensors"):  # torch >= 2.12
        return {dep.name for dep in wrap.identify_accessed_tensors(kernel, kwargs, {}).read_writes.writes}
    if hasattr(wrap, "identify_mutated_tensors"):
        return set(wrap.identify_mutated_tensors(kernel, kwargs, {}))
    pytest.skip(f"torch {torch.__version__} has no Triton mutation analysis that this test knows")


def run_operators(monkeypatch) -> None:
    """Forward and backward passes of every operator on small CPU tensors (the kernels are not
    run: the outputs are left as allocated)."""
    from gno_ext.kernels import load
    from gno_ext.layers import _gathered, boundary

    ops = torch.ops.gno_ext
    # the key-tiled backward kernel (<= 64 queries) and the query-tiled one, each with one tile
    # of keys (97) and with more (300: the forward kernel's loop over key tiles; with 150
    # queries, the backward kernels' split pair)
    for n, m in itertools.product((64, 150), (97, 300)):
        q = torch.randn(2, n, 4, 32, requires_grad=True)
        kv = torch.randn(2, m, 2, 4, 32, requires_grad=True)
        out, _ = ops.token_attention(q, kv)
        out.sum().backward()
    x, weight, bias = torch.randn(8, 97, 64, requires_grad=True), torch.randn(4, 64, 128), torch.randn(4, 128)
    weight.requires_grad_(), bias.requires_grad_()
    index = torch.tensor([0, 1, 1, 3, 0, 0, 2, 1])
    ops.gathered_mm(x, index, weight, bias, _gathered.run_plan(index, 4, 2), 2).sum().backward()
    kernels = load("boundary")
    assert kernels is not None
    monkeypatch.setattr(boundary, "_kernels", kernels)  # (loaded on import only where CUDA is)
    bt = boundary.BoundaryTransfer(256, 2)
    desc, state = torch.randn(3, 32, 64, requires_grad=True), torch.randn(3, 32, 256, requires_grad=True)
    bt.forward_fused(desc, state).sum().backward()


def test_each_kernel_writes_only_its_outputs(launches, target, caplog, monkeypatch):
    run_operators(monkeypatch)
    seen = {}
    for kernel, args, kwargs in launches:
        named = dict(zip(kernel.arg_names, args))
        named.update((k, v) for k, v in kwargs.items() if k in kernel.arg_names)
        with caplog.at_level(logging.WARNING):
            seen.setdefault(kernel.fn.__name__, []).append((written(kernel, named), expected_writes(kernel.fn.__name__,
                                                                                                    kwargs)))
    assert set(seen) == set(OUTPUTS), f"kernels launched: {sorted(seen)}"
    assert {"dq_ptr"} in [want for _, want in seen["_token_attention_backward_keys"]]  # the split pass ran
    assert {kwargs["ONE_TILE"] for kernel, _, kwargs in launches  # the forward pass ran in both regimes
            if kernel.fn.__name__ == "_token_attention_forward"} == {True, False}
    for name, found in seen.items():
        for writes, want in found:
            assert writes == want, (f"{name}: torch finds {sorted(writes)} written, expected {sorted(want)}; "
                                    f"log: {caplog.text[-2000:]}")
