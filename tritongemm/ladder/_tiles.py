"""The pieces every `triton.language` rung shares: tile numbering, the K loop, the store.

Each rung is "which tile am I?" plus these three helpers, so the rungs differ only in the one
idea they add. The pid -> tile formulas are the `@triton.jit` twins of `tritongemm.tile_order`;
the tests run the kernels with TRACE=True and compare what they record with that module.
"""

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """Tile (pid_m, pid_n) of program `pid` in the grouped (swizzled) order; see tile_order.py."""
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


# Whether Triton decorated these kernels for its CPU interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED = isinstance(grouped_tile, InterpretedFunction)


@triton.jit
def tile_offsets(pid_m, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """Row indices (BLOCK_M,) and column indices (BLOCK_N,) of the C tile (pid_m, pid_n).

    INT64 widens them before they meet the strides: `offs_m * stride_am` is int32 arithmetic
    otherwise, and wraps once a tensor spans 2**31 elements.
    """
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if INT64:
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
    return offs_m, offs_n


@triton.jit
def dot_tile(
    # pointers
    a_ptr,
    b_ptr,  # A (M, K), B (K, N)
    # tile
    offs_m,
    offs_n,  # (BLOCK_M,), (BLOCK_N,) rows of A and columns of B this tile needs
    # sizes
    M,
    N,
    K,
    # strides
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    # meta-parameters
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MASK_MN: tl.constexpr,  # False: the caller clamped offs_m / offs_n into range itself
    INPUT_PRECISION: tl.constexpr,  # fp32 operands: "tf32" or "ieee"
):
    """acc (BLOCK_M, BLOCK_N) fp32 = A[offs_m, :] @ B[:, offs_n], streamed BLOCK_K at a time."""
    # 1. Pointers to the first (BLOCK_M, BLOCK_K) block of A and (BLOCK_K, BLOCK_N) block of B:
    #    a column of row offsets plus a row of column offsets broadcasts to a 2D block.
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn)

    # 2. Walk K. Lanes past an edge load 0, the identity of the sum, so partial blocks are exact.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        if MASK_MN:
            a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < k_left)
            b_mask = (offs_k[:, None] < k_left) & (offs_n[None, :] < N)
        else:
            a_mask = offs_k[None, :] < k_left
            b_mask = offs_k[:, None] < k_left
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn):
    """Cast the fp32 accumulator to C's dtype and write the in-bounds part of the tile."""
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def record_tile(trace_ptr, pid_m, pid_n, num_pid_n, program, step, TRACE: tl.constexpr):
    """Debug aid, compiled out unless TRACE: trace[pid_m, pid_n] = (program, step)."""
    if TRACE:
        slot = trace_ptr + 2 * (pid_m * num_pid_n + pid_n)
        tl.store(slot, program)
        tl.store(slot + 1, step)
