"""How fp8's plans are built, on a problem's first call: quantize_fp8's launches, and scaled_mm's
kernel chosen (dispatch/fp8.py), its tile, its launch compiled. What they return is kept in the
plan cache (fp8/api.py); nothing here runs on a hit."""

from __future__ import annotations

import functools
import math

import torch

import tritongemm.fp8.block as fp8_block
import tritongemm.fp8.odd_width as fp8_odd_width
import tritongemm.fp8.tma as fp8_tma
import tritongemm.fp8.ws as fp8_ws
from tritongemm.core import device_info, registry
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Epilogue, activate_torch
from tritongemm.core.registry import BATCH_INVARIANT
from tritongemm.dispatch import fp8 as choice
from tritongemm.fp8.recipes import (
    SCALE_BLOCK,
    TINY,
    check_quantize,
    check_scaled_mm,
    fp8_cast_meta,
    fp8_max,
    given_recipe,
    scale_shape,
)
from tritongemm.fp8.tl import _absmax_kernel, _quantize_kernel, _scaled_mm_kernel
from tritongemm.ladder.swap_ab import transposed_alignment
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tiling import cdiv
from tritongemm.primitives.tl.host import alignment_hints, needs_int64

# - "fp8_grouped": the `triton.language` rung (fp8/tl.py), every input;
# - "fp8_swap_ab": the same kernel computing C.T's tiles, the tokens on the MMA's narrow side
#   (decode sizes; every recipe);
# - "fp8_tma": the Gluon rung (fp8/tma.py), Hopper and TMA-aligned operands;
# - its warp-specialized persistent successors: "fp8_ws" (fp8/ws.py) for tensor- and
#   row-wise scales, "fp8_block" (fp8/block.py) for block scales;
# - "fp8_odd_width" (fp8/odd_width.py): tensor- and row-wise scales on 96- to 192-column
#   tiles, for decode-sized M whose tiles would leave SMs idle.
# "auto" chooses among them (_auto).
KERNELS = ("auto", *(k.name for k in registry.all_kernels("scaled_mm")))
GLUON_KERNELS = tuple(k.name for k in registry.all_kernels("scaled_mm") if not k.interpretable)

# Quantization tiles: 32 rows x 128 columns a step (a weight block's 128 rows at once).
_QUANT_ROWS, _QUANT_COLS = 32, 128
# The tensor recipe's programs each take this many columns of their rows.
_TENSOR_GROUP_COLS = 1024
# Quantization programs a GPU's SM should get at least (rows a program halve until they do):
# each program reads its rows twice, the absmax pass and the cast, one load in flight at a time.
_PROGRAMS_PER_SM = 2


