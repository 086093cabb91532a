"""Per-call eager time of one GEMM three ways: torch.matmul, tritongemm.matmul (the direct path)
and torch.ops.tritongemm.mm (the same work behind PyTorch's dispatcher), interleaved, median of 7.
Why eager calls bypass the operator (BENCHMARKS.md, "Host time per call"). Run on a GPU:
PYTHONPATH=. python3 scripts/probes/host/dispatch_cost.py"""

import statistics

import torch

import tritongemm
from tritongemm.bench.measure import eager_timer

for m, n, k, dt in [(64, 64, 64, torch.float16), (1, 4096, 4096, torch.bfloat16)]:
    a = torch.randn(m, k, device="cuda", dtype=dt)
    b = torch.randn(n, k, device="cuda", dtype=dt).T
    fns = {
        "torch.matmul": lambda a=a, b=b: torch.matmul(a, b),
        "tritongemm.matmul": lambda a=a, b=b: tritongemm.matmul(a, b),
        "torch.ops.tritongemm.mm": lambda a=a, b=b: torch.ops.tritongemm.mm(a, b),
    }
    samples = {name: [] for name in fns}
    for _ in range(7):
        for name, fn in fns.items():
            samples[name].append(eager_timer(fn) * 1e3)
    print(f"{m}x{n}x{k} {dt}: " + ", ".join(f"{name} {statistics.median(v):.1f} us" for name, v in samples.items()))
