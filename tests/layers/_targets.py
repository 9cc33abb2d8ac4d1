"""Compiling gno_ext's Triton kernels for a CUDA target on a machine without a GPU, to read
the shared memory each program needs (what Triton checks against the device's limit when it
loads a kernel, raising ``OutOfResources`` above it).

`recording` replaces the modules' launcher (``launch``) so that calling an operator's Python
launch function on CPU tensors records the launches it would make, with their compile-time
constants and launch options, instead of running them; `shared_memory` compiles one recorded
launch for a target architecture, and `assert_fit` checks recorded launches against a target's
limit.
"""

import contextlib

import torch

# Opt-in shared memory per program (bytes) of three GPU generations: A100 (sm80), Ada
# (sm89: L40S, RTX 4090) and H100/H200 (sm90)
LIMITS = {80: 166912, 89: 101376, 90: 232448}
_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
          torch.int64: "*i64"}


@contextlib.contextmanager
def recording(*modules):
    """Within the block, the modules' kernel launches are appended to the yielded list as
    ``(kernel, args, kwargs)`` instead of running."""
    launches = []

    def launch(kernel):
        class Grid:
            def __getitem__(self, grid):
                return lambda *args, **kwargs: launches.append((kernel, args, kwargs))
        return Grid()

    saved = [m.launch for m in modules]
    for m in modules:
        m.launch = launch
    try:
        yield launches
    finally:
        for m, old in zip(modules, saved):
            m.launch = old


def shared_memory(kernel, args, kwargs, arch: int) -> int:
    """Bytes of shared memory that one program of the recorded launch needs, compiled by Triton
    for CUDA compute capability ``arch`` (80, 89, 90)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    runtime = [p for p in kernel.params if not p.is_constexpr]
    signature = {p.name: _TYPES[a.dtype] if torch.is_tensor(a) else "i32" for p, a in zip(runtime, args)}
    signature.update({p.name: "constexpr" for p in kernel.params if p.is_constexpr})
    constants = {p.name: kwargs[p.name] for p in kernel.params if p.is_constexpr}
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options).metadata.shared


def assert_fit(launches, arch: int, seen: set | None = None) -> None:
    """Assert that every recorded launch, compiled for ``arch``, needs some shared memory and
    no more than `LIMITS` allows there. Launches whose program was checked before (the same
    kernel, operand types and compile-time constants, kept in ``seen``) are not compiled again."""
    seen = set() if seen is None else seen
    for kernel, args, kwargs in launches:
        key = (kernel.fn.__name__, tuple(a.dtype for a in args if torch.is_tensor(a)), tuple(sorted(kwargs.items())))
        if key not in seen:
            seen.add(key)
            need = shared_memory(kernel, args, kwargs, arch)
            assert 0 < need <= LIMITS[arch], (key, need, LIMITS[arch])
