"""Loading a script of ``recipes/`` or ``benchmarks/`` (not packages) as a module, for the tests."""

from __future__ import annotations

import importlib.util
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
