"""Probe: what one eager nn.Linear forward + backward costs at launch-bound sizes, torch.nn.Linear
against tritongemm.nn.Linear on the same parameters (x requires grad, as a model's activations
do; both accumulate into .grad), then cProfile of ours over 2000 steps. `bench overhead` times
the forward alone; an eager training step's linear layers also pay their backward's host time.

    PYTHONPATH=. python3 scripts/probes/host/linear_backward_host.py
"""

import cProfile
import functools
import io
import pstats
import statistics

import torch

import tritongemm
from tritongemm.bench.measure import eager_timer

CASES = ((16, 4096, 4096, False), (16, 3584, 3584, True), (128, 4096, 4096, False))  # M, N, K, bias
ROUNDS = 7


def step(module, x, grad) -> None:
    module(x).backward(grad)


def operands(m, n, k, bias):
    module = torch.nn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return module, tritongemm.nn.Linear.from_linear(module), x, torch.randn(1, m, n, device="cuda", dtype=x.dtype)


def main() -> None:
    torch.manual_seed(0)
    for m, n, k, bias in CASES:
        module, ours, x, grad = operands(m, n, k, bias)
        steps = {"torch": functools.partial(step, module, x, grad), "ours": functools.partial(step, ours, x, grad)}
        forwards = {"torch": functools.partial(module, x), "ours": functools.partial(ours, x)}
        for timed, label in ((steps, "forward + backward"), (forwards, "forward only (autograd recording)")):
            samples = {name: [] for name in timed}
            for _ in range(ROUNDS):  # interleaved rounds, medians
                for name, fn in timed.items():
                    samples[name].append(eager_timer(fn) * 1e3)
            t, o = (statistics.median(samples[name]) for name in ("torch", "ours"))
            print(f"{m}x{n}x{k} bias={bias} {label}: torch {t:.1f} us, ours {o:.1f} us, ours/torch {o / t:.2f}")
    module, ours, x, grad = operands(16, 4096, 4096, False)
    for _ in range(50):
        ours(x).backward(grad)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(2000):
        ours(x).backward(grad)
    profiler.disable()
    torch.cuda.synchronize()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(35)
        print(text.getvalue())


if __name__ == "__main__":
    main()
