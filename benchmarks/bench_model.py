"""Speed, memory and achieved TFLOP/s of the GNO (paper size) against a single-kernel stand-in.

For each model, batch size and mode it times, in bf16 autocast:
the forward pass (no grad) and a full training step (forward, backward, AdamW step). Three
warm-up runs (on a GPU, at least 2 s of them, so that its clocks are probably up again after
the compilation), then the median of ``--repeats`` CUDA-synchronised runs. FLOPs are counted once per
configuration with ``torch.utils.flop_counter.FlopCounterMode`` on a training step; TFLOP/s is
that count over the median step time.

Modes:
* ``eager``;
* ``compiled``: ``torch.compile`` (inductor, no CUDA graphs);
* ``graphs``: ``torch.compile(mode="reduce-overhead")``, the model's forward and backward
  graphs replayed as CUDA graphs, the optimizer step run from Python;
* ``whole-graph`` (CUDA only): the model compiled by inductor without CUDA graphs, and the
  *whole* training step (forward, loss, backward, capturable fused AdamW step) captured in
  one CUDA graph (`gno_ext.training.capture_step`) and replayed; the forward pass likewise.
  No host work is left per step but one replay, so this shows what the GPU needs when the
  host is not the bottleneck.

Models:
* ``gno``: paper defaults (K = 4 kernels, boundary transfer).
* ``vit-standin``: the same backbone with one kernel and no boundary transfer.
* ``gno-no-mixture`` (one kernel) and ``gno-no-boundary`` (no boundary transfer), on request:
  the cost of each part.
* ``fno``, ``gno-fno``, ``gno-fno-soft``, ``gno-fno-no-mixture`` and ``gno-fno-no-boundary``,
  on request: neuraloperator's FNO with the parameters and boundaries as channels (the ``fno``
  baseline) and the GNO on that backbone (``gno_fno``; ``gno-fno-soft`` with the soft mixture of
  kernels, ``gno_fno_soft``), at the recipes' paper size (12 modes, width 64, 4 layers; K = 4,
  boundary segments of 16 cells).

The parameters of the batch are spread over [0.01, 1] (log scale) and the boundaries mix
Dirichlet and Neumann faces; the table reports how many kernels each block actually used.

The optimizer is a fused AdamW. By default (``--optimizer flat``, as in the recipes' trainer)
it steps flat buffers of which the parameters are views (`gno_ext.training.FlatParameters`);
``--optimizer fused`` gives it the parameters themselves.

The attention kernels attend through gno_ext's Triton kernels (`attend_tokens`) on a GPU by
default; ``--attention sdpa`` takes ``scaled_dot_product_attention`` instead. ``--attention``
and ``--boundary`` are requests: where the fused kernels do not take the sizes (head widths
above 128; more boundary tokens per sample than `gno_ext.kernels.boundary.max_tokens`,
64 at the default widths of a 256-wide model, 32 otherwise) or there is no GPU, the layers run
their PyTorch paths. Each row's ``ran`` says which paths the step took, read from
the operators that ran while its FLOPs were counted.

    python benchmarks/bench_model.py --device cuda --batch 1 256 --out benchmarks/history/model_h100.json
    python benchmarks/bench_model.py --batch 256 --modes graphs --chunk 0 4     # gathered kernels against chunks of 4
    python benchmarks/bench_model.py --batch 256 --modes graphs --boundary fused unfused   # boundary operator paths
    python benchmarks/bench_model.py --batch 32 --shape 128 384 --channels 4    # The Well TRL size
    python benchmarks/bench_model.py --batch 256 --profile 40                   # kernels of one compiled step
    python benchmarks/bench_model.py --batch 256 --modes graphs --compile-options combo_kernels=True
    python benchmarks/bench_model.py --batch 256 --modes whole-graph --optimizer flat fused   # optimizer layouts
    python benchmarks/bench_model.py --batch 256 --modes whole-graph --attention fused sdpa   # attention paths
    python benchmarks/bench_model.py --batch 256 --modes graphs whole-graph --compile-options combo_kernels=True
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from pathlib import Path

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from gno_ext._files import write_json
from gno_ext.benchmark.run import git_commit
from gno_ext.benchmark.timing import timed
from gno_ext.layers import (
    AttentionKernel,
    AttentionKernelBank,
    BoundaryTransfer,
    FullPrecisionSpectralConv,
)
from gno_ext.models import GNO, get_model
from gno_ext.schema import BoundarySpec
from gno_ext.training import FlatParameters, capture_step, compile_model
from gno_ext.training.captured import side_stream
from gno_ext.training.setup import fused_adamw

MODELS = {
    "gno": {},
    "vit-standin": {"n_kernels": 1, "boundary_transfer": False},
    "gno-no-mixture": {"n_kernels": 1},  # the two ablations: what each part costs
    "gno-no-boundary": {"boundary_transfer": False},
    # models of the registry (key "model"), at the recipes' paper size
    "fno": {"model": "fno", "n_modes": 12, "hidden_channels": 64, "n_layers": 4},
    "gno-fno": {"model": "gno_fno", "n_modes": 12, "hidden_channels": 64, "n_layers": 4, "boundary_patch": 16},
    "gno-fno-soft": {"model": "gno_fno", "n_modes": 12, "hidden_channels": 64, "n_layers": 4, "boundary_patch": 16,
                     "soft_routing": True},
    "gno-fno-no-mixture": {"model": "gno_fno", "n_modes": 12, "hidden_channels": 64, "n_layers": 4,
                           "boundary_patch": 16, "n_kernels": 1},
    "gno-fno-no-boundary": {"model": "gno_fno", "n_modes": 12, "hidden_channels": 64, "n_layers": 4,
                            "boundary_transfer": False},
    "unisolver": {"model": "unisolver", "latent": 256, "patch": 16, "depth": 8, "heads": 8},
}
DEFAULT_MODELS = ["gno", "vit-standin"]


def on_fno(name: str) -> bool:
    """Whether model ``name`` is one of neuraloperator's FNO backbone (``fno``, ``gno_fno``): the
    models that take ``fourier``, ``activations`` and ``checkpoint_blocks``."""
    return MODELS[name].get("model") in ("fno", "gno_fno")


def make_inputs(batch: int, shape: tuple[int, ...], channels: int, device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    theta = torch.logspace(-2, 0, batch)[:, None] if batch > 1 else torch.tensor([[0.1]])
    faces = 2 * len(shape)  # Dirichlet on the first axis's faces, Neumann on the others'
    kinds = torch.tensor([1, 1] + [2] * (faces - 2)).repeat(batch, 1)
    values = (torch.rand(batch, faces, 2, 1, generator=g) * 20 - 10)
    return {"u": torch.randn(batch, 1, channels, *shape, generator=g).to(device), "theta": theta.to(device),
            "bc": BoundarySpec(kinds, values).to(device)}


def setup(name: str, batch: int, shape: tuple[int, ...], channels: int, device: str,
          chunk: int | None, boundary: str = "fused", capturable: bool = False,
          optimizer: str = "flat", attention: str = "fused", fourier: str = "dft", activations: str = "float32",
          checkpoint: bool = False) -> tuple[GNO, dict, torch.optim.Optimizer, FlatParameters | None]:
    """The model (normalisation fitted, mixture chunk, boundary and attention paths set), its inputs, a
    fused AdamW (``capturable`` for a step captured in a CUDA graph) and, for ``optimizer="flat"``
    (what the recipes' trainer does), the `FlatParameters` it steps; ``"fused"``: the AdamW
    steps the parameters themselves."""
    if attention not in ("fused", "sdpa"):
        raise ValueError(f"attention: expected fused or sdpa, got {attention!r}")
    if optimizer not in ("flat", "fused"):
        raise ValueError(f"optimizer: expected flat or fused, got {optimizer!r}")
    torch.manual_seed(0)
    kwargs = dict(MODELS[name])
    registered = kwargs.pop("model", None)
    if on_fno(name):
        kwargs.update(activations=activations, checkpoint_blocks=checkpoint)
    model = (get_model(registered, in_channels=channels, n_params=1, log_params=[True], ndim=len(shape), **kwargs)
             if registered else GNO(in_channels=channels, ndim=len(shape), **kwargs)).to(device)
    model.param_norm.fit(torch.logspace(-2, 0, 64)[:, None].to(device))
    for block in getattr(model, "blocks", []):
        if block.mixture is not None:
            block.mixture.chunk = chunk
    for module in model.modules():
        if isinstance(module, (AttentionKernel, AttentionKernelBank)):
            module.fused_attention = attention == "fused"
        if isinstance(module, BoundaryTransfer):
            module.fused = boundary == "fused"
        if isinstance(module, FullPrecisionSpectralConv):
            module.fourier = fourier
    x = make_inputs(batch, shape, channels, device)
    x["target"] = x["u"] + 0.01
    cuda = device == "cuda"
    flat = FlatParameters(model.parameters()) if optimizer == "flat" else None
    params = model.parameters() if flat is None else flat.param_groups
    fused = fused_adamw([{"params": list(model.parameters())}], torch.device(device))  # as the trainer decides
    return model, x, torch.optim.AdamW(params, lr=1e-4, fused=fused, capturable=cuda and capturable), flat


def train_step(net: torch.nn.Module, x: dict, opt: torch.optim.Optimizer, device: str, graphs: bool = False,
               flat: FlatParameters | None = None) -> None:
    """Forward in bf16 autocast, MSE loss, backward, optimizer step (of the flat buffers if
    ``flat`` is given)."""
    if graphs:
        torch.compiler.cudagraph_mark_step_begin()
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = (net(x["u"], theta=x["theta"], bc=x["bc"]).float() - x["target"]).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if flat is not None:
        flat.gather_grads()
    opt.step()


def count_flops(model: torch.nn.Module, x: dict, device: str) -> tuple[int, set[str]]:
    """FLOPs of one training step's forward and backward (``FlopCounterMode``), counted eagerly,
    and the names of the operators that did them (`paths_taken` reads the layers' paths there).

    A function of its own so that the loss, and with it the autograd graph of this step, dies
    with it: its gradient accumulators remember the stream they were made on (here the default
    one), and a step captured in a CUDA graph later must not run them there. (The mixtures
    still keep this step's routing, `last_routing`; the capture worked regardless.)"""
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = (model(x["u"], theta=x["theta"], bc=x["bc"]).float() - x["target"]).pow(2).mean()
        loss.backward()
    return counter.get_total_flops(), {str(op) for ops in counter.get_flop_counts().values() for op in ops}


def saved_bytes(model: torch.nn.Module, x: dict, device: str) -> int:
    """The bytes of the tensors a bf16-autocast forward pass saves for the backward (distinct
    storages, counted in full): the activation memory a training step holds at its peak, less
    the temporaries of the backward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast(device, dtype=torch.bfloat16):
        out = model(x["u"], theta=x["theta"], bc=x["bc"])
    del out
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


def traffic_floor(model: torch.nn.Module, x: dict, device: str) -> int:
    """A floor on the bytes a training step moves through memory: every tensor the forward
    pass saves for the backward (distinct storages, counted in full) written once and read
    once, the input read and the output written once, and the optimizer's update of the
    parameters (fused AdamW reads the weights, gradients and both moments and writes weights
    and moments: 7 float32 numbers per parameter, plus writing the gradients). A step that did
    nothing but this traffic would take ``bytes / bandwidth``: `bench` prints that time beside
    the measured one."""
    n_params = sum(p.numel() for p in model.parameters())
    return 2 * saved_bytes(model, x, device) + 2 * x["u"].nbytes + 8 * 4 * n_params


def memory(name: str, batch: int, shape: tuple[int, ...], channels: int, device: str,
           activations: str = "float32") -> dict:
    """What a training step of ``name`` holds, without timing it (any device, a CPU included):
    the activations its forward pass saves (`saved_bytes`) per sample and per step (what does not
    grow with the batch, e.g. the bf16 copies of the weights), from the forward passes at batch
    ``batch`` and ``2 batch``; and the parameters with their gradients and AdamW's two moments
    (16 bytes per parameter). A run at batch ``B`` holds at least ``B x per_sample + per_step +
    state``; the backward's temporaries and the allocator's slack come on top."""
    model, x, _, _ = setup(name, batch, shape, channels, device, None, activations=activations)
    one = saved_bytes(model, x, device)
    two = saved_bytes(model, make_inputs(2 * batch, shape, channels, device), device)
    per_sample = (two - one) / batch
    n_params = sum(p.numel() for p in model.parameters())
    return {"model": name, "batch": batch, "shape": list(shape), "params_m": n_params / 1e6,
            "activations": activations if on_fno(name) else None,
            "saved_gib_per_sample": per_sample / 2**30, "saved_gib_per_step": (one - batch * per_sample) / 2**30,
            "state_gib": 16 * n_params / 2**30}


def copy_bandwidth(device: str, nbytes: int = 2**30) -> float:
    """Bytes per second of a device-to-device copy of ``nbytes`` (read and written), the
    memory's practical bandwidth (median of 10); NaN off CUDA."""
    if device != "cuda":
        return float("nan")
    a = torch.empty(nbytes // 4, device=device)
    b = torch.empty_like(a)
    seconds = timed(lambda: b.copy_(a), 10, device)
    return 2 * nbytes / seconds


def paths_taken(ops: set[str], boundary_transfer: bool) -> dict:
    """The paths that the attention and the boundary operator took in a step that ran the
    operators ``ops`` (from `count_flops`): ``fused`` where gno_ext's Triton operator ran, the
    PyTorch path otherwise. A requested fused path falls back to PyTorch where the kernels do
    not take the sizes (a head width above 128, more boundary tokens than
    `gno_ext.kernels.boundary.max_tokens`) or there is no GPU."""
    return {"attention": "fused" if "gno_ext.token_attention" in ops else "sdpa",
            "boundary": ("fused" if "gno_ext.boundary_transfer" in ops else "unfused") if boundary_transfer else None}


def bench(name: str, batch: int, mode: str, shape: tuple[int, ...], channels: int, device: str, repeats: int,
          chunk: int | None = None, options: dict | None = None, boundary: str = "fused",
          optimizer: str = "flat", attention: str = "fused", fourier: str = "dft", bandwidth: float = float("nan"),
          activations: str = "float32", checkpoint: bool = False) -> dict:
    if mode == "whole-graph" and device != "cuda":
        raise SystemExit("--modes whole-graph needs a CUDA device")
    # on a GPU everything on a stream of its own, as the trainer's loop runs (`side_stream`): the
    # FLOP count's autograd graph, kept alive by a mixture's last routing, must not be the default
    # stream's when the whole step is captured
    with (side_stream() if device == "cuda" else contextlib.nullcontext()) as stream:
        return _bench(name, batch, mode, shape, channels, device, repeats, chunk, options, boundary, optimizer,
                      attention, fourier, bandwidth, stream, activations, checkpoint)


def _bench(name: str, batch: int, mode: str, shape: tuple[int, ...], channels: int, device: str, repeats: int,
           chunk: int | None, options: dict | None, boundary: str, optimizer: str, attention: str, fourier: str,
           bandwidth: float, stream: torch.cuda.Stream | None = None, activations: str = "float32",
           checkpoint: bool = False) -> dict:
    whole = mode == "whole-graph"
    model, x, opt, flat = setup(name, batch, shape, channels, device, chunk, boundary, capturable=whole,
                                optimizer=optimizer, attention=attention, fourier=fourier, activations=activations,
                                checkpoint=checkpoint)
    # a fresh compilation cache for every configuration: otherwise, after dynamo's recompilation
    # limit (8 by default), a later model of the same class silently runs eagerly
    torch._dynamo.reset()
    graphs = mode == "graphs"
    net = model if mode == "eager" else compile_model(model, "reduce-overhead" if graphs else True, options)

    def forward() -> None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            net(x["u"], theta=x["theta"], bc=x["bc"])

    flops, ops = count_flops(model, x, device)
    floor_bytes = traffic_floor(model, x, device)
    if hasattr(model, "blocks"):
        kernels_used = [len(set(b.mixture.last_routing.index.tolist())) if b.mixture is not None else 1
                        for b in model.blocks]
    elif getattr(model, "soft_routing", False):  # every kernel weighs in on every sample
        kernels_used = [model.n_kernels] * len(model.routing_index())
    else:  # gno_fno's layers; 1 for a model without gates
        kernels_used = [len(set(i.tolist())) for i in getattr(model, "routing_index", list)()] or [1]
    model.zero_grad(set_to_none=True)  # the FLOP count's gradients
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step = lambda: train_step(net, x, opt, device, graphs, flat)  # noqa: E731
    if whole:
        forward, step = capture_step(forward, stream=stream), capture_step(step, stream=stream)
    t_fwd = timed(forward, repeats, device)
    t_step = timed(step, repeats, device)
    memory = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return {"model": name, "batch": batch, "mode": mode, "forward_ms": 1e3 * t_fwd,
            "step_ms": 1e3 * t_step, "train_tflops": flops / t_step / 1e12, "step_gflop": flops / 1e9,
            "peak_gib": memory, "kernels_used": kernels_used,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "chunk": chunk,
            "boundary": boundary if has_boundary(model) else None, "compile_options": options or {},
            "optimizer": optimizer, "attention": attention, "ran": paths_taken(ops, has_boundary(model)),
            "fourier": fourier if any(isinstance(m, FullPrecisionSpectralConv) for m in model.modules()) else None,
            "activations": activations if on_fno(name) else None,
            "checkpoint_blocks": checkpoint if on_fno(name) else None,
            "traffic_floor_gib": floor_bytes / 2**30, "traffic_floor_ms": 1e3 * floor_bytes / bandwidth}


def has_boundary(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs the boundary transfer operator (the GNO's or gno_fno's)."""
    return any(isinstance(m, BoundaryTransfer) for m in model.modules())


def profile(name: str, batch: int, shape: tuple[int, ...], channels: int, device: str, top: int,
            chunk: int | None = None, options: dict | None = None, boundary: str = "fused",
            optimizer: str = "flat", attention: str = "fused") -> None:
    """Print the GPU kernels of one compiled training step (inductor, no CUDA graphs, so that
    every kernel is seen), grouped by name and sorted by total time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model, x, opt, flat = setup(name, batch, shape, channels, device, chunk, boundary, optimizer=optimizer,
                                attention=attention)
    torch._dynamo.reset()
    net = compile_model(model, True, options)
    for _ in range(3):
        train_step(net, x, opt, device, flat=flat)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        train_step(net, x, opt, device, flat=flat)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.time_range.elapsed_us() for e in events)
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    short = sum(e.time_range.elapsed_us() < 5 for e in events)
    path = boundary if has_boundary(model) else "none"
    print(f"\n{name}, batch {batch}, requested: boundary {path}, attention {attention}: {len(events)} kernels ({short} under 5 us), "
          f"{total / 1e3:.2f} ms of GPU time in one step")
    by_category: dict[str, list[float]] = {}
    for kname, times in by_name.items():
        by_category.setdefault(kernel_category(kname), []).extend(times)
    for category, times in sorted(by_category.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {sum(times) / 1e3:8.3f} ms {len(times):5d} x  [{category}]")
    for kname, times in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"  {sum(times) / 1e3:8.3f} ms {len(times):5d} x  {kname[:110]}")


CATEGORIES = {  # first match wins, on the lower-cased kernel name
    "mixture products (gno_ext's gathered-weight kernels)": ("gathered_mm", "grouped_wgrad"),
    "boundary transfer (gno_ext's fused kernels)": ("_boundary_",),
    "attention": ("fmha", "flash", "attention", "cudnn"),
    "optimizer": ("adam", "foreach", "multi_tensor"),
    "matmul": ("gemm", "cutlass", "nvjet", "sm90_", "sm80_", "sm75_", "cublas", "splitk", "gemv"),
    "inductor (fused element-wise, norms, reductions)": ("triton",),
    "copy / gather": ("copy", "index", "gather", "scatter", "cat"),
}


def kernel_category(name: str) -> str:
    """A coarse class of a CUDA kernel, from its name (for the profile summary)."""
    lower = name.lower()
    return next((c for c, keys in CATEGORIES.items() if any(k in lower for k in keys)), "other")


def parse_options(pairs: list[str]) -> dict:
    """``["combo_kernels=True", ...]`` to ``{"combo_kernels": True, ...}`` (values read as YAML)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--compile-options: expected KEY=VALUE, got {pair!r}")
        options[key] = yaml.safe_load(value)
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--shape", type=int, nargs="+", default=[128, 128],
                        help="grid, 2 or 3 sizes (128 384: The Well TRL; 64 64 64: the 3-D table)")
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--chunk", type=int, nargs="+", default=[0],
                        help="samples per weight group of the mixture's chunked products (0: the default, "
                             "the gathered-weight kernels on a GPU with Triton, else default_chunk)")
    parser.add_argument("--boundary", nargs="+", default=["fused"], choices=["fused", "unfused"],
                        help="the boundary transfer operator as fused Triton kernels (the default on a GPU "
                             "with Triton) or as PyTorch operations")
    parser.add_argument("--optimizer", nargs="+", default=["flat"], choices=["flat", "fused"],
                        help="flat: the fused AdamW steps one flat buffer of which the parameters are views "
                             "(gno_ext.training.FlatParameters, what the trainer does); fused: it steps the "
                             "parameters themselves")
    parser.add_argument("--attention", nargs="+", default=["fused"], choices=["fused", "sdpa"],
                        help="the attention kernels' attention as gno_ext's Triton kernels (attend_tokens, the "
                             "default on a GPU with Triton) or scaled_dot_product_attention")
    parser.add_argument("--activations", nargs="+", default=["float32"], choices=["float32", "autocast"],
                        help="the FNO models' activations between layers under autocast (their `activations`)")
    parser.add_argument("--checkpoint-blocks", nargs="+", default=["false"], choices=["false", "true"],
                        help="the FNO models' blocks recomputed in the backward pass (their `checkpoint_blocks`): "
                             "compare the step time and peak memory with and without (timing modes only)")
    parser.add_argument("--fourier", nargs="+", default=["dft"], choices=["dft", "fft"],
                        help="the spectral convolutions' transforms (FNO-backbone models): the retained modes "
                             "alone by matrix products (the default) or the full FFT")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--modes", nargs="+", choices=["eager", "compiled", "graphs", "whole-graph"],
                        help="default: eager compiled graphs, and whole-graph on a CUDA device")
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(MODELS))
    parser.add_argument("--compile-options", nargs="*", default=[], metavar="KEY=VALUE",
                        help="inductor options for the compiled modes, e.g. combo_kernels=True")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--profile", type=int, metavar="TOP", default=0,
                        help="instead of timing, list the TOP kernels of a compiled training step (CUDA)")
    parser.add_argument("--memory", action="store_true",
                        help="instead of timing, the activations saved per sample and the training state (any device)")
    args = parser.parse_args()
    if len(args.shape) not in (2, 3):
        parser.error(f"--shape: 2 or 3 sizes, got {args.shape}")
    if args.memory and "true" in args.checkpoint_blocks:
        parser.error("--memory counts the tensors a forward pass saves, and recomputed blocks save theirs out of "
                     "its sight: time with --checkpoint-blocks true on a GPU instead (its rows give the peak memory)")
    if args.memory:
        rows = [memory(model, batch, tuple(args.shape), args.channels, args.device, kind)
                for batch in args.batch for model in args.models
                for kind in (args.activations if on_fno(model) else ["float32"])]
        for r in rows:
            kind = f" ({r['activations']} activations)" if r["activations"] else ""
            print(f"{r['model']:15s} grid {'x'.join(map(str, r['shape']))}{kind}: {r['params_m']:.2f} M parameters, "
                  f"saved activations {r['saved_gib_per_sample']:.3f} GiB per sample and {r['saved_gib_per_step']:.2f} "
                  f"per step, parameters with gradients and AdamW moments {r['state_gib']:.2f} GiB", flush=True)
        if args.out:
            write_json(args.out, {"device": args.device, "torch": torch.__version__, "commit": git_commit(),
                                  "rows": rows})
        return
    args.modes = args.modes or ["eager", "compiled", "graphs"] + ["whole-graph"] * (args.device == "cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    options = parse_options(args.compile_options)
    if args.profile:
        for batch, model, path, optimizer, attention in itertools.product(
                args.batch, args.models, args.boundary, args.optimizer, args.attention):
            profile(model, batch, tuple(args.shape), args.channels, args.device, args.profile,
                    args.chunk[0] or None, options, path, optimizer, attention)
        return
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    bandwidth = copy_bandwidth(args.device)
    meta = {"device": name, "torch": torch.__version__, "commit": git_commit(), "shape": args.shape,
            "channels": args.channels, "compile_options": options, "copy_bandwidth_gb_s": bandwidth / 1e9}
    rows = []
    print(f"device: {name}, torch {torch.__version__}, grid {args.shape}, {args.channels} channels, bf16 autocast, "
          f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"{'model':15s} {'batch':>5s} {'mode':>8s} {'fwd ms':>8s} {'step ms':>8s} {'floor ms':>8s} {'TFLOP/s':>8s} "
          f"{'GFLOP':>8s} {'GiB':>6s}  kernels used per block")
    for batch in args.batch:
        for mode in args.modes:
            for model in args.models:
                chunks = args.chunk if MODELS[model].get("n_kernels", 4) > 1 else [0]
                paths = args.boundary if MODELS[model].get("boundary_transfer", True) else ["fused"]
                fouriers, kinds, recomputes = ((args.fourier, args.activations, args.checkpoint_blocks) if on_fno(model)
                                               else (["dft"], ["float32"], ["false"]))
                for chunk, path, optimizer, attention, fourier, activations, recompute in itertools.product(
                        chunks, paths, args.optimizer, args.attention, fouriers, kinds, recomputes):
                    r = bench(model, batch, mode, tuple(args.shape), args.channels, args.device, args.repeats,
                              chunk or None, options, path, optimizer, attention, fourier, bandwidth, activations,
                              recompute == "true")
                    rows.append(r)
                    print(f"{model:15s} {batch:5d} {mode:>8s} {r['forward_ms']:8.3f} {r['step_ms']:8.3f} "
                          f"{r['traffic_floor_ms']:8.3f} {r['train_tflops']:8.1f} {r['step_gflop']:8.1f} "
                          f"{r['peak_gib']:6.2f}  {r['kernels_used']}  chunk {chunk or 'auto'}, optimizer {optimizer}, "
                          f"ran: boundary {r['ran']['boundary']}, attention {r['ran']['attention']}"
                          f"{f', fourier {fourier}' if r['fourier'] else ''}"
                          f"{f', activations {activations}' if r['activations'] else ''}"
                          f"{', blocks recomputed' if r['checkpoint_blocks'] else ''}", flush=True)
                    if args.out:  # after every row: a run stopped part-way keeps what it measured
                        args.out.parent.mkdir(parents=True, exist_ok=True)
                        write_json(args.out, {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
