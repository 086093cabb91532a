"""`tritongemm demo`: every available kernel on a real problem, checked against the fp64
reference and timed next to torch.matmul (cuBLAS)."""

from __future__ import annotations

import torch

DEMO_SHAPES = [(4096, 4096, 4096), (3000, 5000, 1000)]


def run_demo() -> int:
    from tritongemm.bench import run_bench

    if torch.cuda.is_available():
        print(f"tritongemm demo on {torch.cuda.get_device_name()}: each kernel vs torch.matmul, same inputs, same run")
    rows = run_bench(shapes=DEMO_SHAPES, dtypes=("bfloat16", "float16"), out_dir=None, progress=False)
    failed = [r for r in rows if r.status != "ok"]
    for r in failed:
        print(f"FAILED: {r.kernel} on {r.m}x{r.n}x{r.k} {r.dtype}: {r.status} (rel err {r.max_rel_err})")
    print(f"{len(rows) - len(failed)} of {len(rows)} runs matched the fp64 reference.")
    return 1 if failed else 0
