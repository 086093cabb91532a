"""Blackwell's tensor-core step behind mma.py's interface: `tcgen05_mma` into an accumulator in
tensor memory, completion tracked through `tcgen05_commit` and mbarriers.

COMPILED FOR sm_100, NEVER RUN: no Blackwell GPU was available. tests/test_gluon_compile.py
compiles the kernels that take it for sm_100a on every CI run (docs/blackwell.md).

What changes from Hopper's WGMMA (mma.WGMMA), after the Gluon persistence tutorial's account:

  * the accumulator lives in tensor memory (TMEM: 128 lanes x 512 columns of 32 bits an SM),
    not in registers. The MMA reads A and B from shared memory as WGMMA does and writes TMEM, so
    the warps' registers are free during the K loop; the finished tile is loaded out of TMEM
    into registers (`take_result`) for the epilogue;
  * one thread issues the MMA, for the whole CTA, where a WGMMA is issued by a warpgroup;
  * completion is not a `wait` on a count of groups: `tcgen05_commit` makes an mbarrier arrive
    once every MMA issued before it has finished, and the issuing program waits on that barrier's
    phase.

The interface is WGMMA's (the more restrictive of the two): start an accumulator, issue one
K-step, wait until at most N steps are in flight, take the tile. So `wait_num_outstanding(n)`
must find the barrier phase of the step n before the last. The tutorial commits every step to
one barrier; then, if both steps in flight finish before the wait, the barrier has moved two
phases past the one asked for, and a parity wait can't tell that phase from the current one: it
would wait for a commit that never comes. Here the steps alternate between two barriers, so each
barrier completes at most one phase while a step is awaited (the kernels keep at most two in
flight: pipeline.issue_mma waits down to one after each issue).

Not done on Blackwell (the tutorial's further steps): two-CTA MMAs (`two_ctas`, a 256-row tile
over a CTA pair), cluster launch control for the persistent schedule, and a TMEM accumulator
double-buffered so that the epilogue of one tile overlaps the next tile's MMAs.
"""

# No `from __future__ import annotations` here: aggregates type-check their fields against the
# annotations at trace time, which must therefore be real types, not strings.

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.blackwell import (
    TensorMemoryLayout,
    allocate_tensor_memory,
    tcgen05_commit,
    tcgen05_mma,
    tensor_memory_descriptor,
)
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from triton.language.core import _aggregate as aggregate

from tritongemm.primitives.gluon.compat import tmem_load

# Steps in flight at most (pipeline.issue_mma): one barrier each, used in turn.
_BARRIERS = gl.constexpr(2)


@gluon.constexpr_function
def tmem_accumulator_layout(BLOCK_M, BLOCK_N):
    """fp32 accumulator in TMEM: one 32-bit column an element (col_stride 1)."""
    return TensorMemoryLayout([BLOCK_M, BLOCK_N], col_stride=1)


@aggregate
class TCGen05MMA:
    """fp32 accumulator of one output tile in tensor memory, whether the next MMA adds to it,
    and the barriers and count that say which steps have finished.

    Aggregates are immutable: every method returns the new state (as mma.WGMMA's)."""

    acc_tmem: tensor_memory_descriptor
    bars: gl.shared_memory_descriptor  # [_BARRIERS, 1]: step i commits to bars[i % _BARRIERS]
    use_acc: gl.tensor  # False for the first K-step of a tile: the MMA overwrites instead of adds
    issued: gl.tensor  # K-steps issued so far, over the program's whole run

    @gluon.constexpr_function
    def __init__(self, acc_tmem, bars, use_acc, issued):
        self.acc_tmem = acc_tmem
        self.bars = bars
        self.use_acc = use_acc
        self.issued = issued

    @gluon.jit
    def initialize(dtype: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr):
        acc_tmem = allocate_tensor_memory(gl.float32, [BLOCK_M, BLOCK_N], tmem_accumulator_layout(BLOCK_M, BLOCK_N))
        bars = gl.allocate_shared_memory(gl.int64, [_BARRIERS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(_BARRIERS):
            mbarrier.init(bars.index(i), count=1)  # one arrival a phase: the commit of its step
        return TCGen05MMA(acc_tmem, bars, gl.to_tensor(False), gl.to_tensor(0))

    @gluon.jit
    def issue_async_mma(self, a, b):
        """acc (+)= a @ b for one K-step; a: [BLOCK_M, BLOCK_K] smem, b: [BLOCK_K, BLOCK_N] smem view."""
        tcgen05_mma(a, b, self.acc_tmem, use_acc=self.use_acc)
        tcgen05_commit(self.bars.index(self.issued % _BARRIERS))
        return TCGen05MMA(self.acc_tmem, self.bars, gl.to_tensor(True), self.issued + 1)

    @gluon.jit
    def wait_num_outstanding(self, num_outstanding: gl.constexpr):
        """Wait until step issued - 1 - num_outstanding (0-based) has finished: its barrier's phase
        number is how many of that barrier's steps came before it."""
        step = self.issued - 1 - num_outstanding
        if step >= 0:
            mbarrier.wait(self.bars.index(step % _BARRIERS), (step // _BARRIERS) & 1)
        return self

    @gluon.jit
    def take_result(self):
        """The finished tile in registers (call wait_num_outstanding(0) first) and the state for the
        next tile, whose first MMA overwrites the tensor memory."""
        acc = tmem_load(self.acc_tmem)
        return acc, TCGen05MMA(self.acc_tmem, self.bars, gl.to_tensor(False), self.issued)
