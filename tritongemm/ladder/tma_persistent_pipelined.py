"""Rung 6: the persistent kernel pipelined across tiles.

Idea: a persistent program knows its next tile, so nothing has to stop between tiles. The first
NUM_BUFFERS - 1 loads of tile t + 1 are issued during the last MMAs of tile t (the next tile's
prologue is peeled into this tile's drain), and the TMA store of tile t runs while tile t + 1
computes: its `store_wait` moves to the next epilogue. Small K gains most, as the per-tile
prologue/epilogue is a larger share there: on this repo's H100, 8192 x 8192 x 1024 bf16 ran at
652 TFLOP/s against 600 for rung 5 and 681 for cuBLAS (0.96x; 1.00-1.05x from K = 2048 up).

Overlapping the store keeps the C staging tile alive next to the whole operand ring. When both
do not fit (128x256x64 fp16 with 4 buffers: 4 x 48 KB + 64 KB > 227 KB), C is staged in B
slots instead (`STEAL_B`, see pipeline.py): at the epilogue exactly the B slots the next loads
will fill are free, so the ring gets EPI_SPLIT - 1 extra B slots and the next tile waits for the
store just before its first new load.

The tensor-core step is the constexpr `MMA` (mma.py's interface): WGMMA on Hopper, tcgen05 on
Blackwell, where C is always staged whole (docs/blackwell.md; compiled for sm_100, never run).

A gated pair (`glu`, blocks/gated_pair.py; WGMMA): as in rung 9, each B slot holds the gate's box
above the up projection's and the epilogue stores act(gate) * up, half the MMA's width, from a C
buffer of its own (never B's slots). Checked and timed on the H100 (docs/blocks.md).
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from tritongemm.core.config import MatmulConfig
from tritongemm.primitives.epilogue import apply_gl, gated_gl
from tritongemm.primitives.gluon.descriptors import make_descriptors, planned_launch
from tritongemm.primitives.gluon.mma import mma_for
from tritongemm.primitives.gluon.pipeline import (
    barriers_per_slot,
    check_gated_pair,
    check_mma_tile,
    init_barriers,
    invalidate_barriers,
    issue_loads,
    issue_mma,
    plan_ring,
    refuse_c_pieces_for_tcgen05,
    store_tile,
    store_tile_in_b_slots,
)
from tritongemm.primitives.tiling.gluon import num_persistent_programs, scheduler_for


@gluon.jit
def _tma_persistent_pipelined_kernel(
    # TMA descriptors
    a_desc,  # (M, K) block [BLOCK_M, BLOCK_K]; (K, M) block [BLOCK_K, BLOCK_M] if A_M_MAJOR
    b_desc,  # (K, N) block [BLOCK_K, BLOCK_N]; (N, K) block [BLOCK_N, BLOCK_K] if B_K_MAJOR
    c_desc,  # (M, N), block [BLOCK_M, BLOCK_N // EPI_SPLIT]: one epilogue piece
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
    MMA: gl.constexpr,  # the tensor-core step: mma.WGMMA (Hopper) or tcgen05.TCGen05MMA (Blackwell)
    Scheduler: gl.constexpr,  # a class from primitives/tiling/gluon.py
    NUM_BUFFERS: gl.constexpr,
    BARRIERS_PER_SLOT: gl.constexpr,  # 1; 2 under ConSan (pipeline.barriers_per_slot)
    STEAL_B: gl.constexpr,  # stage C in free B slots instead of a buffer of its own
    A_M_MAJOR: gl.constexpr,
    B_K_MAJOR: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_ALPHA: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    GLU: gl.constexpr,  # "none", or a gated pair's activation: C = act(A @ W[:N].T) * (A @ W[N:2N].T)
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1] if A_M_MAJOR else a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0] if A_M_MAJOR else a_desc.block_type.shape[1]
    # A gated pair's B slot holds two of b_desc's boxes, the gate's rows above the up projection's
    # (pipeline.issue_loads); the MMA covers both, C's tile is half its width (act(gate) * up).
    B_BOXES: gl.constexpr = 2 if GLU != "none" else 1
    BLOCK_N: gl.constexpr = B_BOXES * (b_desc.block_type.shape[0] if B_K_MAJOR else b_desc.block_type.shape[1])
    TILE_N: gl.constexpr = BLOCK_N // B_BOXES  # C's columns per tile
    EPI_SPLIT: gl.constexpr = TILE_N // c_desc.block_type.shape[1]
    NUM_B_BUFFERS: gl.constexpr = NUM_BUFFERS + EPI_SPLIT - 1 if STEAL_B else NUM_BUFFERS
    dtype: gl.constexpr = a_desc.dtype
    K = a_desc.shape[0] if A_M_MAJOR else a_desc.shape[1]
    N = c_desc.shape[1]
    gl.static_assert(NUM_BUFFERS >= 2, "one slot is read by the MMA in flight while the next one loads")
    gl.static_assert(STEAL_B or EPI_SPLIT == 1, "only the stolen-B epilogue stores C in pieces")
    gl.static_assert(B_BOXES == 1 or not STEAL_B, "a gated pair stages C in a buffer of its own")

    # 1. Per-program state. Ring and C live for the whole program: their lifetimes now overlap.
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    if B_BOXES == 2:
        B_BOX: gl.constexpr = b_desc.block_type.shape
        b_bufs = gl.allocate_shared_memory(dtype, [NUM_B_BUFFERS, 2 * B_BOX[0], B_BOX[1]], b_desc.layout)
    else:
        b_bufs = gl.allocate_shared_memory(dtype, [NUM_B_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    if not STEAL_B:
        c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS * BARRIERS_PER_SLOT, 1], mbarrier.MBarrierLayout())
    init_barriers(ready)
    producer = 0
    consumer = 0
    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, num_warps)
    scheduler = Scheduler.initialize(c_desc.shape[0], N, BLOCK_M, TILE_N)
    num_tiles = scheduler.get_num_tiles()

    # 2. Prologue of the first tile: its first NUM_BUFFERS - 1 K-steps (past K: zero-filled).
    #    Predicated, so that a program without tiles leaves no copy in flight when it exits.
    #    (A gated pair's up rows start C's width on: the weight is [gate; up], (2N, K).)
    pid_m, pid_n = scheduler.get_tile(0)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * TILE_N
    has_work = num_tiles > 0
    for ki in gl.static_range(NUM_BUFFERS - 1):
        k0 = ki * BLOCK_K
        producer = issue_loads(
            producer, a_desc, b_desc, off_m, off_n, k0, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR, has_work, N
        )

    for idx in range(num_tiles):
        # 3. First K-step, loaded one tile ago; then the previous C must have left the B slots
        #    that the next loads fill.
        consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
        if STEAL_B:
            tma.store_wait(pendings=0)

        # 4. Steady state: one load and one MMA per K-step.
        for k in range((NUM_BUFFERS - 1) * BLOCK_K, K, BLOCK_K):
            producer = issue_loads(
                producer, a_desc, b_desc, off_m, off_n, k, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR, True, N
            )
            consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)

        # 5. Drain this tile's last MMAs while the next tile's prologue loads go out.
        out_m = off_m
        out_n = off_n
        has_next = idx + 1 < num_tiles
        pid_m, pid_n = scheduler.get_tile(gl.minimum(idx + 1, num_tiles - 1))  # stay in range when last
        off_m = pid_m * BLOCK_M
        off_n = pid_n * TILE_N
        for ki in gl.static_range(NUM_BUFFERS - 1):
            k0 = ki * BLOCK_K
            producer = issue_loads(
                producer, a_desc, b_desc, off_m, off_n, k0, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR, has_next, N
            )
            if ki < NUM_BUFFERS - 2:  # the last of these loads has no MMA left to pair with
                consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
        mma = mma.wait_num_outstanding(0)

        # 6. Epilogue, overlapped with the next tile's loads (in flight) and MMAs (after it).
        acc, mma = mma.take_result()
        if B_BOXES == 2:
            acc = gated_gl(acc, GLU)
        else:
            acc = apply_gl(
                acc, out_m, out_n, c_desc.shape[0], N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn,
                stride_pm, alpha, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
            )  # fmt: skip
        if STEAL_B:
            # Free now: the EPI_SPLIT B slots from `producer` on (NUM_BUFFERS - 1 are loading).
            store_tile_in_b_slots(acc, c_desc, b_bufs, producer, out_m, out_n)
        else:
            tma.store_wait(pendings=0)  # the previous tile's store has read c_smem
            store_tile(acc, c_desc, c_smem, out_m, out_n)

    tma.store_wait(pendings=0)
    invalidate_barriers(ready)


def plan(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    config: MatmulConfig,
    *,
    num_programs: int | None = None,
    glu: str | None = None,
    scheduler=None,
    **epilogue,
):
    """`launch(a, b, c)` for tensors of this geometry: min(#SMs, #tiles) programs pipelined across
    their tiles in `config.scheduler` order, checked and compiled once (descriptors.planned_launch,
    whose keywords `epilogue` passes on: the fused epilogue's spec, bias and residual).
    `num_programs` replaces the SM count (tests: several tiles per program). `glu`: a gated pair,
    C = act(A @ B[:, :N]) * (A @ B[:, N:]) for C (M, N) and b the transpose of a (2N, K) weight
    [gate; up] (pipeline.check_gated_pair), C staged in a buffer of its own. `scheduler`: a class
    of primitives/tiling/gluon.py in the place of `config.scheduler`'s (distributed/gathered.py's, which waits
    for rows still in flight)."""
    name = "tma_persistent_pipelined"
    gated = glu is not None
    if gated:
        check_gated_pair(name, a, b, c, config, glu, epilogue)
    mma = mma_for(name, c.device)
    check_mma_tile(name, config, mma)
    M, N = c.shape
    ring = plan_ring(config, a.element_size(), gated=gated)
    if ring.steal_b:  # C in B's slots, in column pieces
        refuse_c_pieces_for_tcgen05(name, config, a.element_size(), mma)
    tile_n = config.BLOCK_N // 2 if gated else config.BLOCK_N  # C's columns per tile; a gated B box's rows
    desc = make_descriptors(a, b, c, config.BLOCK_M, tile_n, config.BLOCK_K, epi_split=ring.epi_split)
    num_tiles = -(-M // config.BLOCK_M) * -(-N // tile_n)
    grid = (num_persistent_programs(num_tiles, c.device, num_programs),)
    constexprs = dict(
        MMA=mma, Scheduler=scheduler or scheduler_for(config.scheduler, config.GROUP_SIZE_M),
        NUM_BUFFERS=config.num_stages, BARRIERS_PER_SLOT=barriers_per_slot(),
        STEAL_B=ring.steal_b, **desc.layout_constexprs(), GLU=glu or "none",
        num_warps=config.num_warps,
    )  # fmt: skip
    return planned_launch(_tma_persistent_pipelined_kernel, grid, desc, constexprs, c, **epilogue)


def launch(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, *, num_programs: int | None = None,
    glu: str | None = None,
) -> None:  # fmt: skip
    plan(a, b, c, config, num_programs=num_programs, glu=glu)(a, b, c)
