"""Rung 9: the persistent kernel, warp-specialized: one warp loads, the warpgroups compute.

Idea: in rungs 4-6 the warps that issue the MMAs also issue the loads, so a load goes out only
when the issuing warps reach it in program order, and nothing is requested while they run the
epilogue. Here the two jobs get warps of their own (`gl.warp_specialize`), which the hardware
schedules independently:

  * the load partition, one warp with a small register budget (`LOAD_REGISTERS`), walks the
    same tiles in the same order as the MMA partition and only issues TMA loads into the ring;
  * the MMA partition, the kernel's `num_warps` (one warpgroup, or two that split the tile's
    rows, 64 each), only waits for loaded slots, issues WGMMA, and runs the fused epilogue and
    the TMA store of C.

So the loads of tile t + 1 go out while tile t's epilogue runs, with no peeled prologue as in
rung 6. `warp_specialize`'s register budgets make the compiler emit `setmaxnreg`: the load warp
gives registers back and the MMA warps take them, for the accumulator.

The ring. NUM_BUFFERS slots of one A and one B tile, each slot with two barriers:
  * ready[s]: the loads of the slot's current step have landed (the load warp's `expect` plus
    the bytes of both copies complete its phase; two barriers under ConSan, pipeline.py);
  * empty[s]: the MMA partition no longer reads the slot (one `arrive` completes its phase).
K-step i (counted over the program's whole run, across tiles) uses slot i % NUM_BUFFERS on its
lap j = i // NUM_BUFFERS, and each barrier completes one phase per lap. So the MMA partition
waits for phase j & 1 of ready[s], and the load warp, before refilling the slot for lap j, waits
for lap j - 1's release: phase (j - 1) & 1 = (j & 1) ^ 1 of empty[s]. On lap 0 that is the phase
"before" a fresh barrier, which a parity wait already counts as complete, so the first
NUM_BUFFERS loads go out at once.

Release. WGMMA reads its operands from shared memory asynchronously: a slot is free only once
the MMA that reads it has retired. The MMA partition keeps one MMA in flight (`issue_mma` waits
until at most one is outstanding), so after issuing step i it releases step i - 1; the tile's
last step is released after the final wait, before the epilogue.

C is staged in a buffer of its own and its TMA store overlaps the next tile's MMAs (the wait
moves to the next epilogue), as in rung 6 when C fits next to the ring. Where a whole C tile and
the ring don't fit together (128 x 256 with 4 slots: 4 x 48 KB + 64 KB > 227 KB), the buffer is
half a tile and C goes out in two halves, the second after the first's store has read the buffer
(`c_pieces`): a slot more for the loads, for a short wait in each epilogue.

Rung 11, ping-pong (`tma_ping_pong`, `consumers=2`): the same kernel with two consumer
warpgroups, each on every other tile of the program, each with its own accumulator and C tile,
so one's epilogue runs while the other multiplies. They share the ring: K-steps keep the load
warp's count over all tiles, so consumer c's tile idx starts at step idx * k_steps. A parity wait
can't tell a barrier's phase from the one two laps later, so a consumer must not wait on the ring
for its tile before the other consumer has passed its last wait on the tile before (else it could
take a slot still holding that tile's data): the two `turns` barriers hand the ring over, one
arrival a tile.

The tensor-core step is the constexpr `MMA` (mma.py's interface): WGMMA on Hopper, tcgen05 on
Blackwell for one consumer, C stored whole there (docs/blackwell.md; compiled for sm_100, never
run). Ping-pong stays Hopper's.

A gated pair (`glu`, blocks/gated_pair.py; one consumer, WGMMA): C = act(A @ gate.T) * (A @ up.T)
for a weight [gate; up]. Each B slot holds the gate's box above the up projection's
(pipeline.issue_loads), the MMA covers both, and the epilogue stores act(gate) * up, a tile half
the MMA's width (primitives/epilogue.py `gated_gl`). Checked and timed on the H100 (docs/blocks.md).

fp8 operands with tensor- or row-wise scales (`SCALES`, fp8_ws.py): the same loop, one WGMMA
taking 32 fp8 elements of K, and the finished tile dequantized (primitives/epilogue.py `scale_gl`)
before the epilogue; C is staged in its own dtype.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from tritongemm.core.config import MatmulConfig
from tritongemm.primitives.epilogue import apply_gl, gated_gl, scale_gl
from tritongemm.primitives.gluon.descriptors import make_descriptors, planned_launch
from tritongemm.primitives.gluon.mma import WGMMA, mma_for
from tritongemm.primitives.gluon.pipeline import (
    _SMEM_SLACK_BYTES,
    H100_SHARED_MEMORY_BYTES,
    barriers_per_slot,
    c_tile_bytes,
    check_gated_pair,
    check_mma_tile,
    init_barriers,
    invalidate_barriers,
    issue_loads,
    issue_mma,
    operand_stage_bytes,
    refuse_c_pieces_for_tcgen05,
    require_sm90,
    store_tile_in_pieces,
)
from tritongemm.primitives.tiling.gluon import num_persistent_programs, scheduler_for

NAME = "tma_warp_specialized"
PING_PONG_NAME = "tma_ping_pong"  # rung 11: the same kernel with two consumers on alternate tiles
# Registers a thread of the load warp keeps (setmaxnreg): it holds a few scalars (tile offsets,
# counters, addresses). 40 is CUTLASS's producer budget; ptxas fits it without spills (24, the
# least, too), and with two MMA warpgroups it leaves them 232 each of the SM's 64K registers.
LOAD_REGISTERS = 40
# Ping-pong's second consumer, a warpgroup with a 128 x 128 fp32 accumulator (128 registers a
# thread) and the epilogue: 232, as CUTLASS gives its consumers. setmaxnreg acts per warpgroup, and
# the load warp's is padded to 4 warps, so 512 registers a thread are shared out three ways: 40 to
# the load warp's group, 232 here, and what is left (232, the compiler's sum) to the first
# consumer, the default partition (PTX of triton 3.6 and 3.9: setmaxnreg 232 / 232 / 40).
CONSUMER_REGISTERS = 232


@gluon.jit
def _load_partition(
    a_desc,
    b_desc,
    c_desc,
    a_bufs,
    b_bufs,
    ready,
    empty,
    Scheduler: gl.constexpr,
    A_M_MAJOR: gl.constexpr,
    B_K_MAJOR: gl.constexpr,
    GATED: gl.constexpr,
):
    """The load warp: every K-step of every tile of this program, in the MMA partition's order.
    GATED: each B slot holds a gated pair (pipeline.issue_loads), the gate's weight rows at the
    tile's output columns and the up projection's C's width further on."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1] if A_M_MAJOR else a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0] if A_M_MAJOR else a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_bufs.shape[1] if B_K_MAJOR else b_bufs.shape[2]  # the MMA's N
    TILE_N: gl.constexpr = BLOCK_N // 2 if GATED else BLOCK_N  # C's columns per tile
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    K = a_desc.shape[0] if A_M_MAJOR else a_desc.shape[1]
    N = c_desc.shape[1]
    scheduler = Scheduler.initialize(c_desc.shape[0], N, BLOCK_M, TILE_N)
    producer = 0
    for idx in range(scheduler.get_num_tiles()):
        pid_m, pid_n = scheduler.get_tile(idx)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * TILE_N
        for k in range(0, K, BLOCK_K):
            # The slot's previous lap released (module docstring: lap 0 passes at once).
            lap_phase = (producer // NUM_BUFFERS) & 1
            mbarrier.wait(empty.index(producer % NUM_BUFFERS), lap_phase ^ 1)
            # A gated pair's up rows start C's width on: the weight is [gate; up], (2N, K).
            producer = issue_loads(
                producer, a_desc, b_desc, off_m, off_n, k, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR, True, N
            )


@gluon.jit
def _mma_partition(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_smem, ready, empty, turns,
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha, sa_ptr, sb_ptr,
    MMA: gl.constexpr, Scheduler: gl.constexpr, A_M_MAJOR: gl.constexpr, B_K_MAJOR: gl.constexpr,
    ACTIVATION: gl.constexpr, HAS_ALPHA: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr, GLU: gl.constexpr, SCALES: gl.constexpr, CONSUMER: gl.constexpr,
    CONSUMERS: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """A consumer: wait for a slot, multiply, release the slot; per tile, the epilogue. Consumer c
    of CONSUMERS takes the program's tiles c, c + CONSUMERS, ... (ping-pong when there are two).
    GLU (an activation's name, else "none"): the tile is a gated pair's, stored as act(gate) * up.
    SCALES ("tensor" or "row", else "none"): fp8 operands, the tile dequantized by their scales
    before the epilogue (fp8_ws.py)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1] if A_M_MAJOR else a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0] if A_M_MAJOR else a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_bufs.shape[1] if B_K_MAJOR else b_bufs.shape[2]  # the MMA's N
    TILE_N: gl.constexpr = BLOCK_N // 2 if GLU != "none" else BLOCK_N  # C's columns per tile
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    M = c_desc.shape[0]
    N = c_desc.shape[1]
    K = a_desc.shape[0] if A_M_MAJOR else a_desc.shape[1]
    k_steps = gl.cdiv(K, BLOCK_K)
    mma = MMA.initialize(a_desc.dtype, BLOCK_M, BLOCK_N, num_warps)
    scheduler = Scheduler.initialize(M, N, BLOCK_M, TILE_N)
    for idx in range(CONSUMER, scheduler.get_num_tiles(), CONSUMERS):
        pid_m, pid_n = scheduler.get_tile(idx)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * TILE_N
        consumer = idx * k_steps  # the tile's first K-step, in the load warp's count over all tiles
        if CONSUMERS > 1:
            # 0. My turn: the consumer of tile idx - 1 has passed its last wait on the ring, so
            #    every slot I wait for is at most one phase ahead of its barrier (a parity wait
            #    can't tell a phase from the one two laps later). Its arrival number (idx - 1) //
            #    CONSUMERS on turns[me] is the phase; the program's first tile goes at once.
            mbarrier.wait(turns.index(CONSUMER), ((idx - 1) // CONSUMERS) & 1, pred=idx > 0)

        # 1. The K loop. After issue_mma, step `consumer - 1` is in flight and `consumer - 2` has
        #    retired: its slot goes back to the load warp. (A tile's first step has no earlier
        #    step of its own: the previous tile released its last one in step 2.)
        for k in range(0, K, BLOCK_K):
            consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
            mbarrier.arrive(empty.index((consumer + NUM_BUFFERS - 2) % NUM_BUFFERS), pred=k > 0)
        if CONSUMERS > 1:  # the next tile's consumer may wait on the ring now
            mbarrier.arrive(turns.index((CONSUMER + 1) % CONSUMERS))

        # 2. The last MMA retires; its slot is free for the next tile's loads before the epilogue.
        mma = mma.wait_num_outstanding(0)
        mbarrier.arrive(empty.index((consumer + NUM_BUFFERS - 1) % NUM_BUFFERS))

        # 3. Epilogue, while the load warp fills the ring for the next tile (and, in ping-pong,
        #    the other consumer multiplies it).
        acc, mma = mma.take_result()
        if SCALES != "none":
            acc = scale_gl(acc, off_m, off_n, M, N, sa_ptr, sb_ptr, SCALES == "row")
        if GLU != "none":
            acc = gated_gl(acc, GLU)
        else:
            acc = apply_gl(
                acc, off_m, off_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
                ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
            )  # fmt: skip
        store_tile_in_pieces(acc, c_desc, c_smem, off_m, off_n)  # after my previous tile's store read c_smem
    tma.store_wait(pendings=0)


@gluon.jit
def _tma_warp_specialized_kernel(
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
    # fp8 operands' dequantization scales (fp32), read where SCALES says: one element each, or
    # scale_a (M,) and scale_b (N,) contiguous
    sa_ptr,
    sb_ptr,
    # meta-parameters
    MMA: gl.constexpr,  # the tensor-core step: mma.WGMMA (Hopper) or tcgen05.TCGen05MMA (Blackwell)
    Scheduler: gl.constexpr,  # a class from primitives/tiling/gluon.py
    NUM_BUFFERS: gl.constexpr,
    BARRIERS_PER_SLOT: gl.constexpr,  # 1; 2 under ConSan (pipeline.barriers_per_slot)
    A_M_MAJOR: gl.constexpr,
    B_K_MAJOR: gl.constexpr,
    LOAD_REGS: gl.constexpr,  # registers a thread of the load warp keeps (setmaxnreg)
    CONSUMERS: gl.constexpr,  # 1: the kernel's warps compute every tile; 2: ping-pong (tma_ping_pong)
    CONSUMER_REGS: gl.constexpr,  # ping-pong: registers a thread of the second consumer
    ACTIVATION: gl.constexpr,
    HAS_ALPHA: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    GLU: gl.constexpr,  # "none", or a gated pair's activation: C = act(A @ W[:N].T) * (A @ W[N:2N].T)
    SCALES: gl.constexpr,  # "none", or fp8 operands' recipe, "tensor" or "row" (fp8_ws.py)
    num_warps: gl.constexpr,
):
    dtype: gl.constexpr = a_desc.dtype
    gl.static_assert(NUM_BUFFERS >= 2, "one slot is read by the MMA in flight while the next one loads")

    # Shared by the partitions for the whole program: the ring, its barriers, C's staging tile
    # (one per consumer) and the consumers' turns. A gated pair's B slot holds two of b_desc's
    # boxes, the gate's rows above the up projection's.
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    if GLU != "none":
        B_BOX: gl.constexpr = b_desc.block_type.shape
        b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS, 2 * B_BOX[0], B_BOX[1]], b_desc.layout)
    else:
        b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [CONSUMERS] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS * BARRIERS_PER_SLOT, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    init_barriers(ready)
    init_barriers(empty)  # count 1: the one `arrive` of a consumer per lap
    init_barriers(turns)  # count 1: the one `arrive` of the consumer before

    # The default partition (the kernel's num_warps warps) computes; one worker warp loads; in
    # ping-pong a second consumer of num_warps warps takes every other tile. (The argument tuples
    # are written in the call: a tuple bound to a name can't hold the Scheduler class.)
    if CONSUMERS == 1:
        gl.warp_specialize(
            [
                (_mma_partition, (
                    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_smem.index(0), ready, empty, turns,
                    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha, sa_ptr, sb_ptr,
                    MMA, Scheduler, A_M_MAJOR, B_K_MAJOR, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
                    GLU, SCALES, 0, 1, num_warps,
                )),
                (_load_partition, (
                    a_desc, b_desc, c_desc, a_bufs, b_bufs, ready, empty, Scheduler, A_M_MAJOR, B_K_MAJOR,
                    GLU != "none",
                )),
            ],
            [1],  # warps of each worker partition
            [LOAD_REGS],  # and their registers a thread
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_mma_partition, (
                    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_smem.index(0), ready, empty, turns,
                    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha, sa_ptr, sb_ptr,
                    MMA, Scheduler, A_M_MAJOR, B_K_MAJOR, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
                    GLU, SCALES, 0, 2, num_warps,
                )),
                (_mma_partition, (
                    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_smem.index(1), ready, empty, turns,
                    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha, sa_ptr, sb_ptr,
                    MMA, Scheduler, A_M_MAJOR, B_K_MAJOR, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
                    GLU, SCALES, 1, 2, num_warps,
                )),
                (_load_partition, (
                    a_desc, b_desc, c_desc, a_bufs, b_bufs, ready, empty, Scheduler, A_M_MAJOR, B_K_MAJOR,
                    GLU != "none",
                )),
            ],
            [num_warps, 1],  # the second consumer (a warpgroup, warpgroup-aligned after the first), the load warp
            [CONSUMER_REGS, LOAD_REGS],
        )  # fmt: skip

    # Every partition has finished: every load was consumed and every release made.
    invalidate_barriers(ready)
    invalidate_barriers(empty)
    invalidate_barriers(turns)


def c_pieces(config: MatmulConfig, elem_bytes: int, consumers: int = 1, smem_limit: int = H100_SHARED_MEMORY_BYTES,
             gated: bool = False, c_elem_bytes: int | None = None) -> int:  # fmt: skip
    """Into how many column pieces C's staging buffer cuts a tile: 1 (a whole C tile per consumer)
    when that fits beside the ring, else 2 (a half-tile buffer, stored one half after the other).
    A gated pair's C tile is half the MMA's width (act(gate) * up). C's elements are the operands'
    unless `c_elem_bytes` says otherwise (fp8 operands, a bf16 C)."""
    ring = config.num_stages * operand_stage_bytes(config, elem_bytes)
    whole = ring + consumers * c_tile_bytes(config, c_elem_bytes or elem_bytes, gated)
    tile_n = config.BLOCK_N // 2 if gated else config.BLOCK_N
    return 1 if whole <= smem_limit - _SMEM_SLACK_BYTES or tile_n < 32 else 2


def smem_bytes(config: MatmulConfig, elem_bytes: int, consumers: int = 1,
               smem_limit: int = H100_SHARED_MEMORY_BYTES, gated: bool = False,
               c_elem_bytes: int | None = None) -> int:  # fmt: skip
    """The ring plus C's staging buffer of each consumer, all live for the whole program (barriers aside)."""
    pieces = c_pieces(config, elem_bytes, consumers, smem_limit, gated, c_elem_bytes)
    ring = config.num_stages * operand_stage_bytes(config, elem_bytes)
    return ring + consumers * c_tile_bytes(config, c_elem_bytes or elem_bytes, gated) // pieces


def check_config(config: MatmulConfig, elem_bytes: int, smem_limit: int = H100_SHARED_MEMORY_BYTES,
                 consumers: int = 1, mma=WGMMA, gated: bool = False, c_elem_bytes: int | None = None,
                 name: str | None = None) -> None:  # fmt: skip
    """Raise ValueError, naming the kernel (`name`, else this rung's), when the MMA (WGMMA unless
    `mma` says otherwise) can't compute the tile or the ring and C (in halves, if need be) don't
    fit in shared memory; in ping-pong (two consumers), also when a consumer is not one warpgroup."""
    name = name or (NAME if consumers == 1 else PING_PONG_NAME)
    check_mma_tile(name, config, mma)
    if consumers > 1 and config.num_warps != 4:
        raise ValueError(
            f"{name}: each of its two consumers is one warpgroup, so num_warps must be 4; got {config.num_warps}"
        )
    if config.num_stages < 2:
        raise ValueError(
            f"{name}: num_stages (ring slots) must be >= 2, since one is read by the MMA in flight while "
            f"the next loads; got {config.num_stages}"
        )
    budget = smem_limit - _SMEM_SLACK_BYTES
    need = smem_bytes(config, elem_bytes, consumers, smem_limit, gated, c_elem_bytes)
    if need > budget:
        c_halves = consumers * c_tile_bytes(config, c_elem_bytes or elem_bytes, gated) // 2
        fitting = (budget - c_halves) // operand_stage_bytes(config, elem_bytes)
        hint = f"num_stages <= {fitting}" if fitting >= 2 else "a smaller tile"
        raise ValueError(
            f"{name}: {config.short()} needs {need} bytes of shared memory (the ring and {consumers} C staging "
            f"buffer(s) of half a tile), more than the {smem_limit} a block may have (less {_SMEM_SLACK_BYTES} "
            f"for barriers and alignment); use {hint}"
        )


def programs(config: MatmulConfig, c: torch.Tensor, tile_n: int, mma, consumers: int = 1,
             num_programs: int | None = None, glu: str | None = None, scales: str | None = None):  # fmt: skip
    """(grid, constexprs) of a launch over C's tiles of BLOCK_M x tile_n columns: min(#SMs, #tiles)
    persistent programs (`num_programs` replaces the SM count), and every constexpr but the
    operands' layouts and the epilogue's."""
    M, N = c.shape
    tiles = -(-M // config.BLOCK_M) * -(-N // tile_n)
    grid = (num_persistent_programs(tiles, c.device, num_programs),)
    constexprs = dict(
        MMA=mma, Scheduler=scheduler_for(config.scheduler, config.GROUP_SIZE_M),
        NUM_BUFFERS=config.num_stages, BARRIERS_PER_SLOT=barriers_per_slot(),
        LOAD_REGS=LOAD_REGISTERS, CONSUMERS=consumers, CONSUMER_REGS=CONSUMER_REGISTERS, GLU=glu or "none",
        SCALES=scales or "none", num_warps=config.num_warps,
    )  # fmt: skip
    return grid, constexprs


def plan(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    config: MatmulConfig,
    *,
    num_programs: int | None = None,
    consumers: int = 1,
    glu: str | None = None,
    **epilogue,
):
    """`launch(a, b, c)` for tensors of this geometry: min(#SMs, #tiles) warp-specialized programs
    over their tiles in `config.scheduler` order, checked and compiled once
    (descriptors.planned_launch, whose keywords `epilogue` passes on). `num_programs` replaces the
    SM count (tests: several tiles per program); `consumers=2` is ping-pong (tma_ping_pong).

    `glu` ("silu", "gelu" or "gelu_tanh"): a gated pair, C = act(A @ B[:, :N]) * (A @ B[:, N:])
    for C (M, N) and b the transpose of a (2N, K) weight [gate; up] (pipeline.check_gated_pair).
    Each tile's MMA covers config.BLOCK_N of B's columns, half the gate's and half the up's, and
    stores BLOCK_N / 2 columns of C: the (M, 2N) product never reaches memory."""
    name = NAME if consumers == 1 else PING_PONG_NAME
    gated = glu is not None
    if gated:
        if consumers != 1:
            raise ValueError(f"{PING_PONG_NAME}: a gated pair runs on one consumer (tma_warp_specialized)")
        check_gated_pair(name, a, b, c, config, glu, epilogue)
    if consumers > 1:  # ping-pong's two accumulators: Hopper's registers only, so far
        require_sm90(name, c.device)
    mma = mma_for(name, c.device)
    check_config(config, a.element_size(), consumers=consumers, mma=mma, gated=gated)
    if a.shape[1] == 0:  # matmul never launches for K = 0; a tile's release would have no load to match
        raise ValueError(f"{name}: K must be >= 1, but got K = 0 (a zero sum needs no kernel)")
    pieces = c_pieces(config, a.element_size(), consumers, gated=gated)
    if pieces > 1:
        refuse_c_pieces_for_tcgen05(name, config, a.element_size(), mma)
    tile_n = config.BLOCK_N // 2 if gated else config.BLOCK_N  # C's columns per tile; a gated B box's rows
    desc = make_descriptors(a, b, c, config.BLOCK_M, tile_n, config.BLOCK_K, epi_split=pieces)
    grid, constexprs = programs(config, c, tile_n, mma, consumers, num_programs, glu)
    constexprs.update(desc.layout_constexprs())
    # No scales (they are fp8_ws.py's): two integers stand for their pointers, never read.
    return planned_launch(_tma_warp_specialized_kernel, grid, desc, constexprs, c, trailing=(0, 0), **epilogue)


def launch(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, *, num_programs: int | None = None,
    consumers: int = 1, glu: str | None = None,
) -> None:  # fmt: skip
    plan(a, b, c, config, num_programs=num_programs, consumers=consumers, glu=glu)(a, b, c)
