"""Train a GNO (or any registered model) on a recipe, then evaluate it.

    python recipes/train.py                                                # the default: heat-param, size=small, CPU minutes
    accelerate launch recipes/train.py --recipe heat-joint size=paper      # GPUs
    python recipes/train.py --recipe trl data.root=/data/the_well model=gated_fno trainer.epochs=50
    torchrun --nproc_per_node 2 recipes/train.py --recipe heat-param size=smoke   # 2 CPU processes (gloo)

``--recipe`` selects ``recipes/conf/recipe/NAME.yaml``; every other argument is a Hydra
override of the composition in ``recipes/conf`` (groups recipe, model, data, trainer,
optimizer, size). ``--list`` prints the recipes with what each does, ``--print-config`` the
resolved configuration. A misspelled setting or config name gets one line that suggests the
closest valid one; Ctrl-C stops with the command that continues the run.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Any

CONF = Path(__file__).resolve().parent / "conf"
DEFAULT_RECIPE = "heat-param"  # the README's main job


def available(group: str) -> list[str]:
    """Names of the configs of a group (``recipe``, ``model``, ...)."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def description(recipe: str) -> str:
    """The description of a recipe: the comment that opens its config file (after the
    ``@package`` line), its lines joined."""
    lines = (CONF / "recipe" / f"{recipe}.yaml").read_text().splitlines()[1:]
    words = []
    for line in lines:
        if not line.startswith("# "):
            break
        words.append(line[2:].strip())
    return " ".join(words)


def _closest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _keys(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return []
    return [k for key, value in tree.items() for k in [f"{prefix}{key}", *_keys(value, f"{prefix}{key}.")]]


def _explain(error: Exception, recipe: str, overrides: list[str]) -> str:
    """One line for a Hydra composition error: the override at fault and the closest valid name."""
    text = str(error)
    missing = re.search(r"Could not find '([^'/]+)/([^']+)'", text)
    if missing:
        group, name = missing.groups()
        names = available(group) if (CONF / group).is_dir() else []
        return f"{group}={name}: unknown{_closest(name, names)} (available: {', '.join(names)})"
    key = re.search(r"Could not (?:override|append to|delete) '([^']+)'", text) or re.search(r"Key '([^']+)'", text)
    if key:
        name = key.group(1)
        valid = _keys(compose(recipe, [o for o in overrides if not o.lstrip("+~").startswith(name)]))
        return (f"{name}: no such setting{_closest(name, valid)} (python recipes/train.py --recipe {recipe} "
                "--print-config shows them all)")
    return text.splitlines()[0]


def compose(recipe: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """The resolved configuration of ``recipe`` with Hydra ``overrides``, as a plain dict."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    if recipe not in available("recipe"):
        raise SystemExit(f"--recipe {recipe!r}: unknown{_closest(recipe, available('recipe'))} "
                         f"(available: {', '.join(available('recipe'))})")
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=[f"recipe={recipe}", *(overrides or [])],
                                return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise SystemExit(f"error: {_explain(error, recipe, list(overrides or []))}") from None
    chosen = cfg.hydra.runtime.choices.get("model")
    with open_dict(cfg):
        del cfg["hydra"]
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise SystemExit(f"recipe {recipe}: no value for {', '.join(missing)} (pass it as an override, "
                         f"e.g. {missing[0]}=...)")
    out = OmegaConf.to_container(cfg, resolve=True)
    if chosen and not out["model"].get("label") and chosen != out["model"].get("name"):
        # a config that extends another (gno_fno_soft extends gno_fno) names its runs itself
        out["model"]["label"] = chosen
    return out


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Other arguments are Hydra overrides, e.g. size=smoke trainer.epochs=5.")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"recipe name (see --list; default {DEFAULT_RECIPE})")
    parser.add_argument("--list", action="store_true", help="list the recipes (with what each does) and models, and exit")
    parser.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        parser.error(f"unrecognised option(s) {bad}; Hydra overrides look like key=value")
    return args, overrides


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args, overrides = parse(argv)
    if args.list:
        print("recipes:")
        for recipe in available("recipe"):
            print(f"  {recipe:22s} {description(recipe)}")
        print("models: ", ", ".join(available("model")))
        print("sizes:  ", ", ".join(available("size")))
        return None
    cfg = compose(args.recipe, overrides)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(cfg, sort_keys=False))
        return None
    from gno_ext.training import train

    return train(cfg)


if __name__ == "__main__":
    # --list, --print-config and the configuration's errors (a misspelled setting) are answered
    # before torch is imported: seconds, not the half minute its import can take on a busy machine
    cli, given = parse()
    if cli.list or cli.print_config:
        main()
        sys.exit(0)
    compose(cli.recipe, given)
    # Under torchrun or `accelerate launch` with several processes, `record` writes a failing
    # process's traceback to the error file that the launcher reads, so the launcher's summary
    # names the root cause (rank, exception, traceback) instead of an exit code only.
    from torch.distributed.elastic.multiprocessing.errors import record

    from gno_ext._files import DiskFull
    from gno_ext.models.registry import MissingDependencyError

    try:
        record(main)()
    except KeyboardInterrupt:  # one line, not a traceback per process and worker
        print("\ninterrupted: the last checkpoint is kept; run the same command with resume=auto to continue",
              file=sys.stderr)
        sys.exit(130)
    except (FileNotFoundError, FileExistsError, ValueError, KeyError, MissingDependencyError, DiskFull) as err:
        # configuration and data errors: one clear line, no traceback (set GNO_EXT_DEBUG=1 for it)
        import os

        if os.environ.get("GNO_EXT_DEBUG"):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
