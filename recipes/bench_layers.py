"""Time one layer of the GNO on its own, for each of its paths and modes (``eager``;
``compiled``: ``torch.compile``), in bf16 autocast: the forward pass (no grad) and forward +
backward (gradients of the inputs and of every parameter).

Layers (``--layers``) and their paths (``--paths``, default: all of the layer's):

* ``boundary``: one `BoundaryTransfer` on a batch of random boundary tokens. Paths: ``fused``
  (the Triton kernels of `gno_ext.layers._boundary_kernels`, CUDA only), ``unfused`` (PyTorch).
* ``attention``: `attend_tokens` on random queries ``(B, N, H, d)`` and keys/values
  ``(B, M, 2, H, d)``, for each ``--keys`` M. Paths: ``fused`` (the Triton kernels of
  `gno_ext.layers._attention_kernels`, CUDA only, with their default choice of backward
  kernel), ``fused-query-tiles`` (the same, the backward pass forced onto the query-tiled
  kernel), ``sdpa`` (`scaled_dot_product_attention`).

On a GPU, ``--calls`` calls are captured in one CUDA graph and the graph's replays are timed
(so launch overheads are left out, as in a model compiled with CUDA graphs); on a CPU the calls
are timed one by one. Either way with `bench_model.timed`: warm-up runs (at least 2 s on a GPU),
then the median of ``--repeats`` synchronised runs. Inductor's FX graph cache (and with it
AOTAutograd's cache) is off while a compiled row is timed: the caches do not see the kernels'
launch settings, so a cached graph could run another row's kernel.

    python recipes/bench_layers.py                          # both layers at the paper size, batch 256
    python recipes/bench_layers.py --layers attention --keys 65 97 --modes eager
    python recipes/bench_layers.py --device cpu --batch 16 --layers boundary --paths unfused --modes eager
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from gno_ext.layers import attention
from gno_ext.layers.boundary import BoundaryTransfer
from gno_ext.training import capture_step

sys.path.insert(0, str(Path(__file__).parent))
from bench_model import timed  # noqa: E402  (the same timing as the model benchmark)


def replay_time(fn: Callable[[], None], calls: int, repeats: int) -> float:
    """Seconds per call of ``fn``: ``calls`` calls captured in one CUDA graph
    (`gno_ext.training.capture_step`), timed by replaying the graph (`bench_model.timed`)."""

    def many() -> None:
        for _ in range(calls):
            fn()

    return timed(capture_step(many), repeats, "cuda") / calls


PATHS = {"boundary": ("unfused", "fused"), "attention": ("sdpa", "fused", "fused-query-tiles")}


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
                   repeats: int) -> dict:
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

    def forward() -> None:
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            net(features, state)

    def forward_backward() -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            y = net(features, state)
        torch.autograd.grad(y, leaves, grad_out)

    t_fwd, t_both = _time_both(forward, forward_backward, device, calls, repeats, mode == "compiled")
    return {"layer": "boundary_transfer", "path": path, "mode": mode, "batch": batch, "tokens": tokens, "dim": dim,
            "width": width, "forward_us": 1e6 * t_fwd, "forward_backward_us": 1e6 * t_both}


def bench_attention(path: str, mode: str, batch: int, queries: int, keys: int, heads: int, head_dim: int,
                    device: str, calls: int, repeats: int) -> dict:
    """Forward and forward + backward time of `attend_tokens` (gradients of the queries and of
    the keys and values)."""
    if path not in PATHS["attention"]:
        raise SystemExit(f"unknown attention path {path!r}; choose from {PATHS['attention']}")
    torch.manual_seed(0)
    q = torch.randn(batch, queries, heads, head_dim, device=device, requires_grad=True)
    kv = torch.randn(batch, keys, 2, heads, head_dim, device=device, requires_grad=True)
    grad_out = torch.randn(batch, queries, heads, head_dim, device=device)
    fused = path != "sdpa"
    if fused and not attention.tokens_fusable(q, kv):
        raise SystemExit(f"the fused attention cannot run here (device {device}, {keys} keys, head width "
                         f"{head_dim}); it needs a CUDA device with Triton and every key of a sample in one tile")
    kernels = attention.load_kernels()
    torch._dynamo.reset()
    fn = torch.compile(attention.attend_tokens) if mode == "compiled" else attention.attend_tokens

    def forward() -> None:
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            fn(q, kv, fused=fused)

    def forward_backward() -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            y = fn(q, kv, fused=fused)
        torch.autograd.grad(y, (q, kv), grad_out)

    key_tiled = kernels.KEY_TILED_QUERIES if kernels is not None else None
    try:
        if path == "fused-query-tiles":
            kernels.KEY_TILED_QUERIES = 0
        backward = ("key tiles" if kernels.key_tiled(queries) else "query tiles") if fused else "sdpa"
        t_fwd, t_both = _time_both(forward, forward_backward, device, calls, repeats, mode == "compiled")
    finally:
        if kernels is not None:
            kernels.KEY_TILED_QUERIES = key_tiled
    return {"layer": "attention", "path": path, "mode": mode, "batch": batch, "queries": queries, "keys": keys,
            "heads": heads, "head_dim": head_dim, "backward": backward, "forward_us": 1e6 * t_fwd,
            "forward_backward_us": 1e6 * t_both}


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
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (GPU)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, batch {args.batch}, D {args.dim}, bf16 autocast")
    print(f"{'layer':9s} {'size':22s} {'path':17s} {'mode':>9s} {'forward us':>11s} {'fwd+bwd us':>11s}")
    rows = []
    for layer in args.layers:
        paths = [p for p in args.paths or PATHS[layer] if p in PATHS[layer]]
        sizes = [args.tokens] if layer == "boundary" else args.keys
        for size, path, mode in itertools.product(sizes, paths, args.modes):
            if layer == "boundary":
                r = bench_boundary(path, mode, args.batch, size, args.dim, args.device, args.calls, args.repeats)
                label = f"{size} tokens"
            else:
                r = bench_attention(path, mode, args.batch, args.queries, size, args.heads, args.dim // args.heads,
                                    args.device, args.calls, args.repeats)
                label = f"{args.queries} q, {size} keys"
            rows.append(r)
            print(f"{layer:9s} {label:22s} {path:17s} {mode:>9s} {r['forward_us']:11.1f} "
                  f"{r['forward_backward_us']:11.1f}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"device": name, "torch": torch.__version__}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
