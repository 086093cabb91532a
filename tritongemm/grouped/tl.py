"""The grouped GEMMs in `triton.language`: ragged groups whose boundaries live on the device.

Neither kernel reads `offs` on the host, so a call makes no synchronization, and CUDA graphs and
torch.compile keep working:

- groups along M (the MoE forward): a persistent grid whose size depends on the shapes alone.
  Each program loads the offsets once, as a vector, and counts every group's tiles (an empty
  group has none) and their running total; it then takes the tiles whose running index is its own
  modulo the grid, as the Triton tutorials' grouped GEMM does, finding each one's group with a
  comparison against the running totals instead of a serial walk over the groups (a decode
  step of a 128-expert layer has a few tiles and 128 offsets). The rows after the last group's
  end belong to no group: one more slot writes them as zeros, so the output never holds
  uninitialized memory.
- a gated pair (GLU: SwiGLU, GeGLU) in the row-group kernel's epilogue: B's columns are [gate;
  up], and each output tile is activation(x @ gate) * (x @ up) from two accumulators filled in one
  walk over K (`_dot_pair`), so the (rows, 2 x width) product never reaches memory.
- groups along K (the weight gradient): one program per (group, tile), the group's K range read
  from the offsets; an empty group's tiles are zeros.
- both in fp8 (`SCALED`, fp8/grouped.py): the accumulator dequantized by row-wise scales before
  the store, a group's own for B (along M) or for both operands (along K: each quantized over its
  group's K range).
- expert rows (MoE decode): no groups at all; each (token, expert) pair is a row that reads its
  expert's weights by the router's index (moe_decode.py).
- the weighted un-permute (MoE, after the down projection): each token's top_k rows, found in
  expert order through the inverse of the sort, times their routing weights, summed in fp32.
"""

import triton
import triton.language as tl

from tritongemm.primitives.epilogue import _activate_tl, scale_tl
from tritongemm.primitives.tiling.tl import grouped_tile
from tritongemm.primitives.tl.tiles import dot_tile, store_tile, tile_offsets


# fmt: off
@triton.jit
def _groups_along_m_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,  # A (M, K), B (G, K, N), C (M, N)
    offs_ptr,  # (G,) int32: group g is rows [offs[g - 1], offs[g]) (offs[-1] = 0)
    sa_ptr, sb_ptr,  # SCALED: A's row scales (M,), B's (G, N) per group and column; else unread
    # sizes
    G, M, N, K,
    # strides (elements)
    stride_am, stride_ak,
    stride_bg, stride_bk, stride_bn,
    stride_cm, stride_cn,
    stride_sbg,  # SCALED: between B's groups' scales
    # meta-parameters
    NUM_PROGRAMS: tl.constexpr,
    GROUPS_POW2: tl.constexpr,  # a power of two > G: the groups, and the rows past the last, as one vector
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,  # the L2 swizzle within a group (ladder/grouped.py)
    INPUT_PRECISION: tl.constexpr,
    ALIGN: tl.constexpr,  # _host.alignment_hints' nine entries, all 1 here: a group starts at any row
    INT64: tl.constexpr,  # some operand spans 2**31 elements: offsets in int64
    GLU: tl.constexpr,  # "none", or the gate's activation: C is activation(A @ B[:, :N]) * (A @ B[:, N:])
    WHOLE: tl.constexpr = False,  # G = 1 and offs not read: one group of all M rows (a dense gated pair)
    SCALED: tl.constexpr = False,  # fp8 A and B, row-wise scales (fp8/grouped.py): acc * sa[m] * sb[g, n]
):
    # fmt: on
    # 1. The schedule, computed here from offs (never on the host): each group's tile count and
    #    the running total before it, as vectors over the groups. Slot G holds the rows past the
    #    last group's end, written as zeros.
    slot = tl.arange(0, GROUPS_POW2)
    if WHOLE:  # group 0 is rows [0, M); slot 1, past it, is empty
        ends = tl.where(slot <= G, M, 0)
        starts = tl.where((slot > 0) & (slot <= G), M, 0)
    else:
        ends = tl.load(offs_ptr + slot, mask=slot < G, other=0)
        ends = tl.where(slot < G, ends, tl.where(slot == G, M, 0))
        starts = tl.load(offs_ptr + slot - 1, mask=(slot > 0) & (slot <= G), other=0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.where(slot <= G, tl.cdiv(ends - starts, BLOCK_M) * tiles_n, 0)
    after = tl.cumsum(tiles, 0)  # tiles up to and including each group
    total = tl.sum(tiles, 0)

    # 2. Tile t of the running order goes to program t % NUM_PROGRAMS: find its group (the first
    #    whose running total passes t), then its place in the group, swizzled for L2.
    for t in range(tl.program_id(0), total, NUM_PROGRAMS):
        g = tl.sum((after <= t).to(tl.int32), 0)
        pick = slot == g
        start = tl.sum(tl.where(pick, starts, 0), 0)
        end = tl.sum(tl.where(pick, ends, 0), 0)
        local = t - tl.sum(tl.where(pick, after - tiles, 0), 0)
        pid_m, pid_n = grouped_tile(local, tl.cdiv(end - start, BLOCK_M), tiles_n, GROUP_SIZE_M)
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INT64)
        offs_m += start
        # 3. The group's rows times its B; past the last group, zeros.
        if g < G:
            b_group = b_ptr + g.to(tl.int64) * stride_bg
            if GLU == "none":
                acc = dot_tile(a_ptr, b_group, offs_m, offs_n, end, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, True, INPUT_PRECISION, ALIGN)  # fmt: skip
            else:  # the gate's columns offs_n and the up projection's N + offs_n, in one walk over K
                gate, up = _dot_pair(a_ptr, b_group, offs_m, offs_n, end, N, K, stride_am, stride_ak, stride_bk,
                                     stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, INPUT_PRECISION)  # fmt: skip
                acc = _activate_tl(gate, GLU) * up
            if SCALED:
                acc = scale_tl(acc, offs_m, offs_n, end, N, sa_ptr, sb_ptr + g.to(tl.int64) * stride_sbg, 1, 1, True)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        store_tile(c_ptr, acc, offs_m, offs_n, end, N, stride_cm, stride_cn, ALIGN)


