"""``gno-data``: generate and inspect datasets.

    gno-data list
    gno-data generate heat-param --size small --out data [--device cuda]
    gno-data info data/datasets/heat-param
    gno-data grid-form ~/.cache/gno_ext/data/small/mesh/heat-square square.h5
"""

from __future__ import annotations

import argparse
import os
import sys

from gno_ext.data.generate import dataset_info, generate
from gno_ext.data.presets import PRESETS, SIZES


def main(argv: list[str] | None = None) -> int:
    """The ``gno-data`` command; a bad path or argument is one line on stderr and exit status 2
    (``GNO_EXT_DEBUG=1`` for the traceback)."""
    try:
        return _main(argv)
    except (FileNotFoundError, FileExistsError, ValueError, KeyError) as err:
        if os.environ.get("GNO_EXT_DEBUG"):
            raise
        print(f"gno-data: error: {err.args[0] if isinstance(err, KeyError) and err.args else err}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gno-data", description="Generate and inspect gno_ext datasets.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the presets")
    gen = sub.add_parser("generate", help="generate (or resume generating) a preset")
    gen.add_argument("preset", choices=sorted(PRESETS))
    gen.add_argument("--size", default="small", choices=SIZES)
    gen.add_argument("--out", default="data", help="base folder (will hold datasets/PRESET)")
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    gen.add_argument("--batch-size", type=int, default=64)
    gen.add_argument("--shard-size", type=int, default=256)
    gen.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="storage type of the fields")
    info = sub.add_parser("info", help="summarise a generated dataset")
    info.add_argument("path")
    grid = sub.add_parser("grid-form", help="write a square-domain mesh dataset as one grid file (custom recipe)")
    grid.add_argument("folder", help="the mesh dataset's folder (train.h5, valid.h5, test.h5 of the square)")
    grid.add_argument("out", help="the grid file to write (.h5)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, p in sorted(PRESETS.items()):
            counts = ", ".join(f"{s}: {len(p.plan(s, 'train'))}" for s in SIZES)
            print(f"{name:22s} {p.family:10s} {p.ndim}-D, train trajectories ({counts})")
    elif args.command == "generate":
        root = generate(args.preset, args.size, args.out, args.device, args.batch_size, args.shard_size,
                        dtype=args.dtype)
        print(dataset_info(root))
    elif args.command == "grid-form":
        from gno_ext.data.mesh import grid_form

        counts = grid_form(args.folder, args.out)
        print(f"{args.out}: {sum(counts)} trajectories (train, valid, test: {', '.join(map(str, counts))}); train a "
              f"grid model on them with: python recipes/train.py --recipe custom data.root={args.out} "
              f"data.split_fractions=[{','.join(map(str, counts))}]")
    else:
        print(dataset_info(args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
