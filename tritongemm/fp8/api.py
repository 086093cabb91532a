"""`quantize_fp8` and `scaled_mm`: the fp8 family's public calls, checked before anything launches.

The hot path is linear's (dense/linear.py): the first call for a problem checks it, chooses and compiles,
and keeps a function that only allocates and launches (fast_launch) in plan.PLANS, under a key of
every fact those steps read; a later call with that key runs it, checking nothing again.
"""

from __future__ import annotations

import functools
import importlib
import math

import torch

from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Epilogue
from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts
from tritongemm.fp8.recipes import SCALE_BLOCK, TINY, check_quantize, check_scaled_mm, fp8_format, fp8_max, scale_shape

# - "fp8_grouped": the `triton.language` rung (fp8/tl.py), every input;
# - "fp8_swap_ab": the same kernel computing C.T's tiles, the tokens on the MMA's narrow side
#   (decode sizes; every recipe);
# - "fp8_tma": the Gluon rung (fp8/tma.py), Hopper and TMA-aligned operands;
# - its warp-specialized persistent successors: "fp8_ws" (fp8/ws.py) for tensor- and
#   row-wise scales, "fp8_block" (fp8/block.py) for block scales;
# - "fp8_odd_width" (fp8/odd_width.py): tensor- and row-wise scales on 96- to 192-column
#   tiles, for decode-sized M whose tiles would leave SMs idle.
# "auto" chooses among them (_auto).
KERNELS = ("auto", "fp8_grouped", "fp8_swap_ab", "fp8_tma", "fp8_ws", "fp8_block", "fp8_odd_width")
GLUON_KERNELS = ("fp8_tma", "fp8_ws", "fp8_block", "fp8_odd_width")

# Quantization tiles: 32 rows x 128 columns a step (a weight block's 128 rows at once).
_QUANT_ROWS, _QUANT_COLS = 32, 128
# The tensor recipe's programs each take this many columns of their rows.
_TENSOR_GROUP_COLS = 1024
# Quantization programs a GPU's SM should get at least (rows a program halve until they do):
# each program reads its rows twice, the absmax pass and the cast, one load in flight at a time.
_PROGRAMS_PER_SM = 2


