"""Where a patched model's greedy decode spends its host time, against torch, eager and compiled:
one bench-model family (random weights, nothing downloaded), its four providers' `generate`
timed in interleaved rounds, each run once under cProfile, and the host and GPU time of single
Linear modules at the decode shape (M = 1). bf16, on a GPU:

    PYTHONPATH=. python3 scripts/probes/model/decode_probe.py qwen2-7b
    PYTHONPATH=. python3 scripts/probes/model/decode_probe.py mixtral-8x7b-moe torch,hf-grouped_mm,tritongemm
"""

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from tritongemm.bench.model import (
    SETTINGS,
    _recompile_limits,
    build_models,
    generator,
    make_inputs,
    model_config,
    timed_call,
)

ROUNDS = 5


def wall_ms(call, n: int = 3) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e3


def host_us(module, x, n: int = 500) -> tuple[float, float]:
    """(us a call until the last launch returns, us a call until the GPU is done)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        module(x)
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / n * 1e6, (time.perf_counter() - start) / n * 1e6


def main(family: str, providers: tuple[str, ...] | None = None) -> None:
    setting = next(s for s in SETTINGS if s.phase == "generate")
    config = model_config(family)
    models = build_models(family, config, device="cuda", **({"providers": providers} if providers else {}))
    inputs = make_inputs(setting, config["vocab_size"], "cuda")
    with torch.no_grad(), _recompile_limits():
        calls = {p: timed_call(generator(m), setting, inputs) for p, m in models.items()}
        for call in calls.values():  # compiles, warms up
            call(), call()
        times = {p: [] for p in calls}
        for _ in range(ROUNDS):
            for p, call in calls.items():
                times[p].append(wall_ms(call))
        for p, t in times.items():
            print(f"{p:20s} " + " ".join(f"{x:7.1f}" for x in t) + f"  median {statistics.median(t):.1f} ms")
        for p, call in calls.items():
            profiler = cProfile.Profile()
            profiler.runcall(call)
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
            print(f"===== cProfile {p}\n{text.getvalue()}")
        base, patched = models["torch"], models["tritongemm"]
        linears = [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)]
        for name in [n for n in linears if ".0." in n] + linears[-1:]:  # the first layer's, the head
            print(module_line(name, base.get_submodule(name), patched.get_submodule(name)))


def module_line(name: str, theirs, ours) -> str:
    x = torch.randn(1, 1, theirs.in_features, device="cuda", dtype=torch.bfloat16)
    parts = []
    for provider, module in (("torch", theirs), ("tritongemm", ours)):
        for _ in range(50):
            module(x)
        host, idle = host_us(module, x)
        gpu = do_bench(lambda module=module: module(x)) * 1e3
        parts.append(f"{provider} host {host:.1f} us, to GPU idle {idle:.1f} us, do_bench {gpu:.1f} us")
    shape = f"{theirs.in_features} -> {theirs.out_features}, bias {theirs.bias is not None}"
    return f"{name} ({shape}): " + ", ".join(parts)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "qwen2-7b", tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else None)
