"""Two CTAs, one above the other, sharing the loads of one operand (Triton >= 3.8:
compat.CLUSTER_MULTICAST): the ring of a kernel launched on clusters of two (num_ctas = 2).

Gluon writes such a kernel for the whole cluster: its blocks are the cluster's, and a layout's
`cga_layout` says which CTA holds what. Here a tile is two tiles one above the other. Each CTA
loads its own rows of A; the weight's tile (B), the same for both, is loaded once by the first
CTA and multicast by TMA into both CTAs' rings, so the cluster reads it from L2 once for both.
That changes when a slot may be refilled: after this CTA's consumers have released it (`empty`,
for its A rows) and, in the first CTA, after both CTAs' consumers have (`pair`, a barrier in the
first CTA that both arrive on; compat.cluster_ring_barriers). fp8/block.py runs on it (docs/fp8.md,
"Two CTAs, one weight tile", has the measurements), and grouped/ws.py's cluster form on its
pieces (docs/grouped.md).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from tritongemm.primitives.gluon.compat import tma_load

# How the two CTAs of a cluster hold a block (its cga_layout): each half the rows, the first CTA the
# upper half; or both the whole block, a multicast load's destination.
SPLIT_ROWS = ((1, 0),)
BOTH = ((0, 0),)


def block_layouts(cluster: int) -> tuple[tuple, tuple]:
    """(SPLIT_ROWS, BOTH) for the host's descriptors of a cluster's blocks; () each for one CTA."""
    return ((), ()) if cluster == 1 else (SPLIT_ROWS, BOTH)


@gluon.constexpr_function
def cluster_rows_layout(cluster):
    """SPLIT_ROWS for a cluster's register layouts; () for one CTA."""
    return () if cluster == 1 else SPLIT_ROWS


@gluon.constexpr_function
def replicated_1d_layout(num_warps, cluster):
    """A 1-D layout over num_warps warps whose whole vector each CTA of the cluster holds: a
    kernel's bookkeeping (a tile count summed over the groups, say), the same in both CTAs. On two
    CTAs a layout must say so (a cga_layout of zeros); without one Gluon refuses the reduction."""
    more = dict(cga_layout=[[0]]) if cluster > 1 else {}
    return gl.BlockedLayout([1], [32], [num_warps], [0], **more)


@gluon.jit
def release_slot(empty, pair, slot, CLUSTER: gl.constexpr, pred=True):
    """This consumer is done with `slot`: tell this CTA's load warp, and in a cluster the first
    CTA's too (`pair` counts both CTAs' consumers), since its multicast writes the slot here."""
    mbarrier.arrive(empty.index(slot), pred=pred)
    if CLUSTER > 1:
        mbarrier.arrive(pair.index(slot), pred=pred)


@gluon.jit
def cluster_load_partition(a_desc, b_desc, c_desc, a_bufs, a_bufs_1, b_bufs, ready, empty, pair,
                            Scheduler: gl.constexpr):  # fmt: skip
    """The load warp of a two-CTA cluster (CLUSTER = 2): every K-step of every tile of the
    cluster. Each CTA loads its own rows of A, in two boxes, one per consumer (a_desc's box is a
    consumer's rows of the cluster's tile, half of them in each CTA); the weight's tile, the same
    for both CTAs, is loaded once by the first CTA and multicast into both (half the weight
    traffic of two CTAs each loading it). So before a slot is refilled this CTA's consumers must
    have released it (`empty`, for its A rows) and, in the first CTA, both CTAs' consumers
    (`pair`: only the first CTA waits on it)."""
    CONSUMER_ROWS: gl.constexpr = a_desc.block_type.shape[0]
    TILE_M: gl.constexpr = 2 * CONSUMER_ROWS
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    NUM_BUFFERS: gl.constexpr = b_bufs.shape[0]
    K = a_desc.shape[1]
    scheduler = Scheduler.initialize(c_desc.shape[0], c_desc.shape[1], TILE_M, BLOCK_N)
    producer = 0
    for idx in range(scheduler.get_num_tiles()):
        pid_m, pid_n = scheduler.get_tile(idx)
        off_m = pid_m * TILE_M
        off_n = pid_n * BLOCK_N
        for k in range(0, K, BLOCK_K):
            slot = producer % NUM_BUFFERS
            lap_phase = (producer // NUM_BUFFERS) & 1  # lap 0 passes at once
            mbarrier.wait(empty.index(slot), lap_phase ^ 1)
            mbarrier.wait(pair.index(slot), lap_phase ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, 2 * a_desc.nbytes_per_cta + b_desc.nbytes_per_cta)
            tma_load(a_desc, [off_m, k], bar, a_bufs.index(slot))
            tma_load(a_desc, [off_m + CONSUMER_ROWS, k], bar, a_bufs_1.index(slot))
            tma_load(b_desc, [off_n, k], bar, b_bufs.index(slot), multicast=True)
            producer += 1
