"""The last step of a GEMM + reduce-scatter: sum each rank's partial product of this rank's rows,
then the epilogue, in one pass.

    out = activation(alpha * sum_w partials[w] + bias) + residual

The partials arrive as one (world, m, N) tensor in rank order; the sum runs in fp32 in that
order (the same on every rank, whatever arrived first) and rounds once, where NCCL's
reduce-scatter of bf16 rounds after every add. The epilogue is `linear`'s (epilogue.kernels),
so a row-parallel layer's bias, an average (alpha = 1 / world) and the residual stream's add cost
no pass of their own. The bias must come after the sum, so it can't ride in a partial's GEMM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongemm.core.epilogue import Epilogue
from tritongemm.primitives.epilogue import apply_tl
from tritongemm.primitives.launch import compile_launch

BLOCK_M, BLOCK_N = 32, 128  # 4K fp32 elements a program: enough bytes in flight for a streaming pass


@triton.jit
def _reduce_partials(
    # pointers
    parts_ptr,  # (WORLD, M, N), contiguous
    out_ptr,  # (M, N), contiguous
    bias_ptr, residual_ptr,  # (N,), (M, N) with strides stride_rm, stride_rn; or 0 when absent
    # sizes and strides
    M, N, plane, stride_rm, stride_rn,  # plane = M * N, one partial's elements: an int64 when large
    alpha,
    # meta-parameters
    WORLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    # 1. The sum, in rank order.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    parts_ptrs = parts_ptr + offs
    for _ in tl.static_range(WORLD):
        acc += tl.load(parts_ptrs, mask=mask, other=0.0).to(tl.float32)
        parts_ptrs += plane  # one partial at a time: w * plane could pass 2**31 in 32 bits
    # 2. The epilogue, and one rounding.
    acc = apply_tl(acc, offs_m, offs_n, M, N, bias_ptr, residual_ptr, 0, stride_rm, stride_rn, 0, alpha,
                   ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT)  # fmt: skip
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def reduce_partials(
    parts: torch.Tensor,
    *,
    alpha: float = 1.0,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """activation(alpha * parts.sum(0) + bias) + residual for contiguous `parts` (world, m, N),
    summed in fp32; the output is (m, N) in parts' dtype. The caller has checked the arguments."""
    world, M, N = parts.shape
    out = parts.new_empty((M, N))
    if M == 0 or N == 0:
        return out
    grid, args, meta = _launch_arguments(parts, out, alpha, bias, activation, residual)
    _reduce_partials[grid](*args, **meta)
    return out


def planned_reduce(parts: torch.Tensor, *, alpha: float = 1.0, bias=None, activation=None, residual=None):
    """`reduce(parts, bias, residual)`, `reduce_partials` compiled once for tensors like these
    (same shapes, strides and 16-byte alignment; the caller's plan key says so), which launches
    without Triton's per-call binding (primitives/launch.py): for a plan that runs it on every call."""
    world, M, N = parts.shape
    assert M and N, "an empty output has no kernel to plan"
    out = parts.new_empty((M, N))  # this call's, to plan on
    grid, args, meta = _launch_arguments(parts, out, alpha, bias, activation, residual)
    launch = compile_launch(_reduce_partials, grid, args, meta, parts.device)
    spec = Epilogue(activation, float(alpha), bias is not None, residual is not None)
    fixed = args[4:]  # the sizes, residual strides and alpha

    def reduce(parts, bias, residual):
        out = parts.new_empty((M, N))
        launch(parts, out, *spec.pointers(bias, residual)[:2], *fixed)
        return out

    return reduce


def _launch_arguments(parts, out, alpha, bias, activation, residual) -> tuple:
    """(grid, runtime arguments, constexprs) of `_reduce_partials` for these tensors."""
    world, M, N = parts.shape
    spec = Epilogue(activation, float(alpha), bias is not None, residual is not None)
    bias_arg, residual_arg, _ = spec.pointers(bias, residual)
    stride_rm, stride_rn, _, alpha = spec.fixed_args(residual)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    args = (parts, out, bias_arg, residual_arg, M, N, M * N, stride_rm, stride_rn, alpha)
    meta = dict(WORLD=world, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **spec.constexprs())
    return grid, args, meta
