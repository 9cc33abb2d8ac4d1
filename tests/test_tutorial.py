"""docs/tutorial.md runs as written: its Python blocks, in order, as one script."""

import re
from pathlib import Path

import torch

PAGE = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"


def test_the_tutorial_runs_and_its_model_learns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) == 4, "the tutorial's four steps: data, model, training, rollout"
    scope: dict = {}
    exec(compile("\n".join(blocks), str(PAGE), "exec"), scope)  # noqa: S102 (our own page)
    assert scope["losses"][-1] < 0.5 * scope["losses"][0]  # it trains
    assert scope["rollout"].shape == scope["truth"].shape and torch.isfinite(scope["rollout"]).all()
    routing = scope["model"].mixture.last_routing
    assert routing.index.shape == (1,)  # the gate chose one kernel for the rolled-out sample
    # the boundary transfer is in the path: other boundary data change the prediction
    window = scope["window"]
    bc = window.bc
    other = type(bc)(bc.kind, bc.values + 1.0, bc.coeffs)
    with torch.no_grad():
        a = scope["model"](window.u_in, window.theta, bc, window.grid)
        b = scope["model"](window.u_in, window.theta, other, window.grid)
    assert (a - b).abs().max() > 1e-6