def quantize_fp8(x: torch.Tensor, recipe: str = "row", *, block: tuple[int, int] | None = None,
                 dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(x_fp8, scale) with x ≈ x_fp8 * scale, in one kernel per pass: each group's absmax, its
    scale (absmax / the fp8 maximum, in fp32) and the cast (round to nearest even, clamped to the
    fp8 range).

    Args:
        x: (..., K), bfloat16, float16 or float32, any strides.
        recipe: "tensor" (one scale: a 0-d tensor; two passes, as the whole tensor's absmax comes
            before any cast), "row" (one per row: per token for activations, per output channel
            for an (N, K) weight; scale (..., 1)) or "block".
        block: for "block", (1, 128) (activations, DeepSeek-V3's; scale (..., ceil(K / 128))) or
            (128, 128) (a 2D (N, K) weight; scale (ceil(N / 128), ceil(K / 128))). Default (1, 128).
        dtype: torch.float8_e4m3fn (default) or torch.float8_e5m2.

    The result equals `tritongemm.fp8.reference_quantize` (torch, the same arithmetic) value for
    value. A call like one seen before (every fact in its key) runs the launches planned then.
    """
    key = _quantize_key(x, recipe, block, dtype)
    call = planned(key, lambda: plan_quantize(x, recipe, block, dtype))
    return call(x)


def plan_quantize(x, recipe, block=None, dtype=torch.float8_e4m3fn):
    """`call(x) -> (x_fp8, scale)` for tensors like x (every fact of `tensor_facts`), checked and
    compiled once."""
    group = check_quantize(x, recipe, block, dtype)
    from tritongemm.fp8.tl import _absmax_kernel, _quantize_kernel
    from tritongemm.primitives.launch import compile_launch

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
            group_cols = _cdiv(K, _QUANT_COLS) * _QUANT_COLS
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
        groups_per_row = _cdiv(K, group_cols)
        if x.device.type == "cuda":
            while rows > 1 and _cdiv(R, rows) * groups_per_row < _PROGRAMS_PER_SM * device_info.sm_count(x.device):
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
                WHOLE_TENSOR=whole, FP8_MAX=fp8_max(dtype), **fp8_format(dtype))  # fmt: skip
    amax = x2.new_zeros((), dtype=torch.float32)
    quantize = compile_launch(_quantize_kernel, (_cdiv(R, rows), _cdiv(K, group_cols)),
                              (x2, q2, scale, amax, *sizes), meta, x.device)  # fmt: skip
    if whole:
        absmax_grid = (_cdiv(R, _QUANT_ROWS), _cdiv(K, _QUANT_COLS))
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


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    kernel: str = "auto",
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """activation(alpha * (scale_a a) @ (scale_b b) + bias) + residual, accumulated in fp32 and
    rounded once to out_dtype, as `torch._scaled_mm` takes its operands.

    Args:
        a: (M, K) float8_e4m3fn or float8_e5m2, row-major.
        b: (K, N) fp8, column-major: the transpose of an (N, K) weight (`weight.T`).
        scale_a, scale_b: float32 dequantization scales of one recipe (fp8/recipes.py): one
            element each (tensor-wise), (M, 1) and (1, N) (row-wise), or (M, K/128) and
            (ceil(N/128), K/128) (block-wise: 1 x 128 of a's rows, 128 x 128 of the weight; K a
            multiple of 128). `quantize_fp8` makes them.
        bias: (N,), residual: (M, N); bfloat16, float16 or float32, added in fp32.
        out_dtype: bfloat16 (default), float16 or float32.
        activation, alpha: as for `tritongemm.linear`.
        kernel: "auto" (the measured choice of `_auto`), "fp8_grouped" (the `triton.language`
            rung, any input), "fp8_swap_ab" (the same computing C.T's tiles, for a few tokens),
            "fp8_tma" (the Gluon rung: Hopper, one fp8 dtype for a and b,
            bf16 or fp16 out, TMA-aligned operands), "fp8_ws" (its warp-specialized persistent
            successor for tensor- and row-wise scales), "fp8_block" (the same for block scales,
            K a multiple of 128) or "fp8_odd_width" (tensor- and row-wise scales on tiles of 96 to
            192 columns, odd_width.py's); config: a MatmulConfig for it
            (BLOCK_K = 128 under block scales), None for the default; with "auto" it takes the
            `tl` rung.
    """
    key = _scaled_mm_key(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype, kernel, config)
    call = planned(
        key,
        lambda: plan_scaled_mm(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype, kernel, config),
    )
    return call(a, b, scale_a, scale_b, bias, residual)


def plan_scaled_mm(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype, kernel, config):
    """`call(a, b, scale_a, scale_b, bias, residual) -> c` for tensors like these (every fact of
    `tensor_facts`), checked, chosen and compiled once."""
    recipe = check_scaled_mm(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype)
    if kernel not in KERNELS:
        raise ValueError(f"scaled_mm: expected kernel to be one of {KERNELS}, but got {kernel!r}")
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
    M, K = a.shape
    N = b.shape[1]
    spec = Epilogue(activation, float(alpha), bias is not None, residual is not None)
    if M * N == 0 or K == 0:
        return functools.partial(_empty_scaled_mm, M, N, out_dtype, activation)
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)  # this call's, to plan on
    if kernel == "auto":
        kernel, config = _auto(a, b, c, recipe) if config is None else ("fp8_grouped", config)
    config = _config(config, recipe, M, N, K, a.device, kernel)
    fixed = spec.fixed_args(residual)
    if kernel in GLUON_KERNELS:
        from tritongemm.fp8 import block as fp8_block
        from tritongemm.fp8 import odd_width as fp8_odd_width
        from tritongemm.fp8 import tma as fp8_tma
        from tritongemm.fp8 import ws as fp8_ws

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
    from tritongemm.fp8.tl import _scaled_mm_kernel
    from tritongemm.ladder.swap_ab import transposed_alignment
    from tritongemm.primitives.launch import compile_launch
    from tritongemm.primitives.tl.host import alignment_hints

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
                ALIGN_T=transposed_alignment(align, K) if swap else None, num_warps=config.num_warps,
                num_stages=config.num_stages,
                **spec.constexprs())  # fmt: skip
    grid = (_cdiv(M, config.BLOCK_M) * _cdiv(N, config.BLOCK_N),)
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
    from tritongemm.core.epilogue import activate_torch

    z = c.new_zeros((M, N), dtype=torch.float32) + (0.0 if bias is None else bias.float())
    return c.copy_(activate_torch(z, activation) + (0.0 if residual is None else residual.float()))


def _scaled_mm_key(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype, kernel, config):
    """scaled_mm's plan key: each tensor's facts (problem.tensor_facts), every other argument as it
    is; None where a tensor's facts can't be read (an unhashable argument the cache's look-up
    finds), or where alpha is a bool (True == 1 in a key, but the
    checks refuse alpha=True: they then say so). Spelled out, not a loop over the arguments: that
    loop was half of the key's 3.5 us on this repository's CPU machine, on every call."""
    if type(alpha) is bool:
        return None
    try:
        key = ("scaled_mm", kernel, config, activation, alpha, out_dtype, tensor_facts(a), tensor_facts(b),
               tensor_facts(scale_a), tensor_facts(scale_b), tensor_facts(bias), tensor_facts(residual))  # fmt: skip
    except (AttributeError, RuntimeError, TypeError):
        return None
    return key


def _quantize_key(x, recipe, block, dtype) -> tuple | None:
    """quantize_fp8's plan key, as `_scaled_mm_key` makes scaled_mm's."""
    if bool in (type(recipe), type(block), type(dtype)):
        return None
    try:
        key = ("quantize_fp8", recipe, block, dtype, tensor_facts(x))
    except (AttributeError, RuntimeError, TypeError):
        return None
    return key


# "auto"'s tiles, from scripts/probes/fp8/fp8_configs.py (results/h100/probes/fp8/fp8-configs.csv, the H100;
# results/h200/probes/fp8/fp8-ws-configs-large.csv and -small.csv, an H200):
# - M > 64, where TMA takes the call on Hopper: the warp-specialized persistent rungs, fp8_ws for
#   tensor- and row-wise scales and fp8_block for block scales, on the largest of their tiles
#   (TILES, largest first) that gives at least half the SMs a tile (_filling_tile).
#   - M >= 2048: 128 x 256 on two warpgroups. fp8_ws 1.03-1.10x torch's _scaled_mm on the H200,
#     where fp8_tma's 128 x 256 (one tile a program) gave 0.94-1.09x, below 1 on 6 of 18; fp8_block
#     0.86-0.98x torch's block-wise on the H100, where fp8_tma's 128 x 128 gave 0.50-0.57x.
#   - M <= 128, tensor- and row-wise: of fp8_ws's 64 x 128 and 64 x 64 (256 deep) and
#     fp8_odd_width's 64 x 96, the tile that fills its waves best (_wave_filling_tile). A decode
#     step streams the weight, and an SM without a tile is bandwidth lost. On the H100
#     (probes/fp8/fp8-odd-m128.csv, tensor-wise): 128 x 6144 x 4096 takes 64 x 96 (128 tiles) at
#     1.05x torch's where 64 x 128 (96 tiles) ran 0.92-0.95x; 128 x 28672 x 4096 64 x 64 (7 waves
#     97% full) at 0.99x where the earlier rule's 128 x 256 (112 tiles) ran 0.94x; 64 x 64 at
#     N = 4096 as before. Row-wise the same tiles win (1.47-1.50x at 6144 against 1.29x).
#     bench fp8 then gave tensor-wise 0.999 geomean at M <= 128 (probes/fp8/fp8-bench-m128-odd-width.csv,
#     kernel-only) where results/h100/fp8.csv had 0.966. Where that tile is 64 x 64 in one wave
#     on a K of at most 4096, rung 4 runs it (_decode_tile; probes/fp8/fp8-m128-rung4.txt, H100):
#     128 x 4096 x 4096 at 1.13x torch's tensor-wise (two runs: 6.02 and 6.10 us) where fp8_ws
#     ran 0.98x, 2.08x against 1.78x row-wise; at K = 14336 0.91x against fp8_ws's 0.99x.
#   - M = 128 before that rule, the H200: the rule's tiles were the probe's best ws tile on each
#     of the four weights (64 x 128 at N = 6144, 64 x 64 at N = 4096, 128 x 256 at N = 28672), tensor-wise 0.91-1.01x
#     torch's where the `tl` rung's 64-row tiles gave 0.68-0.84x; block-wise 0.91-1.07x where the
#     tiles before gave 0.51-0.86x. Filling every SM instead (the rule before, for block scales)
#     took 64 x 64 at N = 6144, 192 tiles for 132 SMs: 0.67x. At 128 x 4096 x 4096 the `tl` rung's
#     64 x 64 x 256 tile ran faster still (1.05x against the rule's 0.91x); fp8_ws's 64-row tiles
#     now step 256 of K too (H100, probes/fp8/fp8-ws-deep-m128.csv: 0.98x there, 0.85x 128 deep).
# - M <= 16 on Hopper, tensor- and row-wise scales: fp8_swap_ab's 16 tokens x 64 weight rows x 512
#   (results/h100/probes/fp8/fp8-swap-m16.csv, the H100): tensor-wise 0.92-1.04x torch's where the `tl`
#   rung's 64 x 32 tile gave 0.73-0.99x, row-wise 1.07-2.59x where 1.08-2.35x. Narrower, 16 x 32
#   (twice the programs at 4096 weight rows), ran 0.53-0.80x at N = 4096 and 6144 against 0.92-1.05x
#   (probes/fp8/fp8-swap-m16-narrow.csv): 16 x 4096 x 4096 stays at ~0.92x, half the SMs pulling its weight.
# - Block scales at M <= 16 on Hopper, K <= _SWAP_BLOCK_MAX_K: fp8_swap_ab's tile (_SWAP_BLOCK_TILE).
# - Else block scales at M <= 64 on Hopper, weights of _BLOCK_GLUON_FROM_WEIGHT elements or more:
#   fp8_block's 64-row tiles, the larger of the two that gives half the SMs a tile
#   (results/h100/probes/fp8/fp8-block-small-partitions.csv and fp8-block-m16-rule.csv, M = 16):
#   1.00-1.13x torch's at 16 x 28672 x 4096 (64 x 128) and 0.91-0.93x at 16 x 4096 x 14336
#   (64 x 64), where the `tl` rung gave 0.82-0.89x and 0.69-0.77x; on the smaller weights the
#   `tl` rung stays ahead (1.00x against 0.95-0.97x at 6144 x 4096, 1.28x against 1.07-1.13x at
#   4096 x 4096).
# - Else at M <= 64, or where TMA can't take the call: the `tl` rung, a 64-row tile narrow enough
#   that the tiles along N fill the SMs (a 128 x 128 tile left 100 of 132 idle at 16 x 4096 x 4096,
#   0.34x torch's tensor-wise), deep along K where the scales allow. At M = 16 the ws tiles ran
#   0.45-0.78x torch's tensor-wise, the `tl` rung 0.64-0.92x.
# The wide tile serves both rungs on Hopper: the `tl` rung's best at M > 128 too, where the Gluon one can't run.
_WIDE = MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
_BLOCK_TL = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=SCALE_BLOCK, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
_SMALL_M = 128
_TL_MAX_M = 64
# fp8_swap_ab's: 16 tokens (C.T's columns) x 64 of the weight's rows, 512 deep (the probe's best of
# 16 x 32, 64, 128 and 256 or 512 deep; 120 KB of ring, past an Ada SM's 100 KB).
_SWAP_TILE = MatmulConfig(BLOCK_M=16, BLOCK_N=64, BLOCK_K=512, GROUP_SIZE_M=8, num_warps=4, num_stages=3)
_SWAP_MAX_M = 16
# Not split along K. Split among S programs a tile where K >= 2N, as bf16's swap_ab does
# (results/h100/probes/fp8/fp8-swap-split.txt, .csv, .patch; H100, tensor- and row-wise): kernel-only
# 0-8% faster at 1-16 x 4096 x 14336 and x 3584 x 18944 (16 x 8192 x 28672 has tiles enough not
# to split). But eagerly 0.73-1.03x the unsplit tile, tensor-wise 0.73-0.93x: the second launch and
# the workspace's allocation cost up to 11 us a call, more than the split saves on a 24-30 us kernel.
# Under block scales the swapped tile steps one 128-wide K block at a time (promotion), 8 slots
# deep: 80 KB in flight, within an Ada SM's 100 KB. `auto` takes it for block scales at M <= 16 on
# Hopper, K up to _SWAP_BLOCK_MAX_K (scripts/probes/fp8/fp8_configs.py --swap --recipes block, M = 16):
# - the H100 (results/h100/probes/fp8/fp8-swap-block-m16.csv): 1.47x torch's block-wise at 6144 x 4096,
#   1.51x at 4096 x 4096, 1.07x at 28672 x 4096, where the rule before gave 0.99x, 1.28x and 1.02x
#   (results/h100/fp8.csv);
# - an H200 (results/h200/probes/fp8/fp8-swap-block-m16.csv, the rule before beside it): 1.52x, 1.56x
#   and 1.03x, where it gave 0.99x, 1.28x and 0.90x.
# At K = 14336 it ran 0.92x (H100) and 0.81x (H200), where fp8_block's 64 x 64 tile, which stays,
# ran 0.96x and 0.89x: its 64 programs' steps take as long as at K = 4096, torch's do not.
_SWAP_BLOCK_TILE = _SWAP_TILE.with_(BLOCK_K=SCALE_BLOCK, num_stages=8)
_SWAP_BLOCK_MAX_K = 4096
# Rung 4's ring on the 64 x 64 x 256 tile at decode sizes (_decode_tile): 4 slots (3 ran 0.93x
# torch's where 4 ran 1.13x at 128 x 4096 x 4096), for K up to 4096 (at K = 14336 fp8_ws's
# persistent loop stays ahead, 0.99x against 0.91x).
_ONE_TILE_STAGES = 4
_ONE_TILE_MAX_K = 4096
_BLOCK_GLUON_FROM_WEIGHT = 1 << 25  # N * K: 28672 x 4096 and 4096 x 14336 take fp8_block at M <= 64


def _auto(a, b, c, recipe: str) -> tuple[str, MatmulConfig | None]:
    """(kernel, config) for "auto": the measured choice above, by M and what the GPU has."""
    M, N = c.shape
    if a.device.type != "cuda":
        return "fp8_grouped", None
    hopper = device_info.capability(a.device) == (9, 0)  # the GPU the tiles were measured on
    if hopper and M <= _SWAP_MAX_M and (recipe != "block" or a.shape[1] <= _SWAP_BLOCK_MAX_K):
        return "fp8_swap_ab", _SWAP_BLOCK_TILE if recipe == "block" else _SWAP_TILE
    large_block_weight = recipe == "block" and N * a.shape[1] >= _BLOCK_GLUON_FROM_WEIGHT
    if hopper and (M > _TL_MAX_M or large_block_weight):
        from tritongemm.fp8 import block as fp8_block
        from tritongemm.fp8 import tma as fp8_tma
        from tritongemm.fp8 import ws as fp8_ws

        if fp8_tma.unsupported_reason(a, b, c, recipe) is None:
            sms = device_info.sm_count(a.device)
            if recipe != "block" and M <= _SMALL_M:
                return _decode_tile(M, N, a.shape[1], sms)
            if recipe != "block":
                return "fp8_ws", _filling_tile(fp8_ws.TILES, M, N, sms)
            # At M <= 64 (large weights only): a warpgroup's 64 rows.
            return "fp8_block", _filling_tile(
                fp8_block.TILES if M > _TL_MAX_M else fp8_block.ONE_WARPGROUP_TILES, M, N, sms
            )
    if M > _SMALL_M:
        # Elsewhere the first default: the wide tile's 144 KB ring is more than an Ada SM's 100 KB.
        return "fp8_grouped", _WIDE if hopper and recipe != "block" else _BLOCK_TL
    wide = _cdiv(M, 64) * _cdiv(N, 64) >= device_info.sm_count(a.device)
    deep = recipe != "block" and hopper  # 96 KB of ring, near an Ada SM's 100 KB
    return "fp8_grouped", MatmulConfig(BLOCK_M=64, BLOCK_N=64 if wide else 32, BLOCK_K=256 if deep else SCALE_BLOCK,
                                       GROUP_SIZE_M=8, num_warps=4, num_stages=3 if deep else 4)  # fmt: skip


def _decode_tile(M: int, N: int, K: int, sms: int) -> tuple[str, MatmulConfig]:
    """(kernel, tile) at M = 65-128 on Hopper: `_wave_filling_tile`'s, on rung 4 (fp8_tma, one
    tile a program) where that tile is fp8_ws's 64 x 64, its tiles one wave, and K short: a
    persistent program with one tile has nothing to overlap, and rung 4 skips its setup."""
    kernel, tile = _wave_filling_tile(M, N, sms)
    if kernel == "fp8_ws" and tile.BLOCK_N == 64 and tile.num_tiles(M, N) <= sms and K <= _ONE_TILE_MAX_K:
        return "fp8_tma", tile.with_(num_stages=_ONE_TILE_STAGES)
    return kernel, tile


def _wave_filling_tile(M: int, N: int, sms: int) -> tuple[str, MatmulConfig]:
    """(kernel, tile) at decode sizes: of fp8_ws's two 64-row tiles and fp8_odd_width's 64 x 96,
    the one whose tiles fill their waves of the SMs best (odd_width.wave_fill), the larger where
    two fill as well."""
    from tritongemm.fp8 import odd_width as fp8_odd_width
    from tritongemm.fp8 import ws as fp8_ws
    from tritongemm.ladder.odd_width import wave_fill

    candidates = [("fp8_ws", t) for t in fp8_ws.TILES if t.BLOCK_M == 64] + [
        ("fp8_odd_width", fp8_odd_width.DEFAULT_CONFIG)
    ]
    return max(candidates, key=lambda kt: (round(wave_fill(kt[1], M, N, sms), 2), kt[1].BLOCK_M * kt[1].BLOCK_N))


def _filling_tile(tiles: tuple[MatmulConfig, ...], M: int, N: int, sms: int) -> MatmulConfig:
    """The first (largest) of `tiles` whose grid gives at least half the SMs a tile, else the last."""
    return next((t for t in tiles if 2 * t.num_tiles(M, N) >= sms), tiles[-1])


def _config(config, recipe: str, M: int, N: int, K: int, device: torch.device, kernel: str) -> MatmulConfig:
    """The tile: the caller's (or _auto's), checked, or the kernel's default."""
    if config is None and kernel == "fp8_tma":
        from tritongemm.fp8.tma import default_config

        return default_config(recipe)
    if config is None and kernel in ("fp8_block", "fp8_ws", "fp8_odd_width"):  # each its module's DEFAULT_CONFIG
        return importlib.import_module(f"tritongemm.fp8.{kernel.removeprefix('fp8_')}").DEFAULT_CONFIG
    if config is None and kernel == "fp8_swap_ab" and device.type == "cuda":  # 256 deep: 60 KB of ring for an Ada SM
        if recipe == "block":
            return _SWAP_BLOCK_TILE
        return _SWAP_TILE if device_info.capability(device) == (9, 0) else _SWAP_TILE.with_(BLOCK_K=256)
    if config is None:
        if device.type == "cpu":  # the interpreter: small tiles keep the tests quick
            return MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=SCALE_BLOCK, GROUP_SIZE_M=4, num_warps=4, num_stages=1)
        return _BLOCK_TL
    if not isinstance(config, MatmulConfig):
        raise TypeError(f"scaled_mm: expected config to be None or a MatmulConfig, but got {config!r}")
    if recipe == "block" and config.BLOCK_K != SCALE_BLOCK:
        raise ValueError(
            f"scaled_mm: block-wise scales change every 128 of K, so a config's BLOCK_K must be 128, but got "
            f"BLOCK_K={config.BLOCK_K}"
        )
    return config


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)
