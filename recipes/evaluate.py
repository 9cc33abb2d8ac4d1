"""Evaluate a trained model by autoregressive rollout and write the report.

    python recipes/evaluate.py runs/heat-param/gno-small-seed0
    python recipes/evaluate.py runs/ns-param/gno-paper-seed0 --checkpoint runs/ns-param/gno-paper-seed0/checkpoints/step_00040000
    python recipes/evaluate.py RUN --steps 20 --split valid --max-trajectories 100
    python recipes/evaluate.py RUN --precision no   # float32 rollouts on a GPU
    python recipes/evaluate.py RUN --start-frame 50 --out RUN/eval/from-frame-50   # Navier-Stokes past its transient

Reads the run's ``config.yaml`` (data, groups) and a model folder (the run's final ``model/`` by
default, or any checkpoint), rolls out every test trajectory and writes ``report.json``,
``report.md`` and the figures (per-step error, error versus parameter and by boundary
configuration, the training curve, rollouts). On a GPU the
rollouts run in the run's ``trainer.precision`` (as at the end of training), elsewhere in float32.
"""

from __future__ import annotations

import argparse


def _at_least(low: int):
    """An argparse type: an integer of at least ``low`` (argparse's one-line error names the option)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    return parse


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="run folder (holds config.yaml)")
    parser.add_argument("--checkpoint", help="checkpoint or model folder (default: RUN/model, else the newest checkpoint)")
    parser.add_argument("--out", help="report folder (default: RUN/eval for the final model, RUN/eval/<checkpoint> "
                                      "for another checkpoint)")
    parser.add_argument("--overwrite", action="store_true", help="replace a report already in the output folder")
    parser.add_argument("--steps", type=_at_least(1), help="rollout steps (default: the run's eval.steps)")
    parser.add_argument("--split", help="split to evaluate (default: test)")
    parser.add_argument("--max-trajectories", type=_at_least(1), help="evaluate at most this many trajectories")
    parser.add_argument("--start-frame", type=_at_least(0), help="the frame each rollout starts from (default: the run's "
                                                        "eval.start_frame, 0 unless set)")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp16", "no"],
                        help="mixed precision of the rollouts, no: float32 (default: on a GPU the run's "
                             "trainer.precision, as at the end of training; float32 elsewhere)")
    args = parser.parse_args(argv)
    from gno_ext.training import evaluate_saved

    overrides = {k: v for k, v in (("steps", args.steps), ("split", args.split),
                                   ("max_trajectories", args.max_trajectories),
                                   ("start_frame", args.start_frame)) if v is not None}
    report = evaluate_saved(args.run, args.checkpoint, args.out, overrides, args.device, args.precision,
                            overwrite=args.overwrite)
    n = report["nmse"]
    print(f"{report['trajectories']} trajectories, {report['steps']} steps: nMSE {n['mean']:.4e} +- {n['std']:.4e}, "
          f"worst group {n['worst_group']['label']} {n['worst_group']['nmse_mean']:.4e}; relative L2 "
          f"{report['rel_l2']['mean']:.4e}")
    return report


if __name__ == "__main__":
    import os
    import sys

    from gno_ext._files import DiskFull

    try:
        main()
    except (FileNotFoundError, FileExistsError, ValueError, KeyError, DiskFull) as err:  # a bad path or setting, a full disk: one line
        if os.environ.get("GNO_EXT_DEBUG"):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
