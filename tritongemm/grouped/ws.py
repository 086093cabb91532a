"""grouped_mm's row groups (the MoE forward) on rung 9's warp-specialized pipeline.

Group g is rows offs[g - 1]:offs[g] of A times its own weight, B[g]; the groups are ragged and
their ends live on the device, so the schedule is computed here, never on the host (CUDA graphs
and torch.compile keep working, as with the `tl` kernel in grouped/tl.py).

The schedule. Every group's tiles, one group after the other, make one running order; the rows
past the last group's end come last, as tiles of zeros. Program p of P takes running tiles p,
p + P, p + 2P, ... Each partition first sums every group's tile count (one vector over the
groups), then walks the groups alongside its tiles: a walk that only moves forward, so a program
reads each group end once, whatever the tile count. Within a group, tiles go down M first: at
decode sizes a group has one row of tiles, and the programs beside each other share B's panels.

The loads (rung 9's load warp, pipeline.issue_loads): A's tile at the group's rows, from a
descriptor over all of A (rows past the group's end are the next group's: loaded, multiplied,
never stored); B's from a descriptor over the stacked K-major weights, (G * N, K), at row g * N +
the tile's columns (columns past N are the next group's: never stored either). A gated pair
(GLU) stacks [gate; up] per group, (G * 2N, K), and its B slot holds both boxes, as in rung 9.
An N-major B, (G, K, N) contiguous, is the weights as stored where they are read untransposed
(the input gradient of an MoE layer, dX = dC @ W[g]): its descriptor stacks them as (G * K, N),
B's tile is at row g * K + k, and K must be a whole number of K-steps, or the last one would read
the next group's rows into the sum (grouped_mm's other K go to the `tl` kernel).

The store. A tile whose rows all lie in its group goes out by TMA, asynchronously, as rung 9's
do (columns past N are clipped by C's descriptor). A box can't stop at a group's last row, so a
tile that straddles the group's end goes through shared memory and out with masked stores, a few
rows at a time (rows below the group's end, columns below N), coalesced: each thread writes 16
bytes of a row.

Checked and timed on the H100 (docs/grouped.md); grouped_mm takes it for plain row groups of
128 rows or more on average (dispatch/grouped.py `takes_ws`), where it measured faster than the `tl`
kernel.
"""

# No `from __future__ import annotations`: aggregates check field types against real annotations.
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.core import _aggregate as aggregate

from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.core.tma import view_reason
from tritongemm.ladder.tma_warp_specialized import LOAD_REGISTERS, c_pieces
from tritongemm.primitives.epilogue import gated_gl
from tritongemm.primitives.gluon.cluster import block_layouts, cluster_rows_layout, release_slot, replicated_1d_layout
from tritongemm.primitives.gluon.compat import CLUSTER_MULTICAST, cluster_barrier, cluster_ring_barriers, tma_load
from tritongemm.primitives.gluon.descriptors import GL_DTYPES, bind, descriptor
from tritongemm.primitives.gluon.mma import WGMMA, wgmma_accumulator_layout
from tritongemm.primitives.gluon.pipeline import (
    _SMEM_SLACK_BYTES,
    H100_SHARED_MEMORY_BYTES,
    barriers_per_slot,
    c_tile_bytes,
    check_wgmma_tile,
    init_barriers,
    invalidate_barriers,
    issue_loads,
    issue_mma,
    operand_stage_bytes,
    require_sm90,
    store_tile_in_pieces,
)
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tiling.gluon import num_persistent_programs

