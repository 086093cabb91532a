"""The reductions a transformer computes besides its GEMMs, in an order that does not depend on
how many rows there are: softmax and log-softmax (attention's probabilities, a sampler's) and the
mean (an RMSNorm's), each over a row's last dimension.

torch's CUDA reductions choose their launch (threads on a row, rows on a block, blocks on a row)
from the tensor's whole shape, so a row's sum can be added up in another order when the batch
around it changes. Here one program takes one row and walks it BLOCK columns at a time, BLOCK
chosen from the row's length alone; a chunk is summed by tl.sum's tree, the chunks in order. A
row's result is then one arithmetic for every number of rows. Kernels and launches are compiled
once per problem (core.plans.PLANS).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts
from tritongemm.primitives.launch import compile_launch

MAX_BLOCK = 4096  # columns a program holds at once; longer rows are walked in chunks of it


@triton.jit
def _softmax_kernel(
    x_ptr, y_ptr,  # (rows, N) each, rows at stride_x and stride_y
    N, stride_x, stride_y,
    LOG: tl.constexpr,  # log-softmax: x - max - log(sum)
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row, y_row = x_ptr + row * stride_x, y_ptr + row * stride_y
    cols = tl.arange(0, BLOCK)
    # 1. The row's max (exact in any order), then 2. the sum of exp(x - max), chunk by chunk in order.
    top = tl.full((), float("-inf"), tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < N, other=float("-inf")).to(tl.float32)
        top = tl.maximum(top, tl.max(x, axis=0))
    total = tl.zeros((), tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < N, other=float("-inf")).to(tl.float32)
        total += tl.sum(tl.exp(x - top), axis=0)
    # 3. Each element from the two.
    for start in range(0, N, BLOCK):
        mask = start + cols < N
        x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            y = x - top - tl.log(total)
        else:
            y = tl.exp(x - top) / total
        tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mean_kernel(
    x_ptr, y_ptr,  # (rows, N) at stride_x, (rows,)
    N, stride_x,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    total = tl.zeros((), tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_ptr + row * stride_x + start + cols, mask=start + cols < N, other=0.0)
        total += tl.sum(x.to(tl.float32), axis=0)
    tl.store(y_ptr + row, (total / N).to(y_ptr.dtype.element_ty))


def _block(N: int) -> int:
    return min(MAX_BLOCK, triton.next_power_of_2(max(N, 1)))


def _warps(block: int) -> int:
    return 8 if block >= 2048 else 4


def softmax_rows(x: torch.Tensor, out_dtype: torch.dtype, log: bool) -> torch.Tensor:
    """softmax (or log-softmax) of each row of a 2-D x, contiguous along its rows."""
    rows, N = x.shape

    def build():
        block = _block(N)
        probe = x.new_empty((rows, N), dtype=out_dtype)
        return compile_launch(_softmax_kernel, (rows,), (x, probe, N, x.stride(0), N),
                              dict(LOG=log, BLOCK=block, num_warps=_warps(block)), x.device)  # fmt: skip

    launch = planned(("invariant.softmax", tensor_facts(x), out_dtype, log), build)
    y = x.new_empty((rows, N), dtype=out_dtype)
    if rows and N:
        launch(x, y, N, x.stride(0), N)
    return y


def mean_rows(x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The mean of each row of a 2-D x, contiguous along its rows, summed in fp32: (rows,)."""
    rows, N = x.shape

    def build():
        block = _block(N)
        probe = x.new_empty((rows,), dtype=out_dtype)
        return compile_launch(_mean_kernel, (rows,), (x, probe, N, x.stride(0)),
                              dict(BLOCK=block, num_warps=_warps(block)), x.device)  # fmt: skip

    launch = planned(("invariant.mean", tensor_facts(x), out_dtype), build)
    y = x.new_empty((rows,), dtype=out_dtype)
    if rows:
        launch(x, y, N, x.stride(0))
    return y
