"""The Gluon calls whose names moved between the Triton releases tritongemm supports (3.6 to 3.9),
in one place, so that the kernels read the same on every release.

| what                    | triton 3.6, 3.7                   | 3.8                  | 3.9                  |
| TMA load                | tma.async_copy_global_to_shared   | both names           | tma.async_load       |
| TMA store               | tma.async_copy_shared_to_global   | both names           | tma.async_store      |
| view smem as other type | shared_memory_descriptor._reinterpret                   | .reinterpret         |
| TMEM tile to registers  | tmem.load(get_tmem_reg_layout(..))  | (not checked)        | tmem.load()          |
| barrier of the warps    | gl.thread_barrier; gl.barrier     | gl.barrier           | gl.barrier           |
| two CTAs, one TMA load  | none (3.7: the names, not run)    | CLUSTER_MULTICAST (below), both      |

Each helper is chosen once, here, by what the installed Gluon has (not by version number, so a
release that keeps both spellings takes the newer one). The kernels call these names only. The
one exception is the cluster flag, which is also a version floor (below).
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import blackwell
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

# tma_load(desc, coord, barrier, dest_smem, pred): copy a block into shared memory, completing on barrier.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# tma_store(desc, coord, src_smem): copy a shared-memory block out to global memory.
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

# thread_barrier(): every warp of the partition waits for the others (bar.sync).
thread_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

# reinterpret(smem, dtype, shape, layout): smem's bytes as a buffer of another dtype, shape and
# layout (no data moves). The descriptor's builtin method, called unbound.
reinterpret = getattr(gl.shared_memory_descriptor, "reinterpret", None) or gl.shared_memory_descriptor._reinterpret

# tmem_load(tmem): a tensor-memory tile into registers, in the layout of the TMEM load instruction
# (Blackwell, primitives/gluon/tcgen05.py). Triton 3.9 infers that layout itself and dropped the function
# that computed it.
if hasattr(blackwell, "get_tmem_reg_layout"):

    @gluon.jit
    def tmem_load(tmem):
        layout: gl.constexpr = blackwell.get_tmem_reg_layout(tmem.dtype, tmem.shape, tmem.layout, gl.num_warps())
        return tmem.load(layout)

else:

    @gluon.jit
    def tmem_load(tmem):
        return tmem.load()


# CLUSTER_MULTICAST: kernels may run on a cluster of two CTAs that share a tile's loads (fp8/block.py's
# CLUSTER = 2). Gluon's multi-CTA model: a kernel launched with num_ctas = 2 is written for the whole
# cluster, layouts say which CTA holds which rows (cga_layout), a load into a layout both CTAs hold
# is issued once with tma_load(..., multicast=True), and a barrier allocated by
# mbarrier.allocate_mbarrier(two_ctas=True) lives in the first CTA and counts both CTAs' arrivals.
# Triton 3.7 has the names, but the barrier shared by two CTAs came with 3.8 (issue 66), and 3.8 is
# the first release the kernels were run with: older ones keep the one-CTA kernels.
CLUSTER_MULTICAST = tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 8) and hasattr(
    mbarrier, "allocate_mbarrier"
)

# Triton resolves every name a kernel uses when it first compiles it, also in a branch a constexpr
# rules out: so a kernel's cluster branch calls these two, which exist on every release.
if CLUSTER_MULTICAST:

    @gluon.jit
    def cluster_ring_barriers(NUM_BUFFERS: gl.constexpr):
        """(ready, empty, pair) for a ring of NUM_BUFFERS slots in a two-CTA cluster: `ready` and
        `empty` one barrier per slot in each CTA, `pair` one per slot in the first CTA that both
        CTAs arrive on (and only the first waits on)."""
        ready = mbarrier.allocate_mbarrier(batch=NUM_BUFFERS)
        empty = mbarrier.allocate_mbarrier(batch=NUM_BUFFERS)
        pair = mbarrier.allocate_mbarrier(batch=NUM_BUFFERS, two_ctas=True)
        return ready, empty, pair

    @gluon.jit
    def cluster_barrier():
        """Every thread of both CTAs of the cluster waits for the others (barrier.cluster)."""
        gl.barrier(cluster=True)

else:

    @gluon.jit
    def cluster_ring_barriers(NUM_BUFFERS: gl.constexpr):
        gl.static_assert(False, "a two-CTA cluster needs triton >= 3.8 (compat.CLUSTER_MULTICAST)")

    @gluon.jit
    def cluster_barrier():
        gl.static_assert(False, "a two-CTA cluster needs triton >= 3.8 (compat.CLUSTER_MULTICAST)")
