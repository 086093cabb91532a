"""Where linear's backward spends its GPU time: one forward + backward of
`linear(x, w, b, activation="gelu")` against torch's `F.gelu(F.linear(x, w, b))`, timed (do_bench,
median) and profiled by kernel, then the two backward GEMMs alone (dX = dz @ w, dW = dz^T @ x)
with what `auto` picks for each, against torch.matmul. bf16, on a GPU:

    PYTHONPATH=. python3 scripts/probes/backward/backward_profile.py
"""

import functools

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import tritongemm
from tritongemm import dispatch

SHAPES = [(16, 28672, 4096), (2048, 28672, 4096), (16, 4096, 14336)]  # M, N, K: Llama-3-8B's MLP


def step(forward, x, w, b, grad_y):
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    return torch.autograd.grad(forward(*leaves), leaves, grad_y)


def main() -> None:
    providers = {
        "torch": lambda x, w, b: F.gelu(F.linear(x, w, b)),
        "tritongemm": lambda x, w, b: tritongemm.linear(x, w, b, activation="gelu"),
    }
    for M, N, K in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
        b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        grad_y = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        for name, forward in providers.items():
            run = functools.partial(step, forward, x, w, b, grad_y)
            ms = do_bench(run, warmup=50, rep=200)
            print(f"== {M}x{N}x{K} {name}: {ms * 1000:.1f} us per forward + backward")
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    run()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=70))
        for label, a, b_ in (("dX", grad_y, w), ("dW", grad_y.T, x)):
            ours = do_bench(functools.partial(tritongemm.matmul, a, b_), warmup=25, rep=100)
            theirs = do_bench(functools.partial(torch.matmul, a, b_), warmup=25, rep=100)
            print(f"{label}: {dispatch.explain(a, b_).splitlines()[0]}")
            print(f"  strides {a.stride()} {b_.stride()}: tritongemm {ours * 1e3:.1f} us, torch {theirs * 1e3:.1f} us")


if __name__ == "__main__":
    main()
