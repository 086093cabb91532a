"""The racecheck hazards of the warp-specialized rungs (9, 11), reproduced without them.

compute-sanitizer's racecheck reports hazards in rungs 9 and 11 between a shared-memory read at
the kernel's start and writes attributed to the barriers' init and invalidation. This kernel has
none of their ring: gl.warp_specialize with a default partition (4 warps) and one worker warp
that each store a few values to global memory, and, in the `barriers` variant, 8 mbarriers that
are initialized before and invalidated after and that no partition touches.

    PYTHONPATH=. compute-sanitizer --tool racecheck python3 scripts/probes/reliability/racecheck_warp_specialize.py
    PYTHONPATH=. compute-sanitizer --tool racecheck \
        python3 scripts/probes/reliability/racecheck_warp_specialize.py barriers

On the H100 (triton 3.6.0, compute-sanitizer 2025.3.1, 2026-11-23) the plain variant is clean and
the barriers variant reports the hazards: the read is the worker warps' `LDS.U8` of the state
byte by which Triton's warp-specialize lowering tells each warp which partition to run, the
writes are the default warps' `STS` of that byte to start the partitions and to end them, each
separated from the read by `bar.sync 1` on both sides. So they come from the lowering (or from
how racecheck sees it beside mbarrier operations), not from a kernel's own barrier protocol.
Prints whether the results are right, and exits 1 if not.
"""

import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from tritongemm.primitives.gluon.pipeline import init_barriers, invalidate_barriers

DEFAULT_WARPS = 4


@gluon.jit
def _default_partition(out_ptr):
    offs = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(out_ptr + offs, offs.to(gl.float32))


@gluon.jit
def _worker_partition(out_ptr):
    offs = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
    gl.store(out_ptr + 128 + offs, offs.to(gl.float32) + 1000.0)


@gluon.jit
def _plain_kernel(out_ptr, num_warps: gl.constexpr):
    gl.warp_specialize([(_default_partition, (out_ptr,)), (_worker_partition, (out_ptr,))], [1], [40])


@gluon.jit
def _kernel_with_barriers(out_ptr, num_warps: gl.constexpr):
    bars = gl.allocate_shared_memory(gl.int64, [8, 1], mbarrier.MBarrierLayout())
    init_barriers(bars)
    gl.warp_specialize([(_default_partition, (out_ptr,)), (_worker_partition, (out_ptr,))], [1], [40])
    invalidate_barriers(bars)


KERNELS = {"plain": _plain_kernel, "barriers": _kernel_with_barriers}


def main(variant: str) -> int:
    out = torch.zeros(160, device="cuda")
    for _ in range(3):
        KERNELS[variant][(8,)](out, num_warps=DEFAULT_WARPS)
    torch.cuda.synchronize()
    want = torch.cat([torch.arange(128.0), torch.arange(32.0) + 1000]).cuda()
    right = torch.equal(out, want)
    print(f"warp_specialize, {variant}: {'right' if right else 'WRONG'}")
    return 0 if right else 1


if __name__ == "__main__":
    variant = sys.argv[1] if len(sys.argv) > 1 else "plain"
    if variant not in KERNELS:
        sys.exit(f"usage: {sys.argv[0]} [{'|'.join(KERNELS)}]")
    sys.exit(main(variant))
