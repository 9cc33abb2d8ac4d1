"""Loading a script of ``recipes/`` or ``benchmarks/`` (not packages) as a module, and starting
one as from a terminal, for the tests."""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
BENCHMARKS = ROOT / "benchmarks"


def load_recipe(name: str) -> ModuleType:
    """``recipes/<name>.py``, or ``benchmarks/<name>.py`` for a ``bench_*`` script, executed as
    the module ``recipes_<name>``."""
    folder = BENCHMARKS if name.startswith("bench_") else RECIPES
    spec = importlib.util.spec_from_file_location(f"recipes_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def sigint_as_at_a_terminal() -> None:
    """Ctrl-C's default disposition in a child (``preexec_fn``). A shell starts a background job
    (`cmd &`, as a CI script may be run) with SIGINT ignored, its children inherit that, and
    Python then keeps ignoring it: a child sent SIGINT would go on instead of stopping."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
