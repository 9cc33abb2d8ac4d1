"""Print the observed convergence orders of every solver as a Markdown table.

    python recipes/solver_convergence.py [CASE ...]

The cases (exact solutions, refinements) are `gno_ext.solvers.verification.CASES`; the test
suite asserts the same orders.
"""

from __future__ import annotations

import sys
import time

from gno_ext.solvers.verification import CASES


def main(names: list[str]) -> None:
    print("| case | refinement | errors (RMS) | observed orders | design order |")
    print("| --- | --- | --- | --- | --- |")
    for name in names or list(CASES):
        case = CASES[name]
        start = time.perf_counter()
        errors, orders = case.run()
        print(f"| {case.description} | {', '.join(map(str, case.resolutions))} | "
              f"{', '.join(f'{e:.2e}' for e in errors)} | {', '.join(f'{p:.2f}' for p in orders)} | "
              f"{case.expected:g} |", flush=True)
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
