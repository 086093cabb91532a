"""The fp8 rung on Hopper: rung 4's TMA + WGMMA pipeline (pipeline.mma_over_k) on fp8 operands,
the tensor- or row-wise scales applied to the finished tile (epilogue.kernels.scale_gl), then
linear's epilogue, C stored in bf16 or fp16.

Only the building blocks' dtype changes: one WGMMA instruction takes 32 bytes of K, so 32 fp8
elements where bf16 takes 16 (mma.wgmma_accumulator_layout), at twice the FLOPs per cycle. fp8
WGMMA reads both operands K-major from shared memory, which is what scaled_mm's layouts give:
A row-major (M, K), B the transpose of an (N, K) weight. C has its own dtype, so its staging tile
is sized by C's.

Block-wise scales change every 128 of K (BLOCK_K is 128 then, one scale block a K-step): each
step's product is taken out of the MMA accumulator as soon as it retires, scaled by its block's
scales and added to an fp32 sum in registers (`_promoted_over_k`): DeepSeek-V3's promotion, which
also keeps fp8 WGMMA's ~14-bit accumulation to one block's 128 products. Waiting for every step
serializes the MMA with that add; the loads still run ahead through the ring. That is the plain
version of the idea, kept as the step before fp8_block.py, which hides the wait (0.50-0.57x
torch's block-wise here, 0.87-0.96x there: docs/fp8.md).

`scaled_mm`'s "auto" no longer takes it: fp8_ws.py runs tensor- and row-wise scales on rung 9
(1.03-1.10x torch's where this rung gave 0.94-1.09x on an H200), fp8_block.py block scales;
kernel="fp8_tma" names it, the step between the `tl` rung and those.
tests/test_fp8.py runs it on the H100; tests/test_gluon_compile.py compiles it for sm_90 on the CPU.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Epilogue
from tritongemm.core.tma import view_reason
from tritongemm.primitives.epilogue import apply_gl, scale_gl
from tritongemm.primitives.gluon.descriptors import descriptor, descriptor_launch
from tritongemm.primitives.gluon.mma import WGMMA, wgmma_accumulator_layout
from tritongemm.primitives.gluon.pipeline import (
    barriers_per_slot,
    check_sequential_fits,
    check_wgmma_tile,
    init_barriers,
    invalidate_barriers,
    issue_loads,
    issue_mma,
    mma_over_k,
    require_sm90,
    store_tile,
)
from tritongemm.primitives.launch import compile_launch

NAME = "fp8_tma"
# A first tile, from the bf16 rungs' MID_TILE with the K-step doubled to keep 128 bytes of K per
# load: 4 x (128 + 128) x 128 B = 128 KB of ring, then a 32 KB bf16 C tile over the dead ring.
DEFAULT_CONFIG = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_SIZE_M=8, num_warps=4, num_stages=4)
# Block scales keep two fp32 tiles in registers, the MMA's and the promoted sum: 2 x 128 registers
# a thread on one warpgroup, past the 255 there are (ptxas spilled 432 bytes); two warpgroups
# take 64 rows each.
DEFAULT_BLOCK_CONFIG = DEFAULT_CONFIG.with_(num_warps=8)


def default_config(recipe: str) -> MatmulConfig:
    return DEFAULT_BLOCK_CONFIG if recipe == "block" else DEFAULT_CONFIG


@gluon.jit
def _fp8_tma_kernel(
    # TMA descriptors
    a_desc,  # (M, K) fp8, block [BLOCK_M, BLOCK_K]
    b_desc,  # (N, K) fp8, the weight whose transpose is B, block [BLOCK_N, BLOCK_K]
    c_desc,  # (M, N) bf16 or fp16, block [BLOCK_M, BLOCK_N]
    # the fused epilogue (primitives/epilogue.py), after the scales
    bias_ptr,
    residual_ptr,
    preact_ptr,
    stride_rm,
    stride_rn,
    stride_pm,
    alpha,
    # the dequantization scales (fp32): one element each; scale_a (M,) and scale_b (N,) contiguous; or
    # scale_a (M, K/128) and scale_b (ceil(N/128), K/128) with these strides (block-wise)
    sa_ptr,
    sb_ptr,
    stride_sam,
    stride_sak,
    stride_sbn,
    stride_sbk,
    # meta-parameters
    NUM_BUFFERS: gl.constexpr,
    BARRIERS_PER_SLOT: gl.constexpr,  # 1; 2 under ConSan (pipeline.barriers_per_slot)
    RECIPE: gl.constexpr,  # "tensor", "row" or "block" (fp8/recipes.py)
    ACTIVATION: gl.constexpr,
    HAS_ALPHA: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    M = c_desc.shape[0]
    N = c_desc.shape[1]

    # 1. This program's tile, column-major over a 1D grid (as rung 4).
    pid = gl.program_id(axis=0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    off_m = (pid % num_pid_m) * BLOCK_M
    off_n = (pid // num_pid_m) * BLOCK_N

    # 2. The ring, and the K loop of rung 4: A row-major, B K-major.
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS * BARRIERS_PER_SLOT, 1], mbarrier.MBarrierLayout())
    init_barriers(ready)
    mma = WGMMA.initialize(dtype, BLOCK_M, BLOCK_N, num_warps)
    if RECIPE == "block":
        acc = _promoted_over_k(mma, a_desc, b_desc, off_m, off_n, M, N, ready, a_bufs, b_bufs, sa_ptr, sb_ptr,
                               stride_sam, stride_sak, stride_sbn, stride_sbk, num_warps)  # fmt: skip
    else:
        mma = mma_over_k(mma, a_desc, b_desc, off_m, off_n, 0, a_desc.shape[1], ready, a_bufs, b_bufs, False, True)
        acc, mma = mma.take_result()
        acc = scale_gl(acc, off_m, off_n, M, N, sa_ptr, sb_ptr, RECIPE == "row")
    invalidate_barriers(ready)

    # 3. The fused epilogue on the dequantized tile, then the store in C's dtype.
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    acc = apply_gl(
        acc, off_m, off_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
        ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
    )  # fmt: skip
    store_tile(acc, c_desc, c_smem, off_m, off_n)
    tma.store_wait(pendings=0)


@gluon.jit
def _promoted_over_k(
    mma, a_desc, b_desc, off_m, off_n, M, N, ready, a_bufs, b_bufs, sa_ptr, sb_ptr, stride_sam, stride_sak,
    stride_sbn, stride_sbk, num_warps: gl.constexpr,
):  # fmt: skip
    """The tile's fp32 sum over K of each K-step's product times its block's scales,
    scale_a[m, kb] * scale_b[n // 128, kb]: mma_over_k's ring, each step retired and taken out of
    the accumulator before the next is issued."""
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    K = a_desc.shape[1]
    layout: gl.constexpr = wgmma_accumulator_layout(a_desc.dtype, BLOCK_M, BLOCK_N, num_warps)
    offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    sa_ptrs = sa_ptr + offs_m * stride_sam
    sb_ptrs = sb_ptr + (offs_n // BLOCK_K) * stride_sbn  # the weight's 128 x 128 blocks: BLOCK_K is 128
    total = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    producer = 0
    consumer = 0
    for i in gl.static_range(NUM_BUFFERS - 2):  # the loads run NUM_BUFFERS - 2 steps ahead
        producer = issue_loads(producer, a_desc, b_desc, off_m, off_n, i * BLOCK_K, ready, a_bufs, b_bufs, False,
                               True, i * BLOCK_K < K)  # fmt: skip
    for k in range(0, K, BLOCK_K):
        ahead = k + (NUM_BUFFERS - 2) * BLOCK_K
        producer = issue_loads(producer, a_desc, b_desc, off_m, off_n, ahead, ready, a_bufs, b_bufs, False, True,
                               ahead < K)  # fmt: skip
        consumer, mma = issue_mma(consumer, mma, ready, a_bufs, b_bufs, False, True)
        mma = mma.wait_num_outstanding(0)
        partial, mma = mma.take_result()  # the next step overwrites the accumulator
        kb = k // BLOCK_K
        sa = gl.load(sa_ptrs + kb * stride_sak, mask=offs_m < M, other=0.0)
        sb = gl.load(sb_ptrs + kb * stride_sbk, mask=offs_n < N, other=0.0)
        total = total + partial * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)
    return total


def unsupported_reason(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, recipe: str) -> str | None:
    """Why this rung can't take a scaled_mm call as it is (None: it can). scaled_mm has checked
    the operands' dtypes, layouts and scales already."""
    if a.dtype != b.dtype:
        return f"a and b of one fp8 dtype, but got {a.dtype} and {b.dtype}"
    if c.dtype not in (torch.bfloat16, torch.float16):
        return f"C in bfloat16 or float16, but out_dtype is {c.dtype}"
    for name, view in (("a", a), ("b.T", b.T), ("c", c)):
        reason = view_reason(name, view)
        if reason is not None:
            return reason
    if c.shape[1] * c.element_size() % 16:
        return f"C's rows of N = {c.shape[1]} elements end inside a 16-byte chunk, which TMA stores overwrite"
    return None


def check_scaled_call(name: str, a, b, c, recipe: str, epilogue_scales_only: bool = False) -> None:
    """The checks every fp8 Gluon rung makes first, as ValueErrors (RuntimeError off sm_90) naming
    `name`: an sm_90 GPU, the recipe (`epilogue_scales_only`: the rungs that scale finished tiles
    take no block scales) and what `unsupported_reason` refuses."""
    require_sm90(name, c.device)
    if epilogue_scales_only and recipe not in ("tensor", "row"):
        raise ValueError(f"{name}: takes tensor- or row-wise scales (block scales are fp8_block's), not {recipe}-wise")
    reason = unsupported_reason(a, b, c, recipe)
    if reason is not None:
        raise ValueError(f"{name}: {reason}")


def plan(a, b, c, scale_a, scale_b, recipe: str, config: MatmulConfig, spec: Epilogue, bias=None, residual=None):
    """`launch(a, b, c, scale_a, scale_b, bias, residual)` for tensors of this geometry, checked and
    compiled once. Raises ValueError where `unsupported_reason` says why."""
    check_scaled_call(NAME, a, b, c, recipe)
    check_wgmma_tile(NAME, config)
    check_sequential_fits(NAME, config, a.element_size(), c_elem_bytes=c.element_size())  # C over the dead ring
    desc = (descriptor(a, (config.BLOCK_M, config.BLOCK_K)), descriptor(b.T, (config.BLOCK_N, config.BLOCK_K)),
            descriptor(c, (config.BLOCK_M, config.BLOCK_N)))  # fmt: skip
    if recipe == "block" and config.BLOCK_K != 128:
        raise ValueError(
            f"{NAME}: block-wise scales take one K block a step: BLOCK_K must be 128, not {config.BLOCK_K}"
        )
    scale_strides = (*scale_a.stride(), *scale_b.stride()) if recipe == "block" else (0, 0, 0, 0)
    constexprs = dict(NUM_BUFFERS=config.num_stages, BARRIERS_PER_SLOT=barriers_per_slot(), RECIPE=recipe,
                      num_warps=config.num_warps, **spec.constexprs())  # fmt: skip
    grid = (config.num_tiles(*c.shape),)
    return planned_scaled_launch(_fp8_tma_kernel, grid, desc, constexprs, spec, scale_a, scale_b, scale_strides,
                                 bias, residual)  # fmt: skip


def planned_scaled_launch(kernel, grid, desc, constexprs, spec, scale_a, scale_b, scale_strides, bias, residual,
                          tails: tuple = ()):  # fmt: skip
    """`run(a, b, c, scale_a, scale_b, bias, residual)` for an fp8 Gluon kernel that takes (a_desc,
    b_desc, c_desc, *tails, *the epilogue's arguments, scale_a, scale_b, *their strides), compiled
    once: each call moves the plan's descriptors onto its tensors (primitives/launch.py), nothing else.
    `desc`: a's, b's and c's descriptors; `tails`: () or a second pair on b and c (odd_width's
    tile tails)."""
    fixed = (*spec.fixed_args(residual), scale_a, scale_b, *scale_strides)
    runtime = (*desc, *tails, *spec.pointers(bias, residual), *fixed)
    compiled = compile_launch(kernel, grid, runtime, constexprs, scale_a.device)
    launch = descriptor_launch(compiled, (*desc, *tails), tails=bool(tails))
    residual_args = spec.fixed_args(residual)

    def run(a, b, c, scale_a, scale_b, bias=None, residual=None):
        launch(a, b, c, *spec.pointers(bias, residual), *residual_args, scale_a, scale_b, *scale_strides)

    return run
