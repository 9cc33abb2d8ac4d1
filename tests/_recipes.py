"""Loading a script of ``recipes/`` (not a package) as a module, for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def load_recipe(name: str) -> ModuleType:
    """``recipes/<name>.py``, executed as the module ``recipes_<name>``."""
    spec = importlib.util.spec_from_file_location(f"recipes_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
