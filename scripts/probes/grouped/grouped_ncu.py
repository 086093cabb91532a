"""Why grouped_mm's kernels trail torch._grouped_mm on large groups: one launch of each on the
8-expert layer at 8192 tokens (top-2: about 2048 rows an expert, 28672 x 4096 weights), beside
tritongemm's dense rungs on one expert-sized GEMM (2048 x 28672 x 4096), for Nsight Compute:

    ncu --section SpeedOfLight --section WarpStateStats python3 scripts/probes/grouped/grouped_ncu.py --once

Without ncu it times each (do_bench, kernel-only) beside torch's in the same run.
"""

import sys

import torch
from triton.testing import do_bench

import tritongemm
from tritongemm.bench.grouped import GroupedProblem, operands
from tritongemm.grouped.api import grouped_mm_ws


def main() -> None:
    a, b, offs = operands(GroupedProblem(8, 8192, 2, 2 * 14336, 4096), "cuda")
    dense_a = a[:2048].contiguous()
    dense_b = b[0]
    calls = {
        "torch._grouped_mm": lambda: torch._grouped_mm(a, b, offs=offs),
        "grouped_mm (tl)": lambda: tritongemm.grouped_mm(a, b, offs),
        "grouped_ws": lambda: grouped_mm_ws(a, b, offs),
        "dense torch.mm": lambda: torch.mm(dense_a, dense_b),
        "dense rung 6": lambda: tritongemm.matmul(dense_a, dense_b, kernel="tma_persistent_pipelined"),
        "dense rung 9": lambda: tritongemm.matmul(dense_a, dense_b, kernel="tma_warp_specialized"),
    }
    flops = {name: 2 * a.shape[0] * a.shape[1] * b.shape[2] for name in calls}
    flops |= {name: 2 * 2048 * 4096 * b.shape[2] for name in calls if name.startswith("dense")}
    for name, call in calls.items():
        call()
        torch.cuda.synchronize()
        if "--once" in sys.argv:  # under ncu: a warm call above, one profiled here
            torch.cuda.nvtx.range_push(name)
            call()
            torch.cuda.nvtx.range_pop()
            continue
        ms = do_bench(call)
        print(f"{name:20s} {ms:8.3f} ms {flops[name] / ms / 1e9:7.1f} TFLOP/s")


if __name__ == "__main__":
    main()
