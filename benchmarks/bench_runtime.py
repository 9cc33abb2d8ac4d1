r"""Runtime against the solvers at matched accuracy, and the trained model's inference speed.

For a trained run (a folder with ``config.yaml`` and ``model/``, as ``recipes/train.py`` or
``recipes/benchmark.py run`` writes it), on ``--trajectories`` test trajectories of its recipe:

* **Ground truth**: the test split's frames, made by gno_ext's solver at the data's resolution
  (128² for the ``bench`` and ``paper`` sizes). The script checks that its own solve at that
  resolution reproduces them (``reference_nmse`` in the output: below 1e-13 on heat-bc and
  advection-bc at 128²).
* **The solver at coarser resolutions**: each trajectory's initial field (and, for advection,
  its velocity) is restricted to $r^2$ cells, solved for the rollout's frames with the same
  boundary conditions and parameters, and brought back to the data's grid. Restriction and
  prolongation are Fourier truncation and zero-padding on periodic boxes, cell averages and
  bicubic interpolation on bounded ones. The nMSE of the rollout against the ground truth, per
  resolution, is the solver's error-versus-cost curve.
  Solvers: heat by the dataset's exact-in-time method (``exact``; spectral on periodic axes)
  and by explicit finite differences at their stability limit (``ftcs``); advection by WENO5
  and by MUSCL, both with SSP-RK3 at CFL 0.5, the WENO transport compiled on a GPU as when the
  data is generated.
* **The model**: the same rollout from the same frame, in bf16 autocast, run eagerly and
  compiled with the whole rollout captured in one CUDA graph (the inputs copied into static
  tensors, then replayed; on a CPU only the eager rollout is timed).
* **Timing**: every candidate runs the whole rollout (``steps`` frames) at batch 1 and batch
  256 (the trajectories repeated), on the same device in this process: warm-up runs, then the
  median of ``--repeats`` runs, each between two device synchronisations.
* **Matched accuracy**: for each solver, the coarsest resolution whose nMSE is at most the
  model's; the speed-up is the solver's time there divided by the model's captured time (both
  per rollout at the same batch size). Where no coarser resolution is that accurate, the
  data's own resolution is the match.

Everything is reported separately for periodic trajectories and for bounded ones (any face not
periodic), since the solvers differ there.

    python benchmarks/bench_runtime.py run RUN_DIR [RUN_DIR ...] --out benchmarks/results/runtime/heat-bc.json
    python benchmarks/bench_runtime.py render benchmarks/results/runtime/*.json [--summary] [--figure runtime.png]

The results page (``recipes/benchmark.py render``) shows the summary and the figure of every
file in ``benchmarks/results/runtime/``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor

from gno_ext._files import written_whole
from gno_ext.benchmark.run import git_commit
from gno_ext.benchmark.runtime import plot, render, summary
from gno_ext.losses import nmse
from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch, collate
from gno_ext.solvers import solve_advection, solve_heat

__all__ = ["SOLVERS", "matched", "measure_run", "resample", "solve"]

SOLVERS = {"heat": ("exact", "ftcs"), "advection": ("weno5", "muscl")}
RESOLUTIONS = (16, 24, 32, 48, 64, 96, 128)


def _fourier_axis(x: Tensor, dim: int, n_out: int) -> Tensor:
    """Band-limited resampling of a periodic signal along ``dim`` (cell-centred samples):
    the modes |k| < min(n_in, n_out) / 2 kept, the Nyquist mode dropped."""
    n_in = x.shape[dim]
    if n_in == n_out:
        return x
    spec = torch.fft.fft(x.double(), dim=dim)
    half = (min(n_in, n_out) - 1) // 2
    # Cell centres sit at (i + 1/2) h: a shift of half a cell in each grid, so the phase of
    # mode k changes by pi k (1/n_out - 1/n_in) between the two grids
    k = torch.cat([torch.arange(half + 1), torch.arange(-half, 0)]).to(x.device, torch.float64)
    shift = torch.exp(1j * torch.pi * k * (1 / n_out - 1 / n_in))
    shape = [1] * x.ndim
    shape[dim] = k.numel()
    kept = torch.cat([spec.narrow(dim, 0, half + 1), spec.narrow(dim, n_in - half, half)], dim) * shift.view(shape)
    pad = list(kept.shape)
    pad[dim] = n_out - k.numel()
    out = torch.cat([kept.narrow(dim, 0, half + 1), kept.new_zeros(pad), kept.narrow(dim, half + 1, half)], dim)
    return (torch.fft.ifft(out, dim=dim).real * (n_out / n_in)).to(x.dtype)


def resample(x: Tensor, size: int, periodic: bool) -> Tensor:
    """``x`` of shape ``(B, C, n, n)`` (cell-centred, unit box) on a ``size x size`` grid.

    Periodic: Fourier truncation (coarser) or zero-padding (finer), exact for fields whose modes
    fit both grids. Bounded: cell averages (coarser; exact averages where ``size`` divides ``n``)
    or bicubic interpolation between cell centres (finer)."""
    if x.ndim != 4 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"resample: expected (B, C, n, n), got {tuple(x.shape)}")
    n = x.shape[-1]
    if size == n:
        return x
    if periodic:
        return _fourier_axis(_fourier_axis(x, 2, size), 3, size)
    if size < n:
        return F.adaptive_avg_pool2d(x, size)
    return F.interpolate(x, size=(size, size), mode="bicubic", align_corners=False)


def _boundary(batch: PDEBatch) -> BoundarySpec:
    """The batch's boundary conditions with their data of the first frame (constant data only)."""
    values = batch.bc.values
    if values.shape[2] > 1 and not torch.equal(values, values[:, :, :1].expand_as(values)):
        raise ValueError("bench_runtime: time-dependent boundary data is not supported (the solver would need "
                         "the data between frames); use a recipe with constant boundary data")
    if values.shape[-1] != 1:
        raise ValueError(f"bench_runtime: boundary data must be constant along each face, got {values.shape[-1]} "
                         "points per face")
    return BoundarySpec(batch.bc.kind, values[:, :, :1], batch.bc.coeffs)


