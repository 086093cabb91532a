"""Probe: fp8 GEMMs at decode sizes on the Gluon rungs, graph-timed beside torch._scaled_mm
(medians of interleaved rounds, each candidate checked against the fp64 reference first).

(a) Are TMA boxes mostly past M slow? fp8_tma's and fp8_ws's 64-row tiles at M = 16, 32 and 64 on
    a 4096 x 4096 weight: the same 64 tiles and the same weight bytes each time.
(b) M = 128: rung 4 (fp8_tma, one tile a program) beside auto's fp8_ws and fp8_odd_width tiles.

    PYTHONPATH=. python3 scripts/probes/fp8/fp8_decode_probe.py   (results/h100/probes/fp8/fp8-m128-rung4.txt)
"""

from __future__ import annotations

import functools

import torch
import triton

from tritongemm import scaled_mm
from tritongemm.bench.fp8 import Fp8Problem, operands
from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import fp8_tolerance, rel_error
from tritongemm.fp8 import reference_scaled_mm


def cfg(bm, bn, bk, warps, stages):
    return MatmulConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=8, num_warps=warps, num_stages=stages)


OOB = {
    "tma 64x64x256 s4": ("fp8_tma", cfg(64, 64, 256, 4, 4)),
    "ws 64x64x256 s6": ("fp8_ws", cfg(64, 64, 256, 4, 6)),
    "swap 16x64x512": ("fp8_swap_ab", cfg(16, 64, 512, 4, 3)),
}
M128 = {
    "auto": ("auto", None),
    "tma 64x64x256 s4": ("fp8_tma", cfg(64, 64, 256, 4, 4)),
    "tma 64x64x256 s3": ("fp8_tma", cfg(64, 64, 256, 4, 3)),
    "tma 64x64x128 s6": ("fp8_tma", cfg(64, 64, 128, 4, 6)),
    "tma 64x128x256 s3": ("fp8_tma", cfg(64, 128, 256, 4, 3)),
    "ws 64x64x256 s6": ("fp8_ws", cfg(64, 64, 256, 4, 6)),
    "odd 64x96x256 s5": ("fp8_odd_width", cfg(64, 96, 256, 4, 5)),
}


def run(M, N, K, candidates, recipe="tensor", rounds=3):
    a, b, sa, sb = operands(Fp8Problem(recipe, M, N, K), "cuda")
    ref = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64)
    calls = {"torch": functools.partial(torch._scaled_mm, a, b, sa, sb, out_dtype=torch.bfloat16)}
    for name, (kernel, config) in candidates.items():
        calls[name] = functools.partial(scaled_mm, a, b, sa, sb, kernel=kernel, config=config)
    wrong = [name for name, f in calls.items() if rel_error(f(), ref) > fp8_tolerance(torch.bfloat16, K)]
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, f in calls.items():
            times[name].append(triton.testing.do_bench_cudagraph(f, rep=60))
    us = {name: sorted(t)[len(t) // 2] * 1000 for name, t in times.items()}
    cells = " | ".join(f"{name} {t:.2f} ({us['torch'] / t:.3f})" for name, t in us.items())
    print(f"{recipe} {M}x{N}x{K}: {cells}" + (f"  WRONG: {wrong}" if wrong else ""), flush=True)


def main() -> None:
    for M in (16, 32, 64):
        run(M, 4096, 4096, OOB if M == 16 else {k: v for k, v in OOB.items() if not k.startswith("swap")})
    for N, K in ((4096, 4096), (4096, 14336), (6144, 4096), (28672, 4096)):
        for recipe in ("tensor", "row"):
            run(128, N, K, M128, recipe)


if __name__ == "__main__":
    main()