def quantize_call(x, recipe, block=None, dtype=torch.float8_e4m3fn):
    """`call(x) -> (x_fp8, scale)` for tensors like x (every fact of `tensor_facts`), checked and
    compiled once."""
    group = check_quantize(x, recipe, block, dtype)

    *lead, K = x.shape
    R = math.prod(lead)
    shape, s_shape = tuple(x.shape), scale_shape(tuple(x.shape), recipe, group)
    if R * K == 0:  # no element: every group's absmax is the floor's

        def empty(x):
            scale = torch.full(s_shape, TINY / fp8_max(dtype), dtype=torch.float32, device=x.device)
            return torch.empty(shape, dtype=dtype, device=x.device), scale

        return empty
    whole = recipe == "tensor"
    if whole:
        group_rows, group_cols = 1, _TENSOR_GROUP_COLS
    else:
        group_rows, group_cols = group
        if group_cols == K:  # "row": the whole row, in steps
            group_cols = cdiv(K, _QUANT_COLS) * _QUANT_COLS
    if group_rows > 1:  # a weight's 128 x 128 blocks: all their rows at once
        rows, cols = group_rows, min(_QUANT_COLS, group_cols)
    else:
        # Fewer rows a program where that gives the GPU too few programs, and longer steps along
        # them, the tile's 4096 elements kept. At decode sizes the row recipe's single program had
        # walked K in 32 x 128 tiles of one real row, twice: with the GEMM 177 us for a 1 x 4096
        # input on the H100, where scaled_mm alone takes 9 us at M = 16. At prefill sizes its 32-row
        # programs were 64 for 2048 tokens, each reading its rows twice from one SM: 1.4 of a 2-layer
        # Llama-3-8B-shaped prefill's 5.6 ms of GPU time on an H200, the 1 x 128 blocks' 0.24.
        rows = min(_QUANT_ROWS, _next_power_of_2(R))
        groups_per_row = cdiv(K, group_cols)
        if x.device.type == "cuda":
            while rows > 1 and cdiv(R, rows) * groups_per_row < _PROGRAMS_PER_SM * device_info.sm_count(x.device):
                rows //= 2
        cols = min(_QUANT_ROWS * _QUANT_COLS // rows, _next_power_of_2(group_cols))
    x2 = x.reshape(R, K)
    q = torch.empty(shape, dtype=dtype, device=x.device)
    scale = torch.empty(s_shape, dtype=torch.float32, device=x.device)
    q2 = q.view(R, K)
    # The scale grid's strides: (rows of groups, columns of groups); one element for the tensor recipe.
    s_strides = (0, 0) if whole else scale.view(-1, scale.shape[-1]).stride()
    sizes = (R, K, *x2.stride(), *q2.stride(), *s_strides)
    meta = dict(GROUP_R=group_rows, GROUP_C=group_cols, BLOCK_R=rows, BLOCK_C=cols,
                WHOLE_TENSOR=whole, FP8_MAX=fp8_max(dtype), **fp8_cast_meta(dtype))  # fmt: skip
    amax = x2.new_zeros((), dtype=torch.float32)
    quantize = compile_launch(_quantize_kernel, (cdiv(R, rows), cdiv(K, group_cols)),
                              (x2, q2, scale, amax, *sizes), meta, x.device)  # fmt: skip
    if whole:
        absmax_grid = (cdiv(R, _QUANT_ROWS), cdiv(K, _QUANT_COLS))
        absmax = compile_launch(_absmax_kernel, absmax_grid, (x2, amax, R, K, *x2.stride()),
                                dict(BLOCK_R=_QUANT_ROWS, BLOCK_C=_QUANT_COLS), x.device)  # fmt: skip

    flat = x.dim() == 2  # x, q are the kernel's (R, K) as they are: no views to make a call

    def call(x):
        x2 = x if flat else x.reshape(R, K)
        q = x2.new_empty(shape, dtype=dtype)
        scale = x2.new_empty(s_shape, dtype=torch.float32)
        if whole:  # the whole tensor's absmax first, max-reduced into a zero
            amax = x2.new_zeros((), dtype=torch.float32)
            absmax(x2, amax, R, K, *x2.stride())
        else:
            amax = scale  # not read
        quantize(x2, q if flat else q.view(R, K), scale, amax, *sizes)
        return q, scale

    return call


def scaled_mm_call(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype, kernel, config, named=None):
    """`call(a, b, scale_a, scale_b, bias, residual) -> c` for tensors like these (every fact of
    `tensor_facts`), checked, chosen and compiled once. `named`: the caller's recipe, or None."""
    found = check_scaled_mm(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype)
    recipe = given_recipe(named, found, a, b, scale_a, scale_b)
    if kernel not in KERNELS and kernel != BATCH_INVARIANT:
        raise ValueError(f"scaled_mm: expected kernel to be one of {KERNELS}, but got {kernel!r}")
    if kernel == BATCH_INVARIANT and config is not None:
        raise ValueError(f"scaled_mm: batch_invariant=True chooses its own tiles, so config must be None, but got "
                         f"{config.short() if isinstance(config, MatmulConfig) else config!r}")  # fmt: skip
    if kernel == "fp8_odd_width" and recipe == "block":
        raise ValueError(
            "scaled_mm: kernel 'fp8_odd_width' takes tensor- or row-wise scales (its tiles' parts would cut "
            "the weight's 128 x 128 scale blocks), but got block-wise scales"
        )
    if kernel == "fp8_block" and (recipe == "row" or a.shape[1] % SCALE_BLOCK):
        # One element each is a block grid too (M = 1, N <= 128, K = 128), and the rung reads it broadcast.
        raise ValueError(
            f"scaled_mm: kernel 'fp8_block' takes block-wise (or one-element) scales and K a multiple of "
            f"{SCALE_BLOCK}, but got {recipe}-wise scales and K = {a.shape[1]}"
        )
    if kernel in GLUON_KERNELS and a.device.type != "cuda":
        raise ValueError(f"scaled_mm: kernel {kernel!r} runs on a CUDA GPU (sm_90), but a is on {a.device}")
    if config is not None and not isinstance(config, MatmulConfig):
        raise TypeError(f"scaled_mm: expected config to be None or a MatmulConfig, but got {config!r}")
    if config is not None and recipe == "block" and config.BLOCK_K != SCALE_BLOCK:
        raise ValueError(
            f"scaled_mm: block-wise scales change every 128 of K, so a config's BLOCK_K must be 128, but got "
            f"BLOCK_K={config.BLOCK_K}"
        )
    M, K = a.shape
    N = b.shape[1]
    spec = Epilogue(activation, float(alpha), bias is not None, residual is not None)
    if M * N == 0 or K == 0:
        return functools.partial(_empty_scaled_mm, M, N, out_dtype, activation)
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)  # this call's, to plan on
    if kernel == "auto":
        kernel, config = choice.choose(a, b, c, recipe) if config is None else ("fp8_grouped", config)
    elif kernel == BATCH_INVARIANT:
        kernel, config, _ = choice.choose_invariant(a, b, c, recipe)
    config = config or choice.default_config(recipe, M, N, K, a.device, kernel)
    fixed = spec.fixed_args(residual)
    if kernel in GLUON_KERNELS:
        # The rungs index row scales as contiguous vectors: other layouts are copied per call.
        sa_given, sb_given = scale_a.is_contiguous(), scale_b.is_contiguous()
        sa, sb = scale_a.contiguous(), scale_b.contiguous()
        if kernel == "fp8_block":
            run = fp8_block.plan(a, b, c, sa, sb, config, spec, bias, residual)
        elif kernel == "fp8_ws":
            run = fp8_ws.plan(a, b, c, sa, sb, recipe, config, spec, bias, residual)
        elif kernel == "fp8_odd_width":
            run = fp8_odd_width.plan(a, b, c, sa, sb, recipe, config, spec, bias, residual)
        else:
            run = fp8_tma.plan(a, b, c, sa, sb, recipe, config, spec, bias, residual)

        def tma_call(a, b, scale_a, scale_b, bias, residual):
            c = a.new_empty((M, N), dtype=out_dtype)
            sa = scale_a if sa_given else scale_a.contiguous()
            run(a, b, c, sa, scale_b if sb_given else scale_b.contiguous(), bias, residual)
            return c

        return tma_call
    if recipe == "block":
        sa_strides, sb_strides = scale_a.stride(), scale_b.stride()  # (along M, along K), (along N, along K)
    elif recipe == "row":
        sa_strides, sb_strides = (scale_a.stride(0), 0), (scale_b.stride(1), 0)
    else:
        sa_strides = sb_strides = (0, 0)
    sizes = (M, N, K, *a.stride(), *b.stride(), *c.stride(), *sa_strides, *sb_strides)
    meta = dict(BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K,
                GROUP_SIZE_M=config.GROUP_SIZE_M, RECIPE=recipe, SCALE_BLOCK=SCALE_BLOCK,
                ALIGN=(align := alignment_hints(a, b, c)), SWAP_AB=(swap := kernel == "fp8_swap_ab"),
                ALIGN_T=transposed_alignment(align, K) if swap else None,
                INT64=needs_int64(a, b, c), num_warps=config.num_warps,
                num_stages=config.num_stages,
                **spec.constexprs())  # fmt: skip
    grid = (cdiv(M, config.BLOCK_M) * cdiv(N, config.BLOCK_N),)
    runtime = (a, b, c, scale_a, scale_b, *sizes, *spec.pointers(bias, residual), *fixed)
    launch = compile_launch(_scaled_mm_kernel, grid, runtime, meta, a.device)

    def tl_call(a, b, scale_a, scale_b, bias, residual):
        c = a.new_empty((M, N), dtype=out_dtype)
        launch(a, b, c, scale_a, scale_b, *sizes, *spec.pointers(bias, residual), *fixed)
        return c

    return tl_call


def _empty_scaled_mm(M, N, out_dtype, activation, a, b, scale_a, scale_b, bias, residual) -> torch.Tensor:
    """An empty result, or for K = 0 the epilogue of a zero sum (which may be not zero)."""
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if c.numel() == 0:
        return c
    z = c.new_zeros((M, N), dtype=torch.float32) + (0.0 if bias is None else bias.float())
    return c.copy_(activate_torch(z, activation) + (0.0 if residual is None else residual.float()))


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
