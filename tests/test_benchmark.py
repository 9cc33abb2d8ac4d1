"""recipes/benchmark.py: the tables' definitions, the plan, a resumable run and the rendered page."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gno_ext.benchmark import figures as bfig
from gno_ext.benchmark import render as brender
from gno_ext.benchmark import run as brun
from gno_ext.benchmark import tables as btab

from ._recipes import RECIPES, load_recipe

bench = load_recipe("benchmark")  # the command


def page_of(results, name, tables=None):
    """The rendered page of table ``name`` (or ``index``, ``runtime``) from ``results``."""
    pages = brender.render_pages(tables or btab.load_tables(), results)
    return pages.get(f"results/{name}.md", "")

train_py = load_recipe("train")


def test_every_table_names_existing_recipes_and_models_and_the_papers_values():
    tables = btab.load_tables()
    assert {"param", "bc", "joint", "ood", "3d", "ablation", "conditioning", "pino", "trl"} <= set(tables)
    for name, table in tables.items():
        assert set(table["recipes"]) <= set(train_py.available("recipe")), name
        for row, spec in table["rows"].items():
            assert spec["model"] in train_py.available("model"), (name, row)
            assert len(spec["paper"]) == len(table["recipes"])
    # a few cells read against the paper's LaTeX tables
    param = tables["param"]
    assert param["rows"]["gno"]["paper"][param["recipes"].index("heat-param")] == 4.20e-3
    assert param["rows"]["unisolver"]["paper"][param["recipes"].index("advection-param")] == 4.53
    assert tables["joint"]["rows"]["vit-2"]["paper"] == [26.0, 0.333]
    assert tables["ablation"]["rows"]["gno_no_dro"]["overrides"] == ["trainer.curriculum.warmup_fraction=1.0"]
    long = tables["long"]  # the paper's 100 epochs, tested after 10, 30 and 100
    assert {"gno", "gno_fno_soft", "fno", "unisolver", "gno_single_kernel", "gno_fno_single_kernel"} <= set(long["rows"])
    assert long["budget"]["overrides"] == ["trainer.epochs=100", "trainer.batch_size=64", "eval.at_epochs=[10,30,100]"]
    dro = tables["dro"]["rows"]  # each model with DRO, with MSE alone, and with the paper's temperature
    assert {"gno", "gno_erm", "gno_absolute", "gno_fno_soft", "gno_fno_soft_erm", "gno_fno_soft_absolute",
            "gno_fno_soft_running"} == set(dro)
    assert dro["gno_fno_soft_running"]["overrides"] == ["trainer.dro.weights=running"]
    assert dro["gno_erm"]["overrides"] == dro["gno_fno_soft_erm"]["overrides"] == ["trainer.curriculum.warmup_fraction=1.0"]
    # the rows the paper lacks, in every table of the paper's (heat-paper, a supplement, holds the
    # rows that fit its budget; the mesh table has no grid models; the dro table compares two
    # objectives on the same two models; the long table holds the rows whose ranking it checks;
    # ns-start rolls param's models out from another frame)
    for name in set(tables) - {"mesh", "heat-paper", "dro", "long", "ns-start"}:
        assert {"fno", "gated_fno", "persistence"} <= set(tables[name]["rows"]), name
    later = tables["ns-start"]["rows"]
    assert {spec["model"] for spec in later.values()} == {"gno", "gno_fno_soft", "fno", "persistence"}
    assert all(spec["overrides"] == ["eval.start_frame=50"] for spec in later.values())
    assert tables["ablation"]["rows"]["gno_no_balance"]["overrides"] == ["model.balance_weight=0"]
    # Appendix G: the four conditionings at the encoder and before every attention layer ("Attn")
    conditioning = tables["conditioning"]
    assert conditioning["recipes"] == ["ns-param"]
    assert {f"{m}-{w}" for m in ("film", "pos", "proj", "token") for w in ("encoder", "layers")} < set(conditioning["rows"])
    assert conditioning["rows"]["proj-layers"]["paper"] == [1.07e-2]
    assert conditioning["rows"]["proj-encoder"]["paper"] == [None]  # the paper's run diverged
    # Appendix N: The Well's turbulent radiative layer, the plain MSE as the paper reports it
    assert tables["trl"]["metric"] == "mse" and tables["trl"]["rows"]["gno"]["paper"] == [11.99]
    assert "turbulent_radiative_layer_2D" in tables["trl"]["needs"]
    assert {t["metric"] for n, t in tables.items() if n != "trl"} == {"nmse"}


def test_plan_and_its_errors(tmp_path):
    tables = btab.load_tables()
    runs = btab.plan(tables, "bc", [0, 1])
    assert len(runs) == len(tables["bc"]["recipes"]) * len(tables["bc"]["rows"]) * 2
    run = next(r for r in runs if r.recipe == "heat-bc" and r.row == "gno" and r.seed == 1)
    assert run.paper_nmse == 7.80e-2
    assert run.path(tmp_path) == tmp_path / "bc" / "heat-bc" / "gno-seed1.json"
    with pytest.raises(SystemExit, match="unknown; available"):
        btab.plan(tables, "nope", [0])
    with pytest.raises(SystemExit, match=r"no row \['vit-3'\]"):
        btab.plan(tables, "bc", [0], rows=["vit-3"])


def test_the_budget_sets_each_columns_size_and_the_shared_overrides(tmp_path):
    tables = btab.load_tables()
    runs = {r.recipe: r for r in btab.plan(tables, "param", [0], rows=["gno"])}
    assert {r.size for r in runs.values()} == {"bench"}
    # a table's budget may set the paper's counts for a column
    assert {r.size for r in btab.plan(tables, "heat-paper", [0])} == {"paper"}
    assert runs["ns-param"].budget == ("trainer.epochs=10", "trainer.batch_size=64", "trainer.dro.temperature=absolute",
                                      "trainer.dro.tau=1.0")  # the objective its results were made with
    assert {r.size for r in btab.plan(tables, "param", [0], size="smoke")} == {"smoke"}
    # a row that is to run uncaptured says so itself, after any speed override of the command
    (mesh,) = btab.plan(tables, "mesh", [0], ["heat-mesh"], ["gno_mesh"])
    assert mesh.overrides == ("trainer.capture=false",)
    assert btab.merge_overrides(("trainer.epochs=10", "trainer.batch_size=64"), ["trainer.epochs=1", "x=2"]) \
        == ["trainer.batch_size=64", "trainer.epochs=1", "x=2"]
    bad = tmp_path / "tables.yaml"
    bad.write_text(yaml.safe_dump({"tables": {"t": {"title": "t", "recipes": ["heat-param"],
                                                    "budget": {"sizes": {"heat-bc": "paper"}}, "rows": {"gno": {}}}}}))
    with pytest.raises(ValueError, match=r"table t: budget.sizes names \['heat-bc'\], not among its recipes"):
        btab.load_tables(bad)


def test_paper_values_must_match_the_recipes(tmp_path):
    bad = tmp_path / "tables.yaml"
    bad.write_text(yaml.safe_dump({"tables": {"t": {"title": "t", "recipes": ["heat-param", "heat-bc"],
                                                    "rows": {"gno": {"paper": [1.0]}}}}}))
    with pytest.raises(ValueError, match="table t, row gno: 1 paper values for 2 recipes"):
        btab.load_tables(bad)


def test_the_sweep_config_composes():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(RECIPES), version_base="1.3"):
        cfg = compose(config_name="sweep", overrides=["table=bc", "recipe=heat-bc", "row=gno", "seed=1"])
    assert (cfg.table, cfg.recipe, cfg.row, cfg.seed, cfg.size) == ("bc", "heat-bc", "gno", 1, None)


def test_the_multirun_runs_exactly_the_cells_to_do():
    """A grid of runs sweeps recipe × row × seed; runs that are no grid (some cells done, stale
    cells refreshed) are swept as cells, so none of their grid's other cells runs."""
    runs = btab.plan(btab.load_tables(), "bc", [0, 1], None, ["gno", "fno"], None)
    grid = brun.sweep_command(runs, None, [], None, None)
    assert grid[3:] == ["table=bc", "recipe=advection-bc,heat-bc", "row=fno,gno", "seed=0,1"]
    some = [r for r in runs if (r.recipe, r.row, r.seed) != ("heat-bc", "gno", 1)]
    cells = brun.sweep_command(some, "smoke", [], None, None)
    assert cells[3:] == ["table=bc", "cell=" + ",".join(sorted(
        f"{r.recipe}/{r.row}-seed{r.seed}" for r in some)), "size=smoke"]
    assert len(cells[4].split(",")) == 7
    assert [brun.parse_cell(c) for c in cells[4][5:].split(",")] == sorted((r.recipe, r.row, r.seed) for r in some)
    assert brun.parse_cell("heat-param/vit-10-seed12") == ("heat-param", "vit-10", 12)
    for bad in ("heat-param/gno", "gno-seed0", "a/b/c-seed1", "heat-param/gno-seedx"):
        with pytest.raises(ValueError, match=re.escape(f"cell={bad!r}: expected <recipe>/<row>-seed<N>")):
            brun.parse_cell(bad)