NAME = "grouped_ws"
# 128 x 256 on two MMA warpgroups, 4 slots of 48 KB, C staged in halves of 32 KB (c_pieces): on
# the H100 (scripts/probes/grouped/grouped_configs.py --ws, probes/grouped/grouped-ws-configs-wide.csv) 0.94-1.19x
# torch._grouped_mm on the three MoE layers at 2048 and 8192 tokens, where the 128 x 128 tile with
# 5 slots of 32 KB that it replaced gave 0.84-1.23x, reading B's panels again for every 128 columns:
# L2 throughput at 80% of peak under Nsight Compute (scripts/probes/grouped/grouped_ncu.py), twice rung 9's.
DEFAULT_CONFIG = MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_SIZE_M=1, num_warps=8, num_stages=4)
# A gated pair's MMA covers the gate's and the up projection's columns: twice C's tile width, so C's
# 128 x 128 tile fits whole.
GATED_CONFIG = DEFAULT_CONFIG
# Groups of a few rows (decode): every tile streams its group's weights and holds a few real rows,
# so one warpgroup on 64 rows and a deeper ring of loads in flight, as the `tl` kernel's small tile
# (dispatch/grouped.py _GPU_TILES) streams K at depth.
SMALL_CONFIG = MatmulConfig(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=8)
SMALL_GATED_CONFIG = SMALL_CONFIG.with_(BLOCK_N=256, num_stages=5)
SMALL_GROUP_ROWS = 64  # mean rows per group below which the small configs serve
_K_STEP = DEFAULT_CONFIG.BLOCK_K  # every config's: an N-major b's K is a multiple of it
_STORE_BYTES = gl.constexpr(16)  # a thread's share of a row in the masked store: one 16-byte store


