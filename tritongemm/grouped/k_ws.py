"""grouped_mm's K groups (a mixture of experts' weight gradient) on rung 9's warp-specialized pipeline.

Group g is columns offs[g - 1]:offs[g] of A (M, K) and the same rows of B (K, N), and C[g] is their
product: C (G, M, N). In an MoE backward A is the output gradient's transpose and B the layer's
input, both (tokens, ...) row-major, so each expert's weight gradient sums over that expert's
tokens: the groups lie along the reduction (grouped/api.py `grouped_grads`). The `tl` kernel
(grouped/tl.py) ran it at 0.60-0.89x torch._grouped_mm's CUTLASS kernel on the H100's MoE
weight gradients; this is rung 9's load warp, ring and MMA warpgroups on it: 0.72-1.16x
(docs/grouped.md, "The weight gradient on Gluon").

The schedule. Every group has the same grid of C tiles; stacked, they are one (G * tiles_m) x
tiles_n grid, which a persistent scheduler (primitives/tiling/gluon.py) hands out as it would one tall C. A
tile's K-steps start at its group's first row and step BLOCK_K rows while they are in the group:
the load warp and the MMA warps read the group's ends from offs and count the same steps. An
empty group's tiles take no step and store zeros.

The group's end. TMA loads whole boxes, and a box can start at any row but not stop at one, so the
last K-step of a group whose rows are not a multiple of BLOCK_K also brings the next group's first
rows (zeros past K). That step's MMAs are WGMMAs of 16 rows of K each (one instruction's K), and
only those that hold a row of the group run; of the rows they read past the group's end, fewer
than 16, the MMA warps first zero both tiles' in shared memory (`_clear_rows_past`), then fence
those writes before the MMAs read the slot. So nothing of the next group, finite or not, enters
the sum. Zeroing every row past the group's end, with one MMA over the whole step, had cost 2-10%
where a group spans a few K-steps (H100: 8 to 128 experts at 2048-8192 tokens, geomean 1.024x
faster with the 16-row stop, 0.96-1.10x by row; results/h100/probes/grouped/grouped-k-ws-stop-at-16.csv,
scripts/probes/grouped/grouped_k_ws_ab.py).

The layouts. A group starts at any row, so a K-step's box starts at any index along K, and TMA
takes that only in an outer dimension: where K was the inner one (a row-major A, a K-major B)
every launch with a group start off 16 bytes stopped on an illegal instruction (H100). So A must be
M-major and B row-major, K outermost in both, which is how the weight gradient comes
(`grouped_grads`: dB = A^T @ dC and dB^T = dC^T @ A); grouped_mm sends the others to the `tl` kernel.

The store. C is described as (G * M, N), so a box of rows past M would write into the next group's
C: a tile below M goes out by TMA (rung 9's store, in two column halves where C's staging buffer
is half a tile), one that straddles M by grouped_ws.py's masked store.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from tritongemm.core.config import MatmulConfig
from tritongemm.core.tma import a_descriptor_view, b_descriptor_view, tma_unsupported_reason
from tritongemm.grouped.ws import _store_rows
from tritongemm.ladder.tma_warp_specialized import LOAD_REGISTERS, c_pieces, check_config
from tritongemm.primitives.gluon.compat import thread_barrier
from tritongemm.primitives.gluon.descriptors import bind, make_descriptors
from tritongemm.primitives.gluon.mma import WGMMA, wgmma_accumulator_layout
from tritongemm.primitives.gluon.pipeline import (
    barriers_per_slot,
    init_barriers,
    invalidate_barriers,
    issue_loads,
    require_sm90,
    step_operands,
    store_tile_in_pieces,
)
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tiling.gluon import num_persistent_programs, scheduler_for

NAME = "grouped_k_ws"
# grouped_mm's large `tl` tile (dispatch/grouped.py _GPU_TILES) on two MMA warpgroups, 3 slots of 48 KB
# and C staged whole (rung 9's c_pieces). On the H100 (scripts/probes/grouped/grouped_configs.py --form k --ws,
# results/h100/probes/grouped/grouped-k-ws-configs.csv), the best of seven tiles on four of the six weight
# gradients at 2048 and 8192 tokens: 0.72-1.16x torch._grouped_mm, where the `tl` kernel gave
# 0.60-0.89x; with 4 slots, C in halves, 0.71-1.02x; 256 x 128 best on the other two (0.80x, 0.97x).
DEFAULT_CONFIG = MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)


@gluon.jit
def _group_rows(offs_ptr, g):
    """Group g's rows of the reduction: offs[g - 1] (0 for the first group) to offs[g]."""
    end = gl.load(offs_ptr + g)
    start = gl.load(offs_ptr + gl.maximum(g - 1, 0))
    return gl.where(g > 0, start, 0), end


