"""Time one layer of the GNO on its own: the boundary transfer operator, fused or in PyTorch.

For each path (``fused``: the Triton kernels of `gno_ext.layers._boundary_kernels`, CUDA only;
``unfused``: PyTorch) and mode (``eager``; ``compiled``: ``torch.compile``) it times, in bf16
autocast, the forward pass (no grad) and forward + backward (gradients of the state and of
every parameter) of one `BoundaryTransfer` on a batch of random boundary tokens. On a GPU,
``--calls`` calls are captured in one CUDA graph and the graph's replays are timed (so launch
overheads are left out, as in a model compiled with CUDA graphs); on a CPU the calls are timed
one by one. Either way with `bench_model.timed`: warm-up runs (at least 2 s on a GPU), then the
median of ``--repeats`` synchronised runs.

    python recipes/bench_layers.py                                   # paper size: D 256, 32 tokens, batch 256
    python recipes/bench_layers.py --device cpu --batch 16 --paths unfused --modes eager
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

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

    if device == "cuda":
        t_fwd, t_both = (replay_time(f, calls, repeats) for f in (forward, forward_backward))
    else:
        t_fwd, t_both = (timed(f, repeats, device) for f in (forward, forward_backward))
    return {"layer": "boundary_transfer", "path": path, "mode": mode, "batch": batch, "tokens": tokens, "dim": dim,
            "width": width, "forward_us": 1e6 * t_fwd, "forward_backward_us": 1e6 * t_both}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=32, help="boundary tokens per sample (128^2, patch 16: 32)")
    parser.add_argument("--dim", type=int, default=256, help="model width D (the operator's inner width is D / 4)")
    parser.add_argument("--paths", nargs="+", default=["unfused", "fused"], choices=["unfused", "fused"])
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (GPU)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, batch {args.batch}, {args.tokens} tokens, D {args.dim}, "
          "bf16 autocast")
    print(f"{'path':8s} {'mode':>9s} {'forward us':>11s} {'fwd+bwd us':>11s}")
    rows = []
    for path in args.paths:
        for mode in args.modes:
            r = bench_boundary(path, mode, args.batch, args.tokens, args.dim, args.device, args.calls, args.repeats)
            rows.append(r)
            print(f"{path:8s} {mode:>9s} {r['forward_us']:11.1f} {r['forward_backward_us']:11.1f}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"device": name, "torch": torch.__version__}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
