"""`recipes/burgers_oracles.py`: what simple predictors score on a Burgers protocol, and the
figures the datasets page quotes from its committed output."""

import json
import math
import re
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