@pytest.mark.slow
def test_a_run_writes_its_results_skips_them_next_time_and_renders(tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    command = [sys.executable, str(RECIPES / "benchmark.py"), "run", "--table", "bc", "--recipes", "heat-bc",
               "--rows", "gno", "fno", "--size", "smoke", "--results", str(results), "--output-root", str(runs),
               "--", "trainer.epochs=1", "trainer.batch_size=4", "trainer.progress=false", "eval.figures=0",
               "trainer.tensorboard=false"]
    env = {"GNO_EXT_CACHE": str(tmp_path / "cache"), "GNO_EXT_SWEEP_DIR": str(tmp_path / "hydra")}
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env},
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(results.glob("bc/heat-bc/*.json"))
    assert [f.name for f in files] == ["fno-seed0.json", "gno-seed0.json"]
    gno = json.loads(files[1].read_text())
    assert set(btab.REQUIRED) <= set(gno)
    assert (gno["table"], gno["recipe"], gno["model"], gno["seed"], gno["size"]) == ("bc", "heat-bc", "gno", 0, "smoke")
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"  # what the run trains on
    assert gno["epochs"] == 1 and gno["gpu"] == gpu and gno["paper_nmse"] == 7.80e-2 and gno["n_params"] > 1000
    assert gno["nmse_mean"] > 0 and len(gno["per_step_nmse"]) == gno["rollout_steps"]
    assert gno["mse_mean"] > 0 and gno["mse_std"] >= 0  # the plain MSE too, for the tables that show it
    assert gno["extra"] == ["trainer.dro.temperature=absolute", "trainer.dro.tau=1.0", "trainer.epochs=1",
                            "trainer.batch_size=4", "trainer.progress=false", "eval.figures=0",
                            "trainer.tensorboard=false"]  # the table's budget, its epochs and batch replaced
    assert gno["dro"] == {"tau": 1.0, "temperature": "absolute", "weights": "batch", "rate": 0.1}
    before = {f: f.stat().st_mtime_ns for f in files}

    again = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env},
                           cwd=tmp_path)
    assert again.returncode == 0 and "all 2 runs have results" in again.stdout
    assert {f: f.stat().st_mtime_ns for f in files} == before

    page = page_of(results, "bc")
    line = next(l for l in page.splitlines() if l.startswith("| `gno` |") and "7.80e-02" in l)
    assert f"{gno['nmse_mean']:.2e}" in line
    # trainer.precision=auto: bf16 on a GPU that has it, fp16 on one that does not, none on a CPU
    precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if torch.cuda.is_available() else "no"
    assert gno["precision"] == precision
    assert f"size=smoke, 1 epochs, batch 4, lr 0.001, precision {precision} (heat-bc)" in page
    assert ("GPU: none. Run on a CPU: `fno` on heat-bc, `gno` on heat-bc." if gpu == "cpu" else f"GPU: {gpu}.") in page
    assert ("Reproduce: `python recipes/benchmark.py run --table bc --size smoke --seeds 0 -- trainer.batch_size=4 "
            "trainer.epochs=1 eval.figures=0 ") in page  # what differs from the table's budget


def test_the_provenance_names_the_cells_run_on_a_cpu():
    run = {"recipe": "heat-mesh", "model": "mesh_gnn", "gpu": "NVIDIA H100 80GB HBM3", "commit": "a" * 40}
    said = brender._provenance([run, {**run, "model": "persistence", "gpu": "cpu", "commit": "b" * 40}])
    assert "GPU: NVIDIA H100 80GB HBM3. Run on a CPU: `persistence` on heat-mesh. Commits: aaaaaaaaaa, bbbbbbbbbb." in said
    assert "GPU: none. Run on a CPU: `mesh_gnn` on heat-mesh." in brender._provenance([{**run, "gpu": "cpu"}])


def test_the_reproduce_line_gives_each_speed_setting_once():
    """Runs of one table made with different loader workers: the command names the setting once
    (the value most runs used), not both values of one key."""
    table = btab.load_tables()["mesh"]
    run = {"recipe": "heat-mesh", "model": "mesh_gnn", "seed": 0, "size": "bench", "epochs": 10, "batch_size": 64,
           "lr": 3e-4, "precision": "bf16", "extra": ["trainer.num_workers=1", "trainer.compile=false"]}
    other = {**run, "model": "gno_mesh", "extra": ["trainer.num_workers=3", "trainer.compile=false"]}
    found = [run, {**run, "seed": 1}, other]
    line = brender._budget_line("mesh", table, found)
    assert "-- trainer.compile=false trainer.num_workers=1`" in line and "num_workers=3" not in line