@gluon.jit
def _stacked_scheduler(Scheduler: gl.constexpr, M, N, G, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """The scheduler over every group's grid of C tiles stacked into one (G * tiles_m) x tiles_n
    grid, and tiles_m."""
    tiles_m = gl.cdiv(M, BLOCK_M)
    return Scheduler.initialize(G * tiles_m * BLOCK_M, N, BLOCK_M, BLOCK_N), tiles_m


@gluon.jit
def _stacked_tile(scheduler, idx, tiles_m, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(group, first row within C[g], first column) of this program's idx-th tile of the stacked grid."""
    stacked_m, pid_n = scheduler.get_tile(idx)
    return stacked_m // tiles_m, (stacked_m % tiles_m) * BLOCK_M, pid_n * BLOCK_N


@gluon.jit
def _clear_rows_past(buf, valid, stop, num_warps: gl.constexpr):
    """Zero an operand tile's rows (its K index) from `valid` to `stop` in shared memory, a few
    rows at a time (a whole tile in registers beside the MMA's accumulator spilled). Passes that
    lie wholly past `stop` are skipped: no MMA reads those rows."""
    ROWS: gl.constexpr = buf.shape[0]
    COLS: gl.constexpr = buf.shape[1]
    VEC: gl.constexpr = 128 // buf.dtype.primitive_bitwidth  # 16 bytes a thread
    THREADS_N: gl.constexpr = COLS // VEC if COLS // VEC < 32 else 32
    CHUNK: gl.constexpr = 32 // THREADS_N * num_warps  # rows a pass of the layout covers
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // THREADS_N, THREADS_N], [num_warps, 1], [1, 0])
    for r in gl.static_range(0, ROWS, CHUNK):
        if r + CHUNK > valid and r < stop:  # rows below valid are the group's: left as loaded
            part = buf.slice(r, CHUNK)
            k = gl.expand_dims(r + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout)), 1)
            tile = part.load(layout)
            part.store(gl.where(k < valid, tile, gl.zeros_like(tile)))


