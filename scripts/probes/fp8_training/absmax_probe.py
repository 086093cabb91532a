"""The row recipe's maxima pass (fp8/pair_build.py `_row_col_absmax_kernel`): how fast it reads.

kernel_probe.py found it reading at 2.0-2.1 TB/s, where a copy runs at 3.7-4.1. Its compiled code
had each value's row and column maxima reduced by Triton's float atomic_max: two acq_rel atomics
(one per sign), and a layout shuffle through shared memory between them. This times, in a CUDA
graph, GB/s of reads:
  before   that kernel (kept here as it was), in its tiles;
  after    the kernel now: integer maxima of the bits, relaxed (ROW_TILES 1), and a variant
           kept here that walks ROW_TILES tiles a program, the columns' maxima in registers over
           them (one atomic a column a program; slower: each tile's loads wait for the one before);
beside torch's x.abs().amax(1) and amax(0), and checks every variant's maxima against torch's.

    PYTHONPATH=. python scripts/probes/fp8_training/absmax_probe.py

Its last line names the fastest variant over the shapes.
"""

from __future__ import annotations

import collections
import itertools
import statistics

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from tritongemm.fp8 import pair_build

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))
TILES = ((128, 64), (64, 128), (128, 128), (256, 64), (256, 128), (512, 64))
ROW_TILES = (1, 2, 4)
WARPS = (4, 8)


@triton.jit
def _before_kernel(x_ptr, rmax_ptr, cmax_ptr, R, C, stride_xr, stride_xc,
                   BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    offs_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r[:, None] < R) & (offs_c[None, :] < C)
    x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask, other=0.0)
    a = tl.abs(x.to(tl.float32))
    tl.atomic_max(rmax_ptr + offs_r, tl.max(a, 1), mask=offs_r < R)
    tl.atomic_max(cmax_ptr + offs_c, tl.max(a, 0), mask=offs_c < C)


@triton.jit
def _row_tiles_kernel(x_ptr, rmax_ptr, cmax_ptr, R, C, stride_xr, stride_xc,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, ROW_TILES: tl.constexpr):  # fmt: skip
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cols_in = offs_c < C
    col_max = tl.zeros([BLOCK_C], dtype=tl.float32)
    for i in tl.static_range(ROW_TILES):
        offs_r = (tl.program_id(0).to(tl.int64) * ROW_TILES + i) * BLOCK_R + tl.arange(0, BLOCK_R)
        rows_in = offs_r < R
        x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc,
                    mask=rows_in[:, None] & cols_in[None, :], other=0.0)  # fmt: skip
        a = tl.abs(x.to(tl.float32))
        col_max = tl.maximum(col_max, tl.max(a, 0))
        row_bits = rmax_ptr.to(tl.pointer_type(tl.int32)) + offs_r
        tl.atomic_max(row_bits, tl.max(a, 1).to(tl.int32, bitcast=True), mask=rows_in, sem="relaxed")
    col_bits = cmax_ptr.to(tl.pointer_type(tl.int32)) + offs_c
    tl.atomic_max(col_bits, col_max.to(tl.int32, bitcast=True), mask=cols_in, sem="relaxed")


def gbps(x: torch.Tensor, fn) -> float:
    """GB/s of x's reads by `fn()`, timed in a CUDA graph."""
    return x.numel() * x.element_size() / (do_bench_cudagraph(fn, rep=50) * 1e-3) / 1e9


def timed(x: torch.Tensor, kernel, grid, **meta) -> tuple[float, str]:
    """GB/s of `kernel[grid]` finding x's row and column maxima (0 if they are not torch's), and
    the GB/s as printed, marked WRONG then."""
    rmax, cmax = x.new_zeros(x.shape[0], dtype=torch.float32), x.new_zeros(x.shape[1], dtype=torch.float32)

    def launch():
        kernel[grid](x, rmax, cmax, *x.shape, *x.stride(), **meta)

    launch()
    a = x.float().abs()
    right = torch.equal(rmax, a.amax(1)) and torch.equal(cmax, a.amax(0))
    found = gbps(x, launch)
    return (found if right else 0.0), f"{found:5.0f}{'' if right else ' WRONG'}"


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    after = collections.defaultdict(list)  # (BLOCK_R, BLOCK_C, ROW_TILES, warps) -> GB/s by shape
    for R, C in SHAPES:
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
        torch_gbps = gbps(x, lambda: (x.abs().amax(1), x.abs().amax(0)))  # noqa: B023 (called here)
        copy = 2 * gbps(x, x.clone)
        print(f"x ({R}, {C}) bf16: GB/s of reads (torch's amax(1) + amax(0): {torch_gbps:.0f}; clone, reads + writes: "
              f"{copy:.0f})")  # fmt: skip
        for (br, bc), warps in itertools.product(TILES, WARPS):
            line = f"  {br:3d} x {bc:3d} w{warps}: before "
            line += timed(x, _before_kernel, (triton.cdiv(R, br), triton.cdiv(C, bc)), BLOCK_R=br, BLOCK_C=bc,
                          num_warps=warps)[1]  # fmt: skip
            line += " | after, ROW_TILES"
            for row_tiles in ROW_TILES:
                grid = (triton.cdiv(R, br * row_tiles), triton.cdiv(C, bc))
                meta = dict(BLOCK_R=br, BLOCK_C=bc, num_warps=warps)
                if row_tiles == 1:
                    found, shown = timed(x, pair_build._row_col_absmax_kernel, grid, **meta)
                else:
                    found, shown = timed(x, _row_tiles_kernel, grid, ROW_TILES=row_tiles, **meta)
                after[br, bc, row_tiles, warps].append(found)
                line += f" {row_tiles}: {shown}"
            print(line, flush=True)
    best = max(after, key=lambda config: statistics.geometric_mean([max(v, 1e-9) for v in after[config]]))
    print(f"fastest over the shapes (geomean; BLOCK_R, BLOCK_C, ROW_TILES, warps): {best}")


if __name__ == "__main__":
    main()
