"""The command line a new user meets: one clear line for a mistake, with the closest valid name,
recipe descriptions in --list, the default recipe, and Ctrl-C's hint to resume."""

import os
import signal
import subprocess
import sys
import time

import pytest

from gno_ext.data.cli import main as gno_data

from ._recipes import RECIPES, load_recipe, sigint_as_at_a_terminal

train = load_recipe("train")


@pytest.mark.parametrize("override,message", [
    ("trainer.epoch=3", "error: trainer.epoch: no such setting; did you mean trainer.epochs?"),
    ("trainer.dro.tua=2", "error: trainer.dro.tua: no such setting; did you mean trainer.dro.tau?"),
    ("model=gnoo", "error: model=gnoo: unknown; did you mean gno? (available: "),
    ("size=papr", "error: size=papr: unknown; did you mean paper? (available: bench, paper, small, smoke)"),
])
def test_a_misspelled_setting_or_config_name_gets_one_line_with_the_closest_valid_one(override, message):
    """(Before: about 40 lines of Hydra traceback advising `+key=value`.)"""
    with pytest.raises(SystemExit) as error:
        train.compose("heat-param", ["size=smoke", override])
    text = str(error.value)
    assert text.startswith(message) and "\n" not in text and "+trainer" not in text
    with pytest.raises(SystemExit, match=r"--recipe 'heat-parm': unknown; did you mean heat-param\?"):
        train.compose("heat-parm")


def test_list_describes_the_recipes_and_print_config_needs_no_recipe(capsys):
    train.main(["--list"])
    out = capsys.readouterr().out
    assert "  heat-bc                Heat equation at fixed alpha = 0.1" in out
    assert all(f"  {r}" in out for r in train.available("recipe"))
    train.main(["--print-config", "size=smoke"])  # the default recipe: the README's main job
    assert "name: heat-param" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("args,status,says", [(["--list"], 0, "recipes:"),
                                              (["--print-config", "size=smoke"], 0, "recipe:"),
                                              (["trainer.epoch=3"], 1, "did you mean trainer.epochs?")])
