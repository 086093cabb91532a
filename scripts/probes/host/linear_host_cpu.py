"""A CPU stand-in for the eager linear's host time, where no GPU is at hand: `tritongemm.linear`
forward + backward on small tensors with every planned launch made a no-op (the plans are built
first, under the Triton interpreter), beside the same step through an autograd node that does
nothing (a Python `autograd.Function`) and through a C++ op's node (`x * 1.0`). Then what the
backward's two call keys cost against a look-up of the gradient's facts alone. Best of 7 rounds.
docs/launch-path.md quotes it. The GPU host's own costs (launches, allocations) are not in it.

    TRITON_INTERPRET=1 python3 scripts/probes/host/linear_host_cpu.py
"""

import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # read as the kernels are decorated

import torch  # noqa: E402

import tritongemm  # noqa: E402
from tritongemm.core.plans import PLANS  # noqa: E402
from tritongemm.core.problem import tensor_facts
from tritongemm.dense import linear as fused  # noqa: E402
from tritongemm.dense.plan import Plan

M, K, N = 16, 64, 96
weight = torch.randn(N, K, requires_grad=True)
bias = torch.randn(N, requires_grad=True)
x_data, grad_y = torch.randn(2, M // 2, K), torch.randn(2, M // 2, N)


class NothingNode(torch.autograd.Function):
    """A node that saves what linear's saves and computes nothing."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return x.new_empty(*x.shape[:-1], N)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight, bias = ctx.saved_tensors
        return x.new_empty(x.shape), weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def c_node_step():
    x = x_data.detach().requires_grad_(True)
    torch.autograd.backward(x * 1.0, x_data)


def nothing_node_step():
    x = x_data.detach().requires_grad_(True)
    torch.autograd.backward(NothingNode.apply(x, weight, bias), grad_y)


def linear_step():
    x = x_data.detach().requires_grad_(True)
    torch.autograd.backward(tritongemm.linear(x, weight, bias), grad_y)


def backward_keys():
    """The two call keys and look-ups the backward's GEMMs make (dx, then dW)."""
    fused.planned_call(grad_y, weight.T, None, None, None, 1.0, torch.float32, "auto", None, False)
    fused.planned_call(grad_y.reshape(M, N).T, x_data.reshape(M, K).T, None, None, None, 1.0, torch.float32, "auto",
                       None, False)  # fmt: skip


memo = {(tensor_facts(grad_y), fused.allow_tf32()): None}


def gradient_facts_only():
    """A look-up keyed by the gradient's facts alone, the views the backward makes either way."""
    memo.get((tensor_facts(grad_y), fused.allow_tf32()))
    grad_y.reshape(M, N).T, x_data.reshape(M, K).T


def best_us(step, calls: int = 3000) -> float:
    for _ in range(300):
        step()
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    for _ in range(3):  # plans and calls built, kernels run under the interpreter
        linear_step()
    for value in list(PLANS._plans.values()):
        if isinstance(value, Plan):
            object.__setattr__(value, "launch", lambda *args: None)
    print(f"forward + backward of {M} x {K} -> {N}, fp32, us a step (launches no-ops)")
    for step in (c_node_step, nothing_node_step, linear_step, backward_keys, gradient_facts_only):
        print(f"  {step.__name__:20s} {best_us(step):6.1f}")


if __name__ == "__main__":
    main()
