"""Rung 7, split-K: more programs than output tiles, for GEMMs with few tiles and a long K.

A decode step's GEMM (M of 1 to 128 tokens against a 4096 x 4096 weight) has one row of output
tiles: 32 tiles of 64 x 128 for 132 SMs, so three quarters of the GPU idles while each program
walks all of K. Split-K gives every tile S programs, each reducing its own contiguous 1/S of K
(the TMA + WGMMA ring of rung 4, over a K range) into an fp32 partial tile in a workspace; a
second kernel adds the S partials of each tile in a fixed order, applies the fused epilogue and
stores C. The order is fixed, so the result is the same bits on every run, which atomic adds in
arrival order would not give; the price is the workspace's round trip, S x M x N fp32.

Tested on the H100 (tests/test_split_k.py, the fuzzer, the matmul and linear suites), not yet
timed: kernel="auto" does not take it until `tritongemm tune` has (its table then picks it where
it wins).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.primitives.gluon.descriptors import bind, make_descriptors
from tritongemm.primitives.gluon.mma import WGMMA
from tritongemm.primitives.gluon.pipeline import (
    barriers_per_slot,
    check_sequential_fits,
    check_wgmma_tile,
    init_barriers,
    invalidate_barriers,
    mma_over_k,
    require_sm90,
)
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tl.split import MIN_STEPS_PER_SPLIT, reduce_plan, split_plan


@gluon.jit
def _split_k_partial_kernel(
    a_desc,  # (M, K) block [BLOCK_M, BLOCK_K]; (K, M) block [BLOCK_K, BLOCK_M] if A_M_MAJOR
    b_desc,  # (K, N) block [BLOCK_K, BLOCK_N]; (N, K) block [BLOCK_N, BLOCK_K] if B_K_MAJOR
    workspace_ptr,  # (S, M, N) fp32: partial tile of split s at [s, tile rows, tile columns]
    M,
    N,
    k_per_split,  # a multiple of BLOCK_K, and at least NUM_BUFFERS - 2 steps (split_plan)
    NUM_BUFFERS: gl.constexpr,
    BARRIERS_PER_SLOT: gl.constexpr,
    A_M_MAJOR: gl.constexpr,
    B_K_MAJOR: gl.constexpr,
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1] if A_M_MAJOR else a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_K_MAJOR else b_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    K = a_desc.shape[0] if A_M_MAJOR else a_desc.shape[1]
    gl.static_assert(NUM_BUFFERS >= 2, "one slot is read by the MMA in flight while the next one loads")

    # 1. My tile and my split: programs 0..T-1 take split 0 of every tile, T..2T-1 split 1, ...
    pid = gl.program_id(axis=0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_tiles = num_pid_m * gl.cdiv(N, BLOCK_N)
    tile = pid % num_tiles
    split = pid // num_tiles
    off_m = (tile % num_pid_m) * BLOCK_M
    off_n = (tile // num_pid_m) * BLOCK_N
    k_begin = split * k_per_split
    k_end = gl.minimum(K, k_begin + k_per_split)

    # 2. Rung 4's ring over [k_begin, k_end). The prologue's loads stay inside the split (it has
    #    at least NUM_BUFFERS - 2 steps) except in the last split, where they pass K and TMA fills
    #    them with zeros, as in rung 4.
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS * BARRIERS_PER_SLOT, 1], mbarrier.MBarrierLayout())
    init_barriers(ready)
    mma = WGMMA.initialize(dtype, BLOCK_M, BLOCK_N, num_warps)
    mma = mma_over_k(mma, a_desc, b_desc, off_m, off_n, k_begin, k_end, ready, a_bufs, b_bufs, A_M_MAJOR, B_K_MAJOR)
    invalidate_barriers(ready)

    # 3. The fp32 partial tile, straight from the accumulator's registers to the workspace.
    acc, mma = mma.take_result()
    layout: gl.constexpr = acc.type.layout
    offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    rows = gl.expand_dims(offs_m.to(gl.int64), 1)
    cols = gl.expand_dims(offs_n, 0)
    plane = split.to(gl.int64) * M * N
    gl.store(workspace_ptr + plane + rows * N + cols, acc, mask=(rows < M) & (cols < N))


def ring_split_plan(M: int, N: int, K: int, config: MatmulConfig, num_sms: int) -> tuple[int, int]:
    """(S, k_per_split) as primitives/tl/split.split_plan gives, each split at least num_stages - 2 K-steps: the
    ring's prologue loads that many ahead and must stay inside its split (the kernel's step 2)."""
    return split_plan(M, N, K, config, num_sms, max(MIN_STEPS_PER_SPLIT, config.num_stages - 2))


def plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, *, num_sms=None, **epilogue):
    """`launch(a, b, c)` for tensors of this geometry: the partial kernel over (tiles x S)
    programs, then the reduction (module docstring). `num_sms`: the SM count to fill (tests)."""
    require_sm90("split_k", c.device)
    check_wgmma_tile("split_k", config)
    check_sequential_fits("split_k", config, a.element_size())
    M, K = a.shape
    N = b.shape[1]
    S, k_per_split = ring_split_plan(M, N, K, config, num_sms or device_info.sm_count(c.device))
    desc = make_descriptors(a, b, c, config.BLOCK_M, config.BLOCK_N, config.BLOCK_K)
    workspace = torch.empty((S, M, N), device=c.device, dtype=torch.float32)
    partial_meta = dict(
        NUM_BUFFERS=config.num_stages, BARRIERS_PER_SLOT=barriers_per_slot(), **desc.layout_constexprs(),
        num_warps=config.num_warps,
    )  # fmt: skip
    partial = compile_launch(
        _split_k_partial_kernel, (config.num_tiles(M, N) * S,), (desc.a, desc.b, workspace, M, N, k_per_split),
        partial_meta, c.device,
    ).with_descriptors((desc.a, desc.b), bind)  # fmt: skip

    reduce = reduce_plan(S, c, **epilogue)
    del workspace  # each call takes its own: calls on several streams must not share one

    def launch(a, b, c, bias=None, residual=None, preact=None):
        workspace = torch.empty((S, M, N), device=c.device, dtype=torch.float32)
        partial(a, b, workspace, M, N, k_per_split)
        reduce(workspace, c, bias, residual, preact)

    return launch


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig) -> None:
    plan(a, b, c, config)(a, b, c)
