"""Running Triton kernels in Triton's CPU interpreter, for the kernel tests.

The interpreter is chosen when the kernels are defined (``TRITON_INTERPRET=1`` at import), so
each script runs in a process of its own.
"""

import os
import subprocess
import sys
import textwrap

import pytest

PROBE = """
import sys
import torch
import triton
import triton.language as tl


@triton.jit
def _double(x_ptr, n, BLOCK: tl.constexpr):
    for i in range(0, n, BLOCK):
        x = tl.load(x_ptr + i + tl.arange(0, BLOCK))
        tl.store(x_ptr + i + tl.arange(0, BLOCK), 2 * x)


try:  # some Triton releases' interpreters fail with newer numpy (Triton 3.6 with numpy 2.4)
    _double[(1,)](torch.ones(32), 32, BLOCK=16)
except Exception as error:
    print(f"INTERPRETER UNAVAILABLE: Triton {triton.__version__}: {error!r}")
    sys.exit(0)
"""


def run_interpreted(script: str, done_marker: str) -> None:
    """Run ``script`` under Triton's interpreter; fail with its error output if it fails or
    does not print ``done_marker``, skip (with the reason) where the interpreter cannot run."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    source = textwrap.dedent(PROBE) + textwrap.dedent(script)
    done = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    if "INTERPRETER UNAVAILABLE" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done_marker in done.stdout, done.stdout[-3000:]