def solve(family: str, method: str, batch: PDEBatch, res: int, steps: int) -> Tensor:
    """The solver ``method`` of ``family`` at ``res``² cells from the batch's last input frame,
    for ``steps`` frames of spacing ``batch.dt``; returned on the batch's grid,
    shape ``(B, steps, C, n, n)``."""
    periodic = bool((batch.bc.kind == int(BCType.PERIODIC)).all())
    u0 = resample(batch.u_in[:, -1].double(), res, periodic).float()  # float32, as the data is generated
    dt = float(batch.dt[0])
    if not torch.allclose(batch.dt, batch.dt[:1]):
        raise ValueError("bench_runtime: the trajectories of a batch must share their frame interval")
    times = torch.arange(steps + 1, dtype=torch.float64) * dt
    grid = Grid((res, res), batch.grid.extent)
    bc = _boundary(batch)
    if family == "heat":
        u = solve_heat(u0, batch.theta[:, 0].float(), bc, times, grid=grid, method=method)
    elif family == "advection":
        if batch.theta_field is None:
            raise ValueError("bench_runtime: an advection batch needs its velocity (theta_field)")
        velocity = resample(batch.theta_field.double(), res, periodic).float()
        u = solve_advection(u0, velocity, bc, times, grid=grid, scheme=method, cfl=0.5,
                            compile=method == "weno5" and u0.is_cuda)
    else:
        raise ValueError(f"bench_runtime: no solver for the family {family!r} (heat, advection)")
    frames = u[:, 1:].flatten(0, 1)
    n = batch.u_in.shape[-1]
    return resample(frames.double(), n, periodic).unflatten(0, (u.shape[0], steps)).float()