@gluon.jit
def _load_partition(
    a_desc, b_desc, offs_ptr, a_bufs, b_bufs, ready, empty, M, N, G,
    Scheduler: gl.constexpr,
):  # fmt: skip
    """The load warp: every K-step of every tile of this program, in the MMA warps' order."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    scheduler, tiles_m = _stacked_scheduler(Scheduler, M, N, G, BLOCK_M, BLOCK_N)
    producer = 0
    for idx in range(scheduler.get_num_tiles()):
        g, off_m, off_n = _stacked_tile(scheduler, idx, tiles_m, BLOCK_M, BLOCK_N)
        start, end = _group_rows(offs_ptr, g)
        for k in range(start, end, BLOCK_K):
            lap_phase = (producer // NUM_BUFFERS) & 1  # rung 9's: lap 0 passes at once
            mbarrier.wait(empty.index(producer % NUM_BUFFERS), lap_phase ^ 1)
            producer = issue_loads(producer, a_desc, b_desc, off_m, off_n, k, ready, a_bufs, b_bufs, True, False)


@gluon.jit
def _mma_partition(
    a_desc, b_desc, c_desc, offs_ptr, c_ptr, stride_cm, a_bufs, b_bufs, c_smem, ready, empty, M, N, G,
    Scheduler: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Wait for a slot, clear what lies past the group at its last step, multiply, release the slot
    before (rung 9's); per tile, the store of C[g]'s tile."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    MMA_K: gl.constexpr = 16  # K rows of one WGMMA instruction on 16-bit operands
    scheduler, tiles_m = _stacked_scheduler(Scheduler, M, N, G, BLOCK_M, BLOCK_N)
    mma = WGMMA.initialize(a_desc.dtype, BLOCK_M, BLOCK_N, num_warps)
    consumer = 0
    for idx in range(scheduler.get_num_tiles()):
        g, off_m, off_n = _stacked_tile(scheduler, idx, tiles_m, BLOCK_M, BLOCK_N)
        start, end = _group_rows(offs_ptr, g)
        for k in range(start, end, BLOCK_K):
            a, b = step_operands(consumer, ready, a_bufs, b_bufs, True, False)  # A M-major, B row-major
            valid = end - k
            if valid < BLOCK_K:
                # The group's last step also holds the next group's first rows. Its MMAs stop at the
                # first multiple of MMA_K rows past the group's end, and the rows between the two
                # become zeros (none where the group ends on such a multiple).
                stop = gl.cdiv(valid, MMA_K) * MMA_K
                if valid < stop:
                    slot = consumer % NUM_BUFFERS
                    _clear_rows_past(a_bufs.index(slot), valid, stop, num_warps)  # [BLOCK_K, BLOCK_M]: A M-major
                    _clear_rows_past(b_bufs.index(slot), valid, stop, num_warps)  # [BLOCK_K, BLOCK_N]
                    fence_async_shared()  # the writes, before the MMA (the async proxy) reads the slot
                    thread_barrier()
                slot_a = a_bufs.index(consumer % NUM_BUFFERS)
                for j in gl.static_range(0, BLOCK_K, MMA_K):
                    if j < valid:
                        a_j = slot_a.slice(j, MMA_K, dim=0).permute((1, 0))  # [BLOCK_M, MMA_K]
                        mma = mma.issue_async_mma(a_j, b.slice(j, MMA_K, dim=0))
                        mma = mma.wait_num_outstanding(1)
            else:
                mma = mma.issue_async_mma(a, b)
                mma = mma.wait_num_outstanding(1)
            consumer += 1
            # Step consumer - 1 is in flight, so consumer - 2 has retired (none before a tile's first).
            mbarrier.arrive(empty.index((consumer + NUM_BUFFERS - 2) % NUM_BUFFERS), pred=k > start)
        mma = mma.wait_num_outstanding(0)
        mbarrier.arrive(empty.index((consumer + NUM_BUFFERS - 1) % NUM_BUFFERS), pred=end > start)
        acc, mma = mma.take_result()
        row = g * M + off_m  # C[g]'s tile in C's (G * M, N) view
        if end == start:  # an empty group: no MMA wrote acc, and its C[g] is zeros
            layout: gl.constexpr = wgmma_accumulator_layout(a_desc.dtype, BLOCK_M, BLOCK_N, num_warps)
            tma.store_wait(pendings=0)  # c_smem read by the last TMA store before it is written
            zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=layout)
            _store_rows(zeros, c_ptr, stride_cm, c_smem, row, g * M + M, off_n, N, num_warps)
        elif off_m + BLOCK_M <= M:
            store_tile_in_pieces(acc, c_desc, c_smem, row, off_n)  # waits for c_smem's last store
        else:  # a box would run into C[g + 1]'s rows
            tma.store_wait(pendings=0)
            _store_rows(acc, c_ptr, stride_cm, c_smem, row, g * M + M, off_n, N, num_warps)
    tma.store_wait(pendings=0)  # every store out before the program ends and its shared memory goes


@gluon.jit
def _grouped_k_ws_kernel(
    a_desc,  # A M-major: A.T (K, M), block [BLOCK_K, BLOCK_M]
    b_desc,  # B (K, N), block [BLOCK_K, BLOCK_N]
    c_desc,  # C (G * M, N), block [BLOCK_M, BLOCK_N / C_PIECES]
    offs_ptr,  # (G,) int32 group ends along K
    c_ptr,  # C, rows stride_cm apart (the masked store)
    stride_cm,
    M,
    N,
    G,
    Scheduler: gl.constexpr,  # a class from primitives/tiling/gluon.py, over the stacked grid
    NUM_BUFFERS: gl.constexpr,
    BARRIERS_PER_SLOT: gl.constexpr,  # 1; 2 under ConSan (pipeline.barriers_per_slot)
    LOAD_REGS: gl.constexpr,
    num_warps: gl.constexpr,
):
    dtype: gl.constexpr = a_desc.dtype
    gl.static_assert(NUM_BUFFERS >= 2, "one slot is read by the MMA in flight while the next one loads")
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS * BARRIERS_PER_SLOT, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    init_barriers(ready)
    init_barriers(empty)
    gl.warp_specialize(
        [
            (_mma_partition, (
                a_desc, b_desc, c_desc, offs_ptr, c_ptr, stride_cm, a_bufs, b_bufs, c_smem, ready, empty, M, N, G,
                Scheduler, num_warps,
            )),
            (_load_partition, (
                a_desc, b_desc, offs_ptr, a_bufs, b_bufs, ready, empty, M, N, G, Scheduler,
            )),
        ],
        [1],
        [LOAD_REGS],
    )  # fmt: skip
    invalidate_barriers(ready)
    invalidate_barriers(empty)


def unsupported_reason(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """Why this kernel can't take grouped_mm's K-group operands as they lie (None: it can): 16-bit,
    A (M, K) M-major and B (K, N) row-major, K outermost in both (module docstring), as TMA reads
    them in place, and C's rows (N of them) on 16 bytes."""
    reason = tma_unsupported_reason(a, b)
    if reason is not None:
        return reason
    if not a_descriptor_view(a)[1] or b_descriptor_view(b)[1]:  # the views TMA reads them through (descriptors.py)
        return (
            f"a group starts at any index of K, which TMA takes in an outer dimension only: a must be M-major "
            f"and b row-major, but got strides {tuple(a.stride())} and {tuple(b.stride())}"
        )
    return None


