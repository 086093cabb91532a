"""The pieces every `triton.language` rung shares: the tile's offsets, the K loop, the store.

Each rung is "which tile am I?" (primitives/tiling/tl.py) plus these helpers, so the rungs differ
only in the one idea they add. `record_tile` lets the tests see which program computed which tile.
"""

import triton
import triton.language as tl


@triton.jit
def assume_multiple(x, ALIGN: tl.constexpr):
    """x, which the host checked is a multiple of ALIGN, rewritten so the compiler sees it too.

    Triton learns divisibility from argument values only for multiples of 16. With N = 1000 (a
    multiple of 8) every row of B looked misaligned and each load split into 2-byte pieces:
    0.01-0.25x cuBLAS at 2000 x 1000 x 2000 on the H100. `x // 8 * 8` is 8-divisible by
    construction, which is all the alignment analysis needs to emit 16-byte loads.
    """
    if ALIGN > 1:
        x = x // ALIGN * ALIGN
    return x


@triton.jit
def tile_offsets(pid_m, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """Row indices (BLOCK_M,) and column indices (BLOCK_N,) of the C tile (pid_m, pid_n).

    INT64 widens the tile index before it is scaled: `offs_m * stride_am` is int32 arithmetic
    otherwise, and wraps once a tensor spans 2**31 elements (and `pid_m * BLOCK_M` once M does).
    """
    if INT64:
        pid_m = tl.cast(pid_m, tl.int64)
        pid_n = tl.cast(pid_n, tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
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
    ALIGN: tl.constexpr,  # divisibility of (M, N, K, stride_am, stride_ak, stride_bk, stride_bn, ...)
):
    """acc (BLOCK_M, BLOCK_N) fp32 = A[offs_m, :] @ B[:, offs_n], streamed BLOCK_K at a time."""
    # 0. What the host knows about alignment, told to the compiler (see assume_multiple).
    M, N, K = assume_multiple(M, ALIGN[0]), assume_multiple(N, ALIGN[1]), assume_multiple(K, ALIGN[2])
    stride_am, stride_ak = assume_multiple(stride_am, ALIGN[3]), assume_multiple(stride_ak, ALIGN[4])
    stride_bk, stride_bn = assume_multiple(stride_bk, ALIGN[5]), assume_multiple(stride_bn, ALIGN[6])

    # 1. Pointers to the first (BLOCK_M, BLOCK_K) block of A and (BLOCK_K, BLOCK_N) block of B:
    #    a column of row offsets plus a row of column offsets broadcasts to a 2D block.
    #    K offsets take the width of the M / N ones (int64 with INT64), since
    #    `(BLOCK_K - 1) * stride_ak` and the K step `BLOCK_K * stride_ak` wrap too once a step
    #    along K spans 2**31 elements (a transposed A with M >= 2**25, say).
    offs_k = tl.arange(0, BLOCK_K).to(offs_m.dtype)
    step_k = tl.cast(BLOCK_K, offs_m.dtype)
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
        a_ptrs += step_k * stride_ak
        b_ptrs += step_k * stride_bk
    return acc


@triton.jit
def store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN: tl.constexpr):
    """Cast the fp32 accumulator to C's dtype and write the in-bounds part of the tile."""
    M, N = assume_multiple(M, ALIGN[0]), assume_multiple(N, ALIGN[1])
    stride_cm, stride_cn = assume_multiple(stride_cm, ALIGN[7]), assume_multiple(stride_cn, ALIGN[8])
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
