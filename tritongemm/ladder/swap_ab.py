"""Rung 8, swap-AB: for skinny problems (a few tokens against a weight), the weight's rows fill the
tile's long side, and a long K is split until every SM has a program.

A decode step's GEMM is x (M, K) @ W.T with M of 1 to 128 tokens and W an (N, K) weight of
millions of elements. Every rung below puts M on the tile's rows: the tensor cores' instruction
(WGMMA) is 64 rows tall, so at M = 1 a 64-row tile is 63 rows of padding, and N / 128 tiles
(32 for N = 4096) leave three quarters of the 132 SMs idle while each walks all of K. This
rung computes the transposed product C.T = W @ x.T instead: W's rows on the instruction's tall
side, the tokens on its narrow side (BLOCK_M, as small as 16), so no row of the tile is padding
and an N = 4096 weight makes 4096 / BLOCK_N tiles. When that is still fewer programs than SMs and
K is long, each tile's K is split among S programs (primitives/tl/split.py; MatmulConfig.split_k): their
fp32 partials are added in a fixed order, so results are the same bits run to run. The problem
is memory-bound (W is read once, x is tiny): what counts is how many SMs stream W at once, which
is what both ideas buy. Measured on the H100: docs/skinny.md.

The kernel is written in `triton.language`: at these sizes the loads are the work, and Triton's
software pipeline streams them; it runs in the interpreter, so the CPU tests cover it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import PLAIN
from tritongemm.primitives.epilogue import apply_tl
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tl import host as _host
from tritongemm.primitives.tl.split import piece_alignment, reduce_plan, split_plan
from tritongemm.primitives.tl.tiles import dot_tile, store_tile, tile_offsets


# fmt: off
@triton.jit
def _swap_ab_kernel(
    a_ptr, b_ptr, c_ptr,  # A (M, K) activations, B (K, N) the weight's transpose, C (M, N)
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    workspace_ptr,  # SPLIT: (S, M, N) fp32, the partial tile of split s at [s, rows, columns]
    k_per_split,  # SPLIT: K of one split, a multiple of BLOCK_K (_split.split_plan)
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # _host.alignment_hints of (a, b, c)
    ALIGN_T: tl.constexpr,  # the same for the transposed product (b.T, a.T), K's for a split's K
    SPLIT: tl.constexpr,  # S > 1: write the fp32 partial, _split's reduction does the epilogue
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):
    # fmt: on
    # 1. My tile and my split. Consecutive programs take the token blocks of one slice of W's rows
    #    (C's column tile), so each slice of W is fetched from memory once and read from L2 by
    #    the other token blocks while it is still there; the token blocks are small and stay in
    #    L2 throughout. The other order (all of W for token block 0, then all of it again for
    #    block 1) read a W larger than the L2 twice: 0.52-0.57x cuBLAS at M = 128 on the H100.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_tiles = num_pid_m * tl.cdiv(N, BLOCK_N)
    tile = pid % num_tiles
    split = pid // num_tiles
    offs_m, offs_n = tile_offsets(tile % num_pid_m, tile // num_pid_m, BLOCK_M, BLOCK_N, INT64)
    k_begin = split * k_per_split  # 0 without SPLIT: one program per tile, k_per_split = K
    k_size = tl.minimum(K - k_begin, k_per_split)
    if INT64:
        k_begin = tl.cast(k_begin, tl.int64)

    # 2. C.T's tile = W[offs_n, my K] @ x[offs_m, my K].T: W's rows are the dot's M (the
    #    instruction's tall side), the tokens its N. The same K loop as every rung, transposed.
    acc_t = dot_tile(
        b_ptr + k_begin * stride_bk, a_ptr + k_begin * stride_ak, offs_n, offs_m, N, M, k_size,
        stride_bn, stride_bk, stride_ak, stride_am,
        BLOCK_N, BLOCK_M, BLOCK_K, MASK_MN=True, INPUT_PRECISION=INPUT_PRECISION, ALIGN=ALIGN_T,
    )  # fmt: skip
    acc = tl.trans(acc_t)  # back to C's orientation: (BLOCK_M, BLOCK_N)

    # 3. One split: the fused epilogue and the store. Several: the fp32 partial to the workspace.
    if SPLIT:
        plane = tl.cast(split, tl.int64) * M * N
        partial = workspace_ptr + plane + tl.cast(offs_m[:, None], tl.int64) * N + offs_n[None, :]
        tl.store(partial, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
    else:
        acc = apply_tl(
            acc, offs_m, offs_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
            ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
        )  # fmt: skip
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)


def transposed_alignment(align: tuple[int, ...], K: int) -> tuple[int, ...]:
    """ALIGN_T from ALIGN (M, N, K, am, ak, bk, bn, cm, cn): the hints of the product (b.T, a.T),
    i.e. (N, M, K, bn, bk, ak, am, cn, cm), with K's for a split's K (_split.piece_alignment)."""
    M, N, K_align, am, ak, bk, bn, cm, cn = piece_alignment(align, K)
    return (N, M, K_align, bn, bk, ak, am, cn, cm)


def plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, *, num_sms=None, **epilogue):
    """`launch(a, b, c)` for tensors of this geometry: one kernel over (tiles x S) programs, and
    for S > 1 the fixed-order reduction with the epilogue (_split.py). `num_sms`: the SM count to
    fill (tests)."""
    M, K = a.shape
    N = b.shape[1]
    S, k_per_split = split_plan(M, N, K, config, num_sms or _host.sm_count(c.device))
    constexprs = _host.common_constexprs(a, b, c)
    constexprs |= dict(
        BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, num_warps=config.num_warps,
        num_stages=config.num_stages, ALIGN_T=transposed_alignment(constexprs["ALIGN"], K), SPLIT=S > 1,
    )  # fmt: skip
    grid = (config.num_tiles(M, N) * S,)
    if S == 1:  # one program per tile, the epilogue in the kernel, K whole
        return _host.planned_launch(_swap_ab_kernel, grid, a, b, c, constexprs, middle=(0, K), **epilogue)

    # S programs per tile write fp32 partials; the reduction applies the epilogue.
    workspace = torch.empty((S, M, N), device=c.device, dtype=torch.float32)
    plain = PLAIN.fixed_args(None, None)
    args = _host.gemm_args(a, b, c)
    sizes_and_strides = args[3:]
    runtime = (*args, workspace, k_per_split, 0, 0, 0, *plain)
    partial = compile_launch(_swap_ab_kernel, grid, runtime, constexprs | PLAIN.constexprs(), c.device)
    reduce = reduce_plan(S, c, **epilogue)
    del workspace  # each call takes its own: calls on several streams must not share one

    def launch(a, b, c, bias=None, residual=None, preact=None):
        workspace = torch.empty((S, M, N), device=c.device, dtype=torch.float32)
        partial(a, b, c, *sizes_and_strides, workspace, k_per_split, 0, 0, 0, *plain)
        reduce(workspace, c, bias, residual, preact)

    return launch


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig) -> None:
    plan(a, b, c, config)(a, b, c)


# The tiles, from an H100 probe of M = 1, 16, 64 and 128 on Llama-3-8B and -70B weights (bf16,
# kernel-only, same run as cuBLAS): the tokens' side the narrowest tile Triton's dot takes that
# covers M (16 up to 64), the weight's 64 rows, and at M <= 16 a BLOCK_K of 256 (1.02-1.10x
# cuBLAS at M = 1 and 16, where the rules' grouped kernel ran 0.64-0.94x). K is split only where
# it is long against few tiles (the probe's split variant won at N = 4096, K = 14336 alone);
# `tritongemm tune` measures the split counts per bucket.
def default_config(dtype: torch.dtype, M: int, N: int, K: int, device: torch.device) -> MatmulConfig:
    if device.type == "cpu":  # the interpreter: small tiles, the masks exercised, K split for 4 "SMs"
        return MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=1)
    tokens = min(64, max(16, triton.next_power_of_2(M)))
    wide_k = tokens == 16 and dtype != torch.float32  # 16 x 256 of x and 64 x 256 of W per stage
    return MatmulConfig(
        BLOCK_M=tokens, BLOCK_N=64, BLOCK_K=256 if wide_k else (64 if dtype == torch.float32 else 128),
        GROUP_SIZE_M=1, num_warps=4, num_stages=3 if wide_k else 4, split_k=0 if K >= 2 * N else 1,
    )  # fmt: skip


def tuning_configs(dtype: torch.dtype, M: int, N: int, K: int) -> tuple[MatmulConfig, ...]:
    """What `tritongemm tune` tries besides the default: the weight's side 32 to 128 rows, BLOCK_K
    128 or 256, no split, a split that fills the SMs, and (M > 16) narrower token tiles."""
    tokens = min(64, max(16, triton.next_power_of_2(M)))
    block_k = 64 if dtype == torch.float32 else 128
    base = MatmulConfig(BLOCK_M=tokens, BLOCK_N=64, BLOCK_K=block_k, GROUP_SIZE_M=1, num_warps=4, num_stages=4)
    configs = [base.with_(split_k=1), base.with_(split_k=0), base.with_(BLOCK_N=128, split_k=1)]
    if dtype != torch.float32:
        configs += [base.with_(BLOCK_K=256, num_stages=3, split_k=s) for s in (1, 0)]
        configs += [base.with_(BLOCK_N=32, BLOCK_K=256, num_stages=3, split_k=1)]
    if tokens > 16:
        configs += [base.with_(BLOCK_M=tokens // 2, split_k=1)]
    return tuple(configs)