def test_the_commit_is_dirty_for_changed_code_not_for_changed_results(tmp_path, monkeypatch):
    monkeypatch.delenv("GNO_EXT_COMMIT", raising=False)
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path,
                                    check=True, capture_output=True, text=True).stdout.strip()
    results = tmp_path / "benchmarks" / "results" / "t" / "heat-param"
    results.mkdir(parents=True)
    (results / "fno-seed0.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "a")
    head = git("rev-parse", "HEAD")
    commit = lambda: brun.git_commit(tmp_path, tmp_path / "benchmarks" / "results")
    assert commit() == head
    (results / "fno-seed0.json").rename(results / "fno-seed0.json.stale")  # a refresh moves it aside
    (results / "gno-seed0.json").write_text("{}")  # a new result
    assert commit() == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert commit() == head + "-dirty"
    assert brun.git_commit(tmp_path, tmp_path.parent / "elsewhere") == head + "-dirty"
    (tmp_path / "code.py").write_text("x = 1\n")
    (results / "fno-seed0.json.stale").rename(results / "fno-seed0.json")
    assert brun.git_commit(tmp_path, tmp_path.parent / "elsewhere") == head
    monkeypatch.setenv("GNO_EXT_COMMIT", "c" * 40)  # a copy of the tree without its history
    assert commit() == "c" * 40


def test_no_gpu_no_slot():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a host with GPUs")
    with brun.gpu_slot() as slot:
        assert slot is None


def test_gpu_slots_share_every_gpu_out_before_doubling_up(tmp_path, monkeypatch):
    import contextlib

    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with contextlib.ExitStack() as stack:
        slots = [stack.enter_context(brun.gpu_slot(tmp_path, per_gpu=2)) for _ in range(4)]
    assert slots == ["0", "1", "0", "1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu0-1.lock", "gpu0.lock", "gpu1-1.lock", "gpu1.lock"]


def test_gpu_slots_name_the_gpus_of_cuda_visible_devices(tmp_path, monkeypatch):
    """A job started with CUDA_VISIBLE_DEVICES=2,3 trains on GPU 2 or 3, never on the host's GPU 0
    (its child process is given the GPU's own name, not its index among the visible ones)."""
    import contextlib

    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    with contextlib.ExitStack() as stack:
        slots = [stack.enter_context(brun.gpu_slot(tmp_path)) for _ in range(2)]
    assert slots == ["2", "3"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with brun.gpu_slot(tmp_path) as slot:  # the lock is GPU 3's, whoever holds it
        assert slot == "3" and not (tmp_path / "gpu0.lock").exists()
    names = {0: "first", 1: "second"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda k: names[k])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert brun._gpu_name("3") == "second" and brun._gpu_name(None) == "cpu"


def test_each_run_on_a_gpu_gets_its_share_of_the_cores(tmp_path, monkeypatch):
    """The runs that a host's GPU slots hold at once share its cores for torch's threads
    (OMP_NUM_THREADS), unless the user set it; a host without GPUs leaves the environment alone
    (the CPU run chooses its threads itself). The child of `execute` gets that environment."""
    import contextlib

    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    base = {"PATH": "/bin", "GNO_EXT_RUNS_PER_GPU": "4"}
    env = brun.run_environment("3", base, cores=16)
    assert (env["CUDA_VISIBLE_DEVICES"], env["OMP_NUM_THREADS"], env["PATH"]) == ("3", "2", "/bin")
    assert brun.run_environment("2,3", {}, cores=16)["OMP_NUM_THREADS"] == "8"  # one run per GPU
    assert brun.run_environment("2", base, cores=6)["OMP_NUM_THREADS"] == "1"  # never 0
    assert brun.run_environment("2", {**base, "OMP_NUM_THREADS": "5"}, cores=16)["OMP_NUM_THREADS"] == "5"
    assert brun.run_environment(None, base, cores=16) == base and "OMP_NUM_THREADS" not in base
    seen = {}

    def child(command, env):
        seen.update(env)
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setenv("GNO_EXT_RUNS_PER_GPU", "2")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(brun, "gpu_slot", lambda count: contextlib.nullcontext("3"))
    monkeypatch.setattr(brun.subprocess, "run", child)
    (run,) = btab.plan(btab.load_tables(), "bc", [0], ["heat-bc"], ["gno"])
    assert brun.execute(run, [], tmp_path / "results", tmp_path / "runs") is None  # the child failed
    from gno_ext.training.setup import usable_cores

    assert (seen["CUDA_VISIBLE_DEVICES"], seen["OMP_NUM_THREADS"]) == ("3", str(max(1, usable_cores() // 4)))


def test_a_run_of_several_processes_holds_all_its_gpus_or_none(tmp_path, monkeypatch):
    import contextlib

    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,4,6")
    with brun.gpu_slot(tmp_path, count=2) as pair:
        assert pair == "1,4"
        with brun.gpu_slot(tmp_path) as single:
            assert single == "6"
        # two GPUs are not free at once now (only 6 is): taking one and waiting would deadlock
        # two such jobs, so none is held
        monkeypatch.setattr(brun.time, "sleep", lambda s: (_ for _ in ()).throw(TimeoutError("waits")))
        with pytest.raises(TimeoutError, match="waits"), brun.gpu_slot(tmp_path, count=2):
            pass
        with brun.gpu_slot(tmp_path) as single:  # GPU 6 was released
            assert single == "6"
    with contextlib.ExitStack() as stack:
        assert stack.enter_context(brun.gpu_slot(tmp_path, count=3)) == "1,4,6"
    (run,) = btab.plan(btab.load_tables(), "bc", [0], ["heat-bc"], ["gno"])
    assert brun.per_process_batch(run, ["trainer.batch_size=64", "x=1", "trainer.batch_size=32"], 4) == 8
    with pytest.raises(SystemExit, match="needs the global batch as trainer.batch_size=N"):
        brun.per_process_batch(run, ["trainer.epochs=1"], 2)
    with pytest.raises(SystemExit, match="4 GPUs asked for one run, but this process sees 3 \\(1,4,6\\)"), \
            brun.gpu_slot(tmp_path, count=4):
        pass


def test_a_run_over_two_processes_keeps_the_global_batch(tmp_path):
    """``--processes 2`` on a host without GPUs: two CPU processes (gloo) with half the batch
    each; the result records the global batch and the processes, and it is the run one process
    makes (tests/training/test_train.py checks the training itself step by step)."""
    results = {n: tmp_path / f"results{n}" for n in (1, 2)}
    env = {**os.environ, "GNO_EXT_CACHE": str(tmp_path / "cache"), "GNO_EXT_SWEEP_DIR": str(tmp_path / "hydra"),
           "CUDA_VISIBLE_DEVICES": ""}
    found = {}
    for n, folder in results.items():
        command = [sys.executable, str(RECIPES / "benchmark.py"), "run", "--table", "bc", "--recipes", "heat-bc",
                   "--rows", "fno", "--size", "smoke", "--results", str(folder), "--output-root",
                   str(tmp_path / f"runs{n}"), "--processes", str(n), "--", "trainer.epochs=1",
                   "trainer.batch_size=4", "trainer.progress=false", "eval.figures=0", "trainer.tensorboard=false"]
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        found[n] = json.loads((folder / "bc" / "heat-bc" / "fno-seed0.json").read_text())
    assert (found[2]["processes"], found[2]["batch_size"], found[1]["processes"], found[1]["batch_size"]) == (2, 4, 1, 4)
    saved = yaml.safe_load((tmp_path / "runs2" / "bc" / "heat-bc" / "fno-seed0" / "config.yaml").read_text())
    assert saved["trainer"]["batch_size"] == 2 and found[2]["steps"] == found[1]["steps"]
    assert btab.budget_of(found[2]) == btab.budget_of(found[1])  # one budget: they share a table's column
    assert found[2]["nmse_mean"] == pytest.approx(found[1]["nmse_mean"], rel=1e-3)
    page = page_of(results[2], "bc")
    assert "Trained over several GPUs (DDP at the same global batch): `fno` on heat-bc (2)." in page
    assert "Trained over several GPUs" not in page_of(results[1], "bc")
    bad = [str(tmp_path / "bad") if c == str(results[2]) else c for c in command[:-5]] + ["trainer.batch_size=5"]
    bad = subprocess.run(bad, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert bad.returncode != 0 and "a batch of 5 does not split over 2 processes" in bad.stderr
    assert not (tmp_path / "bad").exists() and "recipes/sweep.py" not in bad.stdout  # refused before the sweep


def test_the_results_pages_are_rendered_from_the_committed_results():
    """Every results page and figure under docs/ is what the committed result files give, every
    figure a page shows is there, and every figure there is shown."""
    docs = RECIPES.parent / "docs"
    pages = brender.render_pages(btab.load_tables())
    for name, text in pages.items():
        assert (docs / name).read_text() == text, f"docs/{name} is stale: python recipes/benchmark.py render --docs docs"
    shown = {m for text in pages.values() if True for m in re.findall(r"\]\(([\w.-]+\.png)\)", text)}
    drawn = {p.name for p in (docs / "results").glob("*.png")}
    assert shown == drawn, f"shown, not drawn: {sorted(shown - drawn)}; drawn, never shown: {sorted(drawn - shown)}"
    assert {p.name for p in (docs / "results").glob("*.md")} == {n.split("/")[1] for n in pages if n.startswith("results/")}
    from gno_ext.data.presets import PRESETS

    cards = pages[brender.CARDS]  # a card for every generated dataset, with its figure where drawn
    assert all(f"## `{name}`" in cards for name in PRESETS) and "](../assets/datasets/heat-joint.png)" in cards
    nav = (RECIPES.parent / "mkdocs.yml").read_text()
    assert all(f" {name}\n" in nav for name in pages), "a results page missing from mkdocs.yml's nav"


def test_the_summary_opens_the_overview_and_the_notes_quote_the_result_files(tmp_path):
    results = tmp_path / "results"
    folder = results / "bc" / "heat-bc"
    folder.mkdir(parents=True)
    for seed, nmse in ((0, 0.25), (1, 0.75)):
        (folder / f"fno-seed{seed}.json").write_text(json.dumps(
            {"table": "bc", "recipe": "heat-bc", "model": "fno", "seed": seed, "nmse_mean": nmse, "per_step_nmse": [nmse],
             "nmse_worst_group": {"label": "dirichlet", "nmse_mean": 2 * nmse}, "size": "bench", "epochs": 10,
             "batch_size": 64, "gpu": "H100", "commit": "0" * 40}))
    assert "The GNO" not in page_of(results, "index")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "summary.md").write_text("The FNO scores {{bc/heat-bc/fno:nmse_mean}} "
                                                   "({{bc/heat-bc/fno@1:nmse_worst_group.nmse_mean:.2f}}; "
                                                   "{{bc/heat-bc/fno@0:per_step_nmse.0:.1e}}).\n")
    page = page_of(results, "index")
    assert page.index("## In short") < page.index("The FNO scores 0.5 (1.50; 2.5e-1).") < page.index("## The tables")
    assert "| heat-bc | **`fno`** 0.5 (2 seeds) | — | — |" in page
    # a column the recommended model has no result in is said, not silently left out of the counts
    assert (f"Of the 1 columns that have run, `{brender.DEFAULT_MODEL}` has the lowest error in 0, is level with the "
            "first (the seeds' ranges overlap) in 0 and behind in 0; it has not run in 1 (heat-bc).") in page
    assert "10 epochs (the paper: 100) at batch 64, on the `bench` size" in page
    for seed in (0, 1):  # smoke results: the page says their budget, not the bench tables'
        path = folder / f"fno-seed{seed}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "size": "smoke", "epochs": 2, "batch_size": 4}))
    assert "2 epochs (the paper: 100) at batch 4, on the `smoke` size" in page_of(results, "index")
    for missing in ("{{bc/heat-bc/gno:nmse_mean}}", "{{bc/heat-bc/fno:per_step_nmse.5}}"):  # no row; no 6th step
        (tmp_path / "notes" / "summary.md").write_text(missing)
        with pytest.raises(ValueError, match=rf"summary.md: {re.escape(missing)} has no value"):
            page_of(results, "index")
    (folder / "fno-seed1.json").write_text("{not json")
    (tmp_path / "notes" / "summary.md").write_text("{{bc/heat-bc/fno@1:nmse_mean}}")
    with pytest.raises(ValueError, match=r"summary.md: .* reads .*fno-seed1.json, which is not JSON"):
        brender.fill((tmp_path / "notes" / "summary.md").read_text(), results, "summary.md")



def test_a_check_placeholder_reads_the_checks_beside_the_results(tmp_path):
    """``{{check:...}}`` quotes the CPU checks (benchmarks/checks), never the tables' results of the
    same name, and a check without its file is refused by name."""
    results, checks = tmp_path / "results", tmp_path / "checks"
    for root, value in ((results, 0.5), (checks, 0.25)):
        (root / "modes" / "advection-param").mkdir(parents=True)
        (root / "modes" / "advection-param" / "fno-seed0.json").write_text(json.dumps({"nmse_mean": value}))
    (checks / "modes" / "advection-param" / "fno-seed1.json").write_text(json.dumps({"nmse_mean": 0.35}))
    text = "{{check:modes/advection-param/fno:nmse_mean}} {{check:modes/advection-param/fno@1:nmse_mean:.1f}} " \
           "{{modes/advection-param/fno:nmse_mean}}"
    assert brender.fill(text, results) == "0.3 0.3 0.5"
    with pytest.raises(ValueError, match=r"note.md: \{\{check:modes/advection-param/gno:nmse_mean\}\} has no "
                                         r"value in .*checks/modes/advection-param"):
        brender.fill("{{check:modes/advection-param/gno:nmse_mean}}", results, "note.md")


def test_a_comparison_placeholder_follows_its_figures(tmp_path):
    """``{{ratio:A;B}}`` and ``{{change:A;B}}`` compute "1.65 times" and "5% worse" from the
    results, so that a note's comparison changes with its figures when a cell runs again."""
    results = tmp_path / "results"
    folder = results / "ablation" / "advection-joint"
    folder.mkdir(parents=True)
    for name, value in (("gno-seed0", 0.36), ("gno-seed1", 0.40), ("gno_no_dro-seed0", 0.3648),
                        ("gno_fno-seed0", 0.2), ("zero-seed0", 0.0)):
        (folder / f"{name}.json").write_text(json.dumps({"nmse_mean": value}))
    a, b = "ablation/advection-joint/gno_no_dro:nmse_mean", "ablation/advection-joint/gno:nmse_mean"
    assert brender.fill(f"{{{{ratio:{b};ablation/advection-joint/gno_fno:nmse_mean}}}}", results) == "1.9"
    assert brender.fill(f"{{{{ratio:{b};ablation/advection-joint/gno_fno:nmse_mean:.2f}}}} times", results) == \
        "1.90 times"
    assert brender.fill(f"{{{{change:{a};{b}}}}}", results) == "4% lower"  # 0.3648 against the seeds' 0.38
    assert brender.fill(f"{{{{change:{a};{b}:worse}}}}, {{{{change:{b};{a}:above}}}}", results) == \
        "4% better, 4% above"
    assert brender.fill(f"{{{{change:{a};ablation/advection-joint/gno@0:nmse_mean}}}}", results) == "1% higher"
    (folder / "gno_no_dro-seed0.json").write_text(json.dumps({"nmse_mean": 0.3612}))
    assert brender.fill(f"{{{{change:{a};ablation/advection-joint/gno@0:nmse_mean:worse}}}}", results) == "0.3% worse"
    (folder / "gno_no_dro-seed0.json").write_text(json.dumps({"nmse_mean": 0.36001}))
    assert brender.fill(f"{{{{change:{a};ablation/advection-joint/gno@0:nmse_mean}}}}", results) == "level"
    for text, error in ((f"{{{{change:{a};{b}:faster}}}}", "the mode of a change is one of higher, worse, above, "
                                                            "not 'faster'"),
                        (f"{{{{ratio:{a};ablation/advection-joint/zero:nmse_mean}}}}", "compares with a value of 0"),
                        (f"{{{{ratio:{a};ablation/advection-joint/gno@2:nmse_mean}}}}", "has no value in")):
        with pytest.raises(ValueError, match=re.escape(error)):
            brender.fill(text, results, "note.md")


def _a_table_with_a_broken_row(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """A table ``t`` of two rows on heat-param at the smoke size, ``fno`` and ``broken`` (a model
    argument that does not exist): the ``run`` command (options, then ``--`` and the overrides),
    its environment and the results folder."""
    tables = tmp_path / "tables.yaml"
    tables.write_text(yaml.safe_dump({"tables": {"t": {"title": "t", "recipes": ["heat-param"], "rows": {
        "fno": {}, "broken": {"model": "fno", "overrides": ["+model.kwargs.no_such_argument=1"]}}}}}))
    results = tmp_path / "results"
    command = [sys.executable, str(RECIPES / "benchmark.py"), "run", "--table", "t", "--size", "smoke",
               "--tables", str(tables), "--results", str(results), "--output-root", str(tmp_path / "runs"),
               "--", "trainer.epochs=1", "trainer.batch_size=4", "trainer.progress=false", "eval.figures=0",
               "trainer.tensorboard=false"]
    env = {**os.environ, "GNO_EXT_CACHE": str(tmp_path / "cache"), "GNO_EXT_SWEEP_DIR": str(tmp_path / "hydra")}
    return command, env, results


@pytest.mark.slow
def test_a_failing_run_writes_nothing_and_the_others_go_on(tmp_path):
    command, env, results = _a_table_with_a_broken_row(tmp_path)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode != 0
    assert "1 of 2 runs have no result (failed): heat-param/broken-seed0" in done.stderr
    assert "broken-seed0: FAILED" in done.stderr
    assert [p.name for p in results.glob("t/heat-param/*.json")] == ["fno-seed0.json"]


@pytest.mark.slow
def test_refresh_readings_reruns_the_cells_without_them_and_keeps_a_failed_cells_file(tmp_path):
    command, env, results = _a_table_with_a_broken_row(tmp_path)
    done = subprocess.run([*command[:3], "--rows", "fno", *command[3:]], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = results / "t" / "heat-param"
    new = json.loads((folder / "fno-seed0.json").read_text())
    assert "nmse_readings" in new and "per_trajectory" in new
    # the files of an older run: without the readings, a value of their own
    old = {k: v for k, v in new.items() if k not in ("nmse_readings", "per_trajectory")} | {"nmse_mean": 123.0}
    (folder / "fno-seed0.json").write_text(json.dumps(old))
    broken = {**old, "model": "broken", "overrides": ["+model.kwargs.no_such_argument=1"]}
    (folder / "broken-seed0.json").write_text(json.dumps(broken))
    plan = [*command[:2], "plan", *command[3:11]]  # (no --output-root: nothing runs)
    planned = subprocess.run([*plan, *command[13:]], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert "done" in planned.stdout and "to run again" not in planned.stdout, planned.stdout  # kept without the option
    planned = subprocess.run([*plan, "--refresh-readings", *command[13:]], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert planned.stdout.count("to run again: its file lacks the other readings") == 2, planned.stdout
    # with a second seed, whose cells have no files: --refresh-only plans the two stale cells alone
    both = [*plan, "--seeds", "0", "1"]
    planned = subprocess.run([*both, "--refresh-readings", *command[13:]], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert planned.stdout.count("to run again") == 2 and "4 of 4 runs to do" in planned.stdout, planned.stdout
    planned = subprocess.run([*both, "--refresh-only", *command[13:]], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert planned.stdout.count("to run again") == 2 and planned.stdout.count("not run (--refresh-only)") == 2
    assert "2 of 4 runs to do" in planned.stdout, planned.stdout
    # stale broken-seed0, broken-seed1 and fno-seed0 are no grid: --refresh-only runs those three cells, not
    # fno-seed1 (no file) beside them
    (folder / "broken-seed1.json").write_text(json.dumps({**broken, "seed": 1}))
    only = subprocess.run([*command[:3], "--seeds", "0", "1", "--refresh-only", *command[3:]], capture_output=True,
                          text=True, env=env, cwd=tmp_path)
    assert "cell=heat-param/broken-seed0,heat-param/broken-seed1,heat-param/fno-seed0 " in only.stdout, only.stdout
    assert only.returncode != 0 and ("2 of 3 cells to refresh have no new result (failed): heat-param/broken-seed0, "
                                     "heat-param/broken-seed1") in only.stderr, only.stderr[-3000:]
    assert not (folder / "fno-seed1.json").exists()
    fno = json.loads((folder / "fno-seed0.json").read_text())
    assert "nmse_readings" in fno and fno["nmse_mean"] != 123.0  # run again
    again = subprocess.run([*command[:13], "--refresh-readings", *command[13:]], capture_output=True, text=True,
                           env=env, cwd=tmp_path)
    assert again.returncode != 0 and "heat-param/broken-seed0" in again.stderr
    assert "heat-param/fno-seed0: the same run" not in again.stdout and "fno-seed0: nMSE" not in again.stdout
    assert json.loads((folder / "fno-seed0.json").read_text()) == fno  # it has the readings now: not run again
    assert json.loads((folder / "broken-seed0.json").read_text()) == broken  # its run failed: the old file kept
    assert json.loads((folder / "broken-seed1.json").read_text()) == {**broken, "seed": 1}
    assert sorted(p.name for p in folder.iterdir()) == ["broken-seed0.json", "broken-seed1.json", "fno-seed0.json"]


def test_an_untrained_reference_has_no_budget_and_a_mixed_budget_is_flagged(tmp_path):
    def result(model, steps, epochs, precision):
        return {"table": "bc", "recipe": "heat-bc", "model": model, "seed": 0, "size": "paper", "epochs": epochs,
                "batch_size": 64, "lr": 3e-4, "precision": precision, "extra": ["trainer.capture=true"], "steps": steps,
                "gpu": "NVIDIA H100", "commit": "0" * 40, "nmse_mean": 0.5}

    folder = tmp_path / "bc" / "heat-bc"
    folder.mkdir(parents=True)
    (folder / "gno-seed0.json").write_text(json.dumps(result("gno", 100, 10, "bf16")))
    (folder / "persistence-seed0.json").write_text(json.dumps(result("persistence", 0, 2, "no")))
    page = page_of(tmp_path, "bc")
    assert "size=paper, 10 epochs, batch 64, lr 0.0003, precision bf16 (heat-bc); the curriculum" in page
    assert "MIXED" not in page
    budget = page.split("**Budget**: ")[1].split("Seeds run")[0]
    assert "trainer.capture" not in budget  # speed-only: not the budget (but in the command that reproduces it)
    (folder / "fno-seed0.json").write_text(json.dumps(result("fno", 100, 20, "bf16")))
    assert "(MIXED in ['heat-bc']: rerun at one budget)" in page_of(tmp_path, "bc")
    # two columns at two budgets are not mixed: each is stated with its columns
    (folder / "fno-seed0.json").unlink()
    other = tmp_path / "bc" / "advection-bc"
    other.mkdir()
    (other / "gno-seed0.json").write_text(json.dumps({**result("gno", 100, 10, "bf16"), "recipe": "advection-bc",
                                                      "size": "bench"}))
    page = page_of(tmp_path, "bc")
    assert "MIXED" not in page and "precision bf16 (advection-bc)" in page and "precision bf16 (heat-bc)" in page


def _joint_gno_result() -> dict:
    """A result of the joint table's GNO on advection-joint, seed 0, at the table's budget (written
    before the other readings of the nMSE were recorded)."""
    budget = ["trainer.epochs=10", "trainer.batch_size=64", "trainer.dro.temperature=absolute", "trainer.dro.tau=1.0"]
    return {"table": "joint", "recipe": "advection-joint", "model": "gno", "model_config": "gno", "overrides": [],
            "seed": 0, "size": "bench", "epochs": 10, "batch_size": 64, "lr": 3e-4, "precision": "bf16",
            "extra": [*budget, "trainer.capture=true"], "steps": 3150, "gpu": "NVIDIA H200", "commit": "0" * 40,
            "nmse_mean": 0.36, "paper_nmse": 7.97e-2, "dro": {"tau": 1.0, "temperature": "absolute"}}


def test_a_cell_that_is_another_tables_run_takes_its_result(tmp_path):
    tables = btab.load_tables()
    joint = _joint_gno_result()
    folder = tmp_path / "joint" / "advection-joint"
    folder.mkdir(parents=True)
    (folder / "gno-seed0.json").write_text(json.dumps(joint))
    runs = {r.row: r for r in btab.plan(tables, "ablation", [0], ["advection-joint"])}
    # a result that records no DRO temperature was made with the paper's tau = 1 (the default then):
    # not the run of today's default (the dro table's gno), but that of a row that sets the paper's
    old = {**{k: v for k, v in joint.items() if k != "dro"}, "extra": ["trainer.epochs=10", "trainer.batch_size=64"]}
    (tmp_path / "bc" / "advection-joint").mkdir(parents=True)
    (tmp_path / "bc" / "advection-joint" / "gno-seed0.json").write_text(json.dumps(old))
    dro = {r.row: r for r in btab.plan(tables, "dro", [0], ["advection-joint"])}
    assert btab.same_run(dro["gno_absolute"], [], tmp_path) == tmp_path / "bc" / "advection-joint" / "gno-seed0.json"
    assert btab.same_run(dro["gno"], [], tmp_path) is None
    (tmp_path / "bc" / "advection-joint" / "gno-seed0.json").unlink()
    assert btab.same_run(dro["gno_absolute"], [], tmp_path) == folder / "gno-seed0.json"  # the pinned one
    # the same model, overrides, seed, size and budget; a speed-only override differs: the same run
    assert btab.same_run(runs["gno"], ["trainer.capture=false"], tmp_path) == folder / "gno-seed0.json"
    assert btab.same_run(runs["gno_no_dro"], [], tmp_path) is None  # the same model with a row override
    assert btab.same_run(runs["gno"], ["trainer.epochs=5"], tmp_path) is None  # another budget
    assert btab.same_run(btab.plan(tables, "ablation", [1], rows=["gno"])[0], [], tmp_path) is None
    assert btab.same_run(runs["gno_fno"], [], tmp_path) is None
    target = btab.adopt(runs["gno"], folder / "gno-seed0.json", tmp_path)
    adopted = json.loads(target.read_text())
    assert target == tmp_path / "ablation" / "advection-joint" / "gno-seed0.json"
    assert adopted == {**joint, "table": "ablation", "paper_nmse": 7.97e-2,
                       "same_run_as": "joint/advection-joint/gno-seed0.json"}
    assert btab.same_run(runs["gno"], [], tmp_path) == folder / "gno-seed0.json"  # its own table is not searched twice
    page = page_of(tmp_path, "ablation", tables)
    assert "| `gno` | 3.60e-01 | 7.97e-02 |" in page and "Taken from another table (the same runs): `gno` from `joint`" in page
    planned = subprocess.run([sys.executable, str(RECIPES / "benchmark.py"), "plan", "--table", "pino", "--results",
                              str(tmp_path)], capture_output=True, text=True)
    assert "pino/advection-joint/gno-seed0 (size=bench trainer.epochs=10 trainer.batch_size=64 " \
           "trainer.dro.temperature=absolute trainer.dro.tau=1.0): the same run as " \
           "joint/advection-joint/gno-seed0.json" in planned.stdout and "9 of 10 runs to do" in planned.stdout

    # refreshing the readings: the copy waits for the run it was taken from rather than training a second run
    # of the same computation; once that run has the readings, the copy takes them without training
    refresh = [sys.executable, str(RECIPES / "benchmark.py"), "--table", "ablation", "--recipes", "advection-joint",
               "--rows", "gno", "--results", str(tmp_path), "--refresh-only"]
    planned = subprocess.run([*refresh[:2], "plan", *refresh[2:]], capture_output=True, text=True)
    assert "ablation/advection-joint/gno-seed0 (size=bench trainer.epochs=10 trainer.batch_size=64 " \
           "trainer.dro.temperature=absolute trainer.dro.tau=1.0): waits for joint/advection-joint/gno-seed0.json, " \
           "the run its file was taken from, to be run again" in planned.stdout, planned.stdout
    assert "0 of 1 runs to do; 1 wait for the runs their files were taken from" in planned.stdout
    waited = subprocess.run([*refresh[:2], "run", *refresh[2:]], capture_output=True, text=True)
    assert waited.returncode == 0, waited.stderr[-3000:]
    assert "1 cells wait for the runs their files were taken from" in waited.stdout and "recipes/sweep.py" \
           not in waited.stdout and "all 1 runs have results" not in waited.stdout, waited.stdout
    assert json.loads(target.read_text()) == adopted  # untouched
    readings = {"nmse_readings": dict.fromkeys(btab.READING_NAMES, 0.3), "per_trajectory": [{"nmse": 0.36}]}
    (folder / "gno-seed0.json").write_text(json.dumps({**joint, "nmse_mean": 0.35, **readings}))
    planned = subprocess.run([*refresh[:2], "plan", *refresh[2:]], capture_output=True, text=True)
    assert "gno-seed0 (size=bench trainer.epochs=10 trainer.batch_size=64 trainer.dro.temperature=absolute " \
           "trainer.dro.tau=1.0): the same run as joint/advection-joint/gno-seed0.json, which has the readings" \
           in planned.stdout and "0 of 1 runs to do" in planned.stdout and "wait" not in planned.stdout, planned.stdout
    taken = subprocess.run([*refresh[:2], "run", *refresh[2:]], capture_output=True, text=True)
    assert taken.returncode == 0 and "its result taken" in taken.stdout, taken.stdout + taken.stderr[-3000:]
    assert "recipes/sweep.py" not in taken.stdout
    refreshed = json.loads(target.read_text())
    assert refreshed["nmse_mean"] == 0.35 and btab.has_readings(refreshed)
    assert refreshed["same_run_as"] == "joint/advection-joint/gno-seed0.json"
    # a copy whose source is gone, or holds another computation now, does not wait: it is trained itself
    target.write_text(json.dumps(adopted))
    (folder / "gno-seed0.json").write_text(json.dumps({**joint, "epochs": 5, "extra": ["trainer.epochs=5"]}))
    planned = subprocess.run([*refresh[:2], "plan", *refresh[2:]], capture_output=True, text=True)
    assert "to run again: its file lacks the other readings" in planned.stdout and "wait" not in planned.stdout
    (folder / "gno-seed0.json").unlink()
    planned = subprocess.run([*refresh[:2], "plan", *refresh[2:]], capture_output=True, text=True)
    assert "to run again: its file lacks the other readings" in planned.stdout and "1 of 1 runs to do" in planned.stdout
    # two runs of one computation, neither taken from the other (trained before cells took each other's
    # files): neither waits for the other
    target.write_text(json.dumps({k: v for k, v in adopted.items() if k != "same_run_as"}))
    (folder / "gno-seed0.json").write_text(json.dumps(joint))
    planned = subprocess.run([*refresh[:2], "plan", *refresh[2:]], capture_output=True, text=True)
    assert "to run again: its file lacks the other readings" in planned.stdout and "wait" not in planned.stdout


def test_a_refresh_of_another_table_in_the_same_folder_hides_no_run(tmp_path):
    """Tables refreshed at once over one results folder (several queues on one GPU): while one has
    a stale file moved aside for its rerun (``.json.stale``), another's search still finds that
    run, its copy waits for it, and a new cell takes it, instead of failing on the vanished file
    or training the computation a second time."""
    tables = btab.load_tables()
    joint = _joint_gno_result()
    folder = tmp_path / "joint" / "advection-joint"
    folder.mkdir(parents=True)
    source = folder / "gno-seed0.json"
    source.write_text(json.dumps(joint))
    ablation = btab.plan(tables, "ablation", [0], ["advection-joint"], ["gno"])[0]
    copy = btab.adopt(ablation, source, tmp_path)
    source.rename(source.with_suffix(".json.stale"))  # what the joint table's refresh does while it reruns the cell
    assert btab.read_result(source) == joint
    assert btab.same_run(ablation, [], tmp_path) == source
    planned = subprocess.run([sys.executable, str(RECIPES / "benchmark.py"), "plan", "--table", "ablation",
                              "--recipes", "advection-joint", "--rows", "gno", "--results", str(tmp_path),
                              "--refresh-only"], capture_output=True, text=True)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "waits for joint/advection-joint/gno-seed0.json, the run its file was taken from" in planned.stdout
    pino = btab.plan(tables, "pino", [0], ["advection-joint"], ["gno"])[0]
    taken = json.loads(btab.adopt(pino, btab.same_run(pino, [], tmp_path), tmp_path).read_text())
    assert taken["nmse_mean"] == 0.36 and taken["same_run_as"] == "joint/advection-joint/gno-seed0.json"
    source.with_suffix(".json.stale").unlink()  # gone altogether: no run to find, and no error
    assert btab.read_result(source) is None
    copy.unlink()
    assert btab.same_run(ablation, [], tmp_path) is None


def test_a_refresh_cut_off_before_it_put_its_files_back_leaves_nothing_out(tmp_path, capsys):
    """A refresh killed outright (SIGKILL, its machine taken back) between moving its cells' old
    files aside and putting them back: the same command resumes all of them. `plan` reads each
    aside file as its cell's result (stale, so refreshed again: not 'not run' for want of a file),
    and `run` puts it back in place; an aside file that the new run's file superseded goes."""
    joint = _joint_gno_result()  # without the other readings
    folder = tmp_path / "joint" / "advection-joint"
    folder.mkdir(parents=True)
    (folder / "gno-seed0.json.stale").write_text(json.dumps(joint))  # aside, not put back
    fresh = {**joint, "model": "fno", "model_config": "fno", "nmse_mean": 0.31,
             "nmse_readings": dict.fromkeys(btab.READING_NAMES, 0.3),
             "per_trajectory": [0.3, 0.32]}
    (folder / "fno-seed0.json").write_text(json.dumps(fresh))  # the new run's file
    (folder / "fno-seed0.json.stale").write_text(json.dumps({**joint, "model": "fno", "model_config": "fno"}))
    cells = ["--table", "joint", "--recipes", "advection-joint", "--rows", "gno", "fno", "--results", str(tmp_path)]
    bench.main(["plan", *cells, "--refresh-only"])
    out = capsys.readouterr().out
    assert ("joint/advection-joint/gno-seed0 (size=bench trainer.epochs=10 trainer.batch_size=64 "
            "trainer.dro.temperature=absolute trainer.dro.tau=1.0): to run again: its file lacks the other readings "
            "(its file is aside: a refresh of it is running, or was cut off; run puts it back)") in out, out
    assert "fno-seed0 (size=bench" in out and "): done (its old file, left aside by a refresh that was cut off, goes" \
        in out and "1 of 2 runs to do" in out, out
    assert sorted(p.name for p in folder.iterdir()) == ["fno-seed0.json", "fno-seed0.json.stale",
                                                         "gno-seed0.json.stale"]  # plan moves nothing
    bench.main(["run", *cells])  # a plain run: both cells have results once they are in place, so nothing trains
    out = capsys.readouterr().out
    assert "joint/advection-joint/gno-seed0.json: put back in place, where a refresh cut off had left it aside" \
        in out and "joint/advection-joint/fno-seed0.json.stale: removed, superseded by the new run's file" in out
    assert "table joint: all 2 runs have results" in out, out
    assert sorted(p.name for p in folder.iterdir()) == ["fno-seed0.json", "gno-seed0.json"]
    assert json.loads((folder / "gno-seed0.json").read_text()) == joint
    assert json.loads((folder / "fno-seed0.json").read_text()) == fresh


def test_figures_show_the_gno_the_two_best_rows_and_persistence(tmp_path):
    def result(model, nmse, groups=True):
        return {"table": "bc", "recipe": "heat-bc", "model": model, "seed": 0, "size": "bench", "epochs": 10,
                "batch_size": 64, "lr": 3e-4, "precision": "bf16", "extra": [], "steps": 0 if model == "persistence" else 9,
                "gpu": "NVIDIA H100", "commit": "0" * 40, "nmse_mean": nmse, "per_step_nmse": [nmse / 2, nmse, 2 * nmse],
                "groups": [{"label": "dirichlet, alpha in [0.1, 0.1]", "nmse_mean": nmse},
                           {"label": "neumann, alpha in [0.1, 0.1]", "nmse_mean": 2 * nmse}] if groups else []}

    folder = tmp_path / "bc" / "heat-bc"
    folder.mkdir(parents=True)
    for model, nmse in (("gno", 0.3), ("fno", 0.1), ("unisolver", 0.2), ("vit-5", 0.25), ("persistence", 1.6)):
        (folder / f"{model}-seed0.json").write_text(json.dumps(result(model, nmse)))
    page = page_of(tmp_path, "bc")
    assert "per-step error of `gno`, `fno`, `unisolver`, `persistence`](bc-heat-bc-per_step.png)" in page
    assert "](bc-heat-bc-groups.png)" in page and "vit-5`" not in page.split("## Figures")[1]
    written = bfig.write_figures(btab.load_tables(), tmp_path, tmp_path / "figures")
    assert sorted(p.name for p in written) == ["bc-heat-bc-groups.png", "bc-heat-bc-per_step.png"]
    assert all(p.stat().st_size > 1000 for p in written)
    # results without the groups (older files) are left out of the group figure; with none, there is none
    (folder / "fno-seed0.json").write_text(json.dumps(result("fno", 0.1, groups=False)))
    assert "groups.png" in page_of(tmp_path, "bc")
    for model, nmse in (("gno", 0.3), ("unisolver", 0.2), ("persistence", 1.6)):
        (folder / f"{model}-seed0.json").write_text(json.dumps(result(model, nmse, groups=False)))
    assert "groups.png" not in page_of(tmp_path, "bc")
    assert "bc-heat-bc-groups.png" not in [p.name for p in bfig.write_figures(btab.load_tables(), tmp_path,
                                                                               tmp_path / "none")]
    # persistence alone with its groups (a reference refreshed before the trained rows): no figure of it alone
    (folder / "persistence-seed0.json").write_text(json.dumps(result("persistence", 1.6)))
    page = page_of(tmp_path, "bc")
    assert "groups.png" not in page and "and their error per group" not in page
    assert "bc-heat-bc-groups.png" not in [p.name for p in bfig.write_figures(btab.load_tables(), tmp_path,
                                                                               tmp_path / "alone")]
    (folder / "fno-seed0.json").write_text(json.dumps(result("fno", 0.1)))
    assert "](bc-heat-bc-groups.png)" in page_of(tmp_path, "bc")

    # a table that names them otherwise (ns-start: gno_from50): its one row of each model config
    rows = [("gno_from50", "gno", 0.14), ("fno_from50", "fno", 4e-4), ("gno_fno_soft_from50", "gno_fno_soft", 3.8e-4),
            ("vit_from50", "vit", 0.01), ("persistence_from50", "persistence", 0.21)]
    found = [{**result(row, nmse), "recipe": "ns-param", "model_config": config} for row, config, nmse in rows]
    assert [row for row, _ in btab._shown(found, "ns-param")] == \
        ["gno_from50", "gno_fno_soft_from50", "fno_from50", "persistence_from50"]
    # two rows of the GNO's config and none named gno (the dro table's variants): no row is the paper's GNO
    found += [{**result("gno_erm", 0.2), "recipe": "ns-param", "model_config": "gno"}]
    assert [row for row, _ in btab._shown(found, "ns-param")] == \
        ["gno_fno_soft_from50", "fno_from50", "persistence_from50"]


def test_tables_show_the_worst_group_and_the_error_against_training_time(tmp_path):
    """A table with ``worst: true`` (dro) shows each cell's worst group beside its mean; results
    with test rollouts during training (the long table) give a table of the error after each
    epoch with the GPU minutes to it and a figure of error against GPU minutes, the rows in
    their site-wide colours; `tested_epochs` reads them from a run's metrics (the last row of
    an epoch that a resumption repeated)."""
    def result(table, recipe, model, seed, nmse, at=None):
        return {"table": table, "recipe": recipe, "model": model, "seed": seed, "size": "bench", "epochs": 100,
                "batch_size": 64, "lr": 3e-4, "precision": "bf16", "extra": [], "steps": 9, "gpu": "NVIDIA H100",
                "commit": "0" * 40, "nmse_mean": nmse, "per_step_nmse": [nmse],
                "nmse_worst_group": {"label": "dirichlet, speed in [1, 2]", "nmse_mean": 3 * nmse},
                **({"at_epochs": at} if at else {})}

    for seed, worst in ((0, 0.3), (1, 0.5)):
        folder = tmp_path / "dro" / "advection-bc"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"gno_erm-seed{seed}.json").write_text(json.dumps(result("dro", "advection-bc", "gno_erm", seed, worst / 3)))
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 10, "epoch": 10, "test/nmse_mean": 0.9, "test/nmse_worst_group": 2.0, "test/rel_l2_mean": 0.5,
             "train_s": 60.0}, {"step": 5, "train/loss": 1.0},
            {"step": 10, "epoch": 10, "test/nmse_mean": 0.4, "test/nmse_worst_group": 1.0, "test/rel_l2_mean": 0.3,
             "train_s": 120.0},
            {"step": 30, "epoch": 30, "test/nmse_mean": 0.2, "test/nmse_worst_group": 0.5, "test/rel_l2_mean": 0.2,
             "train_s": 360.0}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics.write_text(metrics.read_text() + json.dumps({"step": 40, "epoch": 8, "train/dro_weight_max": 4.5,
                                                         "train/dro_weight_min": 0.13}) + "\n")
    assert brun.dro_weights(metrics) == [{"epoch": 8, "max": 4.5, "min": 0.13}]
    at = brun.tested_epochs(metrics)
    assert [(a["epoch"], a["nmse_mean"], a["train_s"]) for a in at] == [(10, 0.4, 120.0), (30, 0.2, 360.0)]
    assert brun.tested_epochs(tmp_path / "absent.jsonl") == []
    folder = tmp_path / "long" / "heat-param"
    folder.mkdir(parents=True)
    for model in ("gno", "fno"):
        (folder / f"{model}-seed0.json").write_text(json.dumps(result("long", "heat-param", model, 0, 0.2, at)))
    dro = page_of(tmp_path, "dro")
    assert "| `gno_erm` | — | — | 4.00e-01 ± 1.4e-01 (dirichlet, speed in [1, 2]) |" in dro  # advection-bc: 3rd
    long = page_of(tmp_path, "long")
    assert "| `gno` | 4.00e-01 (2.0 min) | 2.00e-01 (6.0 min) | — | — |" in long  # heat-param's epochs 10, 30
    assert "](long-heat-param-vs_gpu_minutes.png)" in long and "`unisolver`" not in long.split("nMSE during")[1]
    written = bfig.write_figures(btab.load_tables(), tmp_path, tmp_path / "figures")
    assert tmp_path / "figures" / "long-heat-param-vs_gpu_minutes.png" in written
    assert bfig.model_colour("gno") != bfig.model_colour("fno") and bfig.model_colour("gno_erm") == \
        bfig.model_colour("gno_erm")


def test_group_labels_are_shortened_for_the_figures_axes():
    """A group's label on a figure: one boundary type on every face said once; lines of at most 24
    characters under a few groups' bars, one line (slanted) under many."""
    label = "dirichlet/dirichlet/dirichlet/dirichlet, speed in [1.6, 2.5] (outside the training range)"
    lines = bfig._tick_label(label, wrap=True).split("\n")
    assert lines[0].startswith("all dirichlet, speed") and max(map(len, lines)) <= 24
    assert " ".join(lines) == "all dirichlet, speed in [1.6, 2.5] (outside the training range)"
    assert bfig._tick_label(label, wrap=False) == " ".join(lines)
    assert bfig._tick_label("dirichlet/neumann/periodic/periodic, alpha in [0.1, 0.2]", wrap=False) == \
        "dirichlet/neumann/periodic/periodic, alpha in [0.1, 0.2]"
    assert bfig._tick_label("periodic/periodic/periodic/periodic", wrap=False) == "all periodic"


def test_runtime_results_get_their_table_figure_and_commands(tmp_path):
    """The files of benchmarks/results/runtime/ (bench_runtime.py's output) appear on the page as
    one row per case and solver, with a figure and the commands that reproduce them; without
    them the page has no such section."""
    assert page_of(tmp_path, "runtime") == "" and "runtime.md" not in page_of(tmp_path, "index")
    committed = sorted((btab.RESULTS / brender.RUNTIME).glob("*.json"))
    assert committed, "the committed runtime results"
    (tmp_path / brender.RUNTIME).mkdir()
    for p in committed:
        (tmp_path / brender.RUNTIME / p.name).write_text(p.read_text())
    page = page_of(tmp_path, "runtime")
    assert "| [runtime](runtime.md) |" in page_of(tmp_path, "index")
    for p in committed:
        result = json.loads(p.read_text())
        for run in result["runs"]:
            for name, entry in run["classes"].items():
                rows = [l for l in page.splitlines() if l.startswith(f"| {run['recipe']}, {name} |")]
                assert len(rows) == len(entry["solvers"])
                assert all(f"`{run['model']}`, {entry['model_nmse']:.3g}" in l for l in rows)
            table, recipe, folder = Path(run["run"]).parts[-3:]
            assert f"bench_runtime.py run runs/{table}/{recipe}/{folder} --out runs/runtime/{p.name}" in page
    assert "![error against time per frame](runtime.png)" in page
    written = bfig.write_figures(btab.load_tables(), tmp_path, tmp_path / "figures")
    assert tmp_path / "figures" / "runtime.png" in written and (tmp_path / "figures" / "runtime.png").stat().st_size > 10_000


@pytest.mark.slow
def test_the_mesh_table_runs_its_recipes_and_renders(tmp_path):
    """The mesh table's runs go through the same command (data generated once, the rows' capture
    setting last) and leave result files that the page renders."""
    pytest.importorskip("torch_geometric")
    results = tmp_path / "results"
    command = [sys.executable, str(RECIPES / "benchmark.py"), "run", "--table", "mesh", "--size", "smoke",
               "--results", str(results), "--output-root", str(tmp_path / "runs"), "--",
               "trainer.epochs=1", "trainer.batch_size=4", "trainer.progress=false", "eval.figures=0",
               "trainer.tensorboard=false", "trainer.capture=true"]  # the rows turn the capture off again
    env = {"GNO_EXT_CACHE": str(tmp_path / "cache"), "GNO_EXT_SWEEP_DIR": str(tmp_path / "hydra")}
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for recipe in ("heat-mesh", "advection-mesh"):
        files = sorted(p.name for p in (results / "mesh" / recipe).glob("*.json"))
        assert files == ["gno_mesh-seed0.json", "mesh_gnn-seed0.json", "persistence-seed0.json"]
        result = json.loads((results / "mesh" / recipe / "gno_mesh-seed0.json").read_text())
        assert set(btab.REQUIRED) <= set(result) and result["paper_nmse"] is None and result["nmse_mean"] > 0
        assert result["mse_mean"] > 0  # the mesh evaluation records the plain MSE too
    page = page_of(results, "mesh")
    assert page.count("| `gno_mesh` |") == 1 and "size=smoke, 1 epochs, batch 4" in page


def test_a_table_of_downloaded_data_says_what_it_needs_and_stops_before_any_run(tmp_path):
    page = page_of(tmp_path, "trl")
    assert "Not run: it needs the data. The Well's `turbulent_radiative_layer_2D`" in page
    assert "`python recipes/benchmark.py run --table trl -- data.root=PATH`" in page
    # without the files, the run stops before any training with the download's instructions
    done = subprocess.run([sys.executable, str(RECIPES / "benchmark.py"), "run", "--table", "trl", "--rows", "gno",
                           "--results", str(tmp_path), "--output-root", str(tmp_path / "runs")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "recipe trl: The Well's turbulent_radiative_layer_2D is not on this machine" \
        in done.stderr and "the-well-download" in done.stderr
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("trl/**/*.json"))
    done = subprocess.run([sys.executable, str(RECIPES / "benchmark.py"), "run", "--table", "trl", "--rows", "gno",
                           "--results", str(tmp_path), "--", f"data.root={tmp_path / 'nowhere'}"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and f"data.root={tmp_path / 'nowhere'}: no such folder" in done.stderr


def test_a_table_of_the_mse_shows_and_ranks_the_mse(tmp_path):
    def result(model, mse, nmse):
        return {"table": "trl", "recipe": "trl", "model": model, "seed": 0, "size": "bench", "epochs": 10,
                "batch_size": 64, "lr": 3e-4, "precision": "bf16", "extra": [], "steps": 9, "gpu": "NVIDIA H100",
                "commit": "0" * 40, "nmse_mean": nmse, "mse_mean": mse, "per_step_nmse": [nmse] * 3}

    folder = tmp_path / "trl" / "trl"
    folder.mkdir(parents=True)
    # the order by MSE is the reverse of the order by nMSE
    for model, mse, nmse in (("gno", 30.0, 0.1), ("fno", 10.0, 0.3), ("unisolver", 20.0, 0.2), ("vit-2", 40.0, 0.05)):
        (folder / f"{model}-seed0.json").write_text(json.dumps(result(model, mse, nmse)))
    page = page_of(tmp_path, "trl")
    assert "the rollout's MSE, as the paper reports it" in page
    assert "| `gno` | 3.00e+01 | 1.20e+01 |" in page and "| `fno` | 1.00e+01 | — |" in page
    assert "per-step error of `gno`, `fno`, `unisolver`](trl-trl-per_step.png)" in page
    # a result written before the MSE was recorded has no cell in such a table
    (folder / "fno-seed0.json").write_text(json.dumps({**result("fno", 10.0, 0.3), "mse_mean": None}))
    assert "| `fno` | — | — |" in page_of(tmp_path, "trl")
    bad = tmp_path / "tables.yaml"
    bad.write_text(yaml.safe_dump({"tables": {"t": {"title": "t", "recipes": ["heat-param"], "metric": "mae",
                                                    "rows": {"gno": {}}}}}))
    with pytest.raises(ValueError, match=r"table t: metric 'mae', not one of \['mse', 'nmse'\]"):
        btab.load_tables(bad)


def test_the_dro_notes_claims_hold_in_their_result_files():
    """What the dro notes say in words of the result files (their figures are placeholders the
    render fills): the batch's objective is inert on advection-bc (every weight 1, the same run as
    MSE), acts elsewhere, and meets the goal nowhere."""
    folder = btab.RESULTS / "dro"
    load = lambda recipe, row: json.loads((folder / recipe / f"{row}-seed0.json").read_text())  # noqa: E731
    inert = load("advection-bc", "gno_fno_soft")
    assert all(w["max"] == w["min"] == 1.0 for w in inert["dro_weights"]) and inert["dro_weights"]
    assert inert["nmse_mean"] == load("advection-bc", "gno_fno_soft_erm")["nmse_mean"]
    for recipe in ("heat-joint", "advection-joint"):
        assert all(w["max"] > 2 and w["min"] < 0.5 for w in load(recipe, "gno_fno_soft")["dro_weights"])
        for model in ("gno", "gno_fno_soft"):
            dro, erm = load(recipe, model), load(recipe, f"{model}_erm")
            goal = (dro["nmse_worst_group"]["nmse_mean"] <= 0.8 * erm["nmse_worst_group"]["nmse_mean"]
                    and dro["nmse_mean"] <= 1.05 * erm["nmse_mean"])
            assert not goal, f"{recipe}/{model} meets the goal: the notes say no cell does"


def test_a_result_counts_as_done_only_for_its_own_computation(tmp_path, capsys):
    """A smoke run's result in a bench cell's place is not that cell's result: `plan` says the
    cell is blocked and why, `run` refuses before any work, `execute` neither runs the cell nor
    replaces the file. A result of the cell's own computation (speed flags aside) is done."""
    tables = btab.load_tables()
    (run,) = btab.plan(tables, "bc", [0], ["heat-bc"], ["gno"])
    smoke = {"table": "bc", "recipe": "heat-bc", "model": "gno", "model_config": "gno", "overrides": [], "seed": 0,
             "size": "smoke", "extra": ["trainer.epochs=10", "trainer.batch_size=64", "trainer.capture=true"],
             "nmse_mean": 0.5}
    assert "size 'smoke' where this run has 'bench'" in btab.budget_difference(run, [], smoke)
    own = {**smoke, "size": "bench", "extra": [*run.budget, "trainer.compile=true"]}
    assert btab.budget_difference(run, [], own) is None
    assert "DRO (2.0, 'relative', 'batch', None) where this run has (1.0, 'absolute', 'batch', None)" in \
        btab.budget_difference(run, [], {**own, "dro": {"tau": 2.0, "temperature": "relative"}})
    running = {**own, "dro": {"tau": 1.0, "temperature": "absolute", "weights": "running", "rate": 0.1}}
    assert "DRO (1.0, 'absolute', 'running', 0.1) where" in btab.budget_difference(run, [], running)
    target = run.path(tmp_path)
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(smoke))
    bench.main(["plan", "--table", "bc", "--recipes", "heat-bc", "--rows", "gno", "--results", str(tmp_path)])
    assert "bc/heat-bc/gno-seed0 (size=bench" in (out := capsys.readouterr().out) and "blocked: its file holds" in out
    with pytest.raises(SystemExit, match="hold result files of another computation; move them aside"):
        bench.main(["run", "--table", "bc", "--recipes", "heat-bc", "--rows", "gno", "--results", str(tmp_path)])
    assert brun.execute(run, [], tmp_path) is None and json.loads(target.read_text()) == smoke
    assert "holds a result of another computation (size 'smoke'" in capsys.readouterr().err


def test_render_leaves_out_files_that_are_not_the_tables_results_and_names_them(tmp_path):
    """A copied seed-1 file holding seed 0, another table's file, a file of a row the table does
    not have, a file that is not a result, and one that is not JSON: each named under the table,
    none in its cells."""
    tables = btab.load_tables()
    folder = tmp_path / "bc" / "heat-bc"
    folder.mkdir(parents=True)
    good = {"table": "bc", "recipe": "heat-bc", "model": "gno", "seed": 0, "size": "bench", "epochs": 10,
            "batch_size": 64, "lr": 3e-4, "precision": "bf16", "extra": [], "steps": 9, "gpu": "NVIDIA H100",
            "commit": "0" * 40, "nmse_mean": 0.25, "per_step_nmse": [0.25]}
    (folder / "gno-seed0.json").write_text(json.dumps(good))
    (folder / "gno-seed1.json").write_text(json.dumps(good))  # a copy: it holds seed 0
    (folder / "fno-seed0.json").write_text(json.dumps({**good, "table": "joint", "model": "fno"}))
    (folder / "nonesuch-seed0.json").write_text(json.dumps({**good, "model": "nonesuch"}))
    (folder / "notes-seed0.json").write_text(json.dumps({"hello": 1}))
    (folder / "broken-seed0.json").write_text("{")
    (folder / "typed-seed0.json").write_text(json.dumps({**good, "model": "typed", "per_step_nmse": [0.1, "0.1"]}))
    (folder / "zero-seed0.json").write_text(json.dumps({**good, "model": "zero", "nmse_mean": 0}))  # (a ratio's divisor)
    found, left_out = btab.load_results(tmp_path, "bc", tables["bc"])
    assert found == [good]
    text = " ".join(left_out)
    for expected in ("gno-seed1.json` (it holds seed '0')", "fno-seed0.json` (it holds table 'joint')",
                     "nonesuch-seed0.json` (row 'nonesuch' is not a row of the table)",
                     "notes-seed0.json` (not a result file: no table, recipe, model, seed, size, epochs, batch_size, gpu, commit, "
                     "nmse_mean)", "typed-seed0.json` (not a result file: per_step_nmse: [1]: expected a number, "
                     "got \"0.1\")", "zero-seed0.json` (not a result file: nmse_mean: expected a finite number above 0, got 0)",
                     "broken-seed0.json` (not JSON"):
        assert expected in text, expected
    page = page_of(tmp_path, "bc", tables)
    assert "**Left out of this table**" in page and "| `gno` | 2.50e-01 |" in page  # one seed: the copy is out


def test_the_dro_notes_quote_the_cpu_checks():
    """The CPU checks' figures and findings in the dro notes are their committed files'."""
    notes = " ".join((btab.RESULTS.parent / "notes" / "dro.md").read_text().split())
    checks = btab.RESULTS.parent / "checks"
    relative, absolute, erm = json.loads((checks / "dro_heat_param_small.json").read_text())["rows"]
    assert relative["nmse_mean"] > erm["nmse_mean"] and relative["nmse_worst_group"] > erm["nmse_worst_group"]
    assert "the relative temperature made both the mean and the worst group worse than MSE throughout" in notes
    erm, running = json.loads((checks / "dro_heat_bc_small.json").read_text())["rows"]
    low, high = (float(x) for x in running["dro_weights_last_epoch"].split(" to "))
    assert f"({low:.1f} to {high:.1f} times the mean's in the last epoch)" in notes
    assert f"scored {running['nmse_worst_group']:.4f} against {erm['nmse_worst_group']:.4f} with MSE" in notes
    assert running["worst_group"] == erm["worst_group"] == "neumann/neumann/neumann/neumann"
    labels = [g["label"].split("/")[0] for g in running["groups"]]
    loss = dict(zip(labels, running["running_group_losses_at_end"]))
    rollout = {g["label"].split("/")[0]: g["nmse_mean"] for g in running["groups"]}
    assert f"running training loss was {loss['neumann'] / loss['periodic']:.1f} times the periodic one's" in notes
    assert f"rollout nMSE is {rollout['neumann'] / rollout['periodic']:.0f} times as large" in notes


def test_the_pages_quote_the_headline_and_the_main_jobs_check_from_their_files():
    """Home's results line is the headline the results give, and the dro check's run with the
    default objective is the main job's run of the recipes check (the same computation; the heat
    recipe page quotes the latter, tests/test_check_pages.py)."""
    docs = RECIPES.parent / "docs"
    tables = btab.load_tables()
    _, counts = brender._headline(tables, brender.load_all(tables, btab.RESULTS))
    home = " ".join((docs / "index.md").read_text().split())
    assert brender._headline_text(counts) in home, "docs/index.md: the results line is stale (see which-model.md)"
    check = json.loads((RECIPES.parent / "benchmarks" / "checks" / "dro_heat_param_small.json").read_text())
    default = next(r for r in check["rows"] if r["objective"].startswith("absolute"))  # the training default
    main = json.loads((RECIPES.parent / "benchmarks" / "checks" / "recipes" / "heat-param" / "gno_fno_soft-seed0.json")
                      .read_text())
    assert f"{default['nmse_mean']:.3g} {default['nmse_worst_group']:.3g}" == \
        f"{main['nmse_mean']:.3g} {main['nmse_worst_group']['nmse_mean']:.3g}"


def test_the_overview_says_which_result_files_keep_the_other_readings():
    full = {"nmse_mean": 0.1, "nmse_readings": dict.fromkeys(btab.READING_NAMES, 0.1), "per_trajectory": []}
    assert brender._readings_said({"t": ([full, full], [])}).startswith("Each result file also keeps the pooled nMSE")
    said = brender._readings_said({"t": ([full], []), "u": ([{"nmse_mean": 0.2}], [])})
    assert "(1 of 2) also keep the pooled nMSE" in said and "needs the run again" in said and "--refresh-only" in said
    # a file with some of the readings (the mesh runs' before their pooled and per-channel ones) lacks them
    some = {**full, "nmse_readings": {"per_trajectory": 0.1, "per_step": 0.2}}
    assert not btab.has_readings(some) and btab.has_readings(full)
    assert "(1 of 2) also keep" in brender._readings_said({"t": ([full, some], [])})


def test_which_model_names_a_first_mesh_model_only_where_every_row_has_run():
    """A mesh column where one trained row has no result yet names no first model (the row not
    run would be ranked below the rows that ran); each column is said on its own."""
    tables = btab.load_tables()
    loaded = brender.load_all(tables, btab.RESULTS)
    rows = [row for row in tables["mesh"]["rows"] if row != "persistence"]
    result = {"recipe": "heat-mesh", "model": rows[1], "nmse_mean": 0.2, "seed": 0}
    one = {**loaded, "mesh": ([result], loaded["mesh"][1])}
    line = next(x for x in brender.which_model_page(tables, one).splitlines() if "irregular domain" in x)
    assert "heat-mesh: not every row has run yet" in line and "first on" not in line
    both = {**loaded, "mesh": ([result, {**result, "model": rows[0], "nmse_mean": 0.1}], loaded["mesh"][1])}
    line = next(x for x in brender.which_model_page(tables, both).splitlines() if "irregular domain" in x)
    assert f"first on heat-mesh: `{rows[0]}`" in line and "advection-mesh: not every row has run yet" in line
