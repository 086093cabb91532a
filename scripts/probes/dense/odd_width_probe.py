"""Rung 13 (ladder/odd_width.py) against cuBLAS, `auto`, rung 6 and split_tail on few-wave shapes:
each of its tiles and its own pick, checked against fp64 first, then timed in one run (CUDA-graph
medians; `--eager` adds the call as a user makes it). CSV on stdout.

Run on a GPU:
    PYTHONPATH=. python3 scripts/probes/dense/odd_width_probe.py [--eager] [--shapes 'M,N,K,nt;...'] > probe.csv
"""

import argparse
import functools
import sys

import torch

import tritongemm
from tritongemm.bench.measure import eager_timer, gpu_timer
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.ladder import odd_width

# (M, N, K, layout): one GPU's chunks of a four-GPU q,k,v (8192-wide model, 2560 columns each;
# Llama-3-8B's 1536), the weak shapes of the 54-row suite, and a whole-wave control (8192^2).
SHAPES = [(512, 2560, 8192, "nt"), (1024, 2560, 8192, "nt"), (2048, 2560, 8192, "nt"), (4096, 2560, 8192, "nt"),
          (8192, 2560, 8192, "nt"), (2048, 1536, 4096, "nt"), (8192, 1536, 4096, "nt"), (2048, 2560, 8192, "nn"),
          (1000, 1000, 1000, "nn"), (5000, 3000, 7000, "nn"), (777, 4096, 4096, "nn"),
          (8192, 8192, 8192, "nt")]  # fmt: skip


def operands(M, N, K, layout):
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).T if layout == "nt" else None
    return a, b if b is not None else torch.randn(K, N, device="cuda", dtype=torch.bfloat16)


def providers(M, N, K, b_k_major):
    yield "cublas", "torch.matmul", torch.matmul
    yield "auto", "", tritongemm.matmul
    for kernel in ("tma_persistent_pipelined", "split_tail"):
        yield kernel, "default", functools.partial(tritongemm.matmul, kernel=kernel)
    pick = odd_width.default_config(M, N, K, torch.cuda.get_device_properties(0).multi_processor_count, b_k_major)
    for config in odd_width.TILES:
        label = config.short() + (" (pick)" if config == pick else "")
        yield "odd_width", label, functools.partial(tritongemm.matmul, kernel="odd_width", config=config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eager", action="store_true", help="also time eager calls")
    parser.add_argument("--shapes", help="instead of SHAPES: 'M,N,K,layout;...' (layout nt or nn)")
    args = parser.parse_args()
    shapes = SHAPES
    if args.shapes:
        shapes = [(*map(int, item.split(",")[:3]), item.split(",")[3]) for item in args.shapes.split(";")]
    device = torch.cuda.get_device_name()
    print("device,m,n,k,layout,provider,config,timing,ms,tflops,ratio_to_cublas,rel_err")
    for M, N, K, layout in shapes:
        a, b = operands(M, N, K, layout)
        reference = reference_matmul(a, b)
        base = {}
        for name, label, fn in providers(M, N, K, layout == "nt"):
            err = rel_error(fn(a, b), reference)
            if err > tolerance(torch.bfloat16, K):
                print(f"{M}x{N}x{K} {name} {label}: error {err:.2e} over the bound", file=sys.stderr)
                continue
            call = functools.partial(fn, a, b)
            for timing in ("graph", "eager") if args.eager else ("graph",):
                ms = gpu_timer(call, True) if timing == "graph" else eager_timer(call)
                base.setdefault(timing, ms)  # cuBLAS comes first
                tflops = 2 * M * N * K / ms / 1e9
                print(f"{device},{M},{N},{K},{layout},{name},{label},{timing},{ms:.5f},{tflops:.1f},"
                      f"{base[timing] / ms:.3f},{err:.2e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