def plan(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, c: torch.Tensor, config: MatmulConfig | None = None,
         *, num_programs: int | None = None):  # fmt: skip
    """`launch(a, b, offs, c)` for operands of this geometry: C[g] (M, N) = A[:, groups' K range]
    @ B[that range], c contiguous (G, M, N) in a's dtype, checked and compiled once.
    `num_programs` replaces the SM count (tests: several tiles a program)."""
    config = config or DEFAULT_CONFIG
    (M, _), N, G = a.shape, b.shape[1], offs.shape[0]
    if c.shape != (G, M, N) or not c.is_contiguous() or c.dtype != a.dtype:
        raise ValueError(
            f"{NAME}: C must be contiguous ({G}, {M}, {N}) {a.dtype}, but got {tuple(c.shape)} {c.dtype} with "
            f"strides {tuple(c.stride())}"
        )
    reason = unsupported_reason(a, b)
    if reason is not None:
        raise ValueError(f"{NAME}: {reason}")
    if G == 0 or M * N == 0:
        raise ValueError(f"{NAME}: no tile to compute (G = {G}, M = {M}, N = {N}); grouped_mm returns zeros")
    require_sm90(NAME, c.device)
    check_config(config, a.element_size(), name=NAME)
    pieces = c_pieces(config, a.element_size())
    flat = c.view(G * M, N)
    desc = make_descriptors(a, b, flat, config.BLOCK_M, config.BLOCK_N, config.BLOCK_K, epi_split=pieces)
    tiles = G * -(-M // config.BLOCK_M) * -(-N // config.BLOCK_N)
    grid = (num_persistent_programs(tiles, c.device, num_programs),)
    constexprs = dict(
        Scheduler=scheduler_for(config.scheduler, config.GROUP_SIZE_M), NUM_BUFFERS=config.num_stages,
        BARRIERS_PER_SLOT=barriers_per_slot(), LOAD_REGS=LOAD_REGISTERS, num_warps=config.num_warps,
    )  # fmt: skip
    args = (desc.a, desc.b, desc.c, offs, c, N, M, N, G)
    # A launch reads a descriptor's tensor for its address alone: a transposed operand (or C's 3-D
    # tensor) stands for the view its descriptor was built on.
    launch = compile_launch(_grouped_k_ws_kernel, grid, args, constexprs, c.device).with_descriptors(
        (desc.a, desc.b, desc.c), bind
    )
    return lambda a, b, offs, c: launch(a, b, c, offs, c, N, M, N, G)
