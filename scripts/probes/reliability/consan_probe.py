"""Does Triton's concurrency sanitizer (ConSan) accept two TMA loads completing on one mbarrier?

The Gluon rungs put the A and B tiles of a K-step on one barrier (one `expect` for both byte
counts, two loads). ConSan before triton-lang/triton#9046 counted each TMA load as one arrival and
ignored `expect`, so such a barrier looked over-arrived and was reported as a deadlock. This
probe runs the smallest kernel of each kind, each in its own process (a ConSan report is a device
assert, which ends the process), and prints one line per variant:

    one      expect(A), load A, wait                      -> the hardware and ConSan agree
    two      expect(A + B), load A, load B, wait          -> the rungs' pattern
    split    expect(A), load A on bar0; expect(B), load B on bar1; wait both

    TRITON_INSTRUMENTATION_MODE=consan PYTHONPATH=. python3 scripts/probes/reliability/consan_probe.py
"""

import os
import subprocess
import sys

VARIANTS = ("one", "two", "split")


def run_variant(variant: str) -> None:
    import torch
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from tritongemm.primitives.gluon.compat import tma_load, tma_store

    @gluon.jit
    def probe(a_desc, b_desc, out_desc, VARIANT: gl.constexpr):
        a = gl.allocate_shared_memory(a_desc.dtype, a_desc.block_type.shape, a_desc.layout)
        b = gl.allocate_shared_memory(b_desc.dtype, b_desc.block_type.shape, b_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bars.index(0), count=1)
        mbarrier.init(bars.index(1), count=1)
        if VARIANT == "one":
            mbarrier.expect(bars.index(0), a_desc.block_type.nbytes)
            tma_load(a_desc, [0, 0], bars.index(0), a)
            mbarrier.wait(bars.index(0), 0)
        elif VARIANT == "two":
            mbarrier.expect(bars.index(0), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma_load(a_desc, [0, 0], bars.index(0), a)
            tma_load(b_desc, [0, 0], bars.index(0), b)
            mbarrier.wait(bars.index(0), 0)
        else:
            mbarrier.expect(bars.index(0), a_desc.block_type.nbytes)
            tma_load(a_desc, [0, 0], bars.index(0), a)
            mbarrier.expect(bars.index(1), b_desc.block_type.nbytes)
            tma_load(b_desc, [0, 0], bars.index(1), b)
            mbarrier.wait(bars.index(0), 0)
            mbarrier.wait(bars.index(1), 0)
        mbarrier.invalidate(bars.index(0))
        mbarrier.invalidate(bars.index(1))
        tma_store(out_desc, [0, 0], a)
        tma_store(out_desc, [64, 0], b)
        tma.store_wait(pendings=0)

    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16)
    a, b = torch.randn(2, 64, 64, device="cuda", dtype=torch.float16)
    out = torch.full((128, 64), float("nan"), device="cuda", dtype=torch.float16)
    descs = [TensorDescriptor.from_tensor(t, [64, 64], layout) for t in (a, b, out)]
    probe[(1,)](*descs, VARIANT=variant, num_warps=4)
    torch.cuda.synchronize()
    rows = 64 if variant == "one" else 128  # "one" stores B's buffer too, never loaded
    assert torch.equal(out[:rows], torch.cat([a, b])[:rows]), "the probe copied the wrong data"


def main() -> int:
    if len(sys.argv) == 2:
        run_variant(sys.argv[1])
        return 0
    mode = os.environ.get("TRITON_INSTRUMENTATION_MODE", "(unset: ConSan off)")
    print(f"TRITON_INSTRUMENTATION_MODE={mode}")
    for variant in VARIANTS:
        done = subprocess.run([sys.executable, __file__, variant], capture_output=True, text=True, timeout=300)
        report = [line for line in done.stderr.splitlines() if "Deadlock" in line or "Assertion" in line]
        verdict = "clean" if done.returncode == 0 else f"exit {done.returncode}: " + (report or ["?"])[0].strip()
        print(f"{variant:6} {verdict}")
        if done.returncode and not report:
            print(done.stderr[-2000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
