"""Rung 2, grouped: a 1D grid whose program ids are swizzled into groups for L2 reuse.

Same tile computation as rung 1; only the numbering changes. Programs that run at the same time
should share operands: with GROUP_SIZE_M rows per group, consecutive programs walk down a column
of GROUP_SIZE_M tiles before moving right, so a wave of programs touches about GROUP_SIZE_M A
row-panels and a handful of B column-panels instead of one A panel per program.
GROUP_SIZE_M = 1 is plain row-major order on a 1D grid.

`config="autotune"` picks among the five configurations of the seed lesson, per (M, N, K).
"""

import threading

import torch
import triton
import triton.language as tl

from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import PLAIN, Epilogue
from tritongemm.primitives.epilogue import apply_tl
from tritongemm.primitives.tiling.tl import grouped_tile
from tritongemm.primitives.tl import host as _host
from tritongemm.primitives.tl.tiles import dot_tile, record_tile, store_tile, tile_offsets


# fmt: off
@triton.jit
def _grouped_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,  # A (M, K), B (K, N), C (M, N)
    # sizes
    M, N, K,
    # strides (elements)
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    # debugging: trace[pid_m, pid_n] = (program, 0) when TRACE
    trace_ptr,
    # the fused epilogue (primitives/epilogue.py): bias (N,), residual and pre-activation (M, N), alpha; used where
    # the constexprs say
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr, TRACE: tl.constexpr,
    ALIGN: tl.constexpr,  # what the host knows about alignment: _host.alignment_hints
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):
    # fmt: on
    # 1. Which output tile am I? One program id, mapped through the grouped order.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)
    offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INT64)

    # 2. Accumulate over K, exactly as in rung 1.
    acc = dot_tile(
        a_ptr, b_ptr, offs_m, offs_n, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, MASK_MN=True, INPUT_PRECISION=INPUT_PRECISION, ALIGN=ALIGN,
    )  # fmt: skip

    # 3. The fused epilogue (compiled out for a plain GEMM), then store.
    acc = apply_tl(
        acc, offs_m, offs_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
        ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
    )  # fmt: skip
    store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)
    record_tile(trace_ptr, pid_m, pid_n, num_pid_n, pid, 0, TRACE)


# The seed lesson's five configurations, each aimed at one family of shapes. All use GROUP_SIZE_M=8.
LESSON_CONFIGS = (
    MatmulConfig(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4),  # large M, small N
    MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_warps=4, num_stages=3),  # square, mid-range
    MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3),  # square, mid-range
    MatmulConfig(BLOCK_M=64, BLOCK_N=256, BLOCK_K=32, num_warps=8, num_stages=4),  # large N
    MatmulConfig(BLOCK_M=256, BLOCK_N=128, BLOCK_K=32, num_warps=8, num_stages=3),  # small K, wide tiles
)

_autotuned_kernel = triton.autotune(
    configs=[
        triton.Config(
            {"BLOCK_M": c.BLOCK_M, "BLOCK_N": c.BLOCK_N, "BLOCK_K": c.BLOCK_K, "GROUP_SIZE_M": c.GROUP_SIZE_M},
            num_warps=c.num_warps,
            num_stages=c.num_stages,
        )
        for c in LESSON_CONFIGS
    ],
    key=["M", "N", "K"],
)(_grouped_kernel)


# triton.autotune keeps the call in progress on the Autotuner (self.nargs, set to None when a call
# ends), so calls from several threads at once break each other's benchmarking: one at a time.
_AUTOTUNE_LOCK = threading.Lock()


def plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig | str, trace=None, **epilogue):
    """`launch(a, b, c)` for tensors of this geometry, compiled once (see _host.planned_launch);
    with config="autotune" the autotuner still chooses per call. `epilogue`: the fused
    epilogue's spec, bias and residual (_host.planned_launch's keywords)."""
    if config == "autotune":
        spec = epilogue.get("epilogue", PLAIN)
        return lambda a, b, c, *tensors: _launch_autotuned(a, b, c, trace, spec, *tensors)
    grid = (config.num_tiles(*c.shape),)
    constexprs = {**_host.common_constexprs(a, b, c), **config.meta()}
    return _host.planned_launch(_grouped_kernel, grid, a, b, c, constexprs, trace, **epilogue)


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig | str, trace=None) -> None:
    plan(a, b, c, config, trace)(a, b, c)


def _launch_autotuned(a, b, c, trace, spec: Epilogue = PLAIN, bias=None, residual=None, preact=None) -> None:
    M, N = c.shape
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    trace_ptr = 0 if trace is None else trace
    epilogue_args = (*spec.pointers(bias, residual, preact), *spec.fixed_args(residual, preact))
    meta = {**_host.common_constexprs(a, b, c), **spec.constexprs(), "TRACE": trace is not None}
    with _AUTOTUNE_LOCK:
        _autotuned_kernel[grid](*_host.gemm_args(a, b, c), trace_ptr, *epilogue_args, **meta)
