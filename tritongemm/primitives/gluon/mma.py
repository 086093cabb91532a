"""The Hopper tensor-core step as a value: WGMMA accumulator state that the kernels thread
through their loops.

`warpgroup_mma` is asynchronous: it returns a token for an accumulator that lives in registers
but may not be read until `warpgroup_mma_wait` says the instruction retired. The kernels only
ever need four things from it, so that is the whole interface: start a fresh accumulator, issue
one K-step, wait until at most N steps are in flight, and take the finished tile (which also
re-arms the accumulator for the next tile without touching the registers).

Blackwell has the same four steps on other instructions: tcgen05.py's `TCGen05MMA` (tensor
memory, commits and mbarriers; compiled for sm_100, never run). The rungs written against the
interface alone, tma_persistent_pipelined and tma_warp_specialized, take the implementation as
the constexpr `MMA`, chosen per GPU by `mma_for`.
"""

# No `from __future__ import annotations` here: aggregates type-check their fields against the
# annotations at trace time, which must therefore be real types, not strings.

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    warpgroup_mma,
    warpgroup_mma_accumulator,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate

from tritongemm.core import device_info
from tritongemm.primitives.gluon.cluster import cluster_rows_layout
from tritongemm.primitives.gluon.tcgen05 import TCGen05MMA

# One wgmma.mma_async instruction covers 16 rows of the tile per warp and 32 bytes of K.
_WGMMA_INSTR_M = 16
_WGMMA_INSTR_K_BYTES = 32
_WGMMA_MAX_N = 256


@gluon.constexpr_function
def wgmma_warps_per_cta(BLOCK_M, num_warps):
    """How the warps tile the accumulator: a warpgroup (4 warps) spans 64 rows, more warps stack
    along M while the tile still has rows for them, and only then split N (splitting N halves the
    instruction width)."""
    warps = [4, 1]
    while warps[0] * warps[1] < num_warps:
        if BLOCK_M > _WGMMA_INSTR_M * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    return warps


@gluon.constexpr_function
def wgmma_instr_n(BLOCK_M, BLOCK_N, num_warps):
    """The widest N (a multiple of 8, at most 256) that divides the warps' share of BLOCK_N:
    wider instructions move more data per issue (05-wgmma measured 8.5 us -> 8.3 us going from
    n=16 to n>=64 on a 64x128 tile)."""
    warps_m, warps_n = wgmma_warps_per_cta(BLOCK_M, num_warps)
    max_n = max(BLOCK_N // warps_n, 8)
    n = min(_WGMMA_MAX_N, max_n)
    while n > 8 and (BLOCK_N % n != 0 or n > max_n):
        n -= 8
    return n


@gluon.constexpr_function
def wgmma_accumulator_layout(dtype, BLOCK_M, BLOCK_N, num_warps, cga_layout=()):
    """The register layout of a BLOCK_M x BLOCK_N fp32 WGMMA accumulator for operands of `dtype`,
    BLOCK_M rows in each CTA. A kernel written for a cluster of CTAs (Triton >= 3.8, compat.py's
    CLUSTER_MULTICAST) passes `cga_layout`, how the cluster's CTAs share the tile (((1, 0),): two
    CTAs, one above the other); the layout then describes the whole cluster's tile."""
    more = dict(cga_layout=[list(basis) for basis in cga_layout]) if cga_layout else {}
    return gl.NVMMADistributedLayout(
        version=[3, 0],
        warps_per_cta=wgmma_warps_per_cta(BLOCK_M, num_warps),
        instr_shape=[
            _WGMMA_INSTR_M,
            wgmma_instr_n(BLOCK_M, BLOCK_N, num_warps),
            _WGMMA_INSTR_K_BYTES * 8 // dtype.primitive_bitwidth,
        ],
        **more,
    )


@aggregate
class WGMMA:
    """fp32 accumulator of one output tile plus whether the next MMA adds to it.

    Aggregates are immutable: every method returns the new state, re-bound at the call site
    (``mma = mma.issue_async_mma(a, b)``).
    """

    acc: warpgroup_mma_accumulator | gl.tensor  # token while in flight, tensor once waited
    use_acc: gl.tensor  # False for the first K-step of a tile: the MMA overwrites instead of adds

    @gluon.constexpr_function
    def __init__(self, acc, use_acc):
        self.acc = acc
        self.use_acc = use_acc

    @gluon.jit
    def initialize(dtype: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr,
                   CLUSTER: gl.constexpr = 1):  # fmt: skip
        """BLOCK_M rows in each CTA; CLUSTER = 2: the tile of a cluster of two CTAs, one above the
        other (primitives/gluon/cluster.py), 2 * BLOCK_M rows."""
        layout: gl.constexpr = wgmma_accumulator_layout(
            dtype, BLOCK_M, BLOCK_N, num_warps, cluster_rows_layout(CLUSTER)
        )
        # The zeros are never read (use_acc=False on the first step); they give the registers a type.
        acc = gl.zeros((BLOCK_M * CLUSTER, BLOCK_N), dtype=gl.float32, layout=layout)
        return WGMMA(acc, gl.to_tensor(False))

    @gluon.jit
    def issue_async_mma(self, a, b):
        """acc (+)= a @ b for one K-step; a: [BLOCK_M, BLOCK_K] smem, b: [BLOCK_K, BLOCK_N] smem view."""
        acc = warpgroup_mma(a, b, self.acc, is_async=True, use_acc=self.use_acc)
        return WGMMA(acc, gl.to_tensor(True))

    @gluon.jit
    def wait_num_outstanding(self, num_outstanding: gl.constexpr):
        acc = warpgroup_mma_wait(num_outstanding, (self.acc,))
        return WGMMA(acc, self.use_acc)

    @gluon.jit
    def take_result(self):
        """The finished tile (call wait_num_outstanding(0) first) and the state for the next tile."""
        return self.acc, WGMMA(self.acc, gl.to_tensor(False))


def mma_for(kernel: str, device):
    """The MMA implementation for `device`: WGMMA on sm_90 (Hopper), TCGen05MMA on sm_100 and
    sm_103 (Blackwell datacenter parts: compiled, never run); a RuntimeError naming `kernel`
    elsewhere."""
    major, minor = device_info.capability(device)
    if (major, minor) == (9, 0):
        return WGMMA
    if major == 10:
        return TCGen05MMA
    raise RuntimeError(
        f"{kernel}: needs an sm_90 (Hopper: WGMMA) or sm_100 (Blackwell: tcgen05) GPU, but {device} is "
        f"sm_{major}{minor}"
    )