def test_list_print_config_and_typos_are_answered_without_importing_torch(args, status, says):
    """Before any training the command line imports neither torch nor gno_ext: its import takes
    seconds, and on a busy shared machine half a minute, before a typo was reported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(RECIPES / "train.py"), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == status and says in proc.stdout + proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "difflib" in imported and not {"torch", "gno_ext"} & imported  # (difflib: the listing was read)


def test_a_config_that_extends_another_names_its_own_run_folder():
    """``model=gno_fno_soft`` (which extends gno_fno) trains into ``gno_fno_soft-SIZE-seedN``, not
    into the folder of a ``gno_fno`` run (before: it stopped there with "already holds a run")."""
    from gno_ext.training.loop import run_dir_of

    soft = train.compose("heat-param", ["size=smoke", "model=gno_fno_soft"])
    assert soft["model"]["name"] == "gno_fno" and soft["model"]["label"] == "gno_fno_soft"
    assert run_dir_of(soft).name == "gno_fno_soft-smoke-seed0"
    assert run_dir_of(train.compose("heat-param", ["size=smoke", "model=gno_fno"])).name == "gno_fno-smoke-seed0"
    assert run_dir_of(train.compose("heat-param", ["size=smoke"])).name == "gno_fno_soft-smoke-seed0"  # the default
    assert run_dir_of(train.compose("heat-param", ["size=smoke", "model=gno"])).name == "gno-smoke-seed0"
    assert run_dir_of(train.compose("heat-param", ["size=smoke", "model=vit-5"])).name == "vit-5-smoke-seed0"


def test_bad_paths_give_one_line(tmp_path, capsys):
    assert gno_data(["info", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.strip() == f"gno-data: error: {tmp_path / 'nothing'}: no manifest.json (not a " \
                                              "generated dataset folder)"
    done = subprocess.run([sys.executable, str(RECIPES / "evaluate.py"), str(tmp_path / "nothing")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == f"error: {tmp_path / 'nothing'}: not a run folder " \
                                                          "(no config.yaml)"


@pytest.mark.slow
def test_ctrl_c_during_training_is_one_line_with_the_way_to_resume(tmp_path):
    env = {**os.environ, "GNO_EXT_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(RECIPES / "train.py"), "size=small", f"output_root={tmp_path}",
                             "trainer.progress=false", "trainer.tensorboard=false", "trainer.num_workers=0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=sigint_as_at_a_terminal)
    for line in proc.stdout:  # interrupted once training has started
        if line.startswith("run "):
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == ("interrupted: the last checkpoint is kept; run the same command with "
                                            "resume=auto to continue")
    assert "Traceback" not in err


def test_a_redirected_log_has_no_progress_bars(tmp_path):
    """With the output going to a file (not a terminal) the progress bars of the generation and
    of the epochs stay off, even with ``trainer.progress=true``: a log is not filled with their
    updates. The epoch's own line is still written."""
    env = {**os.environ, "GNO_EXT_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(RECIPES / "train.py"), "size=smoke", f"output_root={tmp_path}",
                           "trainer.progress=true", "trainer.epochs=1", "eval.enabled=false"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "epoch 1: loss" in proc.stdout
    assert "it/s]" not in proc.stderr and "traj/s]" not in proc.stderr and "\r" not in proc.stderr


def test_gno_data_generates_where_the_recipes_read_and_says_so(tmp_path, monkeypatch, capsys):
    """Without ``--out`` a dataset goes to the recipes' cache folder, and the command prints where
    and the recipe line that trains on it; ``info`` takes a preset's name; a bad size of shard
    or batch is refused before anything is written."""
    monkeypatch.setenv("GNO_EXT_CACHE", str(tmp_path / "cache"))
    assert gno_data(["generate", "heat-param", "--size", "smoke", "--device", "cpu"]) == 0
    root = tmp_path / "cache" / "data" / "smoke" / "datasets" / "heat-param"
    out = capsys.readouterr().out
    assert f"written to {root}; train on it with: python recipes/train.py --recipe heat-param size=smoke" in out
    from gno_ext.training.recipe_data import resolved_root

    assert resolved_root({"kind": "generated", "preset": "heat-param", "size": "smoke"}) == str(root.parent.parent)
    assert gno_data(["info", "heat-param", "--size", "smoke"]) == 0
    assert "dataset heat-param: preset heat-param, size smoke, complete" in capsys.readouterr().out
    assert gno_data(["info", "heat-bc", "--size", "smoke"]) == 2
    assert "heat-bc at size smoke: not generated yet" in capsys.readouterr().err
    for option in ("--shard-size", "--batch-size"):
        with pytest.raises(SystemExit) as error:
            gno_data(["generate", "heat-bc", "--size", "smoke", "--out", str(tmp_path / "bad"), option, "-2"])
        assert error.value.code == 2
        assert f"argument {option}: expected an integer of at least 1, got '-2'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_list_gives_each_recipes_whole_description():
    """A description that spans several comment lines is given whole (before: its first line,
    cut mid-sentence)."""
    assert train.description("custom").endswith("see the Datasets > Adapters page for the file layout.")
    assert train.description("trl").endswith("then data.root=PATH.")
    assert all(train.description(r).endswith((".", ")")) for r in train.available("recipe")), \
        [r for r in train.available("recipe") if not train.description(r).endswith((".", ")"))]


@pytest.mark.slow
def test_accelerate_launch_quiet_shows_the_recipes_message_alone(tmp_path):
    """``accelerate launch -q`` (as the docs say) on the trl recipe without its data: the
    recipe's one message, a failing exit status, and no launcher traceback."""
    done = subprocess.run(["accelerate", "launch", "-q", "--num_processes", "1", "--cpu", str(RECIPES / "train.py"),
                           "--recipe", "trl", f"output_root={tmp_path}"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "GNO_EXT_CACHE": str(tmp_path / "cache")})
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert out.count("The Well's turbulent_radiative_layer_2D is not on this machine") == 1
    assert "Traceback" not in out and "CalledProcessError" not in out
