"""The block-scaled fp8 rung: rung 9's warp-specialized persistent kernel with DeepSeek-V3's
promotion, each K-step's scales loaded a step ahead.

Block scales change every 128 elements of K (fp8/recipes.py), so each 128-wide K-step is its own
MMA into a fresh accumulator, and its product is scaled by scale_a[m, kb] * scale_b[n // 128, kb]
and added to an fp32 sum in registers (docs/fp8.md). fp8_tma's block path does that too, and ran
at 0.50-0.57x torch's block-wise _scaled_mm on the H100: after each step's MMA its warps loaded
that step's scales from global memory and waited for them, with nothing else to do, while the
tensor cores idled. Here:

  * the scales of step kb + 1 are loaded while step kb multiplies, so the promotion finds them
    in registers. Each step first multiplies its own scales out (scale_a[m, kb] * scale_b[n, kb],
    one number a row and column piece), and only then loads the next step's into the registers
    they leave free. Loaded before that, the next scales had needed registers of their own, and
    ptxas copied them over at the end of the step, a copy that waits for the load: the loads then
    sat in the middle of the step and that wait on global memory in every step (Nsight Compute's
    source view: 12% of the warps' stall samples, the tensor cores idle meanwhile). Multiplying
    first took the wide tile from 0.92-0.97x to 0.94-1.00x torch's at M >= 2048 (two H100s, three
    interleaved rounds each, results/h100/probes/fp8/fp8-block-scale-registers.csv and -2.csv);
  * two warpgroups split the tile's 128 rows, each a partition of its own (`consumers_for`), so
    while one promotes the other's MMA keeps the tensor cores busy (DeepGEMM's schedule; CUTLASS's
    fp8 promotion also waits for each interval's MMAs before it adds). Both had first been one
    partition of 8 warps: the compiler then puts a barrier of all 256 threads before each wait on
    the ring and before each release, so both warpgroups promoted at the same moments, with the
    tensor cores idle. As partitions, each waits for and releases every slot itself (`empty`
    counts one arrival per consumer), and their barriers are a warpgroup's: 0.95x torch's
    block-wise _scaled_mm at M >= 2048 where one partition gave 0.93x (H100, 5 rounds,
    results/h100/probes/fp8/fp8-block-partitions.csv);
  * the tile is 128 x 256 (a quarter less L2 traffic per FLOP than 128 x 128: 0.95x torch's
    against 0.86x, both as partitions; cuBLAS's block-wise kernel is 128 x 128, with two CTAs of a
    cluster sharing their loads, as the cluster below does from Triton 3.8). A warpgroup's
    64 x 256 sum and an MMA accumulator beside it would take 256 registers a thread, more than
    there are, so each K-step is two MMAs of 64 x 128, one per column half, each promoted into
    its half's sum as it retires, from the same A tile: three fp32 tiles of 64 registers. Each
    half lies in one of the weight's 128 x 128 scale blocks, so its scale_b is one number a step
    and the promotion one fused multiply-add an element. Tiles up to 128 wide are one MMA a step;
  * rung 9's shape (tma_warp_specialized.py): a load warp runs ahead through the ring (its
    `_load_partition`, unchanged), each slot goes back once the MMAs reading it have retired,
    and the programs are persistent, so the next tile's loads go out during this tile's epilogue;
  * on Triton 3.8 and later (compat.CLUSTER_MULTICAST), from M = 1024, two CTAs one above the
    other share the weight's tile (CLUSTER = 2, `cluster_for`): the first CTA loads it once and
    TMA multicasts it into both rings, so the cluster reads B from L2 once for 256 rows, as
    cuBLAS's block-wise kernel does. Each CTA still loads its own rows of A. A slot is refilled
    once this CTA's consumers have released it (`empty`) and, for the multicast, once both CTAs'
    have (`pair`, a barrier in the first CTA that both arrive on). The arithmetic per row is the
    one-CTA kernel's, so is the result, bit for bit (tests/test_fp8.py). On the H200 it ran
    0.99-1.05x the one-CTA kernel at M >= 2048 (geomean 1.027x, 15 shapes), 0.984x torch's
    block-wise _scaled_mm where one CTA ran 0.958x, and 1.001x in a second run at M >= 4096
    (results/h200/probes/fp8/fp8-block-cluster.csv and -sweep.csv; docs/fp8.md).

Tried and dropped: two accumulators taking turns, step kb + 1 issued before step kb is promoted.
ptxas serializes every MMA of such a kernel (info C7514: "non wgmma instructions reading
accumulator registers of a wgmma between start and end of the pipeline stage") even once the
PTX reads only retired accumulators, so each MMA waited for the one before. `_promote` says how
the same message came back from where LLVM put the promotion, and what keeps it away.

Also tried, on the H100 beside torch's (results/h100/probes/fp8/fp8-block-registers-1.csv and -2.csv):
  * A loaded once a step into registers, so that the two halves' MMAs read only B from shared
    memory (the ring's reads are 16 KB a step fewer): 0.92x torch's where A from shared memory
    gave 0.99x, the loads into registers costing more than the reads they save;
  * the two warpgroups taking turns to issue their MMAs (an mbarrier pair passed back and forth),
    in case the tensor cores, fed by both at once, finished both at once and left both to promote
    with nothing queued: 0.94x against 0.99x, so that is not where the time goes.
  * a 192 x 128 tile on three consumer warpgroups, each 64 x 128: one MMA and one promotion a
    K-step per warpgroup, with two others' MMAs queued to hide it, in 160 registers a thread
    (A as three 64-row boxes, a ring each: TMA boxes and buffers take power-of-two sides).
    0.90x torch's against 0.98x for 128 x 256 (M >= 2048, 9 shapes, 3 rounds, H100,
    results/h100/probes/fp8/fp8-block-thirds.csv and .patch), lower on every shape. Its tile
    loads 11% more per FLOP than 128 x 256; why it lost more than that was not profiled.

tensor- and row-wise scales are fp8_ws.py's (they apply once, to the finished tile).
scaled_mm's "auto" takes this rung for block scales past M = 64 (dispatch/fp8.py `choose`, on TILES), and
below on weights of 2^25 elements or more (on ONE_WARPGROUP_TILES);
kernel="fp8_block" names it. tests/test_fp8.py runs it on the H100; tests/test_gluon_compile.py
compiles it for sm_90 on the CPU and checks that ptxas neither spills nor serializes its MMAs.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Epilogue
from tritongemm.fp8.recipes import SCALE_BLOCK
from tritongemm.fp8.tma import check_scaled_call, planned_scaled_launch
from tritongemm.ladder.tma_warp_specialized import _load_partition
from tritongemm.primitives.epilogue import apply_gl
from tritongemm.primitives.gluon.cluster import block_layouts, cluster_load_partition, cluster_rows_layout, release_slot
from tritongemm.primitives.gluon.compat import CLUSTER_MULTICAST, cluster_barrier, cluster_ring_barriers
from tritongemm.primitives.gluon.descriptors import descriptor
from tritongemm.primitives.gluon.mma import wgmma_accumulator_layout
from tritongemm.primitives.gluon.pipeline import (
    _SMEM_SLACK_BYTES,
    H100_SHARED_MEMORY_BYTES,
    barriers_per_slot,
    c_tile_bytes,
    check_wgmma_tile,
    init_barriers,
    invalidate_barriers,
    operand_stage_bytes,
    step_operands,
    store_tile_in_pieces,
)
from tritongemm.primitives.tiling.gluon import num_persistent_programs, scheduler_for

NAME = "fp8_block"
# 128 x 256 on two warpgroups (above), 4 slots of 48 KB and a 32 KB bf16 C half: 224 of 227 KB.
# Measured on the H100 (results/h100/probes/fp8/fp8-block-configs.csv): 995-1082 TFLOP/s at M >= 2048,
# where 128 x 128 (5 slots) gave 806-858; 3 slots, GROUP_SIZE_M 4 or 16 no better. As two partitions
# (probes/fp8/fp8-block-partitions.csv): 0.95x torch's, 128 x 128 0.86x with 5 or 6 slots.
DEFAULT_CONFIG = MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_SIZE_M=8, num_warps=8, num_stages=4)
# Registers a thread (setmaxnreg): the load warp's group keeps the least there is, 24 (it holds a few
# tile offsets and counters; ptxas fits it without spills), and each consumer 240 (in the PTX the
# default partition decreases to 240, the second consumer increases to 240: 128 x (24 + 240 + 240)
# = 64,512 of the SM's 65,536, as rung 9's 40 + 232 + 232 is, docs/warp-specialization.md). Rung 9's 40 / 232
# gave 0.976x and 0.973x torch's block-wise _scaled_mm at M >= 2048 where these gave 0.990x and 0.986x
# (two H100s, geomean of 9 shapes each, results/h100/probes/fp8/fp8-block-registers-1.csv and -2.csv):
# no spill either way; with more room ptxas emits a few register moves fewer (7 IMADs of ~1650
# instructions) and places the rest differently.
LOAD_REGISTERS = 24
CONSUMER_REGISTERS = 240
# Half the width, for grids the wide tile leaves short of one tile an SM.
NARROW_CONFIG = DEFAULT_CONFIG.with_(BLOCK_N=128, num_stages=5)
# The 64-row tiles on one warpgroup, for decode sizes (M = 128: 0.96-1.07x torch's block-wise on
# the H200 where 128 x 128 gave 0.58-0.69x; at M <= 64, large weights only: dispatch/fp8.py `choose`).
ONE_WARPGROUP_TILES = (
    DEFAULT_CONFIG.with_(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=8),
    DEFAULT_CONFIG.with_(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=10),
)
# "auto"'s tiles past M = 64, largest first (dispatch/fp8.py `_filling_tile`).
TILES = (DEFAULT_CONFIG, NARROW_CONFIG, *ONE_WARPGROUP_TILES)


@gluon.jit
def _promote(total, acc, scale):
    """total + acc * scale, returned with acc through a wait (for nothing: no MMA is in flight) so
    that the compiler can't sink the multiply-adds below the next MMA into acc. LLVM did: that kept
    the old acc alive beside the new one, a copy ptxas answered by serializing the MMAs (C7514)."""
    total = total + acc * scale
    return warpgroup_mma_wait(0, (total, acc))


@gluon.jit
def _load_warp(a_desc, b_desc, c_desc, a_bufs, a_bufs_1, b_bufs, ready, empty, pair, Scheduler: gl.constexpr,
               CLUSTER: gl.constexpr):  # fmt: skip
    """The load warp: rung 9's on one CTA (one A ring, both consumers' rows), the cluster's on two
    (primitives/gluon/cluster.py: an A ring per consumer, the weight's tile multicast)."""
    if CLUSTER == 1:
        _load_partition(a_desc, b_desc, c_desc, a_bufs, b_bufs, ready, empty, Scheduler, False, True, False)
    else:
        cluster_load_partition(a_desc, b_desc, c_desc, a_bufs, a_bufs_1, b_bufs, ready, empty, pair, Scheduler)


@gluon.jit
def _promoting_partition(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_smem, ready, empty, pair,
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbn, stride_sbk,
    Scheduler: gl.constexpr, ACTIVATION: gl.constexpr, HAS_ALPHA: gl.constexpr, HAS_BIAS: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr, STORE_PREACT: gl.constexpr, CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr,
    CLUSTER: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """A consumer, rows CONSUMER * ROWS to (CONSUMER + 1) * ROWS of every tile (ROWS = TILE_M /
    CONSUMERS): per K-step, an MMA per column piece (two halves of a 256-wide tile, else the
    whole width), one after the other, each promoted into its fp32 sum once retired, with the
    scales loaded a step ahead; after the last, its release of the step's slot (the load warp
    refills it once every consumer has released it). Then the epilogue, piece by piece.
    CLUSTER = 2 (primitives/gluon/cluster.py): the code is the cluster's, its ROWS those of both
    CTAs (each CTA holds half of them, in a_bufs of this consumer's own), and a slot goes back to
    both CTAs' load warps: to this CTA's (`empty`) and to the first CTA's (`pair`), whose
    multicast fills the slot in both."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]  # my rows of the tile (of the cluster's)
    TILE_M: gl.constexpr = BLOCK_M * CONSUMERS
    ROW0: gl.constexpr = CONSUMER * BLOCK_M
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    PIECE_N: gl.constexpr = c_desc.block_type.shape[1]  # one MMA's columns, within one scale block
    HALVES: gl.constexpr = BLOCK_N // PIECE_N
    NUM_BUFFERS: gl.constexpr = b_bufs.shape[0]
    M = c_desc.shape[0]
    N = c_desc.shape[1]
    k_steps = a_desc.shape[1] // BLOCK_K  # K is a multiple of 128 = BLOCK_K under block scales
    layout: gl.constexpr = wgmma_accumulator_layout(
        a_desc.dtype, BLOCK_M // CLUSTER, PIECE_N, num_warps, cluster_rows_layout(CLUSTER)
    )
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    # The zeros are never read (every MMA here starts afresh): they give the registers a type.
    acc = gl.zeros((BLOCK_M, PIECE_N), dtype=gl.float32, layout=layout)
    scheduler = Scheduler.initialize(M, N, TILE_M, BLOCK_N)
    consumer = 0  # K-steps taken by this program, over all its tiles: the load warp's count
    for idx in range(scheduler.get_num_tiles()):
        pid_m, pid_n = scheduler.get_tile(idx)
        off_m = pid_m * TILE_M + ROW0
        off_n = pid_n * BLOCK_N
        offs_m = off_m + rows
        row_mask = offs_m < M
        sa_ptrs = sa_ptr + offs_m * stride_sam
        # Each piece lies in one of the weight's 128 x 128 scale blocks (BLOCK_K is 128): one scale_b a step.
        sb0_ptr = sb_ptr + (off_n // BLOCK_K) * stride_sbn
        total0 = gl.zeros((BLOCK_M, PIECE_N), dtype=gl.float32, layout=layout)
        sa = gl.expand_dims(gl.load(sa_ptrs, mask=row_mask, other=0.0), 1)
        sb0 = gl.load(sb0_ptr)
        if HALVES == 2:
            sb1_ptr = sb_ptr + ((off_n + PIECE_N) // BLOCK_K) * stride_sbn
            right_in = off_n + PIECE_N < N  # else the right half lies past N, and so may its scale block
            total1 = gl.zeros((BLOCK_M, PIECE_N), dtype=gl.float32, layout=layout)
            sb1 = gl.load(sb1_ptr, mask=right_in, other=0.0)
        for kb in range(k_steps):
            # 1. This step's scales, multiplied out before the next step's are loaded into the
            #    same registers (the last step reloads its own); then the (left) piece's MMA.
            s0 = sa * sb0
            if HALVES == 2:
                s1 = sa * sb1
            ahead = gl.minimum(kb + 1, k_steps - 1)
            sa = gl.expand_dims(gl.load(sa_ptrs + ahead * stride_sak, mask=row_mask, other=0.0), 1)
            sb0 = gl.load(sb0_ptr + ahead * stride_sbk)
            if HALVES == 2:
                sb1 = gl.load(sb1_ptr + ahead * stride_sbk, mask=right_in, other=0.0)
            a, b = step_operands(consumer, ready, a_bufs, b_bufs, False, True)
            if CONSUMERS > 1 and CLUSTER == 1:
                a = a.slice(ROW0, BLOCK_M, dim=0)
            acc = warpgroup_mma(a, b.slice(0, PIECE_N, dim=1), acc, use_acc=False, is_async=True)
            acc = warpgroup_mma_wait(0, (acc,))
            if HALVES == 2:
                # 2. Once it retires, its product goes into the left sum; then the right half's
                #    MMA, from the same A tile, and the slot goes back to the load warp.
                total0, acc = _promote(total0, acc, s0)
                acc = warpgroup_mma(a, b.slice(PIECE_N, PIECE_N, dim=1), acc, use_acc=False, is_async=True)
                acc = warpgroup_mma_wait(0, (acc,))
                release_slot(empty, pair, consumer % NUM_BUFFERS, CLUSTER)
                total1, acc = _promote(total1, acc, s1)
            else:  # 2. The slot goes back to the load warp before the promotion.
                release_slot(empty, pair, consumer % NUM_BUFFERS, CLUSTER)
                total0, acc = _promote(total0, acc, s0)
            consumer += 1

        # 3. Epilogue, piece by piece, while the load warp fills the ring for the next tile.
        total0 = apply_gl(
            total0, off_m, off_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm,
            alpha, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
        )  # fmt: skip
        store_tile_in_pieces(total0, c_desc, c_smem, off_m, off_n)  # after the last store read c_smem
        if HALVES == 2:
            total1 = apply_gl(
                total1, off_m, off_n + PIECE_N, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn,
                stride_pm, alpha, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
            )  # fmt: skip
            store_tile_in_pieces(total1, c_desc, c_smem, off_m, off_n + PIECE_N)
    tma.store_wait(pendings=0)


@gluon.jit
def _fp8_block_kernel(
    # TMA descriptors
    a_desc,  # (M, K) fp8, block [BLOCK_M, 128]
    b_desc,  # (N, K) fp8, the weight whose transpose is B, block [BLOCK_N, 128]
    c_desc,  # (M, N) bf16 or fp16, block [BLOCK_M / CONSUMERS, piece_n]: a consumer's rows of a column piece
    # the fused epilogue (primitives/epilogue.py), after the scales
    bias_ptr,
    residual_ptr,
    preact_ptr,
    stride_rm,
    stride_rn,
    stride_pm,
    alpha,
    # the block scales (fp32): scale_a (M, K/128) and scale_b (ceil(N/128), K/128), with these strides
    sa_ptr,
    sb_ptr,
    stride_sam,
    stride_sak,
    stride_sbn,
    stride_sbk,
    # meta-parameters
    Scheduler: gl.constexpr,  # a class from primitives/tiling/gluon.py
    NUM_BUFFERS: gl.constexpr,
    BARRIERS_PER_SLOT: gl.constexpr,  # 1; 2 under ConSan (pipeline.barriers_per_slot)
    LOAD_REGS: gl.constexpr,  # registers a thread of the load warp keeps (setmaxnreg)
    CONSUMERS: gl.constexpr,  # 1, or 2 warpgroups of num_warps = 4 on a tile's row halves
    CONSUMER_REGS: gl.constexpr,  # two consumers: registers a thread of the second (setmaxnreg)
    CLUSTER: gl.constexpr,  # 1, or 2: a cluster of two CTAs, one above the other, sharing the weight's tile
    ACTIVATION: gl.constexpr,
    HAS_ALPHA: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    num_warps: gl.constexpr,
):
    dtype: gl.constexpr = a_desc.dtype
    gl.static_assert(NUM_BUFFERS >= 2, "one slot is read by the MMA in flight while the next one loads")
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [CONSUMERS] + c_desc.block_type.shape, c_desc.layout)
    if CLUSTER == 1:
        a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS * BARRIERS_PER_SLOT, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
        a_bufs_1 = a_bufs  # both consumers read their rows of one A tile
        pair = empty  # not used
    else:
        gl.static_assert(CONSUMERS == 2 and BARRIERS_PER_SLOT == 1, "a cluster runs the two-consumer tile")
        # A consumer's rows of the cluster's tile, half in each CTA: an A ring per consumer.
        a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
        a_bufs_1 = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
        ready, empty, pair = cluster_ring_barriers(NUM_BUFFERS)
    init_barriers(ready)
    for i in gl.static_range(NUM_BUFFERS):
        mbarrier.init(empty.index(i), count=CONSUMERS)  # each consumer's one `arrive` per lap
        if CLUSTER > 1:
            mbarrier.init(pair.index(i), count=CONSUMERS)  # and each of the other CTA's (Gluon doubles it)

    if CONSUMERS == 1:
        gl.warp_specialize(
            [
                (_promoting_partition, (
                    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_smem.index(0), ready, empty, pair,
                    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
                    sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbn, stride_sbk,
                    Scheduler, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT, 0, 1, CLUSTER, num_warps,
                )),
                (_load_warp, (
                    a_desc, b_desc, c_desc, a_bufs, a_bufs_1, b_bufs, ready, empty, pair, Scheduler, CLUSTER,
                )),
            ],
            [1],  # the load warp
            [LOAD_REGS],
        )  # fmt: skip
    else:
        gl.static_assert(CONSUMERS == 2, "one consumer, or two warpgroups on a tile's row halves")
        gl.warp_specialize(
            [
                (_promoting_partition, (
                    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_smem.index(0), ready, empty, pair,
                    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
                    sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbn, stride_sbk,
                    Scheduler, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT, 0, 2, CLUSTER, num_warps,
                )),
                (_promoting_partition, (
                    a_desc, b_desc, c_desc, a_bufs_1, b_bufs, c_smem.index(1), ready, empty, pair,
                    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
                    sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbn, stride_sbk,
                    Scheduler, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT, 1, 2, CLUSTER, num_warps,
                )),
                (_load_warp, (
                    a_desc, b_desc, c_desc, a_bufs, a_bufs_1, b_bufs, ready, empty, pair, Scheduler, CLUSTER,
                )),
            ],
            [num_warps, 1],  # the second consumer (a warpgroup, warpgroup-aligned after the first), the load warp
            [CONSUMER_REGS, LOAD_REGS],
        )  # fmt: skip

    if CLUSTER > 1:
        # The other CTA's consumers arrive on this CTA's `pair` barriers up to their last step, and
        # this CTA's multicast writes into the other's ring: neither may leave before both are done.
        cluster_barrier()
        invalidate_barriers(pair)
    invalidate_barriers(ready)
    invalidate_barriers(empty)


def piece_n(config: MatmulConfig) -> int:
    """Columns of one MMA and of C's staging buffer: a 256-wide tile's half, else the whole
    width; each lies in one of the weight's 128-wide scale blocks."""
    return min(config.BLOCK_N, SCALE_BLOCK)


def smem_bytes(config: MatmulConfig, c_elem_bytes: int) -> int:
    """The fp8 ring and C's staging buffer of one column piece, both live for the whole program (barriers aside)."""
    staging = c_tile_bytes(config, c_elem_bytes) * piece_n(config) // config.BLOCK_N
    return config.num_stages * operand_stage_bytes(config, 1) + staging


def check_config(config: MatmulConfig, c_elem_bytes: int, smem_limit: int = H100_SHARED_MEMORY_BYTES) -> None:
    """Raise ValueError, naming the rung, for a tile this kernel can't run."""
    check_wgmma_tile(NAME, config)
    if config.BLOCK_K != SCALE_BLOCK:
        raise ValueError(f"{NAME}: one scale block a K-step: BLOCK_K must be {SCALE_BLOCK}, not {config.BLOCK_K}")
    if config.BLOCK_N not in (16, 32, 64, 128, 256):
        raise ValueError(
            f"{NAME}: each MMA's columns (a tile's, or each half's of 256) must lie in one of the weight's "
            f"{SCALE_BLOCK}-wide scale blocks: BLOCK_N must be 16, 32, 64, 128 or 256, but got {config.BLOCK_N}"
        )
    if config.num_stages < 2:
        raise ValueError(
            f"{NAME}: num_stages (ring slots) must be >= 2, since one is read by the MMA in flight while the next "
            f"loads; got {config.num_stages}"
        )
    need = smem_bytes(config, c_elem_bytes)
    if need > smem_limit - _SMEM_SLACK_BYTES:
        raise ValueError(
            f"{NAME}: {config.short()} needs {need} bytes of shared memory (ring and C tile), more than the "
            f"{smem_limit} a block may have (less {_SMEM_SLACK_BYTES} for barriers and alignment); use fewer "
            f"num_stages"
        )


def consumers_for(config: MatmulConfig) -> int:
    """A consumer partition per warpgroup of the tile (module docstring: no barrier then makes them
    promote in step)."""
    return config.num_warps // 4


# From M = 1024 the cluster ran 0.99-1.03x the one-CTA kernel on the wide tile, at 256 and 512
# 0.94-1.09x (H200, triton 3.8, results/h200/probes/fp8/fp8-block-cluster-small.csv): a cluster's
# tile is two tiles one above the other, so at small M half the clusters' rows lie past M.
CLUSTER_MIN_M = 1024


def cluster_for(config: MatmulConfig, M: int, consumers: int) -> int:
    """2, a cluster of two CTAs sharing the weight's tile, where this Triton has TMA multicast
    (compat.CLUSTER_MULTICAST), the tile is the wide two-consumer one (the one measured) and M is at
    least CLUSTER_MIN_M; else 1. Not under ConSan, whose per-operand barriers the cluster's ring
    doesn't have."""
    multicast = CLUSTER_MULTICAST and barriers_per_slot() == 1
    wide = config.BLOCK_M == 128 and config.BLOCK_N == 256 and consumers == 2
    return 2 if multicast and wide and M >= CLUSTER_MIN_M else 1


def descriptors(a, weight, c, config: MatmulConfig, consumers: int, cluster: int) -> tuple:
    """TMA descriptors of a (M, K), the weight (N, K) and c (M, N) for the kernel. In a cluster each
    block is the cluster's: A's and C's a consumer's rows of both CTAs (half in each), the weight's
    one block, which both CTAs hold (multicast)."""
    rows, shared = block_layouts(cluster)
    consumer_rows = config.BLOCK_M * cluster // consumers
    a_rows = config.BLOCK_M if cluster == 1 else consumer_rows  # one CTA: the tile's, both consumers'
    return (descriptor(a, (a_rows, config.BLOCK_K), rows), descriptor(weight, (config.BLOCK_N, config.BLOCK_K), shared),
            descriptor(c, (consumer_rows, piece_n(config)), rows))  # fmt: skip


def plan(a, b, c, scale_a, scale_b, config: MatmulConfig, spec: Epilogue, bias=None, residual=None, *,
         num_programs: int | None = None, consumers: int | None = None, cluster: int | None = None):  # fmt: skip
    """`launch(a, b, c, scale_a, scale_b, bias, residual)` for block-scaled tensors of this geometry
    (or one-element scales, K a multiple of 128),
    checked and compiled once. Raises ValueError where the rung can't take them. `num_programs`
    replaces the SM count (tests: several tiles per program); `consumers` (probes) replaces
    consumers_for's count: 1 runs a two-warpgroup tile in one partition; `cluster` (tests,
    probes) replaces cluster_for's choice: 1 or 2 CTAs a cluster."""
    check_scaled_call(NAME, a, b, c, "block")
    check_config(config, c.element_size())
    consumers = consumers or consumers_for(config)
    if consumers not in (1, config.num_warps // 4):
        raise ValueError(
            f"{NAME}: consumers is 1, or one per warpgroup ({config.num_warps // 4} for num_warps = "
            f"{config.num_warps}); got {consumers}"
        )
    M, K = a.shape
    cluster = cluster or cluster_for(config, M, consumers)
    if cluster == 2 and not (CLUSTER_MULTICAST and consumers == 2 and barriers_per_slot() == 1):
        raise ValueError(
            f"{NAME}: a two-CTA cluster needs TMA multicast (triton >= 3.8; this is {triton.__version__}), the "
            f"two-consumer tile (num_warps = 8, got {config.num_warps}) and no ConSan"
        )
    if cluster not in (1, 2):
        raise ValueError(f"{NAME}: cluster is 1 or 2 CTAs, but got {cluster}")
    desc = descriptors(a, b.T, c, config, consumers, cluster)
    # One element each (tensor-wise scales, or the block grid of M = 1, N <= 128, K = 128): read broadcast.
    one_each = scale_a.numel() == 1 and scale_b.numel() == 1
    scale_strides = (0, 0, 0, 0) if one_each else (*scale_a.stride(), *scale_b.stride())
    constexprs = dict(
        Scheduler=scheduler_for(config.scheduler, config.GROUP_SIZE_M), NUM_BUFFERS=config.num_stages,
        BARRIERS_PER_SLOT=barriers_per_slot(), LOAD_REGS=LOAD_REGISTERS, CONSUMERS=consumers,
        CONSUMER_REGS=CONSUMER_REGISTERS, CLUSTER=cluster,
        num_warps=config.num_warps // consumers, **spec.constexprs(),
    )  # fmt: skip
    if cluster > 1:
        constexprs["num_ctas"] = cluster  # the grid counts clusters
    tiles = -(-M // (config.BLOCK_M * cluster)) * -(-c.shape[1] // config.BLOCK_N)
    sms = device_info.sm_count(c.device) if num_programs is None else num_programs
    grid = (num_persistent_programs(tiles, c.device, sms if cluster == 1 else max(sms // cluster, 1)),)
    return planned_scaled_launch(_fp8_block_kernel, grid, desc, constexprs, spec, scale_a, scale_b, scale_strides,
                                 bias, residual)  # fmt: skip
