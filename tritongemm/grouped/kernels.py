"""The grouped GEMMs in `triton.language`: ragged groups whose boundaries live on the device.

Neither kernel reads `offs` on the host, so a call makes no synchronization, and CUDA graphs and
torch.compile keep working:

- groups along M (the MoE forward): a persistent grid whose size depends on the shapes alone.
  Every program walks the groups in order, counting each group's tiles from its offsets (an
  empty group has none), and takes the tiles whose running index is its own modulo the grid, as
  the Triton tutorials' grouped GEMM does. The rows after the last group's end belong to no
  group: one more pass writes them as zeros, so the output never holds uninitialized memory.
- a gated pair (GLU: SwiGLU, GeGLU) in the row-group kernel's epilogue: B's columns are [gate;
  up], and each output tile is activation(x @ gate) * (x @ up) from two accumulators over the same
  rows, so the (rows, 2 x width) product never reaches memory.
- groups along K (the weight gradient): one program per (group, tile), the group's K range read
  from the offsets; an empty group's tiles are zeros.
"""

import triton
import triton.language as tl

from tritongemm.epilogue.kernels import _activate_tl
from tritongemm.ladder._tiles import dot_tile, store_tile, tile_offsets


# fmt: off
@triton.jit
def _groups_along_m_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,  # A (M, K), B (G, K, N), C (M, N)
    offs_ptr,  # (G,) int32: group g is rows [offs[g - 1], offs[g]) (offs[-1] = 0)
    # sizes
    G, M, N, K,
    # strides (elements)
    stride_am, stride_ak,
    stride_bg, stride_bk, stride_bn,
    stride_cm, stride_cn,
    # meta-parameters
    NUM_PROGRAMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    ALIGN: tl.constexpr,  # _host.alignment_hints' nine entries; all 1: a group starts at any row
    GLU: tl.constexpr,  # "none", or the gate's activation: C is activation(A @ B[:, :N]) * (A @ B[:, N:])
):
    # fmt: on
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    seen = 0  # tiles of the groups before this one
    start = 0
    for g in range(0, G + 1):  # G groups, then the rows after the last one's end
        end = tl.where(g < G, tl.load(offs_ptr + tl.minimum(g, G - 1)), M)
        tiles = tl.cdiv(end - start, BLOCK_M) * tiles_n
        # 1. This program's tiles of the group: running index t with t % NUM_PROGRAMS == pid.
        first = seen + (pid - seen % NUM_PROGRAMS + NUM_PROGRAMS) % NUM_PROGRAMS
        for t in range(first, seen + tiles, NUM_PROGRAMS):
            local = t - seen
            offs_m, offs_n = tile_offsets(local // tiles_n, local % tiles_n, BLOCK_M, BLOCK_N, False)
            offs_m += start
            # 2. The group's rows times its B; past the last group, zeros.
            if g < G:
                acc = dot_tile(a_ptr, b_ptr + g * stride_bg, offs_m, offs_n, end, N, K, stride_am, stride_ak,
                               stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, True, INPUT_PRECISION, ALIGN)
                if GLU != "none":  # the up half: B's columns N + offs_n
                    up = dot_tile(a_ptr, b_ptr + g * stride_bg + N * stride_bn, offs_m, offs_n, end, N, K, stride_am,
                                  stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, True, INPUT_PRECISION,
                                  ALIGN)
                    acc = _activate_tl(acc, GLU) * up
            else:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            store_tile(c_ptr, acc, offs_m, offs_n, end, N, stride_cm, stride_cn, ALIGN)
        seen += tiles
        start = end


# fmt: off
@triton.jit
def _groups_along_k_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,  # A (M, K), B (K, N), C (G, M, N)
    offs_ptr,  # (G,) int32: group g is columns [offs[g - 1], offs[g]) of A, the same rows of B
    # sizes
    M, N,
    # strides (elements)
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cg, stride_cm, stride_cn,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    ALIGN: tl.constexpr,
):
    # fmt: on
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    g = pid // (tiles_m * tiles_n)
    local = pid % (tiles_m * tiles_n)
    offs_m, offs_n = tile_offsets(local // tiles_n, local % tiles_n, BLOCK_M, BLOCK_N, False)
    k_start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    k_end = tl.load(offs_ptr + g)
    # The group's K range as a K of its own, from its first column (an empty one: a zero tile).
    acc = dot_tile(a_ptr + k_start * stride_ak, b_ptr + k_start * stride_bk, offs_m, offs_n, M, N, k_end - k_start,
                   stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, True, INPUT_PRECISION,
                   ALIGN)  # fmt: skip
    store_tile(c_ptr + g * stride_cg, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)
