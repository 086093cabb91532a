"""Rung 1, naive: a 2D grid of programs, one output tile each.

Program (pid_m, pid_n) computes the BLOCK_M x BLOCK_N tile of C at row pid_m, column pid_n,
streaming BLOCK_K-wide strips of A and B through one tl.dot per step. The hardware launches
axis 0 fastest, so consecutive programs walk down a column of C: each one re-reads the same
B column-panel (good) but a different A row-panel (that reuse is what rung 2 improves).
"""

import torch
import triton
import triton.language as tl

from tritongemm.core.config import MatmulConfig
from tritongemm.primitives.epilogue import apply_tl
from tritongemm.primitives.tl import host as _host
from tritongemm.primitives.tl.tiles import dot_tile, record_tile, store_tile, tile_offsets


# fmt: off
@triton.jit
def _naive_kernel(
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
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr, TRACE: tl.constexpr,
    ALIGN: tl.constexpr,  # what the host knows about alignment: _host.alignment_hints
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):
    # fmt: on
    # 1. Which output tile am I? The grid is (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INT64)

    # 2. Accumulate the tile over K in fp32, masking on all three axes.
    acc = dot_tile(
        a_ptr, b_ptr, offs_m, offs_n, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, MASK_MN=True, INPUT_PRECISION=INPUT_PRECISION, ALIGN=ALIGN,
    )  # fmt: skip

    # 3. The fused epilogue (a plain GEMM compiles it out), then cast to C's dtype and store the
    #    in-bounds part.
    acc = apply_tl(
        acc, offs_m, offs_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
        ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
    )  # fmt: skip
    store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)
    record_tile(trace_ptr, pid_m, pid_n, tl.num_programs(1), pid_m + pid_n * tl.num_programs(0), 0, TRACE)


_MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y (gridDim.x goes to 2**31 - 1)


def plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, trace=None, **epilogue):
    """`launch(a, b, c)` for tensors of this geometry, compiled once (see _host.planned_launch);
    `epilogue`: the fused epilogue's spec, bias and residual (_host.planned_launch's keywords)."""
    M, N = c.shape
    grid = (triton.cdiv(M, config.BLOCK_M), triton.cdiv(N, config.BLOCK_N))
    if grid[1] > _MAX_GRID_Y:  # the launch would fail with a bare "invalid argument"
        raise ValueError(
            f"naive: N = {N} makes {grid[1]} column tiles of BLOCK_N = {config.BLOCK_N}, but a CUDA grid's "
            f"second axis holds at most {_MAX_GRID_Y}; use a larger BLOCK_N or a 1D-grid kernel ('grouped')"
        )
    tile = dict(BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K)
    options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    constexprs = {**tile, **_host.common_constexprs(a, b, c), **options}
    return _host.planned_launch(_naive_kernel, grid, a, b, c, constexprs, trace, **epilogue)


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, trace=None) -> None:
    plan(a, b, c, config, trace)(a, b, c)
