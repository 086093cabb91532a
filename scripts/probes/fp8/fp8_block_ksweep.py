"""Probe: where `fp8_block`'s time goes, by K. Times the block-scaled rung (its default 128 x 256
tile) and torch's block-wise `_scaled_mm` over K = 1024-16384 at two (M, N), kernel-only, each
checked against the fp64 reference first, and fits t = a + b K per provider: `a` is the fixed part
(the tiles' prologues and epilogues, the launch), `b` the main loop's cost per K.

    PYTHONPATH=. python3 scripts/probes/fp8/fp8_block_ksweep.py

On the H100 (results/h100/probes/fp8/fp8-block-ksweep.txt): our fixed part below cuBLAS's, our part per
K 2-4% above it, so the main loop's promotion, not the epilogue, is where block-wise trails.
"""

import functools

import numpy as np
import torch

from tritongemm.bench.fp8 import Fp8Problem, _torch_scaled_mm, operands, torch_block_scales
from tritongemm.bench.measure import check_then_time
from tritongemm.core.epilogue import PLAIN
from tritongemm.core.reference import fp8_tolerance
from tritongemm.fp8 import block as fp8_block
from tritongemm.fp8 import reference_scaled_mm

SIZES = ((2048, 6144), (8192, 8192))
KS = (1024, 2048, 4096, 8192, 16384)


def main() -> None:
    times = {}  # (M, N, provider) -> [(K, us)]
    for M, N in SIZES:
        for K in KS:
            problem = Fp8Problem("block", M, N, K)
            a, b, sa, sb = operands(problem, "cuda")
            sa, sb = sa.contiguous(), sb.contiguous()
            reference = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64)
            bound = fp8_tolerance(torch.bfloat16, K)
            c = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            run = fp8_block.plan(a, b, c, sa, sb, fp8_block.DEFAULT_CONFIG, PLAIN)

            def ours(run=run, c=c, a=a, b=b, sa=sa, sb=sb):
                run(a, b, c, sa, sb)
                return c

            torch_call = functools.partial(_torch_scaled_mm, *torch_block_scales(a, b, sa, sb, reference, bound))
            _, results = check_then_time({"torch": torch_call, "ours": ours}, reference, bound, problem,
                                         timings=("graph",), rounds=3)  # fmt: skip
            for name, (ms, status) in results["graph"].items():
                times.setdefault((M, N, name), []).append((K, ms * 1e3))
                print(f"{M} {N} {K} {name} {ms * 1e3:.1f} us {problem.flops / ms / 1e9:.0f} TF/s {status}", flush=True)
    for (M, N, name), points in times.items():
        ks, us = np.array([k for k, _ in points], float), np.array([t for _, t in points])
        per_k, fixed = np.polyfit(ks, us, 1)
        at_4096 = fixed + per_k * 4096
        print(
            f"fit {M}x{N} {name}: t = {fixed:.1f} us + {per_k * 1e3:.3f} us per 1000 of K; fixed share at "
            f"K = 4096 {fixed / at_4096:.3f}; residuals {np.round(us - (fixed + per_k * ks), 1).tolist()}"
        )


if __name__ == "__main__":
    main()
