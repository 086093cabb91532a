"""Where an `Fp8Linear` call spends its host time, beside the bf16 `nn.Linear` it replaces: the
whole forward, `quantize_fp8` and `scaled_mm` alone, and each of their planned calls without the
plan look-up. Host time is the wall clock until the last launch returns, per call, over calls
issued back to back (median of 5 rounds); the GPU time is do_bench's. bf16; row-wise scales, or
`--recipe block` or `tensor`. `scaled_mm` is also split into its plan key, the key and its look-up,
and set beside `torch._scaled_mm` on the same operands (tensor- and row-wise). On a GPU:

    PYTHONPATH=. python3 scripts/probes/fp8/fp8_host_probe.py [--recipe block]
"""

import argparse
import statistics
import time

import torch
from triton.testing import do_bench

from tritongemm.core.plans import PLANS
from tritongemm.fp8 import quantize_fp8, scaled_mm
from tritongemm.fp8.api import _quantize_key, _scaled_mm_key
from tritongemm.fp8.linear import Fp8Linear

SHAPES = (
    (1, 4096, 4096),
    (1, 4096, 14336),
    (1, 14336, 4096),
    (16, 4096, 6144),
    (128, 4096, 6144),
    (2048, 4096, 4096),
)  # (M, K, N)
CALLS, ROUNDS = 200, 5


def host_us(call) -> float:
    for _ in range(20):
        call()
    times = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        times.append((time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def probe(M: int, K: int, N: int, recipe: str) -> None:
    linear = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    fp8 = Fp8Linear.from_linear(linear, recipe)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    xq, sx = quantize_fp8(x, recipe)
    w_t, sw = fp8.weight_fp8.T, fp8.weight_scale
    scaled_mm(xq, w_t, sx, sw, out_dtype=torch.bfloat16)
    quantize_call = PLANS.find(_quantize_key(x, recipe, None, torch.float8_e4m3fn))
    mm_facts = (xq, w_t, sx, sw, None, None, None, 1.0, torch.bfloat16, "auto", None)
    mm_call = PLANS.find(_scaled_mm_key(*mm_facts))
    calls = {
        "nn.Linear bf16": lambda: linear(x),
        "Fp8Linear": lambda: fp8(x),
        "quantize_fp8": lambda: quantize_fp8(x, recipe),
        "scaled_mm": lambda: scaled_mm(xq, w_t, sx, sw, out_dtype=torch.bfloat16),
        "quantize's plan, called": lambda: quantize_call(x),
        "scaled_mm's plan, called": lambda: mm_call(xq, w_t, sx, sw, None, None),
        "scaled_mm's key": lambda: _scaled_mm_key(*mm_facts),
        "scaled_mm's key, found": lambda: PLANS.find(_scaled_mm_key(*mm_facts)),
    }
    if recipe != "block" and M >= 16:  # cuBLAS's fp8 GEMM wants M a multiple of 16
        calls["torch._scaled_mm"] = lambda: torch._scaled_mm(xq, w_t, sx, sw, out_dtype=torch.bfloat16)
    print(f"M={M} K={K} N={N} {recipe}")
    for name, call in calls.items():
        print(f"  {name:26s} host {host_us(call):6.1f} us   GPU {do_bench(call) * 1e3:7.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="row", choices=("row", "block", "tensor"))
    recipe = parser.parse_args().recipe
    with torch.no_grad():
        for M, K, N in SHAPES:
            probe(M, K, N, recipe)


if __name__ == "__main__":
    main()
