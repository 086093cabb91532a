"""How the MoE layer's kernels around the grouped GEMMs are planned, on their first call: the
weighted un-permute (moe.py `combine`) and its backward, and the decode step's experts in two
launches (moe_decode.py). The plans go into the plan cache; nothing here runs on a hit."""

from __future__ import annotations

import torch
import triton

from tritongemm.grouped.tl import _combine_backward_kernel, _combine_kernel, _expert_rows_kernel
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tl.host import sm_count

# A program's tile: BLOCK_N columns x BLOCK_K of K, TILE_ELEMENTS in all, so each thread has a
# few 16-byte loads in flight whatever the split; BLOCK_N as wide as still gives every SM WAVES
# programs (a down projection of one token has few columns and a long K).
# 8192 elements, 4 waves, 4 warps: the best of 8 settings on 5 of the 6 probed rows.
TILE = dict(TILE_ELEMENTS=8192, WAVES=4, num_warps=4)

# combine's tile: a few tokens x 512 columns of their rows (4 warps, 16 bytes a load of bf16).
_COMBINE_TOKENS, _COMBINE_COLUMNS = 4, 512


def combine_call(rows, order, top_k_weights):
    """`call(rows, order, top_k_weights)` for checked tensors like these (moe.py `combine`), compiled once."""
    (pairs, hidden), (tokens, top_k) = rows.shape, top_k_weights.shape
    if tokens * top_k * hidden == 0:  # nothing to launch over: a sum of no rows, or no columns
        return lambda rows, order, top_k_weights: rows.new_zeros((tokens, hidden))
    copy = rows.stride(1) != 1  # the kernel reads a row's columns as one contiguous run
    rows = rows.contiguous() if copy else rows
    block_h = min(_COMBINE_COLUMNS, triton.next_power_of_2(hidden))
    grid = (triton.cdiv(tokens, _COMBINE_TOKENS), triton.cdiv(hidden, block_h))
    out = rows.new_empty((tokens, hidden))  # this call's, to plan on
    args = (rows, order, top_k_weights.reshape(-1), out, tokens, hidden, rows.stride(0), out.stride(0))
    meta = dict(TOP_K=top_k, BLOCK_T=_COMBINE_TOKENS, BLOCK_H=block_h, num_warps=4)
    launch = compile_launch(_combine_kernel, grid, args, meta, rows.device)
    positions = dict(device=order.device, dtype=order.dtype)

    def call(rows, order, top_k_weights):
        rows = rows.contiguous() if copy else rows
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(pairs, **positions))
        out = rows.new_empty((tokens, hidden))
        launch(rows, inverse, top_k_weights.reshape(-1), out, tokens, hidden, rows.stride(0), out.stride(0))
        return out

    return call


def combine_backward_call(grad, rows, order, top_k_weights):
    """`call(grad, rows, order, top_k_weights) -> (d rows, d weights)` for tensors like these, both
    computed (a training step needs both), compiled once."""
    (pairs, hidden), top_k = rows.shape, top_k_weights.shape[1]
    if pairs * hidden == 0:  # no rows, or rows of no columns: their weights' gradients are zeros
        return lambda grad, rows, order, top_k_weights: (torch.zeros_like(rows), torch.zeros_like(top_k_weights))
    # The kernel reads a row's columns as one contiguous run, and the sort order as one.
    copy_grad, copy_rows, copy_order = grad.stride(1) != 1, rows.stride(1) != 1, order.stride(0) != 1

    def arguments(grad, rows, order, top_k_weights):
        """The launch's arguments for a call's tensors, its outputs new and contiguous."""
        grad = grad.contiguous() if copy_grad else grad
        rows = rows.contiguous() if copy_rows else rows
        order = order.contiguous() if copy_order else order
        d_rows = torch.empty((pairs, hidden), dtype=rows.dtype, device=rows.device)
        d_weights = torch.empty((pairs // top_k, top_k), dtype=top_k_weights.dtype, device=rows.device)
        return (grad, rows, order, top_k_weights.reshape(-1), d_rows, d_weights, pairs, hidden, grad.stride(0),
                rows.stride(0), hidden)  # fmt: skip

    block_h = min(_COMBINE_COLUMNS, triton.next_power_of_2(hidden))
    grid = (triton.cdiv(pairs, _COMBINE_TOKENS),)
    meta = dict(TOP_K=top_k, BLOCK_R=_COMBINE_TOKENS, BLOCK_H=block_h, num_warps=4)
    launch = compile_launch(_combine_backward_kernel, grid, arguments(grad, rows, order, top_k_weights), meta,
                            rows.device)  # fmt: skip

    def call(grad, rows, order, top_k_weights):
        args = arguments(grad, rows, order, top_k_weights)
        launch(*args)
        return args[4], args[5]

    return call


def decode_call(x, gate_up, down, top_k_index, top_k_weights, glu: str):
    """`call(x, gate_up, down, ids, weights, out=None) -> out` for checked arguments like these
    (moe_decode.py `planned_decode`): the two launches compiled, their grids fixed."""
    (tokens, hidden), top_k = x.shape, top_k_index.shape[1]
    width = gate_up.shape[2] // 2
    ids, weights = top_k_index.reshape(-1), top_k_weights.reshape(-1)
    pairs = tokens * top_k
    h = x.new_empty((pairs, width))  # this call's, to plan on
    out = x.new_empty((tokens, hidden))
    up_n, down_n = _block_n(pairs, width, x.device), _block_n(tokens, hidden, x.device)
    common = dict(num_warps=TILE["num_warps"])
    experts = gate_up.shape[0]
    up_sizes = (width, hidden, experts, *x.stride(), *gate_up.stride(), *h.stride())
    down_sizes = (hidden, width, experts, *h.stride(), *down.stride(), *out.stride())
    launch_up = compile_launch(_expert_rows_kernel, (pairs, -(-width // up_n)),
                               (x, gate_up, h, ids, weights, *up_sizes),
                               dict(common, PAIRS_PER_ROW=1, A_ROW_DIV=top_k, SCALED=False, GLU=glu, BLOCK_N=up_n,
                                    BLOCK_K=_block_k(up_n, hidden)),
                               x.device)  # fmt: skip
    launch_down = compile_launch(_expert_rows_kernel, (tokens, -(-hidden // down_n)),
                                 (h, down, out, ids, weights, *down_sizes),
                                 dict(common, PAIRS_PER_ROW=top_k, A_ROW_DIV=1, SCALED=True, GLU="none",
                                      BLOCK_N=down_n, BLOCK_K=_block_k(down_n, width)), x.device)  # fmt: skip

    def call(x, gate_up, down, ids, weights, out=None):
        h = x.new_empty((pairs, width))
        out = x.new_empty((tokens, hidden)) if out is None else out
        launch_up(x, gate_up, h, ids, weights, *up_sizes)
        launch_down(h, down, out, ids, weights, *down_sizes)
        return out

    return call


def _block_n(rows: int, n: int, device: torch.device) -> int:
    """The widest of 32, 16 and 8 columns a program that still gives every SM TILE["WAVES"]
    programs: the weights stream at the GPU's bandwidth only when every SM has loads in flight."""
    if device.type != "cuda":
        return 16
    for block_n in (32, 16):
        if rows * -(-n // block_n) >= TILE["WAVES"] * sm_count(device):
            return block_n
    return 8


def _block_k(block_n: int, k: int) -> int:
    """TILE_ELEMENTS / BLOCK_N of K, but no more than K's next power of two (and at least 16)."""
    return max(16, min(TILE["TILE_ELEMENTS"] // block_n, 1 << (k - 1).bit_length()))
