"""Store or recompute the pre-activation for linear's backward (fused.PREACT, issue 13): the time
of one forward + backward of `linear(x, w, b, activation="gelu")` with each, beside torch's
F.gelu(F.linear(...)), and the memory the forward keeps for the backward. Gradients are checked
against torch's first. Run on a GPU: PYTHONPATH=. python3 scripts/probes/backward/preact_cost.py [out.csv]
(without one, a CPU smoke run of tiny fp32 shapes under the interpreter).
"""

import functools
import os
import statistics
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F  # noqa: E402

import tritongemm  # noqa: E402
from tritongemm.bench.report import write_dicts  # noqa: E402
from tritongemm.core.reference import rel_error  # noqa: E402
from tritongemm.dense import linear as fused  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE, DTYPE = ("cuda", torch.bfloat16) if ON_GPU else ("cpu", torch.float32)
# Llama-3-8B's MLP up/gate (N = 28672 as one) and attention-sized weights; decode to prefill M.
SHAPES = [(16, 28672, 4096), (512, 28672, 4096), (2048, 28672, 4096), (4096, 4096, 4096)] if ON_GPU else [(16, 32, 48)]


def step(forward, x, w, b, grad_y):
    """One forward and backward; the gradients of x, w and b."""
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    return torch.autograd.grad(forward(*leaves), leaves, grad_y)


def timed(fn) -> float:
    if not ON_GPU:
        return float("nan")
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def kept_bytes(forward, x, w, b) -> int:
    """Memory the forward leaves allocated for the backward, beyond its output."""
    if not ON_GPU:
        return 0
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = forward(*leaves)
    return torch.cuda.memory_allocated() - before - y.numel() * y.element_size()


def main() -> None:
    rows = []
    for M, N, K in SHAPES:
        x, w = torch.randn(M, K, device=DEVICE, dtype=DTYPE), torch.randn(N, K, device=DEVICE, dtype=DTYPE) / K**0.5
        b, grad_y = torch.randn(N, device=DEVICE, dtype=DTYPE), torch.randn(M, N, device=DEVICE, dtype=DTYPE)
        calls = {
            "torch": (None, lambda x, w, b: F.gelu(F.linear(x, w, b))),
            "store": ("store", lambda x, w, b: tritongemm.linear(x, w, b, activation="gelu")),
            "recompute": ("recompute", lambda x, w, b: tritongemm.linear(x, w, b, activation="gelu")),
        }
        reference = step(calls["torch"][1], x, w, b, grad_y)
        samples = {name: [] for name in calls}
        errors, kept = {}, {}
        for name, (preact, forward) in calls.items():  # checked first, and compiled, untimed
            fused.PREACT = preact or fused.PREACT
            errors[name] = max(rel_error(g, r) for g, r in zip(step(forward, x, w, b, grad_y), reference))
            kept[name] = kept_bytes(forward, x, w, b)
        for _ in range(3):  # interleaved rounds, medians kept
            for name, (preact, forward) in calls.items():
                fused.PREACT = preact or fused.PREACT
                samples[name].append(timed(functools.partial(step, forward, x, w, b, grad_y)))
        fused.PREACT = "store"
        torch_ms = statistics.median(samples["torch"])
        for name in calls:
            ms = statistics.median(samples[name])
            row = dict(m=M, n=N, k=K, dtype=str(DTYPE)[6:], provider=name, ms=ms, ratio_to_torch=torch_ms / ms,
                       kept_mib=kept[name] / 2**20, max_rel_err=errors[name])  # fmt: skip
            rows.append(row)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if len(sys.argv) > 1:
        write_dicts(sys.argv[1], rows)


if __name__ == "__main__":
    main()