@gluon.jit
def _tile_count(offs_ptr, G, M, tiles_n, BLOCK_M: gl.constexpr, GROUPS_POW2: gl.constexpr, CLUSTER: gl.constexpr):
    """All running tiles: each group's cdiv(rows, BLOCK_M) * tiles_n, and the tail's (the rows
    past the last group's end, slot G), summed as one vector over the groups (in each CTA of a
    cluster alike)."""
    layout: gl.constexpr = replicated_1d_layout(gl.num_warps(), CLUSTER)
    slot = gl.arange(0, GROUPS_POW2, layout=layout)
    ends = gl.load(offs_ptr + slot, mask=slot < G, other=0)
    ends = gl.where(slot < G, ends, gl.where(slot == G, M, 0))
    starts = gl.load(offs_ptr + slot - 1, mask=(slot > 0) & (slot <= G), other=0)
    tiles = gl.where(slot <= G, (ends - starts + BLOCK_M - 1) // BLOCK_M * tiles_n, 0)
    return gl.sum(tiles, 0)


@aggregate
class RaggedWalk:
    """Where a program's walk over the running order stands: the group that holds its current tile
    (G: the tail past the last group's end), that group's first running tile, tile count and rows.
    Immutable, as the MMA state: each step returns the new walk."""

    g: gl.tensor
    first: gl.tensor
    count: gl.tensor
    start: gl.tensor  # the group's rows are start:end
    end: gl.tensor

    @gluon.constexpr_function
    def __init__(self, g, first, count, start, end):
        self.g = g
        self.first = first
        self.count = count
        self.start = start
        self.end = end

    @gluon.jit
    def initialize(G):
        """Before group 0: no tiles, rows ending at 0 (where group 0 starts)."""
        zero = G * 0
        return RaggedWalk(zero - 1, zero, zero, zero, zero)

    @gluon.jit
    def to_tile(self, t, offs_ptr, G, M, tiles_n, BLOCK_M: gl.constexpr):
        """Forward to the group that holds running tile t (t below the program's tile count)."""
        g, first, count, start, end = self.g, self.first, self.count, self.start, self.end
        while t >= first + count:
            first += count
            g += 1
            start = end
            if g < G:
                end = gl.load(offs_ptr + g)
            else:
                end = M
            count = (end - start + BLOCK_M - 1) // BLOCK_M * tiles_n
        return RaggedWalk(g, first, count, start, end)

    @gluon.jit
    def tile(self, t, tiles_n, BLOCK_M: gl.constexpr, TILE_N: gl.constexpr):
        """(first row, first column) of running tile t within its group: tiles go down M first."""
        local = t - self.first
        tiles_m = self.count // tiles_n
        return self.start + (local % tiles_m) * BLOCK_M, (local // tiles_m) * TILE_N


@gluon.jit
def _tiles(offs_ptr, G, M, N, BLOCK_M: gl.constexpr, TILE_N: gl.constexpr, GROUPS_POW2: gl.constexpr,
           CLUSTER: gl.constexpr):  # fmt: skip
    """This program's running tiles: (its count, the first, the stride P, tiles across N). On a
    cluster, a program is the cluster and BLOCK_M the cluster's rows."""
    tiles_n = gl.cdiv(N, TILE_N)
    total = _tile_count(offs_ptr, G, M, tiles_n, BLOCK_M, GROUPS_POW2, CLUSTER)
    pid = gl.program_id(axis=0)
    programs = gl.num_programs(axis=0)
    return gl.maximum(total - pid + programs - 1, 0) // programs, pid, programs, tiles_n


@gluon.jit
def _load_partition(
    a_desc, b_desc, offs_ptr, a_bufs, b_bufs, ready, empty, G, M, N,
    GATED: gl.constexpr, B_K_MAJOR: gl.constexpr, GROUPS_POW2: gl.constexpr,
):  # fmt: skip
    """The load warp: every K-step of every group tile of this program (none for the tail)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    TILE_N: gl.constexpr = _tile_n(b_desc, B_K_MAJOR)
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    K = a_desc.shape[1]
    rows_per_group = 2 * N if GATED else N  # the stacked K-major weights' rows per group
    num, pid, programs, tiles_n = _tiles(offs_ptr, G, M, N, BLOCK_M, TILE_N, GROUPS_POW2, 1)
    walk = RaggedWalk.initialize(G)
    producer = 0
    for i in range(num):
        t = pid + i * programs
        walk = walk.to_tile(t, offs_ptr, G, M, tiles_n, BLOCK_M)
        if walk.g < G:
            off_m, off_n = walk.tile(t, tiles_n, BLOCK_M, TILE_N)
            if B_K_MAJOR:
                b_n, b_k = walk.g * rows_per_group + off_n, 0
            else:
                b_n, b_k = off_n, walk.g * K  # K is whole K-steps here (unsupported_reason)
            for k in range(0, K, BLOCK_K):
                lap_phase = (producer // NUM_BUFFERS) & 1  # rung 9's: lap 0 passes at once
                mbarrier.wait(empty.index(producer % NUM_BUFFERS), lap_phase ^ 1)
                producer = issue_loads(
                    producer, a_desc, b_desc, off_m, b_n, k, ready, a_bufs, b_bufs, False, B_K_MAJOR, True, N, b_k
                )


@gluon.jit
def _cluster_load_partition(
    a_desc, b_desc, offs_ptr, a_bufs, b_bufs, ready, empty, pair, G, M, N,
    B_K_MAJOR: gl.constexpr, GROUPS_POW2: gl.constexpr,
):  # fmt: skip
    """The load warp of a two-CTA cluster (CLUSTER = 2, primitives/gluon/cluster.py): every K-step
    of every group tile of the cluster, a tile being two, one above the other, in one group. Each
    CTA loads its own rows of A (a_desc's box is the cluster's, half in each CTA); the group's
    weight tile, the same for both, is loaded once by the first CTA and multicast into both. A
    slot is refilled once this CTA's consumer has released it, and in the first CTA once both
    CTAs' have (`pair`)."""
    TILE_M: gl.constexpr = a_desc.block_type.shape[0]  # the cluster's rows
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    TILE_N: gl.constexpr = _tile_n(b_desc, B_K_MAJOR)
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    K = a_desc.shape[1]
    num, pid, programs, tiles_n = _tiles(offs_ptr, G, M, N, TILE_M, TILE_N, GROUPS_POW2, 2)
    walk = RaggedWalk.initialize(G)
    producer = 0
    for i in range(num):
        t = pid + i * programs
        walk = walk.to_tile(t, offs_ptr, G, M, tiles_n, TILE_M)
        if walk.g < G:
            off_m, off_n = walk.tile(t, tiles_n, TILE_M, TILE_N)
            for k in range(0, K, BLOCK_K):
                slot = producer % NUM_BUFFERS
                lap_phase = (producer // NUM_BUFFERS) & 1  # lap 0 passes at once
                mbarrier.wait(empty.index(slot), lap_phase ^ 1)
                mbarrier.wait(pair.index(slot), lap_phase ^ 1)  # the first CTA only
                bar = ready.index(slot)
                mbarrier.expect(bar, a_desc.nbytes_per_cta + b_desc.nbytes_per_cta)
                tma_load(a_desc, [off_m, k], bar, a_bufs.index(slot))
                if B_K_MAJOR:  # the stacked (G * N, K) weights: the group's rows
                    tma_load(b_desc, [walk.g * N + off_n, k], bar, b_bufs.index(slot), multicast=True)
                else:  # the stacked (G * K, N) weights: the group's K rows
                    tma_load(b_desc, [walk.g * K + k, off_n], bar, b_bufs.index(slot), multicast=True)
                producer += 1


@gluon.constexpr_function
def _tile_n(b_desc, b_k_major):
    """C's columns per tile: B's box across N (a gated pair: one box of its two)."""
    return b_desc.block_type.shape[0] if b_k_major else b_desc.block_type.shape[1]


@gluon.jit
def _store_rows(tile, c_ptr, stride_cm, c_smem, off_m, end_m, off_n, N, num_warps: gl.constexpr):
    """Rows off_m.. below end_m and columns off_n.. below N of C get the tile, through c_smem a few
    rows a step; where c_smem is half the tile's width (a whole one doesn't fit beside the ring),
    one column half after the other."""
    if c_smem.shape[1] == tile.shape[1]:
        _store_piece(tile, c_ptr, stride_cm, c_smem, off_m, end_m, off_n, N, num_warps)
    else:
        gl.static_assert(2 * c_smem.shape[1] == tile.shape[1], "a tile is stored in at most 2 pieces")
        # [BLOCK_M, TILE_N] -> [BLOCK_M, TILE_N/2, 2]: the split is a register renaming, no data moves.
        halves = gl.permute(gl.reshape(tile, [tile.shape[0], 2, c_smem.shape[1]]), (0, 2, 1))
        left, right = gl.split(halves)
        _store_piece(left, c_ptr, stride_cm, c_smem, off_m, end_m, off_n, N, num_warps)
        _store_piece(right, c_ptr, stride_cm, c_smem, off_m, end_m, off_n + c_smem.shape[1], N, num_warps)


@gluon.jit
def _store_piece(tile, c_ptr, stride_cm, c_smem, off_m, end_m, off_n, N, num_warps: gl.constexpr):
    """Rows off_m.. below end_m and columns off_n.. below N of C get the tile, c_smem's width."""
    BLOCK_M: gl.constexpr = c_smem.shape[0]
    TILE_N: gl.constexpr = c_smem.shape[1]
    VEC: gl.constexpr = 8 * _STORE_BYTES // c_ptr.dtype.element_ty.primitive_bitwidth
    THREADS_N: gl.constexpr = TILE_N // VEC if TILE_N // VEC < 32 else 32
    THREADS_M: gl.constexpr = 32 // THREADS_N
    CHUNK_M: gl.constexpr = THREADS_M * num_warps
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [THREADS_M, THREADS_N], [num_warps, 1], [1, 0])
    c_smem.store(tile.to(c_ptr.dtype.element_ty))
    cols = off_n + gl.arange(0, TILE_N, layout=gl.SliceLayout(0, layout))
    for r in gl.static_range(0, BLOCK_M, CHUNK_M):
        rows = off_m + r + gl.arange(0, CHUNK_M, layout=gl.SliceLayout(1, layout))
        part = c_smem.slice(r, CHUNK_M).load(layout)
        mask = gl.expand_dims(rows < end_m, 1) & gl.expand_dims(cols < N, 0)
        ptrs = c_ptr + gl.expand_dims(rows.to(gl.int64) * stride_cm, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, part, mask=mask)


@gluon.jit
def _store_rows_direct(tile, c_ptr, stride_cm, off_m, end_m, off_n, N):
    """Rows off_m.. below end_m and columns off_n.. below N of C get the tile, straight from the
    registers: a cluster's tile at a group's end (its rows lie in two CTAs, so c_smem's few rows a
    step of `_store_rows` would be one CTA's). Narrower stores than `_store_rows`', at a group's
    last tile only."""
    layout: gl.constexpr = tile.type.layout
    rows = off_m + gl.arange(0, tile.shape[0], layout=gl.SliceLayout(1, layout))
    cols = off_n + gl.arange(0, tile.shape[1], layout=gl.SliceLayout(0, layout))
    mask = gl.expand_dims(rows < end_m, 1) & gl.expand_dims(cols < N, 0)
    ptrs = c_ptr + gl.expand_dims(rows.to(gl.int64) * stride_cm, 1) + gl.expand_dims(cols, 0)
    gl.store(ptrs, tile.to(c_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _mma_partition(
    a_desc, b_desc, c_desc, offs_ptr, c_ptr, stride_cm, a_bufs, b_bufs, c_smem, ready, empty, pair, G, M, N,
    GLU: gl.constexpr, B_K_MAJOR: gl.constexpr, GROUPS_POW2: gl.constexpr, CLUSTER: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    """Wait for a slot, multiply, release it (rung 9's); per tile, act(gate) * up for a gated
    pair, and the store: by TMA where the tile's rows are all its group's, else masked. The
    tail's tiles are zeros, with no MMA. CLUSTER = 2: the code is the cluster's, BLOCK_M its rows
    (half in each CTA), and a slot goes back to both CTAs' load warps (cluster.release_slot)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_bufs.shape[1] if B_K_MAJOR else b_bufs.shape[2]  # the MMA's N: a gated pair's two
    TILE_N: gl.constexpr = _tile_n(b_desc, B_K_MAJOR)
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    K = a_desc.shape[1]
    mma = WGMMA.initialize(a_desc.dtype, BLOCK_M // CLUSTER, BLOCK_N, num_warps, CLUSTER)
    num, pid, programs, tiles_n = _tiles(offs_ptr, G, M, N, BLOCK_M, TILE_N, GROUPS_POW2, CLUSTER)
    walk = RaggedWalk.initialize(G)
    consumer = 0
    for i in range(num):
        t = pid + i * programs
        walk = walk.to_tile(t, offs_ptr, G, M, tiles_n, BLOCK_M)
        off_m, off_n = walk.tile(t, tiles_n, BLOCK_M, TILE_N)
        if walk.g < G:
            for k in range(0, K, BLOCK_K):
                consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, False, B_K_MAJOR)
                release_slot(empty, pair, (consumer + NUM_BUFFERS - 2) % NUM_BUFFERS, CLUSTER, pred=k > 0)
            mma = mma.wait_num_outstanding(0)
            release_slot(empty, pair, (consumer + NUM_BUFFERS - 1) % NUM_BUFFERS, CLUSTER)
            acc, mma = mma.take_result()
            if GLU != "none":
                acc = gated_gl(acc, GLU)
            if off_m + BLOCK_M <= walk.end:  # whole rows of its group: the TMA store, asynchronous
                store_tile_in_pieces(acc, c_desc, c_smem, off_m, off_n)  # waits for c_smem's last store
            elif CLUSTER == 1:
                tma.store_wait(pendings=0)  # c_smem read by the last TMA store before it is written
                _store_rows(acc, c_ptr, stride_cm, c_smem, off_m, walk.end, off_n, N, num_warps)
            else:
                _store_rows_direct(acc, c_ptr, stride_cm, off_m, walk.end, off_n, N)
        else:
            layout: gl.constexpr = wgmma_accumulator_layout(
                a_desc.dtype, BLOCK_M // CLUSTER, TILE_N, num_warps, cluster_rows_layout(CLUSTER)
            )
            zeros = gl.zeros([BLOCK_M, TILE_N], gl.float32, layout=layout)
            if CLUSTER == 1:
                tma.store_wait(pendings=0)
                _store_rows(zeros, c_ptr, stride_cm, c_smem, off_m, walk.end, off_n, N, num_warps)
            else:
                _store_rows_direct(zeros, c_ptr, stride_cm, off_m, walk.end, off_n, N)
    tma.store_wait(pendings=0)  # every store out before the program ends and its shared memory goes


@gluon.jit
def _grouped_ws_kernel(
    a_desc,  # A (M, K), block [BLOCK_M, BLOCK_K]
    b_desc,  # the stacked K-major weights (G * N, K), or (G * 2N, K) for a gated pair; block [TILE_N, BLOCK_K]
    #          or N-major (G * K, N), block [BLOCK_K, TILE_N] (B_K_MAJOR False)
    c_desc,  # C (M, N), block [BLOCK_M, TILE_N / C_PIECES]: the TMA store of a tile within its group
    offs_ptr,  # (G,) int32 group ends
    c_ptr,  # C (M, N), rows stride_cm apart
    stride_cm,
    G,
    M,
    N,
    NUM_BUFFERS: gl.constexpr,
    BARRIERS_PER_SLOT: gl.constexpr,  # 1; 2 under ConSan (pipeline.barriers_per_slot)
    GROUPS_POW2: gl.constexpr,  # a power of two > G: the groups and the tail as one vector
    C_PIECES: gl.constexpr,  # 1: a whole C tile is staged at once; 2: half its width, one half after the other
    LOAD_REGS: gl.constexpr,
    GLU: gl.constexpr,  # "none", or a gated pair's activation: C = act(A @ gate_g.T) * (A @ up_g.T)
    B_K_MAJOR: gl.constexpr,
    CLUSTER: gl.constexpr,  # 1, or 2: a cluster of two CTAs, one above the other, sharing the weight's tile
    num_warps: gl.constexpr,
):
    dtype: gl.constexpr = a_desc.dtype
    TILE_N: gl.constexpr = _tile_n(b_desc, B_K_MAJOR)
    B_BOX: gl.constexpr = b_desc.block_type.shape
    B_ROWS: gl.constexpr = 2 * B_BOX[0] if GLU != "none" else B_BOX[0]  # a gated pair's slot: two boxes
    gl.static_assert(B_K_MAJOR or GLU == "none", "a gated pair's [gate; up] are rows of K-major weights")
    gl.static_assert(NUM_BUFFERS >= 2, "one slot is read by the MMA in flight while the next one loads")
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS, B_ROWS, B_BOX[1]], b_desc.layout)
    gl.static_assert(c_desc.block_type.shape[1] * C_PIECES == TILE_N, "C's descriptor holds one piece of a tile")
    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    if CLUSTER == 1:
        ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS * BARRIERS_PER_SLOT, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
        pair = empty  # not used
    else:
        gl.static_assert(GLU == "none" and BARRIERS_PER_SLOT == 1, "a cluster runs plain row groups, without ConSan")
        ready, empty, pair = cluster_ring_barriers(NUM_BUFFERS)
    init_barriers(ready)
    init_barriers(empty)
    if CLUSTER == 1:
        gl.warp_specialize(
            [
                (_mma_partition, (
                    a_desc, b_desc, c_desc, offs_ptr, c_ptr, stride_cm, a_bufs, b_bufs, c_smem, ready, empty, pair,
                    G, M, N, GLU, B_K_MAJOR, GROUPS_POW2, CLUSTER, num_warps,
                )),
                (_load_partition, (
                    a_desc, b_desc, offs_ptr, a_bufs, b_bufs, ready, empty, G, M, N, GLU != "none", B_K_MAJOR,
                    GROUPS_POW2,
                )),
            ],
            [1],
            [LOAD_REGS],
        )  # fmt: skip
    else:
        init_barriers(pair)  # one consumer a CTA: one arrival from each (Gluon doubles the count)
        gl.warp_specialize(
            [
                (_mma_partition, (
                    a_desc, b_desc, c_desc, offs_ptr, c_ptr, stride_cm, a_bufs, b_bufs, c_smem, ready, empty, pair,
                    G, M, N, GLU, B_K_MAJOR, GROUPS_POW2, CLUSTER, num_warps,
                )),
                (_cluster_load_partition, (
                    a_desc, b_desc, offs_ptr, a_bufs, b_bufs, ready, empty, pair, G, M, N, B_K_MAJOR, GROUPS_POW2,
                )),
            ],
            [1],
            [LOAD_REGS],
        )  # fmt: skip
        cluster_barrier()  # neither CTA leaves while the other can still arrive on its barriers
        invalidate_barriers(pair)
    invalidate_barriers(ready)
    invalidate_barriers(empty)


def default_config(rows: int, groups: int, gated: bool) -> MatmulConfig:
    """The tile for `rows` over `groups` groups (pure): the small one where groups are short."""
    small = rows < SMALL_GROUP_ROWS * max(groups, 1)
    if gated:
        return SMALL_GATED_CONFIG if small else GATED_CONFIG
    return SMALL_CONFIG if small else DEFAULT_CONFIG


def smem_bytes(config: MatmulConfig, elem_bytes: int, gated: bool = False) -> int:
    """The ring and C's staging buffer (a tile, half the MMA's width for a gated pair, or half of
    that tile where it doesn't fit whole), barriers aside."""
    c_tile = c_tile_bytes(config, elem_bytes, gated) // c_pieces(config, elem_bytes, gated=gated)
    return config.num_stages * operand_stage_bytes(config, elem_bytes) + c_tile


def unsupported_reason(a: torch.Tensor, b: torch.Tensor, glu: str | None = None) -> str | None:
    """Why this kernel can't take grouped_mm's row-group operands as they lie (None: it can): a
    row-major A; K-major weights (b (G, K, N) the transpose of contiguous (G, N, K) weights) or,
    without a gated pair, N-major ones (b contiguous, K whole K-steps); 16-bit, each as TMA reads
    it (descriptors.view_reason)."""
    if a.dtype not in GL_DTYPES or b.dtype != a.dtype:
        return f"operands of {a.dtype} and {b.dtype}; it takes {list(GL_DTYPES)}, one dtype"
    reason = view_reason("a", a)
    if reason is not None:
        return f"a needs rows on 16 bytes with unit column stride: {reason}"
    if _k_major(b):
        weights = b.transpose(1, 2)
        return view_reason("b's stacked weights", weights.reshape(-1, weights.shape[-1]))
    if not b.is_contiguous() or glu is not None:
        return (
            f"b must be the transpose of contiguous (G, N, K) weights, or contiguous without a gated pair, but has "
            f"shape {tuple(b.shape)} and strides {tuple(b.stride())} (glu={glu!r})"
        )
    if b.shape[1] % _K_STEP:
        return f"an N-major b needs K a multiple of {_K_STEP} (its groups' weights are stacked), but K is {b.shape[1]}"
    return view_reason("b's stacked weights", b.reshape(-1, b.shape[-1]))


def _k_major(b: torch.Tensor) -> bool:
    """Whether b (G, K, N) is read K-major: the transpose of contiguous (G, N, K) weights."""
    return b.transpose(1, 2).is_contiguous()


def descriptors(a, b, c, config: MatmulConfig, gated: bool, cluster: int) -> tuple:
    """TMA descriptors of a (M, K), the stacked weights of b (G, K, N or 2N) and c (M, N). On a
    cluster each block is the cluster's: A's and C's both CTAs' rows (half in each), the weight's
    one box, which both CTAs hold (multicast)."""
    (G, K, NB), tile_n = b.shape, config.BLOCK_N // 2 if gated else config.BLOCK_N
    rows, shared = block_layouts(cluster)
    tile_m = config.BLOCK_M * cluster
    if _k_major(b):  # a view: b is the transpose of contiguous weights
        b_desc = descriptor(b.transpose(1, 2).reshape(G * NB, K), (tile_n, config.BLOCK_K), shared)
    else:
        b_desc = descriptor(b.reshape(G * K, NB), (config.BLOCK_K, tile_n), shared)
    pieces = c_pieces(config, a.element_size(), gated=gated)
    c_desc = descriptor(c, (tile_m, tile_n // pieces), rows)
    return descriptor(a, (tile_m, config.BLOCK_K), rows), b_desc, c_desc


def cluster_possible(glu: str | None) -> bool:
    """Whether `plan(cluster=2)` runs here: a Triton with TMA multicast (>= 3.8,
    compat.CLUSTER_MULTICAST), plain row groups (a gated pair's two weight tiles are not shared),
    and not under ConSan, whose per-operand barriers the cluster's ring doesn't have."""
    return CLUSTER_MULTICAST and glu is None and barriers_per_slot() == 1


def plan(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, c: torch.Tensor, config: MatmulConfig | None = None,
         *, glu: str | None = None, num_programs: int | None = None, cluster: int = 1):  # fmt: skip
    """`launch(a, b, offs, c)` for operands of this geometry: C (M, N) = each group's rows of a
    times its weight, b (G, K, N) K-major (or (G, K, 2N), [gate; up] per group, with `glu`),
    checked and compiled once. `cluster` = 2 (where `cluster_possible`; tests and probes only:
    it ran 0.71-0.91x one CTA on the H200, docs/grouped.md): two CTAs, one above the other in one
    group, share the weight's tile by TMA multicast (primitives/gluon/cluster.py)."""
    reason = unsupported_reason(a, b, glu)
    if reason is not None:
        raise ValueError(f"{NAME}: {reason}")
    if cluster not in (1, 2) or (cluster == 2 and not cluster_possible(glu)):
        raise ValueError(
            f"{NAME}: cluster is 1, or 2 where this Triton multicasts (>= 3.8; this is {triton.__version__}) for plain "
            f"row groups (no glu, no ConSan); got cluster={cluster}, glu={glu!r}"
        )
    gated = glu is not None
    config = config or default_config(a.shape[0], b.shape[0], gated)
    check_wgmma_tile(NAME, config)
    k_major = _k_major(b)
    if not k_major and b.shape[1] % config.BLOCK_K:
        raise ValueError(f"{NAME}: an N-major b needs K ({b.shape[1]}) a multiple of BLOCK_K ({config.BLOCK_K})")
    need = smem_bytes(config, a.element_size(), gated)
    if need > H100_SHARED_MEMORY_BYTES - _SMEM_SLACK_BYTES:
        raise ValueError(f"{NAME}: {config.short()} needs {need} bytes of shared memory, more than a block has")
    (M, K), (G, _, NB) = a.shape, b.shape
    N = c.shape[1]
    if NB != (2 * N if gated else N) or c.shape[0] != M or c.stride(1) != 1 or K == 0:
        raise ValueError(f"{NAME}: C {tuple(c.shape)} doesn't match a {tuple(a.shape)} and b {tuple(b.shape)}")
    require_sm90(NAME, c.device)
    pieces = c_pieces(config, a.element_size(), gated=gated)
    reason = view_reason("c", c)
    if reason is not None:
        raise ValueError(f"{NAME}: C is stored by TMA, so its rows must lie on 16 bytes: {reason}")
    a_desc, b_desc, c_desc = descriptors(a, b, c, config, gated, cluster)
    # Each program walks the groups in running order: no more programs than tiles could use, but
    # the tile count is on the device, so the grid is the SMs (or what a test asks for), in
    # clusters of `cluster`.
    sms = device_info.sm_count(c.device) if num_programs is None else num_programs
    grid = (num_persistent_programs(2**31 - 1, c.device, sms if cluster == 1 else max(sms // cluster, 1)),)
    constexprs = dict(
        NUM_BUFFERS=config.num_stages, BARRIERS_PER_SLOT=barriers_per_slot(),
        GROUPS_POW2=triton.next_power_of_2(G + 1), C_PIECES=pieces, LOAD_REGS=LOAD_REGISTERS,
        GLU=glu or "none", B_K_MAJOR=k_major, CLUSTER=cluster,
        num_warps=config.num_warps,
    )  # fmt: skip
    if cluster > 1:
        constexprs["num_ctas"] = cluster  # the grid counts clusters
    stride_cm = c.stride(0)
    args = (a_desc, b_desc, c_desc, offs, c, stride_cm, G, M, N)
    # A launch reads a descriptor's tensor for its address alone, so b (one address) stands for
    # the stacked view the descriptor was built on.
    launch = compile_launch(_grouped_ws_kernel, grid, args, constexprs, c.device).with_descriptors(
        (a_desc, b_desc, c_desc), bind
    )
    return lambda a, b, offs, c: launch(a, b, c, offs, c, stride_cm, G, M, N)
