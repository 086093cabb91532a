"""What the `triton.language` rungs compile to for Hopper, checked on the CPU: Triton compiles
for sm_90 without a GPU (ptxas ships with it), so the alignment hints are tested here rather
than on the H100. Without them an N of 1000 turned every load into 2-byte pieces (0.01-0.25x
cuBLAS at 2000 x 1000 x 2000); with them the loads are 16-byte cp.async copies."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from tritongemm.core.epilogue import PLAIN
from tritongemm.primitives.tl import host as _host

KERNELS = ("naive", "grouped", "persistent")
TILE = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)


def compile_ptx(kernel: str, M: int, N: int, K: int, align: tuple) -> str:
    """PTX of a ladder kernel for sm_90, compiled in a fresh process: this one may have
    decorated the kernels for the interpreter (TRITON_INTERPRET=1), which has no compiler."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = json.dumps([kernel, M, N, K, list(align)])
    code = f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_codegen; "
    code += f"print(json.dumps(test_codegen._compile(*json.loads({args!r}))))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _compile(kernel: str, M: int, N: int, K: int, align: list) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tritongemm.ladder import grouped, naive, persistent

    fn = {"naive": naive._naive_kernel, "grouped": grouped._grouped_kernel, "persistent": persistent._persistent_kernel}
    fn = fn[kernel]
    align = tuple(align)
    a, b, c = (torch.empty(r, k, device="meta", dtype=torch.float16) for r, k in ((M, K), (K, N), (M, N)))
    names = ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
    values = (M, N, K, *a.stride(), *b.stride(), *c.stride())
    # No trace, no epilogue: its unused pointers and strides are the integer 0 (_host.planned_launch)
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "alpha": "fp32"}
    unused = ("trace_ptr", "bias_ptr", "residual_ptr", "preact_ptr", "stride_rm", "stride_rn", "stride_pm")
    signature |= dict.fromkeys(unused, "i32")
    constexprs = dict(TILE, INPUT_PRECISION="tf32", INT64=False, TRACE=False, ALIGN=align, **PLAIN.constexprs())
    constexprs |= {"GROUP_SIZE_M": 8} if kernel != "naive" else {}
    constexprs |= {"NUM_SMS": 132} if kernel == "persistent" else {}
    attrs = {}
    for name, value in zip(names, values):  # how Triton specializes integer arguments
        if value == 1:
            constexprs[name] = 1
        else:
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(list(fn.arg_names).index(name),)] = [["tt.divisibility", 16]]
    signature |= {name: "constexpr" for name in constexprs}
    for i in range(3):  # torch allocations are 16-byte aligned
        attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3)).asm["ptx"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_odd_multiple_of_8_shapes_get_16_byte_async_copies(kernel):
    M, N, K = 2000, 1000, 2000
    a, b, c = (torch.empty(r, k, device="meta", dtype=torch.float16) for r, k in ((M, K), (K, N), (M, N)))
    ptx = compile_ptx(kernel, M, N, K, _host.alignment_hints(a, b, c))
    assert re.search(r"cp\.async\.cg\.shared\.global", ptx), "expected 16-byte cp.async loads"
    assert not re.search(r"ld\.global\.b16", ptx), "2-byte loads: the alignment hints were lost"


def test_without_hints_the_loads_are_scalar():
    """The control: the same kernel without the hints is what the H100 ran at 0.01-0.25x (A,
    whose rows are 2000 elements, still gets cp.async; B's rows of 1000 fall to 2-byte loads)."""
    ptx = compile_ptx("naive", 2000, 1000, 2000, (1,) * 9)
    assert re.search(r"ld\.global\.b16", ptx)


@pytest.mark.parametrize(
    "M, N, K, expected",
    [
        (4096, 4096, 4096, (1,) * 9),  # multiples of 16: Triton sees it itself
        (2000, 1000, 2000, (1, 8, 1, 1, 1, 8, 1, 8, 1)),
        (3001, 1001, 1003, (1, 1, 1, 1, 1, 1, 1, 1, 1)),
        (24, 12, 6, (8, 4, 2, 2, 1, 4, 1, 4, 1)),
    ],
)
def test_alignment_hints(M, N, K, expected):
    a, b, c = (torch.empty(r, k, device="meta") for r, k in ((M, K), (K, N), (M, N)))
    assert _host.alignment_hints(a, b, c) == expected


# ---------------------------------------------------------------------------------------------
# Rungs 8 and 10 compile for sm_90 (their launches built as their plans build them)
# ---------------------------------------------------------------------------------------------


def compile_call_ptx(module: str, kernel: str, args: list, meta: dict) -> str:
    """PTX for sm_90 of `module.kernel` called with `args` (("tensor", dtype name) for a pointer to
    a 16-byte aligned tensor, or an int / float), specialized as Triton specializes a launch; in
    a fresh process, as `compile_ptx`."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    spec = json.dumps([module, kernel, args, meta])
    code = f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_codegen; "
    code += f"print(json.dumps(test_codegen._compile_call(*json.loads({spec!r}))))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _compile_call(module: str, kernel: str, args: list, meta: dict) -> str:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(module), kernel)
    options = {name: meta.pop(name) for name in ("num_warps", "num_stages") if name in meta}
    meta = {k: tuple(v) if isinstance(v, list) else v for k, v in meta.items()}
    pointer = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32", "int32": "*i32",
               "float8_e4m3fn": "*fp8e4nv", "float8_e5m2": "*fp8e5"}  # fmt: skip
    signature, constexprs, attrs = {}, dict(meta), {}
    for i, (name, value) in enumerate(zip(fn.arg_names, args)):
        if isinstance(value, list):  # a tensor: a pointer, 16-byte aligned as torch allocates
            signature[name] = pointer[value[1]]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value == 1:
            constexprs[name] = 1
        else:
            signature[name] = "i32" if abs(value) < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    signature |= {name: "constexpr" for name in constexprs}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


@pytest.mark.parametrize(
    "rung, M, N, K",
    [
        ("stream_k", 777, 4096, 4096),  # split tiles: the main kernel and the fix-up
        ("stream_k", 1024, 1024, 64),  # whole tiles only: one launch
        ("swap_ab", 1, 4096, 4096),
        ("swap_ab", 16, 4096, 14336),  # K split: the partials and the reduction
    ],
)
def test_rungs_8_and_10_compile_for_sm90_with_16_byte_copies(rung, M, N, K, monkeypatch):
    import importlib

    from tritongemm.core.config import MatmulConfig
    from tritongemm.primitives.tl import split as _split

    module = importlib.import_module(f"tritongemm.ladder.{rung}")
    launches = []

    def record(kernel, grid, runtime, meta, device):
        args = [["tensor", str(v.dtype)[6:]] if isinstance(v, torch.Tensor) else v for v in runtime]
        launches.append((kernel.fn.__module__, kernel.fn.__name__, args, dict(meta)))
        return lambda *args: None

    for launching in (module, _split, _host):  # every module whose compile_launch a plan reaches
        monkeypatch.setattr(launching, "compile_launch", record)
    a, b, c = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16).T, torch.empty(M, N)
    c = c.to(torch.bfloat16)
    if rung == "swap_ab":
        config = module.default_config(torch.bfloat16, M, N, K, torch.device("cuda"))
    else:
        config = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=3)
    module.plan(a, b, c, config, num_sms=132)
    assert launches
    for mod, name, args, meta in launches:
        ptx = compile_call_ptx(mod, name, args, meta)
        if name in ("_stream_k_kernel", "_swap_ab_kernel"):  # the GEMMs: A and B in 16-byte async copies
            assert re.search(r"cp\.async\.cg\.shared\.global", ptx), f"{name}: no 16-byte cp.async"