def _timed(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median wall time of ``fn`` in seconds, each run between two device synchronisations."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _select(batch: PDEBatch, index: Tensor) -> PDEBatch:
    """The samples ``index`` of ``batch`` (in that order, repeats allowed), in tensors of their own."""
    def pick(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.index_select(0, index)
    bc = BoundarySpec(pick(batch.bc.kind), pick(batch.bc.values), pick(batch.bc.coeffs))
    return PDEBatch(pick(batch.u_in), pick(batch.u_out), pick(batch.theta), bc, batch.grid, pick(batch.dt),
                    pick(batch.theta_field))


def _tiled(batch: PDEBatch, size: int) -> PDEBatch:
    """``size`` samples: the batch's samples repeated."""
    return _select(batch, torch.arange(size, device=batch.u_in.device) % len(batch))


class ModelRollout:
    """A model's rollout of ``steps`` frames at one batch size: eager (bf16 autocast on a GPU)
    or compiled with the whole rollout captured in one CUDA graph (``captured``); `run` copies a
    batch in and returns the frames."""

    def __init__(self, model: torch.nn.Module, template: PDEBatch, steps: int, captured: bool):
        from gno_ext.models.rollout import rollout
        self.steps, self.device = steps, template.u_in.device
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else None
        if not captured:
            def run(batch: PDEBatch) -> Tensor:
                with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
                    return rollout(model, batch, steps).float()
            self.run = run
            return
        from gno_ext.training import capture_step, compile_model
        net = compile_model(model, mode=True)
        static = _tiled(template, len(template))  # tensors of its own, written by `run`
        bc = _boundary(static)
        out = torch.empty_like(static.u_out[:, :steps], dtype=torch.float32)

        def body() -> None:
            u = static.u_in
            with torch.autocast(self.device.type, dtype=self.dtype):
                for k in range(steps):
                    nxt = net(u, theta=static.theta, theta_field=static.theta_field, bc=bc, grid=static.grid)
                    out[:, k] = nxt[:, 0].float()
                    u = torch.cat([u[:, 1:], nxt.to(u.dtype)], 1)

        with torch.no_grad():
            replay = capture_step(body)

        def run_captured(batch: PDEBatch) -> Tensor:
            static.u_in.copy_(batch.u_in)
            static.theta.copy_(batch.theta)
            if static.theta_field is not None:
                static.theta_field.copy_(batch.theta_field)
            bc.kind.copy_(batch.bc.kind)
            bc.values.copy_(batch.bc.values[:, :, :1])
            if bc.coeffs is not None:
                bc.coeffs.copy_(batch.bc.coeffs)
            with torch.no_grad():
                replay()
            return out.clone()
        self.run = run_captured


def matched(curve: list[dict[str, Any]], error: float, batch: int) -> dict[str, Any]:
    """The coarsest point of a solver's curve (``res``, ``nmse``, ``seconds`` per batch size)
    whose error is at most ``error``; the finest resolution where none is."""
    good = [p for p in curve if p["nmse"] <= error]
    best = min(good, key=lambda p: p["res"]) if good else max(curve, key=lambda p: p["res"])
    return {"res": best["res"], "nmse": best["nmse"], "seconds": best["seconds"][str(batch)],
            "as_accurate": bool(good)}


def _load_batch(cfg: dict[str, Any], trajectories: int, steps: int, device: torch.device) -> PDEBatch:
    from gno_ext.training.recipe_data import (
        batch_to,
        open_split,
        rollout_indices,
        spread,
    )
    t_in = int(cfg["data"].get("n_steps_input", 1))
    ds = open_split(cfg["data"], "test", t_in, steps)
    indices = rollout_indices(ds)
    indices = [indices[i] for i in spread(len(indices), trajectories)]
    return batch_to(collate([ds[i] for i in indices]), device)


def _subset(batch: PDEBatch, mask: Tensor) -> PDEBatch | None:
    """The samples where ``mask`` holds, or None where it holds nowhere."""
    index = mask.nonzero()[:, 0]
    return None if index.numel() == 0 else _select(batch, index)


def measure_run(run_dir: Path, *, trajectories: int = 64, steps: int = 10, batches: tuple[int, ...] = (1, 256),
                resolutions: tuple[int, ...] = RESOLUTIONS, repeats: int = 10, device: str | None = None,
                capture: bool | None = None) -> dict[str, Any]:
    """Everything the module docstring describes, for one trained run; a JSON-ready dict."""
    from gno_ext.data.presets import get_preset
    from gno_ext.models.registry import from_checkpoint
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    capture = dev.type == "cuda" if capture is None else capture
    preset = get_preset(cfg["data"].get("preset") or cfg["recipe"]["name"])
    family = preset.family
    if family not in SOLVERS:
        raise ValueError(f"{run_dir}: recipe {cfg['recipe']['name']!r} is {family}; the runtime comparison "
                         f"covers {', '.join(SOLVERS)}")
    model = from_checkpoint(run_dir / "model", device=str(dev)).eval()
    full = _load_batch(cfg, trajectories, steps, dev)
    n = full.u_in.shape[-1]
    periodic_mask = (full.bc.kind == int(BCType.PERIODIC)).all(1)
    out: dict[str, Any] = {"run": str(run_dir), "recipe": cfg["recipe"]["name"], "model": cfg["model"]["name"],
                           "size": cfg.get("size"), "resolution": n, "steps": steps, "family": family,
                           "classes": {}}
    for name, mask in (("periodic", periodic_mask), ("bounded", ~periodic_mask)):
        batch = _subset(full, mask)
        if batch is None:
            continue
        truth = batch.u_out[:, :steps].float()
        entry: dict[str, Any] = {"trajectories": len(batch)}
        with torch.no_grad():
            eager = ModelRollout(model, batch, steps, captured=False)
            entry["model_nmse"] = float(nmse(eager.run(batch), truth).mean())
            entry["model_seconds"] = {}
            for size in batches:
                tiled = _tiled(batch, size)
                times = {"eager": _timed(lambda: eager.run(tiled), dev, repeats)}
                if capture:
                    try:
                        graph = ModelRollout(model, tiled, steps, captured=True)
                    except Exception as error:  # recorded, and the eager rollout stands in
                        entry["captured_error"] = f"{type(error).__name__}: {error}"[:500]
                        print(f"captured rollout failed: {entry['captured_error']}", flush=True)
                    else:  # the same rollouts both ways: their errors must agree
                        tiled_truth = tiled.u_out[:, :steps].float()
                        entry.setdefault("nmse_by_mode", {})[str(size)] = {
                            mode: float(nmse(fn.run(tiled), tiled_truth).mean())
                            for mode, fn in (("eager", eager), ("captured", graph))}
                        times["captured"] = _timed(lambda: graph.run(tiled), dev, repeats)
                entry["model_seconds"][str(size)] = times
            entry["reference_nmse"] = float(nmse(solve(family, SOLVERS[family][0], batch, n, steps), truth).mean())
            entry["solvers"] = {}
            for method in SOLVERS[family]:
                curve = []
                for res in resolutions:
                    if res > n:
                        continue
                    point = {"res": res, "nmse": float(nmse(solve(family, method, batch, res, steps), truth).mean()),
                             "seconds": {}}
                    for size in batches:
                        tiled = _tiled(batch, size)
                        point["seconds"][str(size)] = _timed(lambda: solve(family, method, tiled, res, steps), dev,
                                                             max(1, repeats // 2), warmup=1)
                    curve.append(point)
                    print(f"{out['recipe']} {name} {method} {res}: nMSE {point['nmse']:.3e}, "
                          + ", ".join(f"batch {b} {s * 1e3:.2f} ms" for b, s in point["seconds"].items()), flush=True)
                entry["solvers"][method] = curve
        entry["matched"] = {
            method: {str(size): {**matched(curve, entry["model_nmse"], size),
                                 "model_seconds": _fastest(entry["model_seconds"][str(size)])}
                     for size in batches}
            for method, curve in entry["solvers"].items()}
        for per_size in entry["matched"].values():
            for m in per_size.values():
                m["speedup"] = m["seconds"] / m["model_seconds"]
        out["classes"][name] = entry
        print(f"{out['recipe']} {name}: model nMSE {entry['model_nmse']:.3e}", flush=True)
    return out


def _fastest(times: dict[str, float]) -> float:
    """The model's time: the captured rollout's where it ran, else the eager one's."""
    return times.get("captured", times["eager"])


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="measure trained runs")
    run.add_argument("runs", nargs="+", type=Path, help="run folders (config.yaml and model/)")
    run.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    run.add_argument("--trajectories", type=int, default=64)
    run.add_argument("--steps", type=int, default=10)
    run.add_argument("--batch", type=int, nargs="+", default=[1, 256])
    run.add_argument("--resolutions", type=int, nargs="+", default=list(RESOLUTIONS))
    run.add_argument("--repeats", type=int, default=10)
    run.add_argument("--device")
    run.add_argument("--no-capture", action="store_true", help="time the eager rollout only")
    show = sub.add_parser("render", help="print the tables of results files, and draw their figure")
    show.add_argument("results", type=Path, nargs="+")
    show.add_argument("--figure", type=Path)
    show.add_argument("--summary", action="store_true", help="one table of the matched resolutions (the results "
                                                              "page's) instead of every curve")
    args = parser.parse_args(argv)
    if args.command == "render":
        results = [json.loads(p.read_text()) for p in args.results]
        print(summary(results) if args.summary else "\n\n".join(render(r) for r in results))
        if args.figure:
            plot(results, args.figure)
        return 0
    for run_dir in args.runs:
        if not (run_dir / "config.yaml").is_file() or not (run_dir / "model").is_dir():
            parser.error(f"{run_dir}: not a trained run (needs config.yaml and model/)")
    if args.out.exists():
        parser.error(f"{args.out} exists; choose another --out")
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    runs = [measure_run(r, trajectories=args.trajectories, steps=args.steps, batches=tuple(args.batch),
                        resolutions=tuple(args.resolutions), repeats=args.repeats, device=str(dev),
                        capture=False if args.no_capture else None) for r in args.runs]
    results = {"gpu": _device_name(dev), "torch": torch.__version__, "commit": git_commit(), "repeats": args.repeats,
               "batches": args.batch, "python": sys.version.split()[0], "runs": runs}
    with written_whole(args.out) as tmp:
        tmp.write_text(json.dumps(results, indent=1))
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
