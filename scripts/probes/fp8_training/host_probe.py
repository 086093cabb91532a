"""Where a small fp8 training layer's step goes (issue 69): host time against GPU time.

The 4096 x 4096 projections' fp8 steps ran slower than bf16 (0.61x eager row-wise, 0.41x under
torch.compile) though their GEMMs are faster: the step is host-bound. For each recipe, eager and
compiled (fullgraph), this prints the host time of one step (launched behind a GPU busy-wait, so
that no launch waits for the GPU), the GPU time of its kernels (profiler), and the host time of
each fp8 call the layer makes, alone; bf16 nn.Linear's step beside them.

    PYTHONPATH=. python scripts/probes/fp8_training/host_probe.py [tokens in out]
"""

from __future__ import annotations

import sys
import time

import torch
from layer_probe import step_fn  # this folder's: the script's own folder is on sys.path

from tritongemm.fp8 import graph_ops
from tritongemm.fp8.pair import quantize_fp8_pair, quantize_fp8_transposed
from tritongemm.fp8.training import _as_scale_b
from tritongemm.nn import Fp8TrainingLinear

RECIPES = ("tensor", "row", "block")


def host_us(fn, calls: int) -> float:
    """Host microseconds a call of `fn`, the GPU held busy so that no launch waits for it."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # about 0.2 s of GPU spin: the calls below only queue work
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def gpu_us(fn, calls: int = 10) -> tuple[float, int]:
    """(GPU microseconds of kernels a call, kernels a call) from the profiler."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in kernels) / calls, len(kernels) // calls


def calls_of(recipe: str, x, w) -> dict:
    """The fp8 calls a layer's step makes, by name, each as the step makes it (eager), and the two
    the compiled graph calls through the dispatcher."""
    quantize, _, _, mm = graph_ops.graph_or_direct()
    block_rows = 128 if recipe == "block" else 1
    xq, xs = quantize(x, recipe, 1)
    wq, ws = quantize(w, recipe, block_rows)
    mm_args = (xq, wq.T, xs, _as_scale_b(ws, recipe), None, torch.bfloat16, recipe)
    calls = {
        "quantize x": lambda: quantize(x, recipe, 1),
        "quantize w": lambda: quantize(w, recipe, block_rows),
        "quantize_transposed w": lambda: quantize_fp8_transposed(w, recipe),
        "scaled_mm": lambda: mm(*mm_args),
        "op scaled_mm": lambda: graph_ops.scaled_mm_op(*mm_args),
    }
    if recipe != "block":  # the block recipe quantizes x alone (its weight gradient is bf16)
        calls["quantize_pair x"] = lambda: quantize_fp8_pair(x, recipe)
        calls["op quantize_pair x"] = lambda: graph_ops.quantize_pair_op(x, recipe)
    return calls


def main():
    tokens, k, n = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (4096, 4096, 4096)
    torch.manual_seed(0)
    import triton

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"step of a {tokens} x {k} -> {n} layer: host us (GPU busy) | GPU us of kernels (kernels)")
    base = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) * 1e-2
    rows = [("bf16", base)] + [(r, Fp8TrainingLinear.from_linear(base, r)) for r in RECIPES]
    for name, layer in rows:
        for mode in ("eager", "compiled"):
            module = torch.compile(layer, fullgraph=True) if mode == "compiled" else layer
            step = step_fn(module, x, dy)
            step()
            host = host_us(step, 20)
            gpu, kernels = gpu_us(step)
            print(f"  {name:<6} {mode:<8} host {host:8.1f} | GPU {gpu:8.1f} ({kernels} kernels)", flush=True)
            if name == "row":  # where the host time goes, by operator
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    for _ in range(10):
                        step()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
            torch._dynamo.reset()

    print("one call alone, host us (GPU busy):")
    w, xd = base.weight.detach(), x.detach()
    for recipe in RECIPES:
        line = ", ".join(f"{name} {host_us(fn, 200):.1f}" for name, fn in calls_of(recipe, xd, w).items())
        print(f"  {recipe:<6} {line}", flush=True)
    print(f"  bf16 mm {host_us(lambda: torch.mm(xd, w.T), 200):.1f}")


if __name__ == "__main__":
    main()
