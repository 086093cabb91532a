"""Rung 3, persistent: launch one program per SM and let each loop over its tiles.

With grid = min(number of SMs, number of tiles), program p computes tiles p, p + P, p + 2P, ...
(P programs), each mapped through the grouped order of rung 2. Launch and scheduling overhead is
paid once per SM instead of once per tile, and the compiler may overlap one tile's epilogue with
the next tile's loads (flatten=True fuses the tile loop and the K loop into one pipelined loop).
The hints tell the compiler the row / column offsets are contiguous runs starting at a multiple
of the block size, which it needs to emit wide vector loads; out-of-range rows and columns are
clamped to 0 (a valid address) instead of masked, so only K needs a mask on loads.
"""

import torch
import triton
import triton.language as tl

from tritongemm.core.config import MatmulConfig
from tritongemm.primitives.epilogue import apply_tl
from tritongemm.primitives.tiling.tl import grouped_tile
from tritongemm.primitives.tl import host as _host
from tritongemm.primitives.tl.tiles import dot_tile, record_tile, store_tile, tile_offsets


# fmt: off
@triton.jit
def _persistent_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,  # A (M, K), B (K, N), C (M, N)
    # sizes
    M, N, K,
    # strides (elements)
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    # debugging: trace[pid_m, pid_n] = (program, step) when TRACE
    trace_ptr,
    # the fused epilogue (primitives/epilogue.py): bias (N,), residual and pre-activation (M, N), alpha; used where
    # the constexprs say
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    NUM_SMS: tl.constexpr,  # tile-loop stride; the grid is min(NUM_SMS, number of tiles)
    INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr, TRACE: tl.constexpr,
    ALIGN: tl.constexpr,  # what the host knows about alignment: _host.alignment_hints
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):
    # fmt: on
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n

    # 1. Loop over my tiles: start_pid, start_pid + NUM_SMS, ...
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INT64)

        # 2. Clamp the ragged edge to row / column 0 so loads need no M or N mask, then promise
        #    the compiler contiguous, block-aligned runs (true for every tile but the clamped edge,
        #    whose garbage rows are never stored).
        offs_am = tl.where(offs_m < M, offs_m, 0)
        offs_bn = tl.where(offs_n < N, offs_n, 0)
        offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
        offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)

        # 3. Accumulate over K, masking K only.
        acc = dot_tile(
            a_ptr, b_ptr, offs_am, offs_bn, M, N, K,
            stride_am, stride_ak, stride_bk, stride_bn,
            BLOCK_M, BLOCK_N, BLOCK_K, MASK_MN=False, INPUT_PRECISION=INPUT_PRECISION, ALIGN=ALIGN,
        )  # fmt: skip

        # 4. The fused epilogue (compiled out for a plain GEMM), then store, both with the real
        #    (unclamped) offsets.
        acc = apply_tl(
            acc, offs_m, offs_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
            ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
        )  # fmt: skip
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)
        record_tile(trace_ptr, pid_m, pid_n, num_pid_n, start_pid, (tile_id - start_pid) // NUM_SMS, TRACE)


def plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, trace=None, **epilogue):
    """`launch(a, b, c)` for tensors of this geometry, compiled once (see _host.planned_launch);
    `epilogue`: the fused epilogue's spec, bias and residual (_host.planned_launch's keywords)."""
    num_sms = _host.sm_count(c.device)
    grid = (min(num_sms, config.num_tiles(*c.shape)),)
    constexprs = {"NUM_SMS": num_sms, **_host.common_constexprs(a, b, c), **config.meta()}
    return _host.planned_launch(_persistent_kernel, grid, a, b, c, constexprs, trace, **epilogue)


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, trace=None) -> None:
    plan(a, b, c, config, trace)(a, b, c)
