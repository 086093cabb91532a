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

from tritongemm.epilogue import PLAIN
from tritongemm.ladder import _host

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
