"""Probe: where an eager linear's forward + backward host time goes on the GPU host, at a
launch-bound size (16 x 4096 x 4096 bf16, bias; x, weight and bias require grad):
(a) a whole step, torch's F.linear against tritongemm.linear and against F.linear wrapped in a
    Python autograd.Function that does nothing (identity): the bare node's cost; with autograd's
    device threads on (the default) and off (set_multithreading_enabled(False): the backward runs
    on the calling thread, without the hand-over);
(b) the time spent inside our Function's forward and backward (perf_counter, in whichever thread
    runs them);
(c) our backward's body (fused.linear_grads) called on the main thread, beside torch's three ops.
Back-to-back calls (eager_timer), medians of 3 interleaved rounds.

    PYTHONPATH=. python3 scripts/probes/host/linear_backward_split.py
"""

import functools
import statistics
import threading
import time

import torch
import torch.nn.functional as F

import tritongemm
from tritongemm.bench.measure import eager_timer
from tritongemm.dense import linear as fused

M, N, K = 16, 4096, 4096
ROUNDS = 3


class Identity(torch.autograd.Function):
    """A Python node that computes nothing: what any autograd.Function costs by itself."""

    @staticmethod
    def forward(ctx, y):
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return grad


def us(seconds_list) -> str:
    return f"{statistics.median(seconds_list) * 1e6:.1f} us"


def eager_s(fn) -> float:
    """Seconds per back-to-back call (eager_timer gives milliseconds)."""
    return eager_timer(fn) * 1e-3


def main() -> None:
    dt = torch.bfloat16
    x = torch.randn(M, K, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(N, K, device="cuda", dtype=dt, requires_grad=True)
    b = torch.randn(N, device="cuda", dtype=dt, requires_grad=True)
    g = torch.randn(M, N, device="cuda", dtype=dt)

    def step(fn):
        torch.autograd.backward(fn(x, w, b), g)

    # (a) whole steps, interleaved rounds, device threads on and off.
    steps = {
        "torch F.linear": functools.partial(step, F.linear),
        "tritongemm.linear": functools.partial(step, tritongemm.linear),
        "F.linear + empty Python node": functools.partial(step, lambda x, w, b: Identity.apply(F.linear(x, w, b))),
    }
    samples = {}
    for threads in (True, False):
        for _ in range(ROUNDS):
            for name, fn in steps.items():
                with torch.autograd.set_multithreading_enabled(threads):
                    samples.setdefault((name, threads), []).append(eager_s(fn))
    for (name, threads), values in samples.items():
        rounds = ", ".join(f"{v * 1e6:.1f}" for v in values)
        print(f"step {name:30s} device threads {'on ' if threads else 'off'}: {us(values)}  (rounds: {rounds})")

    # (b) inside our Function's forward and backward.
    spent = {"forward": [], "backward": [], "thread": []}
    forward, backward = fused._LinearFunction.forward, fused._LinearFunction.backward

    def timed_forward(ctx, *args):
        start = time.perf_counter()
        result = forward(ctx, *args)
        spent["forward"].append(time.perf_counter() - start)
        return result

    def timed_backward(ctx, grad):
        start = time.perf_counter()
        result = backward(ctx, grad)
        spent["backward"].append(time.perf_counter() - start)
        spent["thread"].append(threading.current_thread().name)
        return result

    fused._LinearFunction.forward = staticmethod(timed_forward)
    fused._LinearFunction.backward = staticmethod(torch.autograd.function.once_differentiable(timed_backward))
    try:
        for threads in (True, False):
            for key in spent:
                spent[key].clear()
            with torch.autograd.set_multithreading_enabled(threads):
                total = eager_s(functools.partial(step, tritongemm.linear))
            print(f"instrumented tritongemm.linear, device threads {'on ' if threads else 'off'}: step "
                  f"{total * 1e6:.1f} us; inside forward {us(spent['forward'])}, inside backward "
                  f"{us(spent['backward'])} (thread {spent['thread'][-1]})")  # fmt: skip
    finally:
        fused._LinearFunction.forward, fused._LinearFunction.backward = forward, backward

    # (c) the backward's body on the main thread, and torch's three ops.
    def lin(x, weight, bias, activation, alpha, out_dtype):
        return fused.direct_linear(x, weight, bias, None, activation, alpha, out_dtype, "auto", None)

    xd, wd, bd = x.detach(), w.detach(), b.detach()
    with torch.no_grad():
        body = eager_s(lambda: fused.linear_grads(g, xd, wd, bd, None, None, 1.0, (True, True, True, False), lin))
        pieces = [eager_s(lambda: torch.mm(g, wd)), eager_s(lambda: torch.mm(g.T, xd)), eager_s(lambda: g.sum(0))]
        ours = [eager_s(lambda: lin(g, wd.T, None, None, 1.0, dt)),
                eager_s(lambda: lin(g.T, xd.T, None, None, 1.0, dt))]  # fmt: skip
    print(f"fused.linear_grads on the main thread: {body * 1e6:.1f} us; torch's dX, dW, bias: "
          f"{', '.join(f'{p * 1e6:.1f}' for p in pieces)} us (sum {sum(pieces) * 1e6:.1f}); ours dX, dW: "
          f"{', '.join(f'{p * 1e6:.1f}' for p in ours)} us")  # fmt: skip


if __name__ == "__main__":
    main()
