"""The software pipeline every Hopper kernel is built from: a ring of shared-memory buffers that
TMA fills and WGMMA drains, and the epilogue that sends the finished tile back through TMA.

Counting. The kernels keep two running counters for the whole program: `producer` (K-steps whose
A/B tiles were requested) and `consumer` (K-steps handed to the tensor cores). Step i lives in
slot ``i % NUM_BUFFERS`` and its barrier completes once per lap of the ring, so the phase to wait
for is ``(i // NUM_BUFFERS) & 1``. Counters, not loop indices, carry the state across tiles of a
persistent program, so barriers are initialized once per program.

Depth. `issue_mma` issues step i and then retires step i - 1 (one WGMMA stays in flight, so the
tensor cores never wait for the issuing warps). When step i + d is loaded, steps i - 1 .. i + d
hold buffers, so a ring of NUM_BUFFERS slots allows d = NUM_BUFFERS - 2 loads ahead.

B-buffer stealing. A kernel that overlaps the TMA store of tile t with the loads of tile t + 1
keeps the C staging tile alive next to the operand ring. When that does not fit (128x256x64 fp16
with 4 buffers: 4 x 48 KB + 64 KB > 227 KB), the B ring gets EPI_SPLIT - 1 extra slots instead:
at the epilogue NUM_BUFFERS - 1 slots hold the next tile's first loads and the EPI_SPLIT slots
after them are free, so C goes there, in EPI_SPLIT column pieces of one slot each. Pieces, not one
C-sized view over adjacent slots as in the seed: when the free slots wrap around the end of the
ring (slot R - 1, then slot 0) such a view would run past the allocation.

Barriers per slot. On the hardware one barrier per slot is enough: `expect` announces the bytes
of both tiles and the phase completes when both loads have landed. Triton 3.6's concurrency
sanitizer (ConSan) models each TMA load as one arrival and ignores `expect`, so it calls that
barrier over-arrived and reports a deadlock (triton-lang/triton#9046; scripts/probes/reliability/consan_probe.py
shows it on a one-barrier kernel). Under ConSan the kernels therefore give A and B a barrier each
(`barriers_per_slot`): the ring, its phases and every buffer's reuse stay exactly as they are, so
ConSan checks the same pipeline, and the hardware path is unchanged.

Operand layouts. Each operand is read in place in either of its two layouts, the MMA taking a
transposed shared-memory view where the tile arrived the other way round (WGMMA reads 16-bit
operands from shared memory in both majors; no copy anywhere):
  * ``B_K_MAJOR``: B arrived as the transpose of an (N, K) row-major weight (every forward
    through nn.Linear): its TMA tiles are [BLOCK_N, BLOCK_K];
  * ``A_M_MAJOR``: A arrived as the transpose of a (K, M) row-major tensor (every weight
    gradient, dW = dY^T X, and any ``a.T @ b``): its TMA tiles are [BLOCK_K, BLOCK_M].
"""

import functools
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import GLU_ACTIVATIONS
from tritongemm.primitives.gluon.compat import reinterpret, tma_load, tma_store
from tritongemm.primitives.gluon.mma import WGMMA

# ----------------------------------------------------------------------------------------------
# Device side
# ----------------------------------------------------------------------------------------------


@gluon.jit
def init_barriers(bars):
    """Initialize every barrier of a [count, 1] allocation, before any load uses one."""
    COUNT: gl.constexpr = bars.shape[0]
    for i in gl.static_range(COUNT):
        mbarrier.init(bars.index(i), count=1)  # one arrival a phase: the `expect` of its loads


@gluon.jit
def invalidate_barriers(bars):
    """Retire every barrier once no copy can still arrive on it, so its memory may be reused."""
    COUNT: gl.constexpr = bars.shape[0]
    for i in gl.static_range(COUNT):
        mbarrier.invalidate(bars.index(i))


@gluon.constexpr_function
def _b_has_own_barrier(ready, NUM_BUFFERS):
    """`ready` holds one barrier per slot, or two under ConSan (A's, then B's)."""
    assert ready.shape[0] in (NUM_BUFFERS, 2 * NUM_BUFFERS), f"{ready.shape[0]} barriers for {NUM_BUFFERS} slots"
    return ready.shape[0] == 2 * NUM_BUFFERS


