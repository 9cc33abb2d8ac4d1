"""Train a GNO (or any registered model) on a recipe, then evaluate it.

    accelerate launch recipes/train.py --recipe heat-param                 # size=small, CPU minutes
    accelerate launch recipes/train.py --recipe heat-joint size=paper      # GPUs
    python recipes/train.py --recipe trl data.root=/data/the_well model=gated_fno trainer.epochs=50
    torchrun --nproc_per_node 2 recipes/train.py --recipe heat-param size=smoke   # 2 CPU processes (gloo)

``--recipe`` selects ``recipes/conf/recipe/NAME.yaml``; every other argument is a Hydra
override of the composition in ``recipes/conf`` (groups recipe, model, data, trainer,
optimizer, size). ``--list`` prints the recipes, ``--print-config`` the resolved configuration.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

CONF = Path(__file__).resolve().parent / "conf"


def available(group: str) -> list[str]:
    """Names of the configs of a group (``recipe``, ``model``, ...)."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose(recipe: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """The resolved configuration of ``recipe`` with Hydra ``overrides``, as a plain dict."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    if recipe not in available("recipe"):
        raise SystemExit(f"--recipe {recipe!r}: unknown; available: {', '.join(available('recipe'))}")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=[f"recipe={recipe}", *(overrides or [])])
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise SystemExit(f"recipe {recipe}: no value for {', '.join(missing)} (pass it as an override, "
                         f"e.g. {missing[0]}=...)")
    return OmegaConf.to_container(cfg, resolve=True)


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Other arguments are Hydra overrides, e.g. size=smoke trainer.epochs=5.")
    parser.add_argument("--recipe", help="recipe name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the recipes and models and exit")
    parser.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        parser.error(f"unrecognised option(s) {bad}; Hydra overrides look like key=value")
    if not args.list and not args.recipe:
        parser.error("--recipe is required (see --list)")
    return args, overrides


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args, overrides = parse(argv)
    if args.list:
        print("recipes:", ", ".join(available("recipe")))
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
    # Under torchrun or `accelerate launch` with several processes, `record` writes a failing
    # process's traceback to the error file that the launcher reads, so the launcher's summary
    # names the root cause (rank, exception, traceback) instead of an exit code only.
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        record(main)()
    except (FileNotFoundError, FileExistsError, ValueError, KeyError) as err:
        # configuration and data errors: one clear line, no traceback (set GNO_EXT_DEBUG=1 for it)
        import os

        if os.environ.get("GNO_EXT_DEBUG"):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
