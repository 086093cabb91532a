"""Where a fp8 training layer's GPU time goes (issue 69): each kernel of one step, and the
quantize-and-transpose kernels' bandwidth by tile.

host_probe.py found a 4096 x 4096 -> 4096 layer's fp8 step (13 kernels) taking as long on the GPU
as bf16's (6 kernels), though three fp8 GEMMs should take ~60% of three bf16 ones. This prints
1. every kernel of one step per recipe, in launch order, with its microseconds (profiler);
2. the pair kernels (fp8/pair_build.py) alone, by tile and warps, timed in a CUDA graph, as GB/s
   of their reads and writes, beside torch's bf16 copy and fp8 cast of the same tensor.

    PYTHONPATH=. python scripts/probes/fp8_training/kernel_probe.py [--steps]   (--steps: 1. alone)
"""

from __future__ import annotations

import itertools
import sys

import torch
import triton
from triton.testing import do_bench_cudagraph

from tritongemm.fp8 import pair_build
from tritongemm.fp8.recipes import fp8_cast_meta, fp8_max
from tritongemm.nn import Fp8TrainingLinear

E4M3 = torch.float8_e4m3fn
LAYERS = ((4096, 4096, 4096), (4096, 4096, 14336), (4096, 14336, 4096))
TILES = ((64, 64), (128, 64), (64, 128), (128, 128), (32, 128), (256, 64), (64, 256))
WARPS = (4, 8)


def step_kernels(layer, x, dy) -> list[tuple[str, float]]:
    """(kernel name, microseconds) of one forward + backward, in launch order."""

    def step():
        layer.weight.grad = None
        layer(x).backward(dy)

    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.elapsed_us()) for e in kernels]


def print_steps():
    for tokens, k, n in LAYERS:
        base = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) * 1e-2
        for name, layer in [("bf16", base)] + [(r, Fp8TrainingLinear.from_linear(base, r)) for r in
                                               ("tensor", "row", "block")]:  # fmt: skip
            kernels = step_kernels(layer, x, dy)
            total = sum(us for _, us in kernels)
            print(f"{tokens} x {k} -> {n} {name}: {total:.1f} us, {len(kernels)} kernels", flush=True)
            for kname, us in kernels:
                print(f"    {us:8.1f}  {kname[:110]}")


def gbps(nbytes: int, kernel, *args, **meta) -> float:
    """GB/s of `kernel(*args, **meta)` moving `nbytes`, timed in a CUDA graph (no launch cost)."""
    return nbytes / (do_bench_cudagraph(lambda: kernel(*args, **meta), rep=50) * 1e-3) / 1e9


def print_sweep():
    for R, C in ((4096, 4096), (4096, 14336), (14336, 4096)):
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
        n = R * C
        print(f"x ({R}, {C}) bf16, GB/s (reads + writes):")
        print(f"  torch clone {gbps(4 * n, torch.clone, x):7.0f}   to(e4m3) {gbps(3 * n, x.to, E4M3):7.0f}")
        q, qt = x.new_empty((R, C), dtype=E4M3), x.new_empty((C, R), dtype=E4M3)
        s, st = x.new_empty((R,), dtype=torch.float32), x.new_empty((C,), dtype=torch.float32)
        rmax, cmax = x.new_full((R,), 3.0, dtype=torch.float32), x.new_full((C,), 3.0, dtype=torch.float32)
        sizes = (R, C, *x.stride())
        for (br, bc), warps in itertools.product(TILES, WARPS):
            grid = (triton.cdiv(R, br), triton.cdiv(C, bc))
            absmax = pair_build._row_col_absmax_kernel[grid]
            tile = dict(BLOCK_R=br, BLOCK_C=bc, num_warps=warps)
            found = gbps(2 * n, absmax, x, rmax, cmax, *sizes, ROW_TILES=1, **tile)
            line = f"  tile {br:3d} x {bc:3d} w{warps}: absmax row+col {found:6.0f}"
            for scales, write_q, label in ((1, True, "row pair"), (1, False, "row qt"), (0, True, "tensor pair")):
                meta = dict(SCALES=scales, WRITE_Q=write_q, FP8_MAX=fp8_max(E4M3), **fp8_cast_meta(E4M3), **tile)
                cast = pair_build._quantize_pair_kernel[grid]
                moved = n * (2 + (2 if write_q else 1))
                line += f" | {label} {gbps(moved, cast, x, q, qt, s, st, rmax, cmax, *sizes, **meta):6.0f}"
            print(line, flush=True)


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    torch.manual_seed(0)
    print_steps()
    if "--steps" not in sys.argv:
        print_sweep()


if __name__ == "__main__":
    main()