@gluon.jit
def issue_loads(
    producer,
    a_desc,
    b_desc,
    off_m,
    off_n,
    k,
    ready,
    a_bufs,
    b_bufs,
    A_M_MAJOR: gl.constexpr,
    B_K_MAJOR: gl.constexpr,
    pred=True,
    up_rows=0,
    b_k_offset=0,
):
    """Request the A and B tiles of K-step `producer` (at column k) into its ring slot.

    A B slot twice as tall as b_desc's box holds a gated pair (GLU on rungs 6 and 9, and in
    grouped_ws.py): the box of B's columns from off_n (the gate projection's weight rows) above the
    box `up_rows` further on (the up projection's), so one MMA yields both halves of the tile side
    by side.

    `b_k_offset`: the row of an N-major b_desc where this B's K starts, where the descriptor
    stacks several (K, N) matrices, one group's weight on another's (grouped_ws.py)."""
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    NUM_B_BUFFERS: gl.constexpr = b_bufs.shape[0]  # > NUM_BUFFERS only when stealing
    B_OWN_BARRIER: gl.constexpr = _b_has_own_barrier(ready, NUM_BUFFERS)
    B_BOXES: gl.constexpr = b_bufs.shape[1] // b_desc.block_type.shape[0]  # 2 for a gated pair, else 1
    # Barriers belong to K-steps, not buffers: step i completes on barrier i % NUM_BUFFERS (and
    # NUM_BUFFERS + that for B), wherever its B tile lands in a ring with stolen slots.
    slot = producer % NUM_BUFFERS
    a_bar = ready.index(slot)
    if B_OWN_BARRIER:
        b_bar = ready.index(NUM_BUFFERS + slot)
        mbarrier.expect(a_bar, a_desc.block_type.nbytes, pred=pred)
        mbarrier.expect(b_bar, B_BOXES * b_desc.block_type.nbytes, pred=pred)
    else:
        b_bar = a_bar
        mbarrier.expect(a_bar, a_desc.block_type.nbytes + B_BOXES * b_desc.block_type.nbytes, pred=pred)
    if A_M_MAJOR:
        tma_load(a_desc, [k, off_m], a_bar, a_bufs.index(slot), pred)
    else:
        tma_load(a_desc, [off_m, k], a_bar, a_bufs.index(slot), pred)
    b_slot = b_bufs.index(producer % NUM_B_BUFFERS)
    if B_BOXES == 2:
        gl.static_assert(B_K_MAJOR, "a gated pair's weight halves are rows of an (N, K) weight: B K-major")
        BOX_N: gl.constexpr = b_desc.block_type.shape[0]
        tma_load(b_desc, [off_n, k], b_bar, b_slot.slice(0, BOX_N), pred)
        tma_load(b_desc, [up_rows + off_n, k], b_bar, b_slot.slice(BOX_N, BOX_N), pred)
    elif B_K_MAJOR:
        tma_load(b_desc, [off_n, k], b_bar, b_slot, pred)
    else:
        tma_load(b_desc, [b_k_offset + k, off_n], b_bar, b_slot, pred)
    return producer + 1


