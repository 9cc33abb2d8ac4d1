"""``gno-data``: generate and inspect datasets.

    gno-data list
    gno-data generate heat-param --size small [--out DIR] [--device cuda]
    gno-data info heat-param --size small         (or a dataset's folder: gno-data info DIR/datasets/heat-param)
    gno-data grid-form ~/.cache/gno_ext/data/small/mesh/heat-square square.h5
    gno-data masked-grid-form ~/.cache/gno_ext/data/small/mesh/heat-{annulus,l-shape} --out curved.h5

Without ``--out`` a dataset goes where the recipes look for it (``$GNO_EXT_CACHE/data/SIZE``,
by default ``~/.cache/gno_ext/data/SIZE``), so ``recipes/train.py`` uses it as it is.
"""

from __future__ import annotations

import argparse
import os
import sys

from pathlib import Path

from gno_ext._files import DiskFull
from gno_ext.data.generate import dataset_info, default_root, generate
from gno_ext.data.presets import PRESETS, SIZES


def main(argv: list[str] | None = None) -> int:
    """The ``gno-data`` command; a bad path or argument is one line on stderr and exit status 2
    (``GNO_EXT_DEBUG=1`` for the traceback)."""
    try:
        return _main(argv)
    except (FileNotFoundError, FileExistsError, ValueError, KeyError, DiskFull) as err:
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
    gen.add_argument("--out", default=None, help="base folder, which will hold datasets/PRESET (default: where the "
                                                  "recipes read it, $GNO_EXT_CACHE/data/SIZE)")
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    gen.add_argument("--batch-size", type=_positive, default=64)
    gen.add_argument("--shard-size", type=_positive, default=256)
    gen.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="storage type of the fields")
    info = sub.add_parser("info", help="summarise a generated dataset")
    info.add_argument("path", help="a dataset's folder, or a preset's name (looked up where the recipes keep it)")
    info.add_argument("--size", default="small", choices=SIZES, help="with a preset's name: its size (default small)")
    info.add_argument("--checksums", action="store_true", help="also compare every file's SHA-256 with the manifest's")
    grid = sub.add_parser("grid-form", help="write a square-domain mesh dataset as one grid file (custom recipe)")
    grid.add_argument("folder", help="the mesh dataset's folder (train.h5, valid.h5, test.h5 of the square)")
    grid.add_argument("out", help="the grid file to write (.h5)")
    masked = sub.add_parser("masked-grid-form", help="write mesh datasets of any domain on a masked grid, as one grid "
                                                      "file (custom recipe)")
    masked.add_argument("folders", nargs="+", help="mesh datasets' folders (train.h5, valid.h5, test.h5 each)")
    masked.add_argument("--out", required=True, help="the grid file to write (.h5)")
    masked.add_argument("--side", type=_positive, default=None,
                        help="cells a side (default: three times the square root of the node count)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, p in sorted(PRESETS.items()):
            counts = ", ".join(f"{s}: {len(p.plan(s, 'train'))}" for s in SIZES)
            print(f"{name:22s} {p.family:10s} {p.ndim}-D, train trajectories ({counts})")
    elif args.command == "generate":
        out = args.out if args.out is not None else default_root(args.size)
        root = generate(args.preset, args.size, out, args.device, args.batch_size, args.shard_size,
                        dtype=args.dtype)
        print(dataset_info(root))
        where = "" if args.out is None else f" data.root={out}"
        print(f"written to {root}; train on it with: python recipes/train.py --recipe {args.preset} size={args.size}{where}"
              if args.preset in _recipes() else f"written to {root}")
    elif args.command == "grid-form":
        from gno_ext.data.mesh import grid_form

        counts = grid_form(args.folder, args.out)
        print(_grid_file_written(args.out, counts))
    elif args.command == "masked-grid-form":
        from gno_ext.data.mesh import masked_grid_form

        counts = masked_grid_form(args.folders, args.out, args.side)
        print(_grid_file_written(args.out, counts))
    else:
        path = Path(args.path)
        if not path.exists() and args.path in PRESETS:
            path = default_root(args.size) / "datasets" / args.path
            if not path.exists():
                raise FileNotFoundError(f"{args.path} at size {args.size}: not generated yet (no {path}); "
                                        f"gno-data generate {args.path} --size {args.size} makes it")
        text = dataset_info(path, checksums=args.checksums)
        print(text)
        return 1 if "\n  files: DAMAGED" in text else 0  # a script can tell
    return 0


def _grid_file_written(out: str, counts: list[int]) -> str:
    """What ``grid-form`` and ``masked-grid-form`` say of the file they wrote: its splits, and
    the command that trains a grid model on it."""
    return (f"{out}: {sum(counts)} trajectories (train, valid, test: {', '.join(map(str, counts))}); train a grid "
            f"model on them with: python recipes/train.py --recipe custom data.root={out} "
            f"data.split_fractions=[{','.join(map(str, counts))}]")


def _positive(text: str) -> int:
    """An argparse type: an integer of at least 1, else argparse's one-line error, which names
    the option."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {text!r}")
    return value


def _recipes() -> set[str]:
    """The recipes of a source checkout (``recipes/conf/recipe``), where there is one."""
    folder = Path(__file__).resolve().parents[2] / "recipes" / "conf" / "recipe"
    return {p.stem for p in folder.glob("*.yaml")}


if __name__ == "__main__":
    sys.exit(main())
