"""The probe that chose swap_ab's tiles (results/h100/probes/dense/probe-skinny.csv: H100, 2026-11-23, torch
2.11.0+cu130, triton 3.6.0, tree 163070e, before rung 8 existed). Skinny GEMMs, M = 1 to 128
tokens on Llama weights, bf16, kernel-only (CUDA-graph replays, median) against cuBLAS in the
same run: "auto" as it was, the grouped kernel as is and on swapped operands (C.T = W @ x.T, the
idea of rung 8), and split_k both ways, each with several configs; every result checked first.
Run on a GPU: PYTHONPATH=. python3 scripts/probes/dense/probe_skinny.py [out.csv]
"""

import csv
import functools
import math
import sys

import torch
import triton.testing

import tritongemm
from tritongemm.core.config import MatmulConfig as C

WEIGHTS = [(4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (28672, 8192), (8192, 28672)]
TOKENS = [1, 16, 64, 128]
UNSWAPPED = [C(16, 64, 128, 1, 4, 4), C(16, 128, 128, 1, 4, 4), C(16, 64, 256, 1, 4, 3), C(32, 64, 128, 1, 4, 4),
             C(64, 64, 128, 1, 4, 4), C(64, 128, 64, 8, 4, 4)]  # fmt: skip
SWAPPED = [C(64, 16, 128, 1, 4, 4), C(64, 16, 256, 1, 4, 3), C(128, 16, 128, 1, 4, 4), C(64, 32, 128, 1, 4, 4),
           C(128, 32, 128, 1, 4, 4), C(64, 64, 128, 1, 4, 4), C(128, 64, 64, 1, 4, 4),
           C(128, 128, 64, 1, 8, 4)]  # fmt: skip
SPLIT = [C(64, 16, 128, 1, 4, 4), C(128, 16, 128, 1, 4, 4), C(64, 64, 128, 1, 4, 4), C(128, 64, 64, 1, 4, 4)]


def cublas(x, w, config):
    return torch.matmul(x, w.T)


def plain(kernel, x, w, config):
    return tritongemm.matmul(x, w.T, kernel=kernel, config=config)


def swapped(kernel, x, w, config):
    return tritongemm.matmul(w, x.T, kernel=kernel, config=config).T


def variants(M: int) -> list:
    """(name, fn(x, w, config), config) for M tokens: tiles no wider than the tokens need."""
    rows = [("cublas", cublas, None), ("auto", functools.partial(plain, "auto"), None)]
    rows += [("grouped", functools.partial(plain, "grouped"), c) for c in UNSWAPPED if c.BLOCK_M <= max(16, M) * 2]
    rows += [("grouped_swap", functools.partial(swapped, "grouped"), c) for c in SWAPPED if c.BLOCK_N <= max(16, M)]
    rows += [("split_k_swap", functools.partial(swapped, "split_k"), c) for c in SPLIT if c.BLOCK_N <= max(16, M)]
    return rows + [("split_k", functools.partial(plain, "split_k"), c) for c in SPLIT[2:]]


def timed(fn, xs, ws, config) -> float:
    """ms per GEMM, cycling through input sets that span the L2 twice."""

    def run():
        for x, w in zip(xs, ws):
            fn(x, w, config)

    return triton.testing.do_bench_cudagraph(run, rep=30, return_mode="median") / len(xs)


def main(path: str) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["m", "n", "k", "variant", "config", "ms", "ratio", "err"])
        for N, K in WEIGHTS:
            sets = max(1, min(4, math.ceil(2 * 50e6 / (N * K * 2))))
            ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            for M in TOKENS:
                xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
                ref = xs[0].double() @ ws[0].double().T
                base = None
                for name, fn, config in variants(M):
                    label = config.short() if config else ""
                    try:
                        err = ((fn(xs[0], ws[0], config).double() - ref).norm() / ref.norm()).item()
                        ms = timed(fn, xs, ws, config) if err < 1e-2 else None
                        base = base or ms
                        out.writerow([M, N, K, name, label, ms, base / ms if ms else None, err])
                    except Exception as e:  # a config a kernel refuses is a result too
                        out.writerow([M, N, K, name, label, None, None, f"error {type(e).__name__}: {str(e)[:150]}"])
                    f.flush()
                print(f"{M}x{N}x{K} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe_skinny.csv")
