"""Split-K, the part the split kernels share: how K is cut into splits, and the fixed-order
reduction of their fp32 partial tiles with the fused epilogue (split_k, swap_ab).

A split kernel gives every output tile S programs, each reducing its own contiguous range of K
into an fp32 partial tile of an (S, M, N) workspace; `_reduce_kernel` then adds the S partials of
each element in the order 0, 1, ..., S-1, applies the epilogue and stores C. The order is fixed,
so a result is the same bits on every run (atomic adds in arrival order would not be); the price
is the workspace's round trip and a second launch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import PLAIN, Epilogue
from tritongemm.primitives.epilogue import apply_tl
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tl.tiles import store_tile, tile_offsets

# A split gets at least this many K-steps: fewer, and the loop's prologue and drain dominate it.
MIN_STEPS_PER_SPLIT = 4
# The reduction's tile: it streams S fp32 planes and writes one, so any shape that reads whole
# 128-byte rows does; 64 x 64 keeps the grid large for the few-tile problems splits are for.
REDUCE_BLOCK = 64


def split_plan(M: int, N: int, K: int, config: MatmulConfig, num_sms: int, min_steps: int = MIN_STEPS_PER_SPLIT):
    """(S, k_per_split): config.split_k splits, or (0) enough to give every SM a program when the
    tiles alone can't; each split a multiple of BLOCK_K and at least `min_steps` K-steps (a
    pipeline's prologue must stay inside its split), none empty. Pure: CPU-testable."""
    steps = triton.cdiv(K, config.BLOCK_K)
    wanted = config.split_k or max(1, num_sms // config.num_tiles(M, N))
    splits = max(1, min(wanted, steps // min_steps))
    steps_per_split = triton.cdiv(steps, splits)
    return triton.cdiv(steps, steps_per_split), steps_per_split * config.BLOCK_K


def piece_alignment(align: tuple[int, ...], K: int) -> tuple[int, ...]:
    """A kernel's ALIGN hints (_host.alignment_hints) for a loop over a piece of K: K's entry is
    the power of two up to 8 dividing K, which divides every piece (a multiple of BLOCK_K, or what
    is left of K) too; Triton sees no piece's K at the launch, as it sees K's own divisibility."""
    return (*align[:2], math.gcd(K, 8), *align[3:])


@triton.jit
def _reduce_kernel(
    workspace_ptr, c_ptr, M, N, stride_cm, stride_cn, S,
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):  # fmt: skip
    """C tile = epilogue(partial_0 + partial_1 + ... + partial_{S-1}), added in that order."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    offs_m, offs_n = tile_offsets(pid % num_pid_m, pid // num_pid_m, BLOCK_M, BLOCK_N, True)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    partials = workspace_ptr + offs_m[:, None] * N + offs_n[None, :]
    plane = tl.cast(M, tl.int64) * N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(S):
        acc += tl.load(partials + s * plane, mask=mask, other=0.0)
    acc = apply_tl(
        acc, offs_m, offs_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
        ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
    )  # fmt: skip
    store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)


def reduce_plan(S: int, c: torch.Tensor, epilogue: Epilogue = PLAIN, bias=None, residual=None, preact=None):
    """`reduce(workspace, c, bias=None, residual=None, preact=None)`: the reduction of an (S, M,
    N) fp32 workspace into c, with the fused epilogue (a plan's keywords), compiled once for this
    geometry."""
    M, N = c.shape
    fixed = epilogue.fixed_args(residual, preact)
    grid = (triton.cdiv(M, REDUCE_BLOCK) * triton.cdiv(N, REDUCE_BLOCK),)
    meta = dict(BLOCK_M=REDUCE_BLOCK, BLOCK_N=REDUCE_BLOCK, ALIGN=(1,) * 9, **epilogue.constexprs())
    workspace = torch.empty((S, M, N), device=c.device, dtype=torch.float32)
    compiled = compile_launch(
        _reduce_kernel, grid, (workspace, c, M, N, *c.stride(), S, *epilogue.pointers(bias, residual, preact), *fixed),
        meta, c.device,
    )  # fmt: skip
    c_strides = c.stride()

    def reduce(workspace, c, bias=None, residual=None, preact=None):
        compiled(workspace, c, M, N, *c_strides, S, *epilogue.pointers(bias, residual, preact), *fixed)

    return reduce
