"""Host time per eager call, with the same operands every call and with 16 sets in turn (a model's
layers of one shape, or a benchmark that cycles its inputs past the L2): torch.matmul, `auto`, and
three kernels named, called in turn on each step, so a host that drifts moves them all alike.
Medians over 1500 steps; a synchronize every 8 steps keeps the queue short, so the time is the
host's unless the kernels are longer than a call's host time (128 x 4096 x 4096 with rotating
operands). `--encodings 1` keeps one TMA encoding per operand, as before ENCODINGS_PER_OPERAND.
On a GPU: PYTHONPATH=. python3 scripts/probes/host/probe_host_rotation.py [--encodings N]
(results/h100/probes/host/host-rotation.txt).
"""

import argparse
import statistics
import time

import torch
import triton

import tritongemm
from tritongemm.primitives import launch as fast_launch

SHAPES = ((64, 64, 64, "nn"), (256, 256, 256, "nn"), (1024, 1024, 1024, "nn"), (128, 4096, 4096, "nt"))
CALLS = {
    "torch": torch.matmul,
    "auto": tritongemm.matmul,
    "rung6": lambda a, b: tritongemm.matmul(a, b, kernel="tma_persistent_pipelined"),
    "grouped": lambda a, b: tritongemm.matmul(a, b, kernel="grouped"),
    "swap_ab": lambda a, b: tritongemm.matmul(a, b, kernel="swap_ab"),
}


def operands(M: int, N: int, K: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    if layout == "nt":  # b as nn.Linear's weight, transposed
        return a, torch.randn(N, K, device="cuda", dtype=torch.float16).T
    return a, torch.randn(K, N, device="cuda", dtype=torch.float16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encodings", type=int, default=fast_launch.ENCODINGS_PER_OPERAND)
    fast_launch.ENCODINGS_PER_OPERAND = parser.parse_args().encodings
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; us a call; "
          f"TMA encodings kept per operand: {fast_launch.ENCODINGS_PER_OPERAND}")  # fmt: skip
    torch.manual_seed(0)
    for M, N, K, layout in SHAPES:
        sets = [operands(M, N, K, layout) for _ in range(16)]
        for call in CALLS.values():  # plans built, kernels compiled, every address seen once
            for a, b in sets:
                call(a, b)
        torch.cuda.synchronize()
        for mode in ("fixed", "rotating"):
            times = {name: [] for name in CALLS}
            for step in range(1500):
                a, b = sets[0] if mode == "fixed" else sets[step % len(sets)]
                for name, call in CALLS.items():
                    start = time.perf_counter_ns()
                    call(a, b)
                    times[name].append(time.perf_counter_ns() - start)
                if step % 8 == 7:
                    torch.cuda.synchronize()
            medians = "  ".join(f"{name} {statistics.median(t) / 1e3:5.1f}" for name, t in times.items())
            print(f"{M}x{N}x{K} {layout} {mode:8s} {medians}", flush=True)


if __name__ == "__main__":
    main()