@triton.jit
def _dot_pair(a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              INPUT_PRECISION: tl.constexpr):  # fmt: skip
    """(A[offs_m] @ B[:, offs_n], A[offs_m] @ B[:, N + offs_n]): a gated pair's gate and up
    products in one walk over K, each A block loaded once for both. Two walks of dot_tile, one a
    product, loaded A twice and filled the pipeline twice: 0.92-1.17x torch._grouped_mm plus torch's
    silu * up at 2048-8192 tokens of three MoE layers on the H100, against 1.06-1.37x for one walk,
    and the two within 2% at 1-64 tokens (results/h100/probes/grouped/grouped-pair-loop-3682407.csv)."""
    offs_k = tl.arange(0, BLOCK_K).to(offs_m.dtype)
    a_ptrs = a_ptr + (offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn)
    up_shift = tl.cast(N, offs_n.dtype) * stride_bn  # int64 where the offsets are (INT64)
    step_k = tl.cast(BLOCK_K, offs_m.dtype)
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b_mask = (offs_k[:, None] < k_left) & (offs_n[None, :] < N)
        gate = tl.dot(a, tl.load(b_ptrs, mask=b_mask, other=0.0), gate, input_precision=INPUT_PRECISION)
        up = tl.dot(a, tl.load(b_ptrs + up_shift, mask=b_mask, other=0.0), up, input_precision=INPUT_PRECISION)
        a_ptrs += step_k * stride_ak
        b_ptrs += step_k * stride_bk
    return gate, up


