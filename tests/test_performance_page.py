"""The Performance page's tables hold what their measurement files hold: every table whose
caption names files of ``benchmarks/history/`` is checked cell by cell against them, to the
digits the page shows (a figure copied by hand cannot drift from its file)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "performance.md"


def history_rows(name: str) -> list[dict[str, Any]]:
    """The rows of the measurement file ``benchmarks/history/NAME.json``."""
    return json.loads((REPO / "benchmarks" / "history" / f"{name}.json").read_text())["rows"]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[tuple[list[str], list[str], list[list[str]]]]:
    """(files named by the caption, header, rows) of every table whose caption (the paragraph
    before it) names ``benchmarks/history/*.json`` files."""
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        if not line.startswith("|") or (i and lines[i - 1].startswith("|")):
            continue
        start = i - 1
        while start > 0 and lines[start - 1].strip() == "":  # (the blank line before the table)
            start -= 1
        first = start - 1
        while first > 0 and lines[first - 1].strip():
            first -= 1
        caption = " ".join(lines[first:start])
        files = re.findall(r"`(benchmarks/history/[\w.-]+\.json)`", caption)
        end = i + 2
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        if files:
            found.append((files, _cells(line), [_cells(row) for row in lines[i + 2:end]]))
    return found


def shows(text: str, value: float) -> bool:
    """Whether the cell ``text`` (``1,645``, ``**7,659**``, ``2.9e9``, ``1.43 M``) is ``value`` to
    the digits it shows."""
    text = text.replace("*", "").replace(",", "").replace(" M", "").strip()
    match = re.fullmatch(r"(-?\d+)(?:\.(\d+))?(?:e(-?\d+))?", text)
    assert match, f"not a number: {text!r}"
    decimals, exponent = len(match.group(2) or ""), int(match.group(3) or 0)
    unit = 10.0 ** (exponent - decimals)
    return abs(float(text) - value) <= 0.5 * unit * (1 + 1e-9)


SOLVER_CASES = {"heat, exact (periodic)": "heat exact, periodic",
                "heat, exact (Dirichlet/Neumann)": "heat exact, Dirichlet/Neumann",
                "heat, FTCS (Dirichlet/Neumann)": "heat FTCS, Dirichlet/Neumann",
                "advection, WENO5": "advection WENO5", "advection, WENO5, compiled": "advection WENO5, compiled",
                "Burgers, WENO5": "Burgers WENO5", "Burgers, WENO5, compiled": "Burgers WENO5, compiled",
                "Navier-Stokes (pseudo-spectral)": "Navier-Stokes"}
MODELS = {"gno": "gno", "single-kernel stand-in": "vit-standin", "`fno`": "fno", "`gno_fno`": "gno-fno",
          "`gno_fno_soft`": "gno-fno-soft"}
TRANSFORMS = {"retained modes (`dft`)": "dft", "full FFT (`fft`)": "fft"}
EXECUTION = {"`trainer.compile=reduce-overhead`": "trainer.compile=reduce-overhead",
             "`trainer.compile=true trainer.capture=true`": "trainer.compile=true trainer.capture=true",
             "eager": "trainer.compile=false"}
SYNC = {"—": "-", "DDP": "ddp", "the captured all-reduce": "flat"}


def _one(rows: list[dict[str, Any]], **key: Any) -> dict[str, Any]:
    found = [r for r in rows if all(r.get(k) == v for k, v in key.items())]
    assert len(found) == 1, f"{len(found)} rows of the files have {key}"
    return found[0]


def expected(header: list[str], cells: list[str], rows: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """The (cell, value of the files) pairs of one row of the page, by the table's columns."""
    col = dict(zip(header, cells))
    if "solver" in col:  # the solvers' table, at 128²
        case = SOLVER_CASES[col["solver"]]
        at = {b: _one(rows, case=case, grid="128x128", batch=b) for b in (1, 256)}
        return [(col["trajectories/s at batch 1"], at[1]["traj_per_s"]),
                (col["trajectories/s at batch 256"], at[256]["traj_per_s"]),
                (col["cell updates/s at batch 256"], at[256]["cell_updates_per_s"])]
    if "cold: first step s" in col:  # the startup table: one row per model and commit measured
        found = [r for r in rows if r["model"] == col["model"].strip("`") and r["commit"].startswith(col["commit"])]
        assert len(found) == 1, f"{len(found)} rows of the files have {col['model']} at {col['commit']}"
        r = found[0]
        return [(col["cold: first step s"], r["cold"]["first_step_s"]),
                (col["cold: first captured step s"], r["cold"]["first_captured_step_s"]),
                (col["cold: graphs compiled"], r["cold"]["graphs_compiled"]),
                (col["warm: first step s"], r["warm"]["first_step_s"]),
                (col["warm: first captured step s"], r["warm"]["first_captured_step_s"]),
                (col["warm: graphs loaded"], r["warm"]["graphs_loaded"])]
    if "GPUs" in col:  # training throughput
        r = _one(rows, mode=EXECUTION[col["model execution"]], grad_sync=SYNC[col["gradients averaged by"]],
                 procs=int(col["GPUs"]))
        return [(col["samples/s"], r["samples_per_s"])]
    key: dict[str, Any] = {"model": MODELS[col["model"]]}
    if "batch" in col:
        key.update(batch=int(col["batch"]), mode=col["mode"])
    if "transform" in col:
        key["fourier"] = TRANSFORMS[col["transform"]]
    r = _one(rows, **key)
    fields = {"train step ms": "step_ms", "forward ms": "forward_ms", "train TFLOP/s": "train_tflops",
              "peak GiB": "peak_gib", "parameters": "params_m", "traffic floor ms": "traffic_floor_ms"}
    return [(col[name], r[field]) for name, field in fields.items() if name in col]


def test_the_performance_tables_are_their_measurement_files():
    found = tables(PAGE.read_text())
    assert len(found) == 6, [files for files, _, _ in found]  # solvers, the GNO's step, FNO, transforms, startup, DDP
    drift = []
    for files, header, page_rows in found:
        rows = [{"commit": data.get("commit", ""), **row} for f in files  # (a file's commit on each row)
                for data in [json.loads((REPO / f).read_text())] for row in data["rows"]]
        for cells in page_rows:
            drift += [f"{files[0]}: {' '.join(cells[:3])} shows {cell}, the file holds {value:.6g}"
                      for cell, value in expected(header, cells, rows) if not shows(cell, value)]
    assert not drift, "\n".join(drift)


@pytest.mark.parametrize("text,value,ok", [("2.9e9", 2.94e9, True), ("2.6e9", 2.5231e9, False),
                                           ("17,807", 17806.5, True), ("**7,659**", 7659.05, True),
                                           ("6.93", 6.9319, True), ("6.93", 6.936, False), ("1.43 M", 1.428, True)])
def test_a_cell_shows_a_value_to_its_digits(text, value, ok):
    assert shows(text, value) is ok


def test_the_performance_prose_quotes_its_files():
    """The ratios the page's prose states, computed from the same files."""
    page = " ".join(PAGE.read_text().split())
    step = {(r["model"], r["batch"], r["mode"]): r for r in history_rows("model_h100_r24")}
    gno, standin = step["gno", 256, "whole-graph"], step["vit-standin", 256, "whole-graph"]
    fno = {r["model"]: r for r in history_rows("model_step_fno_gno_fno_h200")}
    spectral = {(r["model"], r["fourier"]): r for r in history_rows("model_fno_spectral_h100_f871385")}
    fno_dft, fno_fft, soft = spectral["fno", "dft"], spectral["fno", "fft"], spectral["gno-fno-soft", "dft"]
    earlier = {(r["model"], r["fourier"]): r for r in history_rows("model_fno_spectral_h100")}
    tuned = history_rows("model_fno_tuned_h100")[0]
    before = {r["model"]: r for r in history_rows("startup_h100")}  # gno_fno_soft with neuraloperator's grid embedding
    started = {r["model"]: r for r in history_rows("startup_gno_fno_soft_h100")}["gno_fno_soft"]
    profile = (REPO / "benchmarks" / "history" / "profile_fno_h100.txt").read_text().splitlines()
    total = re.search(r"(\d+) kernels .*?([\d.]+) ms of GPU time", profile[0])
    classes = {re.search(r"\[(\w+)", line).group(1): line.split() for line in profile[1:7]}
    ddp = {(r["mode"], r["procs"]): r for r in history_rows("ddp_h100x2_r25")}
    captured = "trainer.compile=true trainer.capture=true"
    said = [
        f"The GNO's step costs {round(100 * (gno['step_ms'] / standin['step_ms'] - 1))} % more than the stand-in's",
        f"Of that, {round(100 * (gno['step_gflop'] / standin['step_gflop'] - 1))} % are extra FLOPs",
        f"`gno_fno`'s step takes {fno['gno-fno']['step_ms'] / fno['fno']['step_ms']:.2f} times the FNO's",
        f"The FNO's training step is {fno_fft['step_ms'] / fno_dft['step_ms']:.1f} times faster",
        f"takes {round(100 * (1 - fno_dft['peak_gib'] / fno_fft['peak_gib']))} % less memory",
        f"`gno_fno_soft` with them is {fno_fft['step_ms'] / soft['step_ms']:.1f} times faster than the FNO with the full FFT",
        f"`gno_fno_soft`'s step takes {soft['step_ms'] / fno_dft['step_ms']:.2f} times the FNO's",
        f"its peak memory is {soft['peak_gib'] / fno_dft['peak_gib']:.1f} times the FNO's",
        f"`gno_fno_soft` with the full FFT took {earlier['gno-fno-soft', 'fft']['step_ms']:.1f} ms at a peak of "
        f"{earlier['gno-fno-soft', 'fft']['peak_gib']:.1f} GiB",
        f"retained-mode rows ({earlier['fno', 'dft']['step_ms']:.1f} and {earlier['gno-fno-soft', 'dft']['step_ms']:.1f} ms)",
        f"the FNO's step took {tuned['step_ms']:.1f} ms against the {fno_dft['step_ms']:.1f} ms above",
        f"{fno_fft['step_ms'] / tuned['step_ms']:.1f} times faster than the FNO with the full FFT",
        f"{float(total.group(2)):.1f} ms of GPU time in {total.group(1)} kernels, of which "
        f"{float(classes['inductor'][0]):.1f} ms in the {classes['inductor'][2]} kernels inductor generates",
        f"and {float(classes['matmul'][0]):.1f} ms in {classes['matmul'][2]} matrix products",
        f"A warm start reaches its first captured step in {started['warm']['first_captured_step_s']:.0f} s (`gno_fno_soft`) "
        f"and {before['gno']['warm']['first_captured_step_s']:.0f} s (`gno`), having compiled nothing; a cold one in "
        f"{started['cold']['first_captured_step_s']:.0f} s (`gno_fno_soft`) and {before['gno']['cold']['first_captured_step_s']:.0f} s",
        f"with it `gno_fno_soft`'s cold start took {before['gno_fno_soft']['cold']['first_captured_step_s']:.0f} s",
        f"On two GPUs it is {ddp[captured, 2]['samples_per_s'] / ddp['trainer.compile=reduce-overhead', 2]['samples_per_s']:.1f} "
        "times as fast as `reduce-overhead` under DDP",
        f"wait for the loader {round(100 * ddp[captured, 1]['data_wait'])} % of the time "
        f"({round(100 * ddp[captured, 2]['data_wait'])} % on two)",
    ]
    missing = [s for s in said if s not in page]
    assert not missing, missing


def test_the_runtime_notes_quote_the_runtime_files():
    """The figures of the runtime page's notes (``benchmarks/notes/runtime.md``), computed from the
    runtime files they describe."""
    notes = " ".join((REPO / "benchmarks" / "notes" / "runtime.md").read_text().split())
    runtime = REPO / "benchmarks" / "results" / "runtime"
    heat, adv = ({c: e for run in json.loads((runtime / f"{name}-bc.json").read_text())["runs"]
                  for c, e in run["classes"].items()} for name in ("heat", "advection"))
    times = lambda speedups: f"{min(speedups):.0f} to {max(speedups):.0f} times faster"  # noqa: E731
    faster = lambda method: [1 / heat[c]["matched"][method]["256"]["speedup"] for c in heat]  # noqa: E731
    model_1 = [e["model_seconds"]["1"] for e in (*heat.values(), *adv.values())]
    said = [
        f"({heat['periodic']['solvers']['exact'][0]['nmse']:.1e} against {heat['periodic']['model_nmse']:.2g} on "
        f"periodic boxes, {heat['bounded']['solvers']['exact'][0]['nmse']:.3f} against "
        f"{heat['bounded']['model_nmse']:.2g} on bounded ones)".replace("e-04", "e-4"),
        f"At batch 256 it is {times(faster('exact'))}",
        f"still {times(faster('ftcs'))} than the model at batch 256",
        f"({adv['periodic']['matched']['weno5']['1']['nmse']:.3f} against {adv['periodic']['model_nmse']:.2f} periodic, "
        f"{adv['bounded']['matched']['weno5']['1']['nmse']:.3f} against {adv['bounded']['model_nmse']:.2f} bounded",
        f"the captured model is {adv['periodic']['matched']['weno5']['1']['speedup']:.0f} times (periodic) and "
        f"{adv['bounded']['matched']['weno5']['1']['speedup']:.0f} times (bounded) faster than WENO5",
        f"WENO5 is {1 / adv['periodic']['matched']['weno5']['256']['speedup']:.0f} times faster on periodic boxes and "
        f"{1 / adv['bounded']['matched']['weno5']['256']['speedup']:.1f} times faster on bounded ones",
        f"from {min(t['eager'] for t in model_1) * 1e3:.0f}–{max(t['eager'] for t in model_1) * 1e3:.0f} ms to "
        f"{min(t['captured'] for t in model_1) * 1e3:.1f}–{max(t['captured'] for t in model_1) * 1e3:.1f} ms",
    ]
    missing = [s for s in said if s not in notes]
    assert not missing, missing


def test_the_models_page_quotes_the_performance_files():
    """The speed figures of the models page (its section on speed in your own training loop, the
    float32 attention note, the GNO on the FNO backbone) are those of the files it names."""
    page = " ".join((REPO / "docs" / "models" / "index.md").read_text().split())
    step = {(r["model"], r["mode"]): r for r in history_rows("model_h100_r24") if r["batch"] == 256}
    graphs = {r["model"]: r for r in history_rows("model_h100_r24_graphs") if r["batch"] == 256}
    gno, standin = step["gno", "whole-graph"], step["vit-standin", "whole-graph"]
    attention = {(precision, r["path"]): r["forward_backward_us"] for precision in ("float32", "tf32")
                 for r in history_rows(f"layers_h100_r18_{precision}") if r["layer"] == "attention"}
    fno = {r["model"]: r for r in history_rows("model_step_fno_gno_fno_h200")}
    said = [
        f"that host work is what limits the step: {graphs['gno']['step_ms']:.2f} ms",
        f"step captured together and replayed: {gno['step_ms']:.2f} ms",
        f"the GNO's training step takes {gno['step_ms']:.2f} ms, the same backbone with one kernel and no "
        f"boundary operator {standin['step_ms']:.2f} ms (+{round(100 * (gno['step_ms'] / standin['step_ms'] - 1))} %)",
        f"the boundary operator adds {round(100 * (gno['step_gflop'] / standin['step_gflop'] - 1))} %",
        f"passes took {attention['float32', 'fused']:.0f} µs against {attention['float32', 'sdpa']:.0f} µs",
        f"with TF32 products allowed, {attention['tf32', 'fused']:.0f} µs against {attention['tf32', 'sdpa']:.0f} µs",
        f"Its captured training step takes {fno['gno-fno']['step_ms'] / fno['fno']['step_ms']:.2f} times the `fno`",
    ]
    missing = [s for s in said if s not in page]
    assert not missing, missing


def test_the_trl_page_quotes_its_file():
    page = " ".join((REPO / "docs" / "recipes" / "trl.md").read_text().split())
    runs = [r["step_ms"] for r in history_rows("model_h100_r21_trl_runs")
            if r["batch"] == 32 and r["mode"] == "whole-graph"]
    assert f"took {min(runs):.2f} to {max(runs):.2f} ms in {['no', 'one', 'two', 'three', 'four'][len(runs)]} runs" in page



def test_the_3d_notes_quote_the_memory_file():
    """The 3-D table's notes: the activations per sample and the memory at batch 64 of its file,
    with the FNO models' activations in float32 and in bf16."""
    notes = " ".join((REPO / "benchmarks" / "notes" / "3d.md").read_text().split())
    rows = {(r["model"], r["activations"]): r for r in history_rows("memory_3d_cpu")}
    need = {k: 64 * r["saved_gib_per_sample"] + r["saved_gib_per_step"] + r["state_gib"] for k, r in rows.items()}
    per = {k: r["saved_gib_per_sample"] for k, r in rows.items()}
    fno, soft = ("fno", "float32"), ("gno-fno-soft", "float32")
    fno16, soft16 = ("fno", "autocast"), ("gno-fno-soft", "autocast")
    said = [f"the FNO saves {per[fno]:.2f} GiB per sample and `gno_fno_soft` {per[soft]:.2f} GiB",
            f"hold at least {need[fno]:.0f} and {need[soft]:.0f} GiB",
            f"they save {per[fno16]:.2f} and {per[soft16]:.2f} GiB per sample and need at least "
            f"{need[fno16]:.0f} and {need[soft16]:.0f} GiB",
            f"save about {max(per['gno', None], per['unisolver', None]):.2f} GiB per sample and need about "
            f"{max(need['gno', None], need['unisolver', None]):.0f} GiB at batch 64"]
    missing = [s for s in said if s not in notes]
    assert not missing, missing


def test_the_3d_notes_quote_the_generation_file():
    """The 3-D table's notes: the dataset's size and generation time on the GPU, and the captured
    FNO's memory pool against the card's, as the measurement file records them."""
    notes = " ".join((REPO / "benchmarks" / "notes" / "3d.md").read_text().split())
    run = json.loads((REPO / "benchmarks" / "history" / "generate_3d_h100.json").read_text())
    n = run["trajectories"]
    oom = run["captured_fno_batch64"]
    said = [f"{sum(n.values())} trajectories of {run['frames']} frames at {run['grid'][0]}³ ({n['train']} for "
            f"training, {n['valid']} each for validation and test",
            f"{run['bytes'] / 1e9:.1f} GB in float32", f"`{run['command']}` generated and wrote it in "
            f"{run['wall_s']} s on one {run['device'].split()[1]}",
            f"held {oom['private_pool_gib']:.0f} GiB of the card's {oom['capacity_gib']:.0f}"]
    assert n["valid"] == n["test"] and run["device"].startswith("NVIDIA H100")
    missing = [s for s in said if s not in notes]
    assert not missing, missing


def test_the_activations_paragraph_quotes_its_memory_file():
    page = " ".join(PAGE.read_text().split())
    mib = {(r["model"], r["activations"]): 1024 * r["saved_gib_per_sample"] for r in history_rows("memory_2d_cpu")}
    said = [f"the FNO then saves {mib['fno', 'autocast']:.0f} MiB of activations per sample at 128² instead of "
            f"{mib['fno', 'float32']:.0f}, `gno_fno_soft` {mib['gno-fno-soft', 'autocast']:.0f} instead of "
            f"{mib['gno-fno-soft', 'float32']:.0f}"]
    step = {r["activations"]: r for r in history_rows("model_fno_activations_h100") if r["model"] == "fno"}
    said.append(f"{step['autocast']['step_ms']:.1f} ms against {step['float32']['step_ms']:.1f} ms with float32 activations, "
                f"at a peak of {step['autocast']['peak_gib']:.1f} GiB instead of {step['float32']['peak_gib']:.1f}")
    missing = [s for s in said if s not in page]
    assert not missing, missing


def test_the_recomputed_blocks_paragraph_quotes_its_file():
    """The FLOPs of a step with and without recomputed blocks, as the benchmark file has them."""
    page = " ".join(PAGE.read_text().split())
    flop = {(r["model"], r["checkpoint_blocks"]): r["step_gflop"] for r in history_rows("model_checkpoint_blocks_cpu")}

    def more(model: str) -> float:
        return 100 * (flop[model, True] / flop[model, False] - 1)

    said = [f"{more('fno'):.0f} % more work per step for the FNO ({flop['fno', True]:.1f} GFLOP against "
            f"{flop['fno', False]:.1f} at batch 2) and {more('gno-fno-soft'):.0f} % for `gno_fno_soft` "
            f"({flop['gno-fno-soft', True]:.1f} against {flop['gno-fno-soft', False]:.1f};"]
    assert all(flop[m, True] > flop[m, False] for m in ("fno", "gno-fno-soft"))  # the recomputation counted
    missing = [s for s in said if s not in page]
    assert not missing, missing


def test_the_3d_notes_quote_the_captured_soft_run_log():
    """The 3-D notes' account of `gno_fno_soft`'s captured run with recomputed blocks: the graphs'
    pool and the last MSE epoch's validation as its log records them."""
    import re

    notes = " ".join((REPO / "benchmarks" / "notes" / "3d.md").read_text().split())
    log = (REPO / "benchmarks" / "history" / "soft3d_capture_h100_53fa9f7.log").read_text()
    assert "model.kwargs.checkpoint_blocks=true" in notes and "MSE for 7 epochs, then DRO" in log
    epochs = re.findall(r"epoch (\d+): loss \S+, one-step validation nMSE (\S+)", log)
    assert epochs[-1][0] == "7"
    pool = float(re.search(r"with ([\d.]+) GiB allocated in private pools", log).group(1))
    said = [f"memory pool held {pool:.0f} GiB", f"one-step validation nMSE {float(epochs[-1][1]):.4f} after the seventh"]
    missing = [s for s in said if s not in notes]
    assert not missing, missing
