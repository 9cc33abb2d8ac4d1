"""The user pages quote the CPU checks of ``benchmarks/checks.yaml`` from their result files
(``benchmarks/checks/<table>/<recipe>/<row>-seed<N>.json``, made by ``python recipes/benchmark.py run
--tables benchmarks/checks.yaml --results benchmarks/checks --table NAME``): the recipe pages'
expected results and the models page's options. A figure copied by hand cannot drift from its file.
(The results notes quote them through ``{{check:...}}`` placeholders, filled when the pages render.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ROOT / "benchmarks" / "checks"


def result(table: str, recipe: str, row: str, seed: int = 0) -> dict:
    return json.loads((CHECKS / table / recipe / f"{row}-seed{seed}.json").read_text())


def seed_values(root: Path, table: str, recipe: str, row: str, field: str = "nmse_mean") -> list[float]:
    """``field`` of each seed of a cell under ``root`` (the checks or the tables' results)."""
    values = [json.loads(p.read_text())[field] for p in sorted((root / table / recipe).glob(f"{row}-seed*.json"))]
    assert values, f"no results of {table}/{recipe}/{row} under {root}"
    return values


def mean(root: Path, table: str, recipe: str, row: str, field: str = "nmse_mean") -> float:
    """``field`` of a cell under ``root``, averaged over its seeds."""
    values = seed_values(root, table, recipe, row, field)
    return sum(values) / len(values)


def page(*parts: str) -> str:
    return " ".join((ROOT / "docs" / Path(*parts)).read_text().split())


def expected_rows(path: Path) -> list[list[str]]:
    """The rows of the page's table of expected results (after the heading of that name)."""
    text = path.read_text().split("## Hardware and expected results", 1)[1]
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| `")]


@pytest.mark.parametrize("name", ["heat", "advection"])
def test_the_recipe_pages_expected_results_are_the_checks(name):
    """Every row of the table is a run of the check table ``recipes`` (seed 0), to the digits shown:
    the time, the mean test rollout nMSE and the worst group's."""
    rows = expected_rows(ROOT / "docs" / "recipes" / f"{name}.md")
    assert rows
    for cells in rows:
        recipe, model = (re.match(r"`([\w-]+)`", c).group(1) for c in cells[:2])
        r = result("recipes", recipe, model)
        worst = r["nmse_worst_group"]
        assert cells[3] == f"{r['wall_s'] / 60:.1f} min", (recipe, model, cells[3])
        assert cells[4] == f"{r['nmse_mean']:.3g}", (recipe, model, cells[4])
        assert cells[5].startswith(f"{worst['nmse_mean']:.3g} ("), (recipe, model, cells[5])


def test_every_recipe_check_is_on_a_recipe_page():
    tables = yaml.safe_load((ROOT / "benchmarks" / "checks.yaml").read_text())["tables"]
    shown = {(re.match(r"`([\w-]+)`", c[0]).group(1), re.match(r"`([\w-]+)`", c[1]).group(1))
             for name in ("heat", "advection") for c in expected_rows(ROOT / "docs" / "recipes" / f"{name}.md")}
    wanted = {(recipe, row) for recipe in tables["recipes"]["recipes"] for row in tables["recipes"]["rows"]}
    assert shown == wanted


def test_the_models_page_quotes_the_option_checks():
    """``domain_padding`` and ``shared_kernel``: the figures the models page gives for them."""
    models = page("models", "index.md")
    padded = [result("padding", "advection-bc", "gno_fno_soft_padded", s)["nmse_mean"] for s in (0, 1)]
    plain = [result("padding", "advection-bc", "gno_fno_soft", s)["nmse_mean"] for s in (0, 1)]
    assert (f"`model.kwargs.domain_padding=0.125` gave a rollout nMSE of {padded[0]:.3g} and {padded[1]:.3g} "
            f"against {plain[0]:.3g} and {plain[1]:.3g} without it") in models
    shared = [result("shared", "heat-param", "gno_fno_soft_shared", s)["nmse_mean"] for s in (0, 1)]
    alone = [result("shared", "heat-param", "gno_fno_soft", s)["nmse_mean"] for s in (0, 1)]
    assert (f"the rollout nMSE was {shared[0]:.3g} and {shared[1]:.3g} with it against "
            f"{alone[0]:.3g} and {alone[1]:.3g} without") in models


def test_the_readme_and_getting_started_times_are_the_main_jobs():
    """The main job's time (and the paper's configuration's) as the README and Getting started say
    them, in whole minutes, from the check runs of the same commands."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    started = page("getting-started.md")
    soft, gno = (result("recipes", "heat-param", model)["wall_s"] / 60 for model in ("gno_fno_soft", "gno"))
    assert f"It takes about {round(soft)} minutes on 2 idle cores" in readme
    assert f"(about {round(soft)} minutes on 2 idle cores)" in started
    assert f"`model=gno` trains the paper's configuration instead (about {round(gno)} minutes)" in readme


def test_the_models_page_quotes_the_periodic_layer_ablation():
    """The periodic-layer option's figures on the models page: the `ablation` table's row without
    the layer against `gno_fno` (means over the seeds run)."""
    results = ROOT / "benchmarks" / "results"
    change = {recipe: mean(results, "ablation", recipe, "gno_fno_no_periodic_layer")
              / mean(results, "ablation", recipe, "gno_fno") - 1 for recipe in ("advection-joint", "heat-param")}
    assert change["advection-joint"] < 0 < change["heat-param"]
    assert (f"finds it {round(-100 * change['advection-joint'])} % better on advection-joint and "
            f"{round(100 * change['heat-param'])} % worse on heat-param") in page("models", "index.md")


def test_the_ablation_notes_claims_about_the_seed_spread_hold():
    """The ablation notes' words about the paper's GNO's two seeds on advection-joint: removing the
    boundary transfer or DRO moves its mean no more than the two seeds differ, and the FNO
    backbone's single-kernel gap is about twice that difference."""
    results = ROOT / "benchmarks" / "results" / "ablation" / "advection-joint"
    seeds = [json.loads((results / f"gno-seed{s}.json").read_text())["nmse_mean"] for s in (0, 1)]
    spread, gno = abs(seeds[1] - seeds[0]), sum(seeds) / 2
    text = page("results", "ablation.md")
    assert "no more than the GNO's two seeds differ); without DRO" in text and "likewise); with one kernel" in text
    for row in ("gno_no_boundary", "gno_no_dro"):
        assert abs(mean(results.parents[1], "ablation", "advection-joint", row) - gno) <= spread, row
    gap = (mean(results.parents[1], "ablation", "advection-joint", "gno_fno")
           - mean(results.parents[1], "ablation", "advection-joint", "gno_fno_single_kernel"))
    assert "The gap is about twice the spread of the GNO's two seeds here" in text and 1.5 <= gap / spread <= 2.5


def test_the_notes_claims_about_the_soft_mixture_on_advection_joint_hold():
    """Words of the joint and ablation notes that the seeds' values decide: `gno_fno_soft` and
    `gno_conv` level within their seeds behind Unisolver (the soft one first of the two, as the
    summary orders them); one kernel and the soft mixture overlapping in their seeds; the soft
    mixture with the load-balance term below both seeds without it."""
    results = ROOT / "benchmarks" / "results"
    seeds = lambda table, row: seed_values(results, table, "advection-joint", row)
    overlap = lambda a, b: max(min(a), min(b)) <= min(max(a), max(b))
    soft, conv = seeds("joint", "gno_fno_soft"), seeds("joint", "gno_conv")
    assert "then `gno_fno_soft` (" in page("results", "joint.md") and "is first ahead of `gno_fno_soft`" in page(
        "results", "index.md") and sum(soft) / len(soft) <= sum(conv) / len(conv)
    assert "level within their seeds" in page("results", "joint.md") and overlap(soft, conv)
    assert max(seeds("joint", "unisolver")) < min(soft + conv)
    text = page("results", "ablation.md")
    assert "where the two seeds of each overlap" in text
    assert overlap(seeds("ablation", "gno_fno_soft"), seeds("ablation", "gno_fno_single_kernel"))
    assert "the mean of its two seeds without it and below both" in text
    assert max(seeds("ablation", "gno_fno_soft_balanced")) < min(seeds("ablation", "gno_fno_soft"))


def test_the_conditioning_notes_claims_hold():
    """The conditioning notes: the eight conditioned ViTs' ranges (mean, step 1, 10 and 50), five
    above persistence, every one far above the FNO; the two FiLM forms change places between the
    seeds, and each FiLM form's seeds lie further apart than the Token and Pos forms do."""
    folder = ROOT / "benchmarks" / "results" / "conditioning" / "ns-param"
    forms = [f"{m}-{w}" for m in ("film", "pos", "proj", "token") for w in ("encoder", "layers")]
    runs = {form: [json.loads(f.read_text()) for f in sorted(folder.glob(f"{form}-seed*.json"))] for form in forms}
    mean = {form: sum(r["nmse_mean"] for r in rs) / len(rs) for form, rs in runs.items()}
    per_run = lambda step, skip=(): [r["per_step_nmse"][step] for f, rs in runs.items() if f not in skip for r in rs]
    notes = " ".join((ROOT / "benchmarks" / "notes" / "conditioning.md").read_text().split())
    assert f"between {min(mean.values()):.2f} and {max(mean.values()):.2g}" in notes
    short = lambda x: f"{x:.1e}".replace("e-0", "e-")  # 6.4e-3
    assert f"{short(min(per_run(0, ['proj-layers'])))} to {short(max(per_run(0, ['proj-layers'])))} for seven" in notes
    assert f"step 10 the error is {min(per_run(9, ['proj-layers'])):.2f} to {max(per_run(9, ['proj-layers'])):.2f}" \
        in notes
    assert f"step 50 it is {min(per_run(49)):.0f} to {max(per_run(49)):.0f}" in notes
    persistence = json.loads((folder / "persistence-seed0.json").read_text())["nmse_mean"]
    fno = json.loads((folder / "fno-seed0.json").read_text())["nmse_mean"]
    assert sum(m > persistence for m in mean.values()) == 5 and "five of them above `persistence`" in notes
    assert min(mean.values()) > 100 * fno
    assert [len(runs[f]) for f in forms] == [2, 2, 1, 1, 1, 1, 1, 1]  # "two for the FiLM forms"
    (enc0, enc1), (lay0, lay1) = ([r["nmse_mean"] for r in runs[f"film-{w}"]] for w in ("encoder", "layers"))
    assert lay0 < enc0 and lay1 > enc1 and "with seed 0 conditioning every layer is ahead, with seed 1 behind" in notes
    spread = min(abs(enc0 - enc1), abs(lay0 - lay1))
    assert spread > abs(mean["token-layers"] - mean["token-encoder"]) and mean["token-layers"] < mean["token-encoder"]
    assert spread > abs(mean["pos-layers"] - mean["pos-encoder"])
    assert min(per_run(49)) == runs["proj-layers"][0]["per_step_nmse"][49]  # "the smallest of the eight"
    assert max(mean.values()) == mean["proj-encoder"]


def test_the_3d_notes_claims_about_the_token_sizes_hold():
    """The 3d notes: at the small size no token model beats persistence at any token size and the
    FNO does; at bench the GNO and Unisolver stay within 1 % of persistence at every step."""
    pers = result("patch3d", "advection-3d", "persistence")["nmse_mean"]
    tokens = ("gno", "gno_patch2", "gno_patch8", "unisolver", "unisolver_patch8")
    assert all(result("patch3d", "advection-3d", row)["nmse_mean"] >= pers for row in tokens)
    assert result("patch3d", "advection-3d", "fno")["nmse_mean"] < pers
    bench = ROOT / "benchmarks" / "results" / "3d" / "advection-3d"
    steps = {row: json.loads((bench / f"{row}-seed0.json").read_text())["per_step_nmse"]
             for row in ("gno", "unisolver", "persistence", "fno")}
    for row in ("gno", "unisolver"):
        assert all(abs(a - b) <= 0.01 * b for a, b in zip(steps[row], steps["persistence"]))
    assert all(a < b for a, b in zip(steps["fno"], steps["persistence"]))


def test_the_3d_notes_claims_about_the_fno_backbone_rows_hold():
    """The 3d notes: `fno` and `gno_fno_soft` below persistence at every step of the rollout, the
    FNO below `gno_fno_soft` at every step; the soft row's training time and memory as its log
    and result file record them."""
    bench = ROOT / "benchmarks" / "results" / "3d" / "advection-3d"
    runs = {row: json.loads((bench / f"{row}-seed0.json").read_text())
            for row in ("fno", "gno_fno_soft", "persistence")}
    steps = {row: run["per_step_nmse"] for row, run in runs.items()}
    assert all(f < s < p for f, s, p in zip(steps["fno"], steps["gno_fno_soft"], steps["persistence"]))
    notes = " ".join((ROOT / "benchmarks" / "notes" / "3d.md").read_text().split())
    log = (ROOT / "benchmarks" / "history" / "soft3d_h100_412eb6f.log").read_text()
    soft = runs["gno_fno_soft"]
    assert soft["commit"].startswith("412eb6f") and soft["gpu"].startswith("NVIDIA H100")
    assert "trainer.capture=false" in soft["extra"] and "model.kwargs.checkpoint_blocks=true" in soft["overrides"]
    assert f"{soft['nmse_mean']:.4e}" in log  # the log is this result's run
    mib = max(int(m) for m in re.findall(r"^(\d+) MiB, \d+ %$", log, flags=re.M))
    said = [f"showed at most {mib} MiB ({mib / 1024:.1f} GiB) in use",
            f"its {soft['steps']} steps with a validation after each epoch took {soft['train_s']:.0f} s, "
            f"{soft['train_s'] / soft['steps']:.2f} s a step"]
    missing = [s for s in said if s not in notes]
    assert not missing, missing


def test_the_3d_notes_claims_about_the_training_budget_hold():
    """The 3d notes: in 2-D the GNO is still at persistence after 480 steps and below it after 1800;
    in 3-D at small, five times the epochs take the token models further above persistence; the
    step and field counts they quote are the runs'."""
    joint = {row: result("joint2d", "advection-joint", row) for row in ("gno_e8", "gno", "persistence")}
    pers = joint["persistence"]["nmse_mean"]
    assert abs(joint["gno_e8"]["nmse_mean"] - pers) <= 0.01 * pers and joint["gno"]["nmse_mean"] < 0.8 * pers
    assert (joint["gno_e8"]["steps"], joint["gno"]["steps"]) == (480, 1800)
    for longer, shorter in (("gno_patch8_e150", "gno_patch8"), ("unisolver_patch8_e150", "unisolver_patch8")):
        run = result("longer3d", "advection-3d", longer)
        assert run["steps"] == 2250 and run["nmse_mean"] > result("patch3d", "advection-3d", shorter)["nmse_mean"]
    assert result("patch3d", "advection-3d", "gno")["steps"] == 450
    bench = ROOT / "benchmarks" / "results"
    assert json.loads((bench / "3d" / "advection-3d" / "gno-seed0.json").read_text())["steps"] == 960
    assert json.loads((bench / "joint" / "advection-joint" / "gno-seed0.json").read_text())["steps"] == 3150
    from gno_ext.data.presets import get_preset

    def counts(name, size):  # training trajectories and velocity fields (one per parameter value)
        plan = get_preset(name).plans[size]["train"]
        return len(plan), plan.n_params

    assert (counts("advection-joint", "small"), counts("advection-3d", "small")) == ((96, 8), (24, 8))
    assert counts("advection-joint", "bench")[0] == 1002 and counts("advection-3d", "bench")[0] == 300
