"""linear's weight gradient dW = dz^T @ x, whose A = dz^T is a transposed (M-major) operand: `auto`
on it as is, on a row-major copy (the copy timed too) and torch.matmul, in the same run (bf16,
do_bench medians, eager). It asks whether the transposed operand is why dW is slower than cuBLAS.
Run on a GPU: PYTHONPATH=. python3 scripts/probes/backward/weight_grad_probe.py (the H100's answer, 2026-11-23:
results/h100/probes/backward/weight-grad-probe.txt).
"""

import functools

import torch
from triton.testing import do_bench

import tritongemm
from tritongemm import dispatch

# (M', N, K): tokens, then the weight's shape (N, K); Llama-3-8B's layers, decode to prefill.
SHAPES = [(16, 28672, 4096), (512, 28672, 4096), (2048, 28672, 4096), (2048, 4096, 14336), (4096, 4096, 4096),
          (8192, 14336, 4096)]  # fmt: skip


def on_a_copy(grad_z_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return tritongemm.matmul(grad_z_t.contiguous(), x)


def main() -> None:
    for tokens, N, K in SHAPES:
        grad_z = torch.randn(tokens, N, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(tokens, K, device="cuda", dtype=torch.bfloat16)
        reference = grad_z.T.double() @ x.double()
        ways = {"as is": tritongemm.matmul, "copy": on_a_copy, "torch": torch.matmul}
        for name, fn in ways.items():
            run = functools.partial(fn, grad_z.T, x)
            err = ((run().double() - reference).norm() / reference.norm()).item()
            ms = do_bench(run, warmup=25, rep=100)
            print(f"dW {N}x{K} over {tokens}: {name:6s} {ms * 1000:8.1f} us  err {err:.1e}")
        as_is = dispatch.explain(grad_z.T, x).splitlines()[0]
        copied = dispatch.explain(grad_z.T.contiguous(), x).splitlines()[0]
        print(f"  as is: {as_is} | copy: {copied}")


if __name__ == "__main__":
    main()
