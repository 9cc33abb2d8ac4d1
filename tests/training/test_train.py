"""The recipe end to end: training, evaluation and report, resumption, DDP on CPU, failures."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from gno_ext.models import from_checkpoint, get_model, save_checkpoint
from gno_ext.training import NonFiniteLossError, latest_checkpoint
from gno_ext.training.checkpoint import list_checkpoints

from tests._recipes import load_recipe

from .conftest import PYTHON, QUIET, ROOT, TRAIN_PY, env_with_cache, logged, run_metrics, run_weights, torchrun

def test_heat_param_smoke_end_to_end(train_module, tmp_path):
    result = train_module.main(["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}",
                                "trainer.progress=false"])
    run = Path(result["run_dir"])
    assert run == tmp_path / "heat-param" / "gno_fno_soft-smoke-seed0"  # the recommended GNO is the default
    # training: both phases of the curriculum ran, the loss is finite and logged
    rows = run_metrics(run)
    train_rows = [r for r in rows if "train/loss" in r]
    assert {r["train/dro"] for r in train_rows} == {0.0, 1.0}
    assert all(r["train/loss"] == r["train/loss"] and r["train/loss"] < 1e3 for r in train_rows)
    assert any("valid/nmse_one_step" in r for r in rows)
    # the DRO epoch (the second) logs how its groups were weighed: the worst above the mean's weight
    weighed = [r for r in rows if "train/dro_weight_max" in r]
    assert len(weighed) == 1 and weighed[0]["step"] == 8 and weighed[0]["epoch"] == 2
    assert weighed[0]["train/dro_weight_max"] > 1 > weighed[0]["train/dro_weight_min"] > 0
    assert all(0 <= r["train/data_wait"] <= 1 for r in train_rows)
    assert list((run / "tb").rglob("events.out.tfevents*")), "no TensorBoard log"
    # checkpoints and the final model rebuild from their folders alone
    ckpts = list_checkpoints(run)
    assert ckpts and latest_checkpoint(run) == ckpts[-1]
    state = json.loads((ckpts[-1] / "trainer_state.json").read_text())
    assert state["step"] == result["step"] == 8 and state["epoch"] == 2
    model = from_checkpoint(run / "model")
    assert sum(p.numel() for p in model.parameters()) > 0
    # evaluation: report, figures, the metrics
    report = json.loads((run / "eval" / "report.json").read_text())
    assert report == result["report"] | {"figures": report["figures"]}
    assert report["steps"] == 5  # smoke trajectories have 6 frames: eval.steps is capped
    assert report["nmse"]["mean"] > 0 and len(report["per_step_nmse"]) == 5
    assert report["nmse"]["worst_group"]["nmse_mean"] >= report["nmse"]["mean"] - 1e-12
    for name in ("per_step_nmse.png", "error_vs_parameter.png", "rollout_worst.png", "report.md"):  # eval.figures=1
        assert (run / "eval" / name).stat().st_size > 0
    # the report shows the worst, median and best trajectories, persistence beside the model, and says what nMSE is
    assert len(report["per_step_nmse_persistence"]) == report["steps"]
    text = (run / "eval" / "report.md").read_text()
    assert "divided by its variance about its mean" in text and "Persistence (the input frame copied forward)" in text
    # recipes/evaluate.py reproduces the numbers from the saved model
    evaluate = load_recipe("evaluate")
    with pytest.raises(FileExistsError, match=r"eval/report.json: an earlier report is there; .*--overwrite"):
        evaluate.main([str(run)])  # never replaced silently
    again = evaluate.main([str(run), "--out", str(tmp_path / "again")])
    assert again["nmse"]["mean"] == pytest.approx(report["nmse"]["mean"], rel=1e-6)
    # ... in the precision that training used at its end (on a GPU: bf16 autocast), which the report names
    assert again["precision"] == report["precision"]
    if not torch.cuda.is_available():
        assert report["precision"] == "no" and "(float32)" in (run / "eval" / "report.md").read_text()
    with pytest.raises(ValueError, match="evaluation on cpu, precision 'bf16': .*mixed precision is for GPUs"):
        evaluate.main([str(run), "--device", "cpu", "--precision", "bf16", "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()
    # the rollouts from a later frame (Navier-Stokes past its transient): one step fewer fits
    later = evaluate.main([str(run), "--start-frame", "1", "--out", str(tmp_path / "from1")])
    assert later["start_frame"] == 1 and later["steps"] == report["steps"] - 1 == len(later["per_step_nmse"])
    assert later["nmse"]["mean"] != report["nmse"]["mean"]
    for bad in (["--max-trajectories", "0"], ["--start-frame", "-1"], ["--steps", "0"]):  # (0 evaluated everything)
        with pytest.raises(SystemExit):
            evaluate.main([str(run), *bad, "--out", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()
    # a report folder inside a saved model (this run's or another's) or a file is refused
    for out, error in ((run / "model" / "reports", ValueError), (run / "config.yaml", FileExistsError)):
        with pytest.raises(error, match=r"--out .*(holds a saved model|is a file)"):
            evaluate.main([str(run), "--out", str(out)])
    assert not (run / "model" / "reports").exists()
    # a checkpoint's report goes under the run, named by the checkpoint, labelled with the model it
    # holds (before: RUN's model name, written into the checkpoint's own folder)
    other = save_checkpoint(get_model("persistence"), tmp_path / "other-run" / "model")
    for checkpoint, folder, model in ((ckpts[-1], f"checkpoints-{ckpts[-1].name}", "gno_fno"),
                                      (other, None, "persistence")):
        rep = evaluate.main([str(run), "--checkpoint", str(checkpoint), "--max-trajectories", "1"])
        written = [p.parent for p in (run / "eval").glob("*/report.json")]
        target = run / "eval" / (folder or f"{tmp_path.name}-other-run-model")
        assert target in written and json.loads((target / "report.json").read_text())["model"] == model == rep["model"]
        assert rep["checkpoint"] == str(checkpoint) and not (checkpoint / "eval").exists()
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "model.safetensors"]


def test_test_rollouts_during_training_are_logged_with_the_training_time(train_module, tmp_path):
    """``eval.at_epochs``: the test rollouts after the chosen epochs, logged with the seconds of
    training so far (summed into the final model's record); the last equals the final report."""
    common = ["--recipe", "heat-param", "size=smoke", "trainer.progress=false", "trainer.epochs=3"]
    result = train_module.main([*common, f"output_root={tmp_path}", "eval.at_epochs=[1,3]"])
    run = Path(result["run_dir"])
    rows = run_metrics(run)
    tested = [r for r in rows if "test/nmse_mean" in r]
    assert [r["epoch"] for r in tested] == [1, 3]
    assert 0 < tested[0]["train_s"] < tested[1]["train_s"]
    assert tested[1]["test/nmse_mean"] == pytest.approx(result["report"]["nmse"]["mean"], rel=1e-6)
    assert tested[1]["test/nmse_worst_group"] == pytest.approx(result["report"]["nmse"]["worst_group"]["nmse_mean"])
    assert (run / "eval" / "epoch_001" / "report.json").is_file() and not list(run.glob("eval/epoch_001/*.png"))
    assert json.loads((run / "model" / "config.json").read_text())["extra"]["train_s"] >= tested[1]["train_s"]
    state = json.loads((latest_checkpoint(run) / "trainer_state.json").read_text())
    assert state["train_s"] >= tested[1]["train_s"]  # resumed runs go on counting from here
    for bad, match in (("eval.at_epochs=[0]", "expected epochs from 1 to trainer.epochs = 3, got 0"),
                       ("eval.at_epochs=[4]", "expected epochs from 1 to trainer.epochs = 3, got 4"),
                       ("eval.at_epochs=3", "expected a list of epochs")):
        with pytest.raises(ValueError, match=rf"eval.at_epochs: {match}"):
            train_module.main([*common, f"output_root={tmp_path / 'bad'}", bad])
        assert not (tmp_path / "bad").exists()  # refused before anything was written


def test_an_ood_test_split_is_reported_in_groups_outside_the_training_range(train_module, tmp_path):
    """advection-ood's test speeds lie below and above the training range [0.5, 1.5]: the report's
    groups say so and give their speeds, instead of the outermost training bins' names."""
    result = train_module.main(["--recipe", "advection-ood", "size=smoke", "model=persistence",
                                f"output_root={tmp_path}", "trainer.progress=false"])
    groups = result["report"]["groups"]
    assert len(groups) >= 2 and sum(g["n"] for g in groups) == result["report"]["trajectories"]
    for g in groups:
        speeds = [float(x) for x in re.findall(r"[0-9.]+", g["label"].split("speed")[1])]
        assert g["label"].endswith("(outside the training range)"), g["label"]
        assert all(v < 0.5 for v in speeds) or all(v > 1.5 for v in speeds), g["label"]
    assert "outside the training range" in (Path(result["run_dir"]) / "eval" / "report.md").read_text()


def test_a_later_run_in_the_same_process_may_change_precision(train_module, tmp_path):
    """accelerate keeps its state per process and refuses a new precision once set; a second
    `train` call (a notebook, or these tests on a GPU: bf16, then a float32 run) starts afresh."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # (from the earlier tests)
    Accelerator(cpu=True, mixed_precision="bf16")  # what an earlier run left behind
    result = train_module.main(["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}",
                                "trainer.max_steps=1", "eval.enabled=false", *QUIET])
    assert result["step"] == 1


@pytest.mark.slow
def test_existing_run_and_resume_checks(train_module, tmp_path):
    args = ["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}", "trainer.epochs=1", *QUIET]
    train_module.main(args)
    with pytest.raises(FileExistsError, match="resume=auto"):
        train_module.main(args)
    with pytest.raises(ValueError, match="model.kwargs.n_kernels: 4 -> 2"):
        train_module.main([*args, "resume=auto", "model.kwargs.n_kernels=2"])
    done = train_module.main([*args, "resume=auto", "trainer.epochs=2"])  # extend a finished run
    assert done["step"] == 8
    fresh = train_module.main([*args, "overwrite=true"])
    assert fresh["step"] == 4


@pytest.mark.slow
def test_a_folder_that_is_not_a_run_is_never_deleted_resumed_or_trained_into(train_module, tmp_path):
    """(Before, overwrite=true deleted whatever run_dir= named, a dataset or a user's notes, and
    resume=auto started a fresh run in such a folder.)"""
    notes = tmp_path / "my-notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("years of work")
    args = ["--recipe", "heat-param", "size=smoke", f"run_dir={notes}", "trainer.epochs=1", *QUIET]
    for extra in (["overwrite=true"], ["resume=auto"], ["resume=auto", "overwrite=true"], []):
        with pytest.raises(FileExistsError, match=r"my-notes: not a gno_ext run folder \(it holds thesis.tex; no "
                                                  r"\.gno_ext_run\); nothing in it is deleted") as error:
            train_module.main([*args, *extra])
        assert "overwrite=true" not in str(error.value)  # never suggested for a folder that is not a run
    assert sorted(p.name for p in notes.iterdir()) == ["thesis.tex"]
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(FileExistsError, match="a-file: is a file, not a run folder"):
        train_module.main([*args[:3], f"run_dir={tmp_path / 'a-file'}", "overwrite=true", *QUIET])

    # a run is marked, and overwrite=true replaces it; a run from before the marker is resumed, never deleted
    run = tmp_path / "run"
    train_module.main([*args[:3], f"run_dir={run}", "trainer.epochs=1", *QUIET])
    assert (run / ".gno_ext_run").is_file()
    train_module.main([*args[:3], f"run_dir={run}", "trainer.epochs=1", "overwrite=true", *QUIET])
    (run / ".gno_ext_run").unlink()
    with pytest.raises(FileExistsError, match="a run made before gno_ext marked its runs"):
        train_module.main([*args[:3], f"run_dir={run}", "trainer.epochs=1", "overwrite=true", *QUIET])
    assert train_module.main([*args[:3], f"run_dir={run}", "trainer.epochs=2", "resume=auto", *QUIET])["step"] == 8
    assert (run / ".gno_ext_run").is_file()


@pytest.mark.slow
def test_a_failing_overwrite_leaves_the_old_run_and_bad_settings_are_named(train_module, tmp_path):
    args = ["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}", "trainer.epochs=1", *QUIET]
    done = train_module.main(args)
    kept = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    bad = [  # (what each did before)
        ("trainer.dro.tau=0", "trainer.dro.tau: expected a number above 0, got 0"),  # an error at the first DRO epoch
        ("trainer.dro.tau=inf", "trainer.dro.tau: expected a number above 0, got inf"),  # a NaN loss
        ("trainer.curriculum.warmup_fraction=1.5", r"trainer.curriculum.warmup_fraction: expected a number in \[0, 1\], "
                                                   "got 1.5"),  # no DRO at all
        ("trainer.curriculum.warmup_epochs=-1", "trainer.curriculum.warmup_epochs: expected an integer >= 0 or null, "
                                                "got -1"),
        ("trainer.log_every=0", "trainer.log_every: expected an integer >= 1, got 0"),  # ZeroDivisionError
        ("trainer.val_every=0", "trainer.val_every: expected an integer >= 1, got 0"),  # ZeroDivisionError
        ("trainer.grad_accum=0", "trainer.grad_accum: expected an integer >= 1, got 0"),  # ZeroDivisionError
        ("trainer.clip_grad=-1", "trainer.clip_grad: expected a number above 0 or null, got -1"),  # reversed gradients
        ("trainer.checkpoint_every=-1", "trainer.checkpoint_every: expected an integer >= 0 or null, got -1"),
        ("trainer.epochs=1.5", "trainer.epochs: expected an integer >= 1, got 1.5"),
        ("trainer.ema.decay=2", r"trainer.ema.decay: expected a number in \[0, 1\], got 2"),
        ("optimizer.lr=-1", "optimizer.lr: expected a number >= 0, got -1"),
        ("optimizer.warmup_fraction=abc", "optimizer.warmup_fraction: expected a number in .*, got 'abc'"),
        ("trainer.batch_size=0", "trainer.batch_size: expected an integer >= 1, got 0"),
        ("trainer.dro.bins=0", "trainer.dro.bins: expected an integer >= 1, got 0"),
        ("optimizer.schedule=linear", "optimizer.schedule: expected one of cosine, constant, got 'linear'"),
        ("trainer.capture=yes", "trainer.capture: expected true or false, got 'yes'"),
        ("+model.kwargs.foo=1", "model.kwargs.foo: not an argument of the model"),  # (before: a late TypeError)
        ("eval.steps=0", "eval.steps: expected an integer >= 1, got 0"),  # (before: failed after training)
        ("seed=1.5", "seed: expected an integer >= 0, got 1.5"),
    ]
    late = [  # errors found once the data and the model are set up (each deleted the old run first)
        ("model.kwargs.hidden_channels=-3", ValueError, "hidden_channels: must be an integer >= 1, got -3"),
        ("trainer.compile=maybe", ValueError, "compile mode 'maybe': unknown"),
    ]
    for override, message in bad:
        with pytest.raises(ValueError, match=message):
            train_module.main([*args, "overwrite=true", override])
    for override, error, message in late:
        with pytest.raises(error, match=message):
            train_module.main([*args, "overwrite=true", override])
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == kept  # the finished run is untouched
    assert latest_checkpoint(Path(done["run_dir"])) is not None


@pytest.mark.slow
def test_kill_and_resume_reaches_the_samerun_weights(tmp_path, cache):
    """A run killed (SIGKILL) mid-training and resumed with resume=auto ends with exactly the
    weights of an uninterrupted run (CPU, deterministic)."""
    common = [PYTHON, str(TRAIN_PY), "--recipe", "heat-param", "size=smoke", "trainer.epochs=12",
              "trainer.checkpoint_every=2", "backbone.latent=64", "backbone.depth=3", "eval.enabled=false", *QUIET]
    env = env_with_cache(cache)
    ref = subprocess.run([*common, f"run_dir={tmp_path / 'ref'}"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    run = tmp_path / "killed"
    proc = subprocess.Popen([*common, f"run_dir={run}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        ckpt = latest_checkpoint(run)
        if ckpt is not None and int(ckpt.name.split("_")[1]) >= 6:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (run / "model").exists()
    killed_at = json.loads((latest_checkpoint(run) / "trainer_state.json").read_text())["step"]
    assert 6 <= killed_at < 48
    resumed = subprocess.run([*common, f"run_dir={run}", "resume=auto"], env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    a, b = run_weights(tmp_path / "ref"), run_weights(run)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_run_folder_has_one_writing_job(tmp_path, cache):
    """Two real processes on one run folder: while the first trains, a second with resume=auto
    stops at once with a message naming the first (its pid); once the first is killed (SIGKILL:
    the lock goes with the process) the folder resumes."""
    common = [PYTHON, str(TRAIN_PY), "--recipe", "heat-param", "size=smoke", "trainer.epochs=400", "eval.enabled=false",
              f"run_dir={tmp_path / 'run'}", *QUIET]
    env = env_with_cache(cache)
    first = subprocess.Popen(common, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in first.stdout:  # the lock is held from before this line on
            if line.startswith("run "):
                break
        second = subprocess.run([*common, "resume=auto"], env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2 and first.poll() is None
        assert f"another training job (pid {first.pid} on " in second.stderr and "is writing this run" in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    resumed = subprocess.run([*common, "resume=auto", "trainer.epochs=2"], env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]


def test_resume_never_replaces_newer_work_and_says_when_it_starts_afresh(train_module, tmp_path, capsys):
    """resume=PATH to an older checkpoint of the same folder is refused (it would replace the
    newer ones and the final model), and runs when branched into another folder; resume=auto
    without a checkpoint says that it starts afresh and moves the abandoned rows aside."""
    common = ["--recipe", "heat-param", "size=smoke", "eval.enabled=false", "trainer.progress=false",
              "trainer.tensorboard=false", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=10"]
    run = tmp_path / "run"
    train_module.main([*common, f"run_dir={run}"])
    older = list_checkpoints(run)[0]
    with pytest.raises(FileExistsError, match=rf"resume={older}: {run} holds a newer checkpoint \(step_\d+\)"):
        train_module.main([*common, f"run_dir={run}", f"resume={older}", "trainer.epochs=3"])
    branch = train_module.main([*common, f"run_dir={tmp_path / 'branch'}", f"resume={older}", "trainer.epochs=3"])
    assert branch["step"] > json.loads((older / "trainer_state.json").read_text())["step"]
    abandoned = tmp_path / "abandoned"
    abandoned.mkdir()
    (abandoned / ".gno_ext_run").write_text("{}")
    (abandoned / "metrics.jsonl").write_text('{"step": 1, "train/loss": 9.0}\n')
    capsys.readouterr()
    train_module.main([*common, f"run_dir={abandoned}", "resume=auto", "trainer.max_steps=1"])
    assert f"resume=auto: {abandoned} holds no complete checkpoint; starting afresh" in capsys.readouterr().out
    moved = list(abandoned.glob("metrics.abandoned-*.jsonl"))
    # the abandoned row moved aside whole, and none of the new run's rows is it (a substring test
    # would match "9.0" inside a timing figure such as 129.08)
    assert len(moved) == 1 and run_metrics(abandoned, moved[0].name) == [{"step": 1, "train/loss": 9.0}]
    assert all(row.get("train/loss") != 9.0 for row in run_metrics(abandoned))


def test_interrupted_save_is_not_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000004").mkdir(parents=True)
    (run / "checkpoints" / "step_00000004" / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / ".step_00000008.tmp-123").mkdir()  # a save killed before its rename
    (run / "checkpoints" / "step_00000012").mkdir()  # a folder without its state file
    assert latest_checkpoint(run).name == "step_00000004"
    from gno_ext.models import get_model
    from gno_ext.training.checkpoint import save_training_checkpoint

    model = get_model("gno", latent=16, patch=8, depth=1, heads=2, n_kernels=2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    (run / "checkpoints" / ".step_00000010.old-77").mkdir()  # a replacement killed half-way
    (run / "checkpoints" / ".keep-me").mkdir()  # not a name of ours
    save_training_checkpoint(run, 16, model, opt, sched, {"epoch": 0}, {}, keep=0)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        ".keep-me", "step_00000004", "step_00000012", "step_00000016"]  # the killed saves' folders removed


def test_a_damaged_training_checkpoint_names_its_weights_file(tmp_path):
    from gno_ext.models import get_model
    from gno_ext.training.checkpoint import load_training_checkpoint, save_training_checkpoint

    model = get_model("gno", latent=16, patch=8, depth=1, heads=2, n_kernels=2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    path = save_training_checkpoint(tmp_path / "run", 3, model, opt, sched, {"epoch": 0}, {})
    assert load_training_checkpoint(path, model, opt, sched)["step"] == 3
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"model.safetensors: cannot be read as safetensors"):
        load_training_checkpoint(path, model, opt, sched)
    # a training state that only code could rebuild is refused in one line, without torch's
    # advice to turn the protection off; so is one that is not a training state
    model = get_model("gno", latent=16, patch=8, depth=1, heads=2, n_kernels=2)
    path = save_training_checkpoint(tmp_path / "run2", 3, model, opt, sched, {"epoch": 0}, {})
    torch.save({"optimizer": Unpicklable()}, path / "training_state.pt")
    with pytest.raises(ValueError, match=r"training_state.pt: refused: it holds something other than tensors") as err:
        load_training_checkpoint(path, model, opt, sched)
    assert "weights_only" not in str(err.value) and "\n" not in str(err.value)
    torch.save([1, 2], path / "training_state.pt")
    with pytest.raises(ValueError, match="training_state.pt: not a training state"):
        load_training_checkpoint(path, model, opt, sched)


class Unpicklable:
    """An object that only code could rebuild (unpickling would import this module)."""


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path, cache):
    """torchrun with 2 CPU processes (gloo) and batch 2 each trains like 1 process with batch 4:
    the same global batches, the objective reduced across processes, one run folder; with the
    gradients averaged by DDP's hooks and by the loop over the flat buffers
    (``trainer.grad_sync=flat``, the model outside DDP) alike."""
    env = env_with_cache(cache)
    # the gates' load-balance term is per process, as usual for mixture-of-experts aux losses: off here
    common = ["--recipe", "heat-joint", "size=smoke", "trainer.max_steps=3", "eval.enabled=false",
              "model.balance_weight=0", "trainer.device=cpu", *QUIET]  # CPU processes also where there is a GPU
    one = subprocess.run([PYTHON, str(TRAIN_PY), *common, "trainer.batch_size=4", f"run_dir={tmp_path / 'one'}"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    for sync in ("ddp", "flat"):
        two = torchrun(2, [str(TRAIN_PY), *common, "trainer.batch_size=2", f"trainer.grad_sync={sync}",
                           f"run_dir={tmp_path / sync}"], env, 300)
        assert two.returncode == 0, two.stderr[-3000:]
        assert f"2 process(es) on cpu (gradients averaged by {sync})" in two.stdout
        run, alone = tmp_path / sync, tmp_path / "one"
        steps = [r["step"] for r in run_metrics(run) if "train/loss" in r]
        assert steps == sorted(set(steps)) == [1, 2, 3]  # written once, by the main process
        assert logged(run, "train/loss") == pytest.approx(logged(alone, "train/loss"), rel=1e-6)
        # the norm of the averaged gradient (before clipping): a sum instead of a mean would
        # double it, which Adam's updates alone would hardly show
        assert logged(run, "train/grad_norm") == pytest.approx(logged(alone, "train/grad_norm"), rel=1e-4)
        a, b = run_weights(tmp_path / "one"), run_weights(tmp_path / sync)
        for key in a:
            # Parameters whose exact gradient is zero (attention key biases: softmax ignores a shift)
            # get float-rounding gradients that differ between the two reductions, and Adam scales
            # those to steps of up to lr (1e-3 here, 3 steps): hence the absolute tolerance.
            torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=5e-5, msg=f"{sync}: {key}")


def test_grad_sync_is_resolved_and_checked():
    """``trainer.grad_sync``: auto is flat only for a captured step on several processes; flat
    needs the flat buffers; an unknown value is named."""
    from gno_ext.training.setup import resolve_grad_sync

    assert resolve_grad_sync("auto", 2, True, True) == "flat"
    assert resolve_grad_sync("auto", 2, False, True) == resolve_grad_sync("auto", 1, True, True) == "ddp"
    assert resolve_grad_sync("flat", 1, False, True) == "flat" and resolve_grad_sync("ddp", 4, True, True) == "ddp"
    with pytest.raises(ValueError, match="trainer.grad_sync=flat: needs trainer.flat_parameters=true"):
        resolve_grad_sync("flat", 2, False, False)
    with pytest.raises(ValueError, match="trainer.grad_sync: expected one of auto, ddp, flat, got 'nccl'"):
        resolve_grad_sync("nccl", 2, False, True)


def test_fused_adamw_only_for_real_parameters_on_gpus():
    """Fused AdamW refuses complex parameters (neuraloperator's spectral weights): FNO-based
    models take the foreach AdamW on GPUs; CPUs never take the fused one."""
    from gno_ext.training.setup import fused_adamw

    real, spectral = [torch.nn.Parameter(torch.zeros(2))], [torch.nn.Parameter(torch.zeros(2, dtype=torch.cfloat))]
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert fused_adamw([{"params": real}], cuda) and not fused_adamw([{"params": real}], cpu)
    assert not fused_adamw([{"params": real}, {"params": spectral}], cuda)


def test_cpu_processes_meet_in_a_barrier_without_a_device(monkeypatch):
    """Accelerate's barrier names a GPU (the local process index) also for CPU processes, which
    fails where CUDA is present with fewer GPUs than processes: CPU (gloo) processes meet in a
    barrier without device ids, all others through accelerate."""
    from accelerate.utils import DistributedType

    from gno_ext.training.loop import _wait_for_everyone

    calls = []
    monkeypatch.setattr(torch.distributed, "barrier", lambda *args, **kwargs: calls.append(("torch", args, kwargs)))

    class State:
        def __init__(self, kind):
            self.distributed_type = kind

        def wait_for_everyone(self):
            calls.append(("accelerate",))

    _wait_for_everyone(State(DistributedType.MULTI_CPU))
    assert calls == [("torch", (), {})]
    calls.clear()
    _wait_for_everyone(State(DistributedType.MULTI_GPU))
    assert calls == [("accelerate",)]


@pytest.mark.slow
def test_a_failing_process_names_its_root_cause_to_torchrun(tmp_path, cache):
    """recipes/train.py records a failing process's exception for the launcher, so torchrun's
    summary shows the traceback of the root cause, not only an exit code."""
    missing = tmp_path / "missing.npz"
    out = torchrun(1, [str(TRAIN_PY), "--recipe", "custom", "size=smoke", f"data.root={missing}", "trainer.device=cpu",
                       f"output_root={tmp_path}", *QUIET], env_with_cache(cache), 300)
    assert out.returncode != 0
    summary = out.stderr[out.stderr.index("Root Cause"):]
    assert "error_file: <N/A>" not in summary
    assert "Traceback" in summary and f"FileNotFoundError: {missing}: no such file" in summary


def test_non_finite_training_stops_with_a_clear_error(train_module, tmp_path):
    with pytest.raises(NonFiniteLossError, match="consecutive updates with a non-finite"):
        train_module.main(["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}", "optimizer.lr=1e30",
                           "optimizer.warmup_fraction=0", "trainer.clip_grad=null", "trainer.max_nonfinite=2",
                           *QUIET])


def test_a_non_finite_micro_batch_skips_the_whole_update(train_module, tmp_path, monkeypatch):
    """With gradient accumulation the NaN of the first micro-batch has reached the gradients:
    the update is skipped (counted once) even though the second micro-batch is finite."""
    import gno_ext.training.problem as problem  # the grid problem reduces the error per sample

    calls, mse = {"n": 0}, problem.mse_per_sample

    def mse_with_one_nan(pred, target):
        calls["n"] += 1
        value = mse(pred, target)
        return value * float("nan") if calls["n"] == 3 else value  # micro-batch 1 of update 2

    monkeypatch.setattr(problem, "mse_per_sample", mse_with_one_nan)
    result = train_module.main(["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}",
                                "trainer.grad_accum=2", "trainer.max_steps=3", "trainer.clip_grad=null",
                                "eval.enabled=false", *QUIET])
    assert result["skipped"] == 1 and result["step"] == 3
    assert all(torch.isfinite(w).all() for w in run_weights(Path(result["run_dir"])).values())


@pytest.mark.parametrize("clip", ["null", "1.0"])
def test_non_finite_gradients_with_a_finite_loss_stop_the_run(train_module, tmp_path, monkeypatch, clip):
    """(Before, the finite loss reset the count before the gradient was checked, and without
    clipping the gradient was not checked at all: every update was skipped, or applied with NaN,
    and the run saved its model and exited 0.)"""
    import gno_ext.training.problem as problem

    mse = problem.mse_per_sample

    def mse_with_nan_gradients(pred, target):
        value = mse(pred, target)
        if value.requires_grad:
            value.register_hook(lambda g: g * float("nan"))
        return value

    monkeypatch.setattr(problem, "mse_per_sample", mse_with_nan_gradients)
    with pytest.raises(NonFiniteLossError, match=r"3 consecutive updates with a non-finite loss or gradient "
                                                 r"\(this one: gradient norm nan\)"):
        train_module.main(["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}", f"trainer.clip_grad={clip}",
                           "trainer.max_nonfinite=3", *QUIET])
    assert not any(tmp_path.rglob("model.safetensors"))


def test_non_finite_training_data_is_named_before_training(train_module, tmp_path, monkeypatch):
    """(Before, a NaN in the data made the normalisation, and so the loss, NaN: the run stopped
    after max_nonfinite skipped updates, saying nothing about the data.)"""
    import gno_ext.training.loop as loop

    fetch = loop._fetch

    def fetch_with_a_nan(ds, indices, problem):
        batch = fetch(ds, indices, problem)
        if len(indices) > 3:
            batch.u_out[3, 0, 0, 1, 2] = float("nan")
        return batch

    monkeypatch.setattr(loop, "_fetch", fetch_with_a_nan)
    with pytest.raises(ValueError, match=r"data under .*: training window 3 holds non-finite field values "
                                         r"\(1 of the \d+ windows read to set the normalisation do\)"):
        train_module.main(["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}", *QUIET])
    assert not any(tmp_path.rglob("*.safetensors"))


@pytest.mark.slow
def test_dataloader_workers_give_the_losses_of_the_main_process(train_module, tmp_path):
    """Workers (kept alive across epochs) read the batches the sampler chose for each epoch:
    two epochs with 2 workers log exactly the losses of reading in the main process."""
    losses = {}
    for workers in (0, 2):
        result = train_module.main(["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path / str(workers)}",
                                    f"trainer.num_workers={workers}", "trainer.log_every=1", "eval.enabled=false",
                                    *QUIET])
        rows = (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        losses[workers] = [json.loads(x)["train/loss"] for x in rows if "train/loss" in x]
    assert len(losses[0]) == 8 and losses[2] == losses[0]


@pytest.mark.slow
def test_trl_on_a_well_layout_dataset(train_module, tmp_path, trl_root):
    pytest.importorskip("the_well")  # the recipe reads The Well's files through its package
    result = train_module.main(["--recipe", "trl", "size=smoke", f"data.root={trl_root}", f"output_root={tmp_path}",
                                *QUIET])
    report = result["report"]
    assert report["steps"] == 7 and report["trajectories"] == 4
    assert {g["label"].split(",")[0] for g in report["groups"]} == {"periodic/periodic/open/open"}
    model = from_checkpoint(Path(result["run_dir"]) / "model")
    assert model.in_channels == 4 and model.n_params == 1  # density, pressure, velocity x/y; tcool


def test_trl_without_data_says_what_to_download(train_module, tmp_path):
    with pytest.raises(FileNotFoundError, match="the-well-download.*turbulent_radiative_layer_2D"):
        train_module.main(["--recipe", "trl", "size=smoke", f"output_root={tmp_path}", *QUIET])


def test_gradient_accumulation_matches_the_larger_batch(train_module, tmp_path):
    """Two micro-batches of 2 with grad_accum=2 take the step one batch of 4 takes (MSE phase:
    the mean of equal-size micro-batch means is the batch mean)."""
    # the gates' load-balance term is per micro-batch (as it is per process): off here
    # float32 also on a GPU (trainer.precision=auto would take bf16 there, whose rounding the tolerance is not for)
    common = ["--recipe", "heat-param", "size=smoke", "trainer.max_steps=3", "trainer.curriculum.warmup_epochs=5",
              "model.balance_weight=0", "eval.enabled=false", "trainer.precision=no", *QUIET]
    train_module.main([*common, "trainer.batch_size=4", f"run_dir={tmp_path / 'big'}"])
    train_module.main([*common, "trainer.batch_size=2", "trainer.grad_accum=2", f"run_dir={tmp_path / 'accum'}"])
    a, b = run_weights(tmp_path / "big"), run_weights(tmp_path / "accum")
    for key in a:  # see test_two_processes_train_like_one for the absolute tolerance
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=5e-5, msg=key)


@pytest.mark.slow
def test_flat_parameters_train_like_the_parameters_themselves(train_module, tmp_path):
    """trainer.flat_parameters (the default) takes the optimizer steps of an AdamW over the
    parameters themselves: both phases of the curriculum, gradient clipping on."""
    common = ["--recipe", "heat-param", "size=smoke", "trainer.max_steps=5", "trainer.curriculum.warmup_epochs=1",
              "trainer.clip_grad=0.05", "eval.enabled=false", *QUIET]
    train_module.main([*common, f"run_dir={tmp_path / 'flat'}"])
    train_module.main([*common, "trainer.flat_parameters=false", f"run_dir={tmp_path / 'plain'}"])
    a, b = run_weights(tmp_path / "plain"), run_weights(tmp_path / "flat")
    # (a flat buffer cut off from its parameters would leave them at their initial values)
    for key in a:  # the clipping norm is summed in another order: rounding only
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
def test_ema_weights_are_the_final_model_and_survive_resume(train_module, tmp_path):
    args = ["--recipe", "heat-param", "size=smoke", "trainer.ema.enabled=true", "trainer.ema.decay=0.5",
            "eval.enabled=false", f"run_dir={tmp_path / 'run'}", *QUIET]
    train_module.main([*args, "trainer.epochs=1"])
    ckpt = latest_checkpoint(tmp_path / "run")
    ema = safetensors.torch.load_file(str(ckpt / "ema.safetensors"))
    raw = safetensors.torch.load_file(str(ckpt / "model.safetensors"))
    final = run_weights(tmp_path / "run")
    key = next(k for k in raw if k.endswith("weight"))
    assert torch.equal(final[key], ema["module." + key])  # the final model is the EMA
    assert not torch.equal(final[key], raw[key])
    done = train_module.main([*args, "trainer.epochs=2", "resume=auto"])  # resumes with its EMA state
    assert done["step"] == 8
    assert float(safetensors.torch.load_file(str(latest_checkpoint(tmp_path / "run") / "ema.safetensors"))
                 ["n_averaged"]) == 8


@pytest.mark.slow
def test_ddp_gated_fno_keeps_every_kernel_in_the_graph(tmp_path, cache):
    """GatedFNO's spectral kernels run on the static path: a kernel that no sample of a
    process's batch selects still gets a (zero) gradient, so the 2-process run trains with
    DDP's search for unused parameters off (``auto`` turns it off for this model); the
    kernel-by-kernel dispatch, which left such kernels without a gradient, needed it."""
    from gno_ext.layers.mixture import has_dispatch
    from gno_ext.models import get_model

    model = get_model("gated_fno", n_modes=[4, 4], in_channels=1, out_channels=1, hidden_channels=8, n_layers=1)
    assert not has_dispatch(model)
    for conv in [m for m in model.modules() if hasattr(m, "takes_static_path")]:
        conv.static = False
    assert has_dispatch(model)
    env = env_with_cache(cache)
    common = [str(TRAIN_PY), "--recipe", "heat-joint", "size=smoke", "model=gated_fno", "trainer.max_steps=4",
              "trainer.batch_size=2", "eval.enabled=false", "trainer.device=cpu", *QUIET]  # gloo, also where there is one GPU
    off = torchrun(2, [*common, f"run_dir={tmp_path / 'off'}", "trainer.find_unused_parameters=false"], env, 300)
    assert off.returncode == 0, off.stderr[-3000:]
    assert json.loads((latest_checkpoint(tmp_path / "off") / "trainer_state.json").read_text())["step"] == 4


@pytest.mark.slow
def test_the_process_group_is_destroyed_after_the_ddp_model(tmp_path, cache):
    """Destroyed while the DDP model was alive, gloo's process group could lose its last
    reference in DDP's reducer, whose destructor joins gloo's worker thread while holding the
    GIL that the thread may need: 4 of 71 two-process runs hung at exit. Each process
    reports the DDP models alive when its group is destroyed: none."""
    script = ROOT / "tests" / "training" / "ddp_teardown.py"
    out = torchrun(2, [str(script), "--recipe", "heat-param", "size=smoke", "trainer.max_steps=2", "trainer.batch_size=2",
                       "eval.enabled=false", "trainer.device=cpu", f"run_dir={tmp_path / 'run'}", *QUIET],
                   env_with_cache(cache), 300)
    assert out.returncode == 0, out.stderr[-3000:]
    alive = re.findall(r"rank (\d): DDP models alive at destroy_process_group: (\d+)", out.stdout)
    assert sorted(alive) == [("0", "0"), ("1", "0")], out.stdout[-3000:]


@pytest.mark.slow
def test_custom_recipe_on_a_users_file(train_module, tmp_path, custom_file):
    """--recipe custom on an .npz: trajectories split 8/1/1 in consecutive blocks, trained and
    evaluated; an empty split is a clear error."""
    result = train_module.main(["--recipe", "custom", "size=smoke", f"data.root={custom_file}", f"output_root={tmp_path}",
                                *QUIET])
    assert result["report"]["trajectories"] == 1 and result["report"]["steps"] == 7
    assert from_checkpoint(Path(result["run_dir"]) / "model").in_channels == 2
    with pytest.raises(ValueError, match="leave the valid split empty"):
        train_module.main(["--recipe", "custom", "size=smoke", f"data.root={custom_file}", f"output_root={tmp_path}",
                           "data.split_fractions=[1.0,0.0,0.0]", "overwrite=true", *QUIET])


def test_weight_decay_on_weights_only():
    """Biases (the stacked (K, out) biases of the GNO's kernel banks included), norms and other
    1-D parameters get no weight decay; every weight matrix does."""
    from gno_ext.models import GNO
    from gno_ext.training.setup import param_groups

    model = GNO(latent=32, patch=8, depth=2, heads=4, n_kernels=3)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {names[id(p)] for p in no_decay["params"]} >= {"blocks.0.mixture.kernels.q_bias", "blocks.1.norm.weight"}
    assert all(p.ndim >= 2 and "bias" not in names[id(p)] for p in decay["params"])
    assert "blocks.0.mixture.kernels.kv_weight" in {names[id(p)] for p in decay["params"]}
    assert len(decay["params"]) + len(no_decay["params"]) == len(names)


def test_compile_mode_and_options_reach_torch_compile(train_module, tmp_path, monkeypatch):
    import gno_ext.training.setup as setup

    calls = []
    monkeypatch.setattr(setup, "compile_model", lambda model, mode, options: calls.append((mode, options)) or model)
    train_module.main(["--recipe", "heat-param", "size=smoke", f"output_root={tmp_path}", "trainer.max_steps=1",
                       "trainer.compile=reduce-overhead", "trainer.compile_options.combo_kernels=true",
                       "eval.enabled=false", *QUIET])
    assert calls == [("reduce-overhead", {"combo_kernels": True})]


def test_running_dro_weights_act_where_the_batch_form_cannot_and_resume(train_module, tmp_path):
    """heat-bc's groups are its boundary configurations, and each curriculum batch holds one:
    the batch's log-sum-exp weighs every DRO batch 1 (the plain mean), the running group losses
    weigh the configurations apart. A resumed run continues from the running losses its
    checkpoint saved."""
    common = ["--recipe", "heat-bc", "size=smoke", "trainer.epochs=3", "model=gno_fno_soft", "eval.enabled=false",
              *QUIET]
    weighed = {}
    for weights in ("batch", "running"):
        result = train_module.main([*common, f"trainer.dro.weights={weights}", f"run_dir={tmp_path / weights}"])
        weighed[weights] = [(r["train/dro_weight_min"], r["train/dro_weight_max"])
                            for r in run_metrics(Path(result["run_dir"])) if "train/dro_weight_max" in r]
    assert len(weighed["batch"]) == 1 and all(pair == (1.0, 1.0) for pair in weighed["batch"])
    assert len(weighed["running"]) == 1 and all(low < 1 < high for low, high in weighed["running"])
    state = json.loads((latest_checkpoint(tmp_path / "running") / "trainer_state.json").read_text())
    running = state["dro_running"]
    assert len(running["loss"]) == len(running["seen"]) and sum(running["seen"]) >= 2
    assert all(v > 0 for v, seen in zip(running["loss"], running["seen"]) if seen)
    # resumed: the first DRO step after the checkpoint weighs with the saved running losses
    again = train_module.main([*common, "trainer.epochs=4", "trainer.dro.weights=running", "resume=auto",
                               f"run_dir={tmp_path / 'running'}"])
    assert again["step"] > state["step"]
    assert "dro_running" in json.loads((latest_checkpoint(tmp_path / "running") / "trainer_state.json").read_text())
