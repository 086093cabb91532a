"""Rung 5: the pipelined TMA/WGMMA kernel made persistent.

Idea: launch one program per SM and let each loop over its tiles, in the order a tile scheduler
(primitives/tiling/gluon.py: chunked or grouped-strided) gives. What carries over between tiles is the state
that is costly or awkward to rebuild: the mbarriers (initialized once, their phases tracked by the
program-wide producer/consumer counters) and the MMA accumulator registers. Each tile still runs
prologue -> steady state -> drain -> epilogue in turn; rung 6 overlaps those across tiles.

The operand ring is allocated inside the tile loop and C after the K loop, so the allocator sees
disjoint live ranges and overlaps them: 4 buffers of 128x256x64 fp16 (192 KB) still leave room
for the 64 KB C tile because C reuses ring memory. The price is the `store_wait` at the end of
each tile: the next tile's loads may not land in C's bytes before the store has read them.
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
    issue_loads,
    issue_mma,
    require_sm90,
    store_tile,
)
from tritongemm.primitives.tiling.gluon import num_persistent_programs, scheduler_for


@gluon.jit
def _tma_persistent_kernel(
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
    Scheduler: gl.constexpr,  # a class from primitives/tiling/gluon.py
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
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0] if A_M_MAJOR else a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    K = a_desc.shape[0] if A_M_MAJOR else a_desc.shape[1]
    gl.static_assert(NUM_BUFFERS >= 2, "one slot is read by the MMA in flight while the next one loads")

    # 1. Per-program state, reused by every tile: barriers, counters, accumulator, schedule.
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS * BARRIERS_PER_SLOT, 1], mbarrier.MBarrierLayout())
    init_barriers(ready)
    producer = 0
    consumer = 0
    mma = WGMMA.initialize(dtype, BLOCK_M, BLOCK_N, num_warps)
    scheduler = Scheduler.initialize(c_desc.shape[0], c_desc.shape[1], BLOCK_M, BLOCK_N)

    for idx in range(scheduler.get_num_tiles()):
        pid_m, pid_n = scheduler.get_tile(idx)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N

        # 2. The operand ring, scoped to this tile so that C may reuse its memory.
        a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)

        # 3. Prologue, steady state and drain: as in rung 4.
        for k in gl.static_range(0, (NUM_BUFFERS - 2) * BLOCK_K, BLOCK_K):
            producer = issue_loads(
                producer, a_desc, b_desc, off_m, off_n, k, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR
            )
        for k in range((NUM_BUFFERS - 2) * BLOCK_K, K, BLOCK_K):
            producer = issue_loads(
                producer, a_desc, b_desc, off_m, off_n, k, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR
            )
            consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
        for _ in gl.static_range(NUM_BUFFERS - 2):
            consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
        mma = mma.wait_num_outstanding(0)

        # 4. Epilogue; the wait keeps the next tile's loads off C's bytes while TMA reads them.
        c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
        acc, mma = mma.take_result()
        acc = apply_gl(
            acc, off_m, off_n, c_desc.shape[0], c_desc.shape[1], bias_ptr, residual_ptr, preact_ptr, stride_rm,
            stride_rn, stride_pm, alpha, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
        )  # fmt: skip
        store_tile(acc, c_desc, c_smem, off_m, off_n)
        tma.store_wait(pendings=0)

    invalidate_barriers(ready)


def plan(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    config: MatmulConfig,
    *,
    num_programs: int | None = None,
    **epilogue,
):
    """`launch(a, b, c)` for tensors of this geometry: min(#SMs, #tiles) programs looping over tiles
    in `config.scheduler` order, checked and compiled once (descriptors.planned_launch, whose keywords `epilogue`
    passes on: the fused epilogue's spec, bias and residual).
    `num_programs` replaces the SM count (tests: several tiles per program on small shapes)."""
    require_sm90("tma_persistent", c.device)
    check_wgmma_tile("tma_persistent", config)
    M, N = c.shape
    check_sequential_fits("tma_persistent", config, a.element_size())
    desc = make_descriptors(a, b, c, config.BLOCK_M, config.BLOCK_N, config.BLOCK_K)
    num_tiles = config.num_tiles(M, N)
    grid = (num_persistent_programs(num_tiles, c.device, num_programs),)
    constexprs = dict(
        Scheduler=scheduler_for(config.scheduler, config.GROUP_SIZE_M),
        NUM_BUFFERS=config.num_stages, BARRIERS_PER_SLOT=barriers_per_slot(),
        **desc.layout_constexprs(), num_warps=config.num_warps,
    )  # fmt: skip
    return planned_launch(_tma_persistent_kernel, grid, desc, constexprs, c, **epilogue)


def launch(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, *, num_programs: int | None = None
) -> None:
    plan(a, b, c, config, num_programs=num_programs)(a, b, c)
