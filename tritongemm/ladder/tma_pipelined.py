"""Rung 4: TMA + WGMMA, software-pipelined over K. One program per output tile.

Idea: keep the copy engine and the tensor cores busy at the same time. A ring of `num_stages`
shared-memory buffers is filled by TMA (completion signalled on one mbarrier per slot) while
WGMMA consumes the slot filled earlier; loads run `num_stages - 2` K-steps ahead (see
pipeline.py for why 2). The tile leaves through a TMA store. At M = N = 8192 on this repo's
H100 it ran at 0.88x (K = 1024) to 0.99x (K = 16384) of cuBLAS's TFLOP/s in bf16: every tile pays
its own prologue, drain and store, which small K cannot amortize.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from tritongemm.core.config import MatmulConfig
from tritongemm.primitives.epilogue import apply_gl
from tritongemm.primitives.gluon.descriptors import make_descriptors, planned_launch
from tritongemm.primitives.gluon.mma import WGMMA
from tritongemm.primitives.gluon.pipeline import (
    barriers_per_slot,
    check_sequential_fits,
    check_wgmma_tile,
    init_barriers,
    invalidate_barriers,
    mma_over_k,
    require_sm90,
    store_tile,
)


@gluon.jit
def _tma_pipelined_kernel(
    # TMA descriptors
    a_desc,  # (M, K) block [BLOCK_M, BLOCK_K]; (K, M) block [BLOCK_K, BLOCK_M] if A_M_MAJOR
    b_desc,  # (K, N) block [BLOCK_K, BLOCK_N]; (N, K) block [BLOCK_N, BLOCK_K] if B_K_MAJOR
    c_desc,  # (M, N), block [BLOCK_M, BLOCK_N]
    # the fused epilogue (primitives/epilogue.py): bias (N,), residual and pre-activation (M, N), alpha; used where
    # the constexprs say
    bias_ptr,
    residual_ptr,
    preact_ptr,
    stride_rm,
    stride_rn,
    stride_pm,
    alpha,
    # meta-parameters
    NUM_BUFFERS: gl.constexpr,
    BARRIERS_PER_SLOT: gl.constexpr,  # 1; 2 under ConSan (pipeline.barriers_per_slot)
    A_M_MAJOR: gl.constexpr,
    B_K_MAJOR: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_ALPHA: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    K = a_desc.shape[0] if A_M_MAJOR else a_desc.shape[1]
    gl.static_assert(NUM_BUFFERS >= 2, "one slot is read by the MMA in flight while the next one loads")

    # 1. The tile of this program, in column-major launch order like the naive rung's 2D grid,
    #    but from a 1D grid: a grid's y axis stops at 65535 programs (N > 16.7M at BLOCK_N = 256).
    pid = gl.program_id(axis=0)
    num_pid_m = gl.cdiv(c_desc.shape[0], BLOCK_M)
    off_m = (pid % num_pid_m) * BLOCK_M
    off_n = (pid // num_pid_m) * BLOCK_N

    # 2. The operand ring and its barriers.
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS * BARRIERS_PER_SLOT, 1], mbarrier.MBarrierLayout())
    init_barriers(ready)
    mma = WGMMA.initialize(dtype, BLOCK_M, BLOCK_N, num_warps)

    # 3. Prologue, steady state, drain (pipeline.mma_over_k): the prologue fills all but two slots
    #    (the MMA in flight and the next load); each steady step issues one load and one MMA; the
    #    drain consumes what the prologue got ahead. Loads past K come back as zeros from TMA.
    mma = mma_over_k(mma, a_desc, b_desc, off_m, off_n, 0, K, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
    invalidate_barriers(ready)

    # 4. Epilogue: the fused one (primitives/epilogue.py), then the store. C's buffer is allocated
    #    after the loop, so the allocator may overlap it with the dead ring.
    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    acc, mma = mma.take_result()
    acc = apply_gl(
        acc, off_m, off_n, c_desc.shape[0], c_desc.shape[1], bias_ptr, residual_ptr, preact_ptr, stride_rm,
        stride_rn, stride_pm, alpha, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
    )  # fmt: skip
    store_tile(acc, c_desc, c_smem, off_m, off_n)
    tma.store_wait(pendings=0)


def plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, **epilogue):
    """`launch(a, b, c)` for tensors of this geometry: one program per BLOCK_M x BLOCK_N tile of c
    (see module docstring), checked and compiled once (descriptors.planned_launch, whose keywords `epilogue`
    passes on: the fused epilogue's spec, bias and residual)."""
    require_sm90("tma_pipelined", c.device)
    check_wgmma_tile("tma_pipelined", config)
    M, N = c.shape
    check_sequential_fits("tma_pipelined", config, a.element_size())
    desc = make_descriptors(a, b, c, config.BLOCK_M, config.BLOCK_N, config.BLOCK_K)
    grid = (config.num_tiles(M, N),)
    constexprs = dict(
        NUM_BUFFERS=config.num_stages, BARRIERS_PER_SLOT=barriers_per_slot(),
        **desc.layout_constexprs(), num_warps=config.num_warps,
    )  # fmt: skip
    return planned_launch(_tma_pipelined_kernel, grid, desc, constexprs, c, **epilogue)


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig) -> None:
    plan(a, b, c, config)(a, b, c)