@gluon.jit
def step_operands(consumer, ready, a_bufs, b_bufs, A_M_MAJOR: gl.constexpr, B_K_MAJOR: gl.constexpr):
    """Wait for K-step `consumer`'s tiles to land; return them as the MMA's [BLOCK_M, BLOCK_K] and
    [BLOCK_K, BLOCK_N] shared-memory views."""
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    NUM_B_BUFFERS: gl.constexpr = b_bufs.shape[0]
    slot = consumer % NUM_BUFFERS
    phase = (consumer // NUM_BUFFERS) & 1
    mbarrier.wait(ready.index(slot), phase)
    if _b_has_own_barrier(ready, NUM_BUFFERS):
        mbarrier.wait(ready.index(NUM_BUFFERS + slot), phase)
    a = a_bufs.index(slot)
    if A_M_MAJOR:
        a = a.permute((1, 0))  # [BLOCK_K, BLOCK_M] tile -> [BLOCK_M, BLOCK_K] view
    b = b_bufs.index(consumer % NUM_B_BUFFERS)
    if B_K_MAJOR:
        b = b.permute((1, 0))  # [BLOCK_N, BLOCK_K] tile -> [BLOCK_K, BLOCK_N] view; WGMMA reads it transposed
    return a, b


@gluon.jit
def issue_mma(consumer, mma, ready, a_bufs, b_bufs, A_M_MAJOR: gl.constexpr, B_K_MAJOR: gl.constexpr):
    """Wait for K-step `consumer`'s tiles, issue its MMA, then retire the step before it."""
    a, b = step_operands(consumer, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
    mma = mma.issue_async_mma(a, b)
    mma = mma.wait_num_outstanding(1)
    return consumer + 1, mma


@gluon.jit
def mma_over_k(
    mma,
    a_desc,
    b_desc,
    off_m,
    off_n,
    k_begin,
    k_end,
    ready,
    a_bufs,
    b_bufs,
    A_M_MAJOR: gl.constexpr,
    B_K_MAJOR: gl.constexpr,
):
    """One tile's K-steps k_begin, k_begin + BLOCK_K, ... < k_end through a fresh ring (rungs 4
    and 7); returns the accumulator state with every MMA retired.

    Prologue: fill all but the two slots the steady state needs (the MMA in flight and the next
    load). Its loads do not stop at k_end: past K, TMA fills them with zeros, which add nothing,
    so a range shorter than NUM_BUFFERS - 2 steps must end at K (split_k's plan sees to it).
    """
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0] if A_M_MAJOR else a_desc.block_type.shape[1]
    producer = 0
    consumer = 0
    for i in gl.static_range(NUM_BUFFERS - 2):
        k = k_begin + i * BLOCK_K
        producer = issue_loads(producer, a_desc, b_desc, off_m, off_n, k, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
    # Steady state: one load and one MMA per K-step.
    for k in range(k_begin + (NUM_BUFFERS - 2) * BLOCK_K, k_end, BLOCK_K):
        producer = issue_loads(producer, a_desc, b_desc, off_m, off_n, k, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
        consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
    # Drain: consume what the prologue got ahead.
    for _ in gl.static_range(NUM_BUFFERS - 2):
        consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
    return mma.wait_num_outstanding(0)


@gluon.jit
def store_tile(acc, c_desc, c_smem, off_m, off_n):
    """Start the TMA store of a finished tile through `c_smem`. The caller waits for it
    (`tma.store_wait`) before `c_smem` is written again."""
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()  # order the register->smem writes before the async proxy reads them
    tma_store(c_desc, [off_m, off_n], c_smem)


@gluon.jit
def store_tile_in_pieces(acc, c_desc, c_smem, off_m, off_n):
    """Wait for the previous store through `c_smem`, then start this tile's. When c_desc's block
    is half the tile's width (a staging buffer of half a tile, where a whole one doesn't fit
    beside the ring), the halves go one after the other: the left half's store must have read
    c_smem before the right half is written there."""
    PIECE: gl.constexpr = c_desc.block_type.shape
    EPI_SPLIT: gl.constexpr = acc.shape[1] // PIECE[1]
    if EPI_SPLIT == 1:
        tma.store_wait(pendings=0)
        store_tile(acc, c_desc, c_smem, off_m, off_n)
    else:
        gl.static_assert(EPI_SPLIT == 2, "a tile is stored in at most 2 pieces")
        # [BLOCK_M, BLOCK_N] -> [BLOCK_M, BLOCK_N/2, 2]: the split is a register renaming, no data moves.
        c = acc.to(c_desc.dtype)
        left, right = gl.split(gl.permute(gl.reshape(c, [PIECE[0], 2, PIECE[1]]), (0, 2, 1)))
        tma.store_wait(pendings=0)
        store_tile(left, c_desc, c_smem, off_m, off_n)
        tma.store_wait(pendings=0)
        store_tile(right, c_desc, c_smem, off_m, off_n + PIECE[1])


@gluon.jit
def store_tile_in_b_slots(acc, c_desc, b_bufs, first_slot, off_m, off_n):
    """Start the TMA store of a finished tile staged in B ring slots first_slot, first_slot + 1, ...

    c_desc's block is one column piece of the tile, [BLOCK_M, BLOCK_N / EPI_SPLIT], sized to fit
    one B slot; each piece goes through its own slot, so the slots need not be adjacent in memory
    (after a wrap of the ring they are not).
    """
    NUM_B_BUFFERS: gl.constexpr = b_bufs.shape[0]
    PIECE: gl.constexpr = c_desc.block_type.shape
    EPI_SPLIT: gl.constexpr = acc.shape[1] // PIECE[1]
    c = acc.to(c_desc.dtype)
    if EPI_SPLIT == 1:
        c_smem = reinterpret(b_bufs.index(first_slot % NUM_B_BUFFERS), c_desc.dtype, PIECE, c_desc.layout)
        store_tile(c, c_desc, c_smem, off_m, off_n)
    else:
        gl.static_assert(EPI_SPLIT == 2, "the stolen-B epilogue splits a tile in at most 2 pieces")
        # [BLOCK_M, BLOCK_N] -> [BLOCK_M, BLOCK_N/2, 2]: the split is a register renaming, no data moves.
        left, right = gl.split(gl.permute(gl.reshape(c, [PIECE[0], 2, PIECE[1]]), (0, 2, 1)))
        c_left = reinterpret(b_bufs.index(first_slot % NUM_B_BUFFERS), c_desc.dtype, PIECE, c_desc.layout)
        store_tile(left, c_desc, c_left, off_m, off_n)
        c_right = reinterpret(b_bufs.index((first_slot + 1) % NUM_B_BUFFERS), c_desc.dtype, PIECE, c_desc.layout)
        store_tile(right, c_desc, c_right, off_m, off_n + PIECE[1])


# ----------------------------------------------------------------------------------------------
# Host side: what the kernels need from the GPU and the config
# ----------------------------------------------------------------------------------------------


def barriers_per_slot() -> int:
    """2 under Triton's concurrency sanitizer, else 1 (see "Barriers per slot" above). Read from
    the knob Triton itself consults at each launch (TRITON_INSTRUMENTATION_MODE, cached at import)."""
    return 2 if triton.knobs.compilation.instrumentation_mode == "consan" else 1


def check_gated_pair(kernel: str, a, b, c, config: MatmulConfig, glu: str, epilogue: dict) -> None:
    """Raise ValueError for a gated pair a rung can't compute (`glu`, issue_loads' pair): b must be
    (K, 2N) for C (M, N), the transpose of a (2N, K) weight [gate; up]; no other epilogue; WGMMA,
    whose accumulator's column halves are a register renaming (tcgen05's spreads a row over
    warpgroups)."""
    if glu not in GLU_ACTIVATIONS:
        raise ValueError(f"{kernel}: expected glu to be one of {GLU_ACTIVATIONS}, but got {glu!r}")
    if epilogue:
        raise ValueError(f"{kernel}: a gated pair's epilogue is act(gate) * up alone, but got also {sorted(epilogue)}")
    if b.shape[1] != 2 * c.shape[1]:
        raise ValueError(
            f"{kernel}: a gated pair's b holds [gate; up], twice C's {c.shape[1]} columns, but has {b.shape[1]}"
        )
    if b.stride(0) != 1:
        raise ValueError(
            f"{kernel}: a gated pair reads each half's rows of the (2N, K) weight whose transpose b is; b "
            f"must be K-major (b.stride(0) == 1), but has strides {tuple(b.stride())}"
        )
    if config.BLOCK_N < 32:
        raise ValueError(f"{kernel}: a gated pair needs BLOCK_N >= 32 (two halves of 16 columns), got {config.short()}")
    require_sm90(kernel, c.device)


def require_sm90(kernel: str, device: torch.device) -> None:
    """WGMMA exists on sm_90 alone (Blackwell has tcgen05 instead): say so before the compiler
    fails obscurely."""
    major, minor = device_info.capability(device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"{kernel}: needs an sm_90 (Hopper) GPU for WGMMA, but {device} is sm_{major}{minor}")


def check_wgmma_tile(kernel: str, config: MatmulConfig) -> None:
    """The tiles WGMMA can compute: a warpgroup (4 warps) owns 64 rows, and one instruction is
    at most 256 columns wide; past that the fp32 accumulator no longer fits the registers."""
    if config.num_warps not in (4, 8):
        raise ValueError(f"{kernel}: num_warps must be 4 or 8 (one or two warpgroups), but got {config.num_warps}")
    if config.BLOCK_M < 64:
        raise ValueError(
            f"{kernel}: BLOCK_M must be >= 64 (a warpgroup's WGMMA spans 64 rows), but got {config.BLOCK_M}"
        )
    if config.BLOCK_N > 256:
        raise ValueError(f"{kernel}: BLOCK_N must be <= 256 (the widest WGMMA), but got {config.BLOCK_N}")


def check_tcgen05_tile(kernel: str, config: MatmulConfig) -> None:
    """The tiles these rungs give tcgen05 (Blackwell): one CTA's MMA spans 64 or 128 rows (256
    take a CTA pair, not done here) and at most 256 columns, which with one fp32 column each fit
    tensor memory's 512; num_warps only sizes the epilogue's TMEM load."""
    if config.num_warps not in (4, 8):
        raise ValueError(f"{kernel}: num_warps must be 4 or 8, but got {config.num_warps}")
    if config.BLOCK_M not in (64, 128):
        raise ValueError(f"{kernel}: BLOCK_M must be 64 or 128 for one CTA's tcgen05 MMA, but got {config.BLOCK_M}")
    if config.BLOCK_N > 256:
        raise ValueError(f"{kernel}: BLOCK_N must be <= 256 (the widest tcgen05 MMA), but got {config.BLOCK_N}")


def check_mma_tile(kernel: str, config: MatmulConfig, mma) -> None:
    """check_wgmma_tile or check_tcgen05_tile, as `mma` (mma.mma_for's choice) is."""
    if mma is WGMMA:
        check_wgmma_tile(kernel, config)
    else:
        check_tcgen05_tile(kernel, config)


def refuse_c_pieces_for_tcgen05(kernel: str, config: MatmulConfig, elem_bytes: int, mma) -> None:
    """Raise for a plan that stores C in column pieces under tcgen05, whose epilogue can't cut them
    (whole_c_config), naming the largest ring that keeps C whole. The caller knows it would."""
    if mma is not WGMMA:
        fitting = whole_c_config(config, elem_bytes).num_stages
        raise ValueError(
            f"{kernel}: {config.short()} stores C in column pieces, which tcgen05's epilogue can't cut "
            f"(pipeline.whole_c_config); use num_stages <= {fitting}"
        )


# ----------------------------------------------------------------------------------------------
# Host side: what the ring costs in shared memory
# ----------------------------------------------------------------------------------------------

# Every sm_90 part (H100 SXM/PCIe, H200): 227 KB of shared memory per block once opted in
# (cudaDevAttrMaxSharedMemoryPerBlockOptin).
H100_SHARED_MEMORY_BYTES = 232448
# Barriers (8 B per slot, 16 B under ConSan) and the allocator's 1 KB alignment of swizzled buffers.
_SMEM_SLACK_BYTES = 2048


@dataclass(frozen=True)
class RingPlan:
    """Shared-memory layout of the persistent pipelined kernel for one config."""

    num_b_buffers: int  # B ring slots: num_stages, plus EPI_SPLIT - 1 when stealing
    steal_b: bool  # stage C in free B slots instead of a buffer of its own
    epi_split: int  # column pieces of the C tile in the epilogue (1 unless stealing)
    smem_bytes: int  # operand ring + C staging, without barriers


def operand_stage_bytes(config: MatmulConfig, elem_bytes: int) -> int:
    return (config.BLOCK_M + config.BLOCK_N) * config.BLOCK_K * elem_bytes


def c_tile_bytes(config: MatmulConfig, elem_bytes: int, gated: bool = False) -> int:
    """C's tile: BLOCK_M x BLOCK_N, or half that width for a gated pair (act(gate) * up)."""
    return config.BLOCK_M * config.BLOCK_N * elem_bytes // (2 if gated else 1)


def sequential_smem_bytes(config: MatmulConfig, elem_bytes: int, c_elem_bytes: int | None = None) -> int:
    """Kernels whose C staging tile is live only after the K loop: the allocator overlaps it with
    the operand ring, so the larger of the two counts. C's elements are the operands' unless
    `c_elem_bytes` says otherwise (fp8 operands, a bf16 C)."""
    c_tile = c_tile_bytes(config, c_elem_bytes or elem_bytes)
    return max(config.num_stages * operand_stage_bytes(config, elem_bytes), c_tile)


def check_sequential_fits(
    kernel: str,
    config: MatmulConfig,
    elem_bytes: int,
    smem_limit: int = H100_SHARED_MEMORY_BYTES,
    c_elem_bytes: int | None = None,
) -> None:
    """Raise ValueError, naming the kernel, when a non-overlapped ring does not fit."""
    if config.num_stages < 2:
        raise ValueError(
            f"{kernel}: num_stages (shared-memory buffers) must be >= 2, since one is read by the "
            f"MMA in flight while the next loads; got {config.num_stages}"
        )
    need = sequential_smem_bytes(config, elem_bytes, c_elem_bytes)
    if need > smem_limit - _SMEM_SLACK_BYTES:
        raise ValueError(
            f"{kernel}: {config.short()} needs {need} bytes of shared memory, more than the "
            f"{smem_limit} a block may have (less {_SMEM_SLACK_BYTES} for barriers and alignment); "
            f"use fewer num_stages or a smaller BLOCK_K"
        )


def whole_c_config(config: MatmulConfig, elem_bytes: int, smem_limit: int = H100_SHARED_MEMORY_BYTES) -> MatmulConfig:
    """`config` with its ring cut, where need be, until C's whole tile fits beside it (it is
    unchanged where it already does). For tcgen05 (Blackwell): its epilogue can't cut a tile into
    column pieces in registers, since the load out of tensor memory spreads each row's columns
    over both warpgroups of an 8-warp tile, and splitting them is a cross-warp move."""
    budget = smem_limit - _SMEM_SLACK_BYTES
    stages = config.num_stages
    while stages > 2 and stages * operand_stage_bytes(config, elem_bytes) + c_tile_bytes(config, elem_bytes) > budget:
        stages -= 1
    if stages * operand_stage_bytes(config, elem_bytes) + c_tile_bytes(config, elem_bytes) > budget:
        raise ValueError(f"{config.short()}: not even 2 ring slots leave room for a whole C tile; use a smaller tile")
    return config.with_(num_stages=stages)


@functools.cache  # a function of a frozen config: asked on every launch of rung 6
def plan_ring(
    config: MatmulConfig, elem_bytes: int, smem_limit: int = H100_SHARED_MEMORY_BYTES, gated: bool = False
) -> RingPlan:
    """Own C buffer if it fits next to the ring, else steal B slots; raise if neither fits. A
    gated pair's C tile is half the MMA's width, and always has its own buffer."""
    if config.num_stages < 2:
        raise ValueError(f"tma_persistent_pipelined: num_stages must be >= 2, got {config.num_stages}")
    budget = smem_limit - _SMEM_SLACK_BYTES
    stages = config.num_stages
    b_slot = config.BLOCK_N * config.BLOCK_K * elem_bytes
    own = stages * operand_stage_bytes(config, elem_bytes) + c_tile_bytes(config, elem_bytes, gated)
    if own <= budget:
        return RingPlan(num_b_buffers=stages, steal_b=False, epi_split=1, smem_bytes=own)
    if gated:
        raise ValueError(
            f"tma_persistent_pipelined: a gated pair on {config.short()} needs {own} bytes of shared memory (the "
            f"ring and half a C tile) but a block may have {smem_limit} (less {_SMEM_SLACK_BYTES}); use fewer "
            f"num_stages"
        )
    # One C piece [BLOCK_M, BLOCK_N / split] must fit a B slot [BLOCK_K, BLOCK_N].
    split = max(1, config.BLOCK_M // config.BLOCK_K)
    stolen = stages * operand_stage_bytes(config, elem_bytes) + (split - 1) * b_slot
    if split <= 2 and stolen <= budget:
        return RingPlan(num_b_buffers=stages + split - 1, steal_b=True, epi_split=split, smem_bytes=stolen)
    raise ValueError(
        f"tma_persistent_pipelined: {config.short()} needs {min(own, stolen)} bytes of shared memory but "
        f"a block may have {smem_limit} (less {_SMEM_SLACK_BYTES} for barriers and alignment); "
        f"use fewer num_stages or a smaller BLOCK_K"
    )