# fmt: off
@triton.jit
def _groups_along_k_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,  # A (M, K), B (K, N), C (G, M, N)
    offs_ptr,  # (G,) int32: group g is columns [offs[g - 1], offs[g]) of A, the same rows of B
    sa_ptr, sb_ptr,  # SCALED: A's scales (G, M), B's (G, N), each along its group's K; else unread
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
    INT64: tl.constexpr = False,  # some operand or C spans 2**31 elements: offsets in int64
    SCALED: tl.constexpr = False,  # fp8 A and B (fp8/grouped.py): acc * sa[g, m] * sb[g, n]
):
    # fmt: on
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    g = pid // (tiles_m * tiles_n)
    local = pid % (tiles_m * tiles_n)
    offs_m, offs_n = tile_offsets(local // tiles_n, local % tiles_n, BLOCK_M, BLOCK_N, INT64)
    k_start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    k_end = tl.load(offs_ptr + g)
    if INT64:
        k_start = k_start.to(tl.int64)
    # The group's K range as a K of its own, from its first column (an empty one: a zero tile).
    acc = dot_tile(a_ptr + k_start * stride_ak, b_ptr + k_start * stride_bk, offs_m, offs_n, M, N, k_end - k_start,
                   stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, True, INPUT_PRECISION,
                   ALIGN)  # fmt: skip
    if SCALED:
        acc = scale_tl(acc, offs_m, offs_n, M, N, sa_ptr + g * M, sb_ptr + g * N, 1, 1, True)
    store_tile(c_ptr + g.to(tl.int64) * stride_cg, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)


# MoE experts at decode (moe_decode.py): one program per output row and BLOCK_N columns; each
# (token, expert) pair is a row times its expert's weights, read by the router's index, with no
# sort by expert, no gathered copy of the tokens and no un-permute. A few rows read each weight
# once: the work is the weights' bandwidth, so the products are multiply-adds on the CUDA cores
# into a (BLOCK_N, BLOCK_K) accumulator, reduced once at the end.
# fmt: off
@triton.jit
def _expert_rows_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,  # A (rows, K), B (G, K, N), C (output rows, N)
    ids_ptr,  # (pairs,) each pair's expert: its group of B
    scale_ptr,  # (pairs,) each pair's routing weight, read when SCALED
    # sizes
    N, K, G,  # G experts: a pair routed outside [0, G) adds nothing, as histc drops it on the grouped path
    # strides (elements)
    stride_am, stride_ak,
    stride_bg, stride_bk, stride_bn,
    stride_cm, stride_cn,
    # meta-parameters
    PAIRS_PER_ROW: tl.constexpr,  # output row r sums pairs r * PAIRS_PER_ROW + j
    A_ROW_DIV: tl.constexpr,  # pair p reads row p // A_ROW_DIV of A (a token's top-k pairs share its row)
    SCALED: tl.constexpr,
    GLU: tl.constexpr,  # "none", or C is activation(a @ B[e][:, :N]) * (a @ B[e][:, N:])
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # fmt: on
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(PAIRS_PER_ROW):
        pair = row * PAIRS_PER_ROW + j
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        routed = (expert >= 0) & (expert < G)
        expert = tl.where(routed, expert, 0)
        a_row = a_ptr + (pair // A_ROW_DIV).to(tl.int64) * stride_am
        b_cols = b_ptr + expert * stride_bg + offs_n[:, None].to(tl.int64) * stride_bn
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < K
            a = tl.load(a_row + offs_k * stride_ak, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            mask = n_ok[:, None] & k_ok[None, :] & routed
            acc += tl.load(b_cols + offs_k[None, :] * stride_bk, mask=mask, other=0.0).to(tl.float32) * a
            if GLU != "none":  # the up half: B's columns N + offs_n
                up += tl.load(b_cols + N * stride_bn + offs_k[None, :] * stride_bk, mask=mask,
                              other=0.0).to(tl.float32) * a  # fmt: skip
        y = tl.sum(acc, axis=1)
        if GLU != "none":
            y = _activate_tl(y, GLU) * tl.sum(up, axis=1)
        if SCALED:
            y = y * tl.load(scale_ptr + pair).to(tl.float32)
        out += y
    tl.store(c_ptr + row * stride_cm + offs_n * stride_cn, out.to(c_ptr.dtype.element_ty), mask=n_ok)


# MoE's last step on the grouped path (moe.py): the down projection's rows are in expert order;
# token t's output is the sum over its top_k pairs of routing weight x that pair's row. One read
# of the rows and one write of the tokens, where torch's ops (weights times rows, a scatter back
# to token order, a sum over the pairs) wrote and read the rows twice more, in fp32, as a scatter
# whose every element computes its own index.
# fmt: off
@triton.jit
def _combine_kernel(
    y_ptr,  # (pairs, H): the pairs' rows in expert order
    inv_ptr,  # (pairs,): row of pair p (= t * TOP_K + j) in y, the inverse of the sort
    w_ptr,  # (pairs,): pair p's routing weight
    out_ptr,  # (tokens, H)
    T, H, stride_ym, stride_om,
    TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # fmt: on
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    t_ok = offs_t < T
    mask = t_ok[:, None] & (offs_h[None, :] < H)
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = offs_t.to(tl.int64) * TOP_K + j
        row = tl.load(inv_ptr + pair, mask=t_ok, other=0).to(tl.int64)
        w = tl.load(w_ptr + pair, mask=t_ok, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + row[:, None] * stride_ym + offs_h[None, :], mask=mask, other=0.0)
        acc += w[:, None] * y.to(tl.float32)
    tl.store(out_ptr + offs_t[:, None].to(tl.int64) * stride_om + offs_h[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


# combine's backward, eager (moe.py `combine_grads`): row i of the rows, pair p = order[i] of token
# t = p // TOP_K, gets grad[t] * w[p], and the weight w[p] gets y[i] . grad[t]. One read of the rows
# and the gathered gradient, one write of each result, where torch's ops took about ten kernels
# over fp32 copies of the rows (0.63 ms a layer of a Qwen3-MoE-shaped training step on the H100).
# Under torch.compile the same arithmetic stays torch ops, which Inductor fuses.
# fmt: off
@triton.jit
def _combine_backward_kernel(
    grad_ptr,  # (tokens, H): the gradient of combine's output
    y_ptr,  # (pairs, H): the pairs' rows in expert order, as combine read them
    order_ptr,  # (pairs,): pair p (= t * TOP_K + j) of row i is order[i]
    w_ptr,  # (pairs,): pair p's routing weight
    dy_ptr,  # (pairs, H): row i's gradient, grad[t] * w[p]
    dw_ptr,  # (pairs,): pair p's weight's gradient, y[i] . grad[t]
    P, H, stride_gm, stride_ym, stride_dm,
    TOP_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # fmt: on
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = offs_r < P
    rows = offs_r.to(tl.int64)
    pair = tl.load(order_ptr + offs_r, mask=r_ok, other=0).to(tl.int64)
    token = pair // TOP_K
    w = tl.load(w_ptr + pair, mask=r_ok, other=0.0).to(tl.float32)
    dot = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for h in range(0, H, BLOCK_H):
        offs_h = h + tl.arange(0, BLOCK_H)
        mask = r_ok[:, None] & (offs_h[None, :] < H)
        g = tl.load(grad_ptr + token[:, None] * stride_gm + offs_h[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + rows[:, None] * stride_ym + offs_h[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(dy_ptr + rows[:, None] * stride_dm + offs_h[None, :], (g * w[:, None]).to(dy_ptr.dtype.element_ty),
                 mask=mask)  # fmt: skip
        dot += tl.sum(y * g, axis=1)
    tl.store(dw_ptr + pair, dot.to(dw_ptr.dtype.element_ty), mask=r_ok)


# The public call's check of `offs` on the GPU, without a synchronization: one launch where the
# same check in torch ops (offs[0] >= 0, offs[-1] <= length, offs[1:] >= offs[:-1], all, two ands
# and torch._assert_async) is seven, about as many microseconds of host time each. Compiled with
# debug=True, which is what compiles device_assert in; nothing is specialized, so one binary
# serves every call.
OFFSETS_BLOCK = 1024


@triton.jit
def offsets_in_order(offs_ptr, i, G, length):
    """Whether each group end i < G lies within [the end before it (0 before the first), length];
    True past G. (The interpreter skips device_assert: tests check this part through it.)"""
    ends = tl.load(offs_ptr + i, mask=i < G, other=0)
    before = tl.load(offs_ptr + i - 1, mask=(i >= 1) & (i < G), other=0)
    return (i >= G) | ((before <= ends) & (ends <= length))


@triton.jit(debug=True, do_not_specialize=["G", "length"], do_not_specialize_on_alignment=["offs_ptr"])
def _check_offsets_kernel(offs_ptr, G, length, BLOCK: tl.constexpr):
    """One program: offsets_in_order everywhere, or a device-side assertion, which fails the next
    synchronization as torch._assert_async does."""
    for start in range(0, G, BLOCK):
        ok = offsets_in_order(offs_ptr, start + tl.arange(0, BLOCK), G, length)
        tl.device_assert(ok, "grouped_mm: expected offs sorted group ends between 0 and the grouped length")
