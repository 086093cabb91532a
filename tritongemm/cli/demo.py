"""`tritongemm demo`: every available kernel on a real problem, checked against the fp64
reference and timed next to torch.matmul (cuBLAS on a GPU). Without a GPU: the interpreter's
smoke test, next to torch.matmul on the CPU."""

from __future__ import annotations

import argparse

import torch

from tritongemm import bench
from tritongemm.bench.report import kernel_label

DEMO_SHAPES = [(4096, 4096, 4096), (3000, 5000, 1000)]


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    pass  # the demo takes no options


def run(args: argparse.Namespace) -> int:
    return run_demo()


def run_demo() -> int:
    on_gpu = torch.cuda.is_available()
    baseline = kernel_label("cublas", on_gpu)
    if on_gpu:
        print(f"tritongemm demo on {torch.cuda.get_device_name()}: each kernel vs {baseline}, same inputs, same run")
        rows = bench.run_bench(shapes=DEMO_SHAPES, dtypes=("bfloat16", "float16"), out_dir=None, progress=False)
    else:
        print(f"tritongemm demo without a GPU: each kernel under the Triton interpreter vs {baseline}")
        rows = bench.run_bench(out_dir=None, progress=False)  # the CPU's smoke test: the demo's shapes take hours there
    failed = [r for r in rows if r.status != "ok"]
    for r in failed:
        name = kernel_label(r.kernel, on_gpu)
        print(f"FAILED: {name} on {r.m}x{r.n}x{r.k} {r.dtype}: {r.status} (rel err {r.max_rel_err})")
    print(f"{len(rows) - len(failed)} of {len(rows)} runs matched the fp64 reference.")
    return 1 if failed else 0
