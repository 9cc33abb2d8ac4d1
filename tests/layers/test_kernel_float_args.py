"""The Triton kernels compute in float32, also under `torch.compile`.

Triton's JIT types a Python float argument as float32, but the launchers that inductor
generates for `torch.compile` type it float64, and every value multiplied by it became
float64: the attention kernels ran 5 times slower compiled than eager on an H100. So the
kernels take their float settings (scales, norm epsilons) as compile-time constants. Here each
kernel that has such settings is compiled ahead of time for an H100 (sm_90, no GPU needed), any
float setting that is a run-time argument typed float64 as inductor types it, and its PTX must
hold no float64 arithmetic.
"""

import re
from importlib.util import find_spec

import pytest

pytestmark = pytest.mark.skipif(find_spec("triton") is None, reason="Triton is not installed")

# kernel module, kernel, its float settings, the other constexprs (paper-size values)
BOUNDARY = {"W": 64, "HID": 128, "MP": 32, "G": 1, "BD": 256, "PRECISION": "ieee"}
ATTENTION = {"BQ": 64, "BM": 128, "BD": 32, "PRECISION": "ieee"}
KEY_TILES = {"BQ": 64, "BK": 64, "BD": 32, "PRECISION": "ieee"}
KERNELS = [
    ("attention", "_token_attention_forward", ("SCALE2",), {**KEY_TILES, "BK": 128, "ONE_TILE": True}),
    ("attention", "_token_attention_forward", ("SCALE2",), {**KEY_TILES, "ONE_TILE": False}),
    ("attention", "_token_attention_backward", ("SCALE2", "SCALE"), {**ATTENTION, "WRITE_DQ": True}),
    ("attention", "_token_attention_backward_keys", ("SCALE2", "SCALE"), {**KEY_TILES, "WRITE_KV": True}),
    ("boundary", "_boundary_forward_kernel", ("EPS1", "EPS2", "SCALE"), BOUNDARY),
    ("boundary", "_boundary_backward_kernel", ("EPS1", "EPS2", "SCALE"), BOUNDARY),
]
VALUES = {"SCALE2": 0.255, "SCALE": 0.177, "EPS1": 1e-5, "EPS2": 1e-5}
FLOAT64_ARITHMETIC = re.compile(r"\b(?:add|sub|mul|fma|div|rsqrt|sqrt|ex2|lg2|max|min)(?:\.[a-z]+)*\.f64\b")


def sm90_ptx(fn, floats: tuple[str, ...], constexprs: dict) -> str:
    """PTX of ``fn`` for sm_90: pointers bf16 (float32 where the name says a float32 buffer),
    16-byte aligned; ``floats`` given their `VALUES` where they are constexprs, else typed
    float64 (as inductor types them); other arguments int32."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = {**constexprs, **{p.name: VALUES[p.name] for p in fn.params if p.is_constexpr and p.name in floats}}
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*fp32" if name.split("_")[0] in ("lse", "sums", "grads") else "*bf16"
        else:
            signature[name] = "fp64" if name in floats else "i32"
    missing = set(floats) - set(signature)
    assert not missing, f"{fn.__name__} has no arguments {missing}"
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name.endswith("_ptr")}
    try:
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=aligned),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except (RuntimeError, FileNotFoundError) as error:  # no CUDA back end or assembler in this Triton
        pytest.skip(f"Triton cannot compile for sm_90 here: {error!r:.200}")
    return compiled.asm["ptx"]


@pytest.mark.parametrize("module,kernel,floats,constexprs", KERNELS,
                         ids=[k[1] + {True: "-one-tile", False: "-key-tiles"}.get(k[3].get("ONE_TILE"), "")
                              for k in KERNELS])
def test_kernels_compute_in_float32_under_inductors_argument_types(module, kernel, floats, constexprs):
    import importlib

    fn = getattr(importlib.import_module(f"gno_ext.kernels.{module}"), kernel)
    runtime = [p.name for p in fn.params if p.name in floats and not p.is_constexpr]
    assert not runtime, f"{kernel}: float settings {runtime} are run-time arguments (float64 under inductor)"
    ptx = sm90_ptx(fn, floats, constexprs)
    found = sorted(set(FLOAT64_ARITHMETIC.findall(ptx)))
    assert not found, f"{kernel}: float64 arithmetic in the PTX: {found}"
