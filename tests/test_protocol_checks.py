"""The protocol checks behind the datasets page: `recipes/burgers_oracles.py` (what simple
predictors score on a Burgers protocol) and the committed CPU checks, and the figures the pages
quote from their output."""

import json
import math
from pathlib import Path

import pytest

from ._recipes import load_recipe

ROOT = Path(__file__).resolve().parent.parent
oracles = load_recipe("burgers_oracles")


def test_the_unit_box_loses_the_shifted_fields_and_the_2pi_box_keeps_them():
    """On the unit box the shifted interval's fields decay within the rollout (persistence far
    above the mean predictor, the true-viscosity decay far below it); on the 2 pi box every
    predictor but the mean is below 1 and the viscous decay with the true viscosity beats
    persistence. The mean predictor scores 1 by construction."""
    unit = oracles.score(1.0, (0.01, 1.0), 4, 32, 10, 0.01)
    box = oracles.score(2 * math.pi, (0.01, 1.0), 4, 32, 10, 0.01)
    assert unit["nmse"]["mean"] == pytest.approx(1.0) == box["nmse"]["mean"]
    assert unit["nmse"]["persistence"] > 5 and unit["nmse"]["decay (true nu)"] < 0.2
    assert unit["nmse"]["decay (nu clipped)"] > 1  # a model exact on the training interval, extrapolating
    assert unit["vanished_share"] > 0 and box["vanished_share"] == 0
    assert box["nmse"]["decay (true nu)"] < box["nmse"]["persistence"] < 1


def test_the_datasets_page_quotes_the_committed_oracle_figures():
    """Every number the datasets page gives for the oracles is the committed JSON's (the file
    `python recipes/burgers_oracles.py --trajectories 32 --out benchmarks/protocol/burgers_oracles.json`
    writes)."""
    rows = json.loads((ROOT / "benchmarks" / "protocol" / "burgers_oracles.json").read_text())["rows"]
    page = (ROOT / "docs" / "datasets" / "index.md").read_text()
    table = page.split("<!-- burgers oracles -->")[1]
    for row in rows:
        side = "1" if row["extent"] == 1 else "2π"
        line = next(l for l in table.splitlines() if l.startswith(f"| {side} | {row['test']} |"))
        cells = [c.strip() for c in line.strip("|").split("|")][2:]
        assert cells == [f"{v:.3g}" for k, v in row["nmse"].items() if k != "mean"] + [f"{row['vanished_share']:.0%}"], line
    # the figures its prose quotes
    unit, box = ({r["test"]: r for r in rows if (r["extent"] == 1) == flag} for flag in (True, False))
    prose = " ".join(page.split("## The Burgers protocol")[1].split("<!-- burgers oracles -->")[0].split())
    assert f"persistence scores {unit['shifted']['nmse']['persistence']:.2g}" in prose
    assert f"extrapolates with them scores {unit['shifted']['nmse']['decay (nu clipped)']:.1g}" in prose
    assert f"{unit['shifted']['vanished_share']:.0%}".replace("50%", "half") in prose
    after = " ".join(page.split("<!-- burgers oracles -->")[1].split("```bash")[0].split())
    assert (f"{box['in-distribution']['nmse']['persistence']:.1g} in distribution, "
            f"{box['shifted']['nmse']['persistence']:.2g} on the shifted interval") in after


def test_a_later_start_frame_scores_the_window_a_model_reading_several_frames_rolls_out():
    """``start``: the rollout from frame ``start`` (a model reading k frames starts from k - 1).
    From frame 0 it is the default; later on the shifted interval persistence scores lower (the
    fields of the large viscosities have slowed), and the mean predictor still scores 1."""
    first = oracles.score(2 * math.pi, (0.01, 1.0), 3, 32, 4, 0.01)
    again = oracles.score(2 * math.pi, (0.01, 1.0), 3, 32, 4, 0.01, start=0)
    later = oracles.score(2 * math.pi, (0.01, 1.0), 3, 32, 4, 0.01, start=6)
    assert again["nmse"] == first["nmse"] and later["start"] == 6
    assert later["nmse"]["persistence"] < 0.7 * first["nmse"]["persistence"]
    assert later["nmse"]["mean"] == pytest.approx(1.0)
    with pytest.raises(SystemExit):
        oracles.main(["--start", "-1"])


def test_the_pages_quote_the_committed_window_figures():
    """The datasets page's table of the later windows, and the persistence figures the param notes
    quote from it, are the committed JSON's (`python recipes/burgers_oracles.py --extent
    6.283185307179586 --trajectories 32 --start 1 4 9 --out
    benchmarks/protocol/burgers_oracles_windows.json`)."""
    protocol = ROOT / "benchmarks" / "protocol"
    rows = json.loads((protocol / "burgers_oracles_windows.json").read_text())["rows"]
    assert {r["start"] for r in rows} == {1, 4, 9} and {r["extent"] for r in rows} == {2 * math.pi}
    table = (ROOT / "docs" / "datasets" / "index.md").read_text().split("<!-- burgers oracle windows -->")[1]
    for row in rows:
        line = next(l for l in table.splitlines() if l.startswith(f"| {row['test']} | {row['start']} |"))
        n = row["nmse"]
        assert line.split("|")[3:6] == [f" {n[k]:.3g} " for k in ("persistence", "decay (true nu)", "decay (nu clipped)")]
    shifted = {r["start"]: r["nmse"]["persistence"] for r in rows if r["test"] == "shifted"}
    shifted[0] = next(r["nmse"]["persistence"] for r in json.loads((protocol / "burgers_oracles.json").read_text())["rows"]
                      if r["extent"] > 1 and r["test"] == "shifted")
    notes = " ".join((ROOT / "benchmarks" / "notes" / "param.md").read_text().split())
    assert (f"persistence scores {shifted[9]:.2g} from frame 9 and {shifted[4]:.2g} from frame 4, "
            f"against {shifted[0]:.2g} from frame 0") in notes


def test_the_differences_table_quotes_the_load_balance_check():
    """`gno` with and without its gates' load-balance term (the paper has none): the datasets
    page's figures are the committed check's means over its two seeds."""
    rows = json.loads((ROOT / "benchmarks" / "checks" / "gno_balance_small.json").read_text())["rows"]
    page = " ".join((ROOT / "docs" / "datasets" / "index.md").read_text().split())

    def mean(recipe, weight):
        values = [r["nmse_mean"] for r in rows if r["recipe"] == recipe and r["balance_weight"] == weight]
        assert len(values) == 2
        return sum(values) / 2

    assert (f"without it `gno` scores {mean('heat-param', 0.0):.3f} on heat-param and {mean('advection-joint', 0.0):.3f} "
            f"on advection-joint, with it {mean('heat-param', 0.01):.3f} and {mean('advection-joint', 0.01):.3f}") in page
