"""Time one layer of the GNO on its own, for each of its paths and modes (``eager``;
``compiled``: ``torch.compile``): the forward pass (no grad) and forward + backward (gradients
of the inputs and of every parameter). ``--precision``: ``bf16`` autocast (default, as the GNO
trains), ``float32`` (TF32 off, PyTorch's default) or ``tf32`` (float32 with TF32 products
allowed, as ``torch.set_float32_matmul_precision("high")`` sets).

Layers (``--layers``) and their paths (``--paths``, default: all of the layer's):

* ``boundary``: one `BoundaryTransfer` on a batch of random boundary tokens. Paths: ``fused``
  (the Triton kernels of `gno_ext.kernels.boundary`, CUDA only), ``unfused`` (PyTorch).
* ``attention``: `attend_tokens` on random queries ``(B, N, H, d)`` and keys/values
  ``(B, M, 2, H, d)``, for each ``--keys`` M. Paths: ``fused`` (the Triton kernels of
  `gno_ext.kernels.attention`, CUDA only, with their default choice of backward
  kernel), ``fused-query-tiles`` (the same, the backward pass forced onto the query-tiled
  kernel), ``fused-key-tiles`` (the same, with no tile of every key: the forward pass loops
  over key tiles and the backward pass with more than 64 queries is the split pair, as beyond
  128 keys at head width 32), ``sdpa`` (`scaled_dot_product_attention`). The fused paths run
  the kernels even where `attend_tokens` would not (float32 without TF32); each row says
  which path the library takes (``library``).
* ``products``: the mixture's projections, ``x_b W_{k_b} + c_{k_b}`` with each sample's kernel
  ``k_b`` drawn at random from ``--kernels`` K, at the two shapes of the GNO's attention
  kernel: ``queries`` rows D -> D (the query and output projections) and, for each ``--keys``
  M, M rows D -> 2D (keys and values). Paths: ``gathered`` (`gno_ext.layers._gathered`'s
  Triton kernels, which the GNO uses; CUDA only), ``grouped-mm`` (the samples sorted by kernel,
  ``torch._grouped_mm`` over the sorted rows, the bias added per sample and the rows put back
  in batch order; the sort and its inverse are timed too), ``dense`` (one weight for every
  sample, ``F.linear``: the single-kernel stand-in's product, the mark to reach).

On a GPU, ``--calls`` calls are captured in one CUDA graph and the graph's replays are timed
(so launch overheads are left out, as in a model compiled with CUDA graphs); on a CPU the calls
are timed one by one. Either way with `gno_ext.benchmark.timing.timed`: warm-up runs (at least 2 s on a GPU),
then the median of ``--repeats`` synchronised runs. Inductor's FX graph cache (and with it
AOTAutograd's cache) is off while a compiled row is timed: the caches do not see the kernels'
launch settings, so a cached graph could run another row's kernel.

    python benchmarks/bench_layers.py                          # both layers at the paper size, batch 256
    python benchmarks/bench_layers.py --layers attention --keys 65 97 --modes eager
    python benchmarks/bench_layers.py --device cpu --batch 16 --layers boundary --paths unfused --modes eager
    python benchmarks/bench_layers.py --layers products --modes eager
    python benchmarks/bench_layers.py --precision float32 --modes compiled
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from gno_ext.benchmark.timing import timed  # (the same timing as the model benchmark)
from gno_ext.kernels import precision as kernel_precision
from gno_ext.layers import _gathered, attention
from gno_ext.layers.boundary import BoundaryTransfer
from gno_ext.training import capture_step


def replay_time(fn: Callable[[], None], calls: int, repeats: int) -> float:
    """Seconds per call of ``fn``: ``calls`` calls captured in one CUDA graph
    (`gno_ext.training.capture_step`), timed by replaying the graph (`gno_ext.benchmark.timing.timed`)."""

    def many() -> None:
        for _ in range(calls):
            fn()

    return timed(capture_step(many), repeats, "cuda") / calls


PATHS = {"boundary": ("unfused", "fused"), "attention": ("sdpa", "fused", "fused-query-tiles", "fused-key-tiles"),
         "products": ("gathered", "grouped-mm", "dense")}


PRECISIONS = ("bf16", "float32", "tf32")


@contextlib.contextmanager
def tf32_products(precision: str):
    """TF32 products allowed within the block where ``precision`` is ``tf32``, not otherwise
    (forward and backward passes alike; restored afterwards)."""
    if precision not in PRECISIONS:
        raise SystemExit(f"unknown precision {precision!r}; choose from {PRECISIONS}")
    with kernel_precision.tf32_products(precision == "tf32"):
        yield


def autocast(precision: str, device: str):
    """bf16 autocast for the forward pass where ``precision`` is ``bf16``."""
    return torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")


def passes(call: Callable[[], Tensor], inputs: Sequence[Tensor], grad_out: Tensor, precision: str,
           device: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """The two timed functions of a layer at ``precision``: the forward pass ``call()`` (no
    grad) and forward + backward (gradients of ``inputs`` for ``grad_out``), TF32 set over both
    passes."""
    def forward() -> None:
        with torch.no_grad(), tf32_products(precision), autocast(precision, device):
            call()

    def forward_backward() -> None:
        with tf32_products(precision):
            with autocast(precision, device):
                y = call()
            torch.autograd.grad(y, inputs, grad_out)

    return forward, forward_backward


def _time_both(forward: Callable[[], None], forward_backward: Callable[[], None], device: str, calls: int,
               repeats: int, compiled: bool) -> tuple[float, float]:
    """Seconds per call of ``forward`` and ``forward_backward``: CUDA graphs of ``calls`` calls on a
    GPU (`replay_time`), single calls elsewhere; without inductor's FX graph cache when
    ``compiled``."""
    with torch._inductor.config.patch(fx_graph_cache=not compiled and torch._inductor.config.fx_graph_cache):
        if device == "cuda":
            return replay_time(forward, calls, repeats), replay_time(forward_backward, calls, repeats)
        return timed(forward, repeats, device), timed(forward_backward, repeats, device)


def bench_boundary(path: str, mode: str, batch: int, tokens: int, dim: int, device: str, calls: int,
                   repeats: int, precision: str = "bf16") -> dict:
    """Forward and forward + backward time of one `BoundaryTransfer` (2-D, default widths)."""
    torch.manual_seed(0)
    layer = BoundaryTransfer(dim, 2).to(device)
    layer.fused = path == "fused"
    width = layer.norm.normalized_shape[0]
    if path == "fused" and not layer.fusable(torch.empty(batch, tokens, dim, device=device)):
        raise SystemExit(f"the fused path cannot run here (device {device}, width {width}, {tokens} tokens); "
                         "it needs a CUDA device with Triton")
    features = (torch.randn(batch, tokens, 4, device=device), torch.randint(0, 3, (batch, tokens), device=device),
                torch.arange(tokens, device=device) % 4, torch.rand(tokens, 1, device=device))
    state = torch.randn(batch, tokens, dim, device=device, requires_grad=True)
    grad_out = torch.randn(batch, tokens, dim, device=device)
    leaves = [state, *layer.parameters()]
    net = torch.compile(layer) if mode == "compiled" else layer

    forward, forward_backward = passes(lambda: net(features, state), leaves, grad_out, precision, device)

    t_fwd, t_both = _time_both(forward, forward_backward, device, calls, repeats, mode == "compiled")
    return {"layer": "boundary_transfer", "path": path, "mode": mode, "precision": precision, "batch": batch,
            "tokens": tokens, "dim": dim, "width": width, "forward_us": 1e6 * t_fwd, "forward_backward_us": 1e6 * t_both}


def bench_attention(path: str, mode: str, batch: int, queries: int, keys: int, heads: int, head_dim: int,
                    device: str, calls: int, repeats: int, precision: str = "bf16") -> dict:
    """Forward and forward + backward time of `attend_tokens` (gradients of the queries and of
    the keys and values)."""
    if path not in PATHS["attention"]:
        raise SystemExit(f"unknown attention path {path!r}; choose from {PATHS['attention']}")
    torch.manual_seed(0)
    q = torch.randn(batch, queries, heads, head_dim, device=device, requires_grad=True)
    kv = torch.randn(batch, keys, 2, heads, head_dim, device=device, requires_grad=True)
    grad_out = torch.randn(batch, queries, heads, head_dim, device=device)
    fused = path != "sdpa"
    kernels = attention._kernels
    if fused and not (q.is_cuda and kernels is not None and kernels.supported(keys, head_dim)):
        raise SystemExit(f"the fused attention cannot run here (device {device}, {keys} keys, head width "
                         f"{head_dim}); it needs a CUDA device with Triton and a head width up to 128")
    with tf32_products(precision):  # the path attend_tokens itself takes at this precision
        dtype = torch.bfloat16 if precision == "bf16" else q.dtype
        library = "fused" if attention.tokens_fusable(q.to(dtype), kv.to(dtype)) else "sdpa"
    torch._dynamo.reset()
    fn = torch.compile(attention.attend_tokens) if mode == "compiled" else attention.attend_tokens

    forward, forward_backward = passes(lambda: fn(q, kv, fused=fused), (q, kv), grad_out, precision, device)

    # the module settings that force a path, restored afterwards (the fused paths: the kernels,
    # whatever `tokens_fusable` says)
    forced = {"fused-query-tiles": {"KEY_TILED_QUERIES": 0}, "fused-key-tiles": {"MAX_TILE": 0}}.get(path, {})
    saved = {name: getattr(kernels, name) for name in forced}
    saved_rule = attention.tokens_fusable
    try:
        for name, value in forced.items():
            setattr(kernels, name, value)
        if fused:
            attention.tokens_fusable = lambda q, kv: True
        forward_pass, backward = "sdpa", "sdpa"
        if fused:
            forward_pass = "one key tile" if kernels.one_tile(keys, head_dim) else "key tiles"
            backward = ("key tiles" if kernels.key_tiled(queries) else
                        "query tiles" if kernels.one_tile(keys, head_dim) else "split")
        t_fwd, t_both = _time_both(forward, forward_backward, device, calls, repeats, mode == "compiled")
    finally:
        attention.tokens_fusable = saved_rule
        for name, value in saved.items():
            setattr(kernels, name, value)
    return {"layer": "attention", "path": path, "mode": mode, "precision": precision, "batch": batch,
            "queries": queries, "keys": keys, "heads": heads, "head_dim": head_dim, "library": library,
            "forward": forward_pass, "backward": backward,
            "forward_us": 1e6 * t_fwd, "forward_backward_us": 1e6 * t_both}


class _Permute(torch.autograd.Function):
    """``x[order]`` along the first axis; the gradient is gathered by the inverse permutation
    (not scattered, as indexing's own backward pass does)."""

    @staticmethod
    def forward(x: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
        return x.index_select(0, order)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[2])

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


def grouped_mm_linear(x: Tensor, index: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x[b] @ weight[index[b]] + bias[index[b]]`` through ``torch._grouped_mm``: the samples
    sorted by kernel (stable), one grouped product over their rows, the bias added per sample
    (a one-hot product, whose gradient is a product too), the rows put back in batch order."""
    b, t, din = x.shape
    n_kernels = weight.shape[0]
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    order = torch.argsort(index, stable=True)
    inverse = torch.argsort(order)
    ends = (F.one_hot(index, n_kernels).sum(0).cumsum(0) * t).to(torch.int32)  # no host synchronisation
    rows = _Permute.apply(x.to(dtype), order, inverse).reshape(b * t, din)
    y = torch._grouped_mm(rows, weight.to(dtype), offs=ends).view(b, t, -1)
    y = y + (F.one_hot(index[order], n_kernels).to(dtype) @ bias.to(dtype))[:, None]
    return _Permute.apply(y, inverse, order)


def _gathered_product(x: Tensor, index: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return _gathered.gathered_linear(x, index, weight, bias)


def _dense_product(x: Tensor, index: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return F.linear(x, weight[0].t(), bias[0])


PRODUCTS = {"gathered": _gathered_product, "grouped-mm": grouped_mm_linear, "dense": _dense_product}


def bench_products(path: str, mode: str, batch: int, rows: int, dim_in: int, dim_out: int, n_kernels: int,
                   device: str, calls: int, repeats: int, precision: str = "bf16") -> dict:
    """Forward and forward + backward time of one mixture product (gradients of the input, the
    weights and the biases; ``dense``: one weight and bias)."""
    torch.manual_seed(0)
    index = torch.randint(0, n_kernels, (batch,), device=device)
    x = torch.randn(batch, rows, dim_in, device=device, requires_grad=True)
    n = 1 if path == "dense" else n_kernels
    weight = (torch.randn(n, dim_in, dim_out, device=device) / dim_in**0.5).requires_grad_()
    bias = torch.zeros(n, dim_out, device=device, requires_grad=True)
    if path == "gathered" and not (_gathered._kernels is not None and _gathered.usable(x)):
        raise SystemExit(f"the gathered products cannot run here (device {device}); the path needs a CUDA device with "
                         "Triton and deterministic algorithms off")
    grad_out = torch.randn(batch, rows, dim_out, device=device)
    torch._dynamo.reset()
    fn = torch.compile(PRODUCTS[path]) if mode == "compiled" else PRODUCTS[path]

    forward, forward_backward = passes(lambda: fn(x, index, weight, bias), (x, weight, bias), grad_out, precision,
                                       device)

    t_fwd, t_both = _time_both(forward, forward_backward, device, calls, repeats, mode == "compiled")
    per_kernel = torch.bincount(index, minlength=n_kernels).tolist() if n > 1 else [batch]
    return {"layer": "products", "path": path, "mode": mode, "precision": precision, "batch": batch, "rows": rows,
            "dim_in": dim_in, "dim_out": dim_out, "kernels": n_kernels, "samples_per_kernel": per_kernel,
            "forward_us": 1e6 * t_fwd, "forward_backward_us": 1e6 * t_both}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=32, help="boundary tokens per sample (128^2, patch 16: 32)")
    parser.add_argument("--dim", type=int, default=256, help="model width D (the operator's inner width is D / 4)")
    parser.add_argument("--layers", nargs="+", default=["boundary", "attention"], choices=list(PATHS))
    parser.add_argument("--paths", nargs="+", choices=sorted({p for paths in PATHS.values() for p in paths}),
                        help="default: every path of each layer (a path a layer does not have is left out)")
    parser.add_argument("--queries", type=int, default=64, help="attention: queries per sample (128^2, patch 16: 64)")
    parser.add_argument("--keys", type=int, nargs="+", default=[97],
                        help="attention: keys per sample (the GNO: 64 + 33 context tokens; the stand-in: 65)")
    parser.add_argument("--heads", type=int, default=8, help="attention: heads (the model width D / heads each)")
    parser.add_argument("--kernels", type=int, default=4, help="products: kernels K of the mixture")
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--precision", default="bf16", choices=PRECISIONS,
                        help="bf16 autocast; float32 (TF32 off); float32 with TF32 products (tf32)")
    parser.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (GPU)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, batch {args.batch}, D {args.dim}, precision {args.precision}")
    print(f"{'layer':9s} {'size':22s} {'path':17s} {'mode':>9s} {'forward us':>11s} {'fwd+bwd us':>11s}  library")
    rows = []
    for layer in args.layers:
        paths = [p for p in args.paths or PATHS[layer] if p in PATHS[layer]]
        sizes = {"boundary": [args.tokens], "attention": args.keys,
                 "products": [(args.queries, args.dim)] + [(m, 2 * args.dim) for m in args.keys]}[layer]
        for size, path, mode in itertools.product(sizes, paths, args.modes):
            if layer == "boundary":
                r = bench_boundary(path, mode, args.batch, size, args.dim, args.device, args.calls, args.repeats,
                                   args.precision)
                label = f"{size} tokens"
            elif layer == "products":
                n_rows, dim_out = size
                r = bench_products(path, mode, args.batch, n_rows, args.dim, dim_out, args.kernels, args.device,
                                   args.calls, args.repeats, args.precision)
                label = f"{n_rows} rows, {args.dim}->{dim_out}"
            else:
                r = bench_attention(path, mode, args.batch, args.queries, size, args.heads, args.dim // args.heads,
                                    args.device, args.calls, args.repeats, args.precision)
                label = f"{args.queries} q, {size} keys"
            rows.append(r)
            print(f"{layer:9s} {label:22s} {path:17s} {mode:>9s} {r['forward_us']:11.1f} "
                  f"{r['forward_backward_us']:11.1f}  {r.get('library', '')}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"device": name, "torch": torch.__version__, "precision": args.precision}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
