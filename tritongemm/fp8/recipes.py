"""fp8 scaling recipes: what a scale covers, how a call's scales say which recipe it uses, and the
torch references of quantization and of the scaled GEMM. No Triton here (see core/epilogue.py
for why).

A scale is a dequantization factor, as in `torch._scaled_mm`: the value an fp8 element stands for
is `element * scale`. Three recipes, by what one scale covers:

    tensor  the whole tensor                       a: ()       b: ()
    row     one row of a (a token), one column     a: (M, 1)   b: (1, N)
            of b (an output channel)
    block   a: 1 x 128 of a row (a token's K in    a: (M, K/128)
            blocks); b: 128 x 128 of the weight    b: (ceil(N/128), K/128), the weight's (N, K) blocks

The block recipe is DeepSeek-V3's and the Qwen3 FP8 checkpoints'; it needs K % 128 == 0.
"""

from __future__ import annotations

import math

import torch

from tritongemm.core import device_info
from tritongemm.core.checks import _check_dense
from tritongemm.core.epilogue import ACTIVATIONS, reference_linear
from tritongemm.core.registry import dtype_name

RECIPES = ("tensor", "row", "block")
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)  # what Hopper's fp8 MMA takes, in any pairing
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
EPILOGUE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # a bias or residual, read as fp32
SCALE_BLOCK = 128  # the block recipe's K block (both operands) and its weight blocks' N
# A group whose largest magnitude is 0 (or below this) gets the scale of TINY: its elements
# quantize to 0 instead of 0 / 0 = NaN. torchao's fp8 recipes use the same floor.
TINY = 1e-12


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 dtype: 448 for e4m3fn, 57344 for e5m2."""
    return float(torch.finfo(dtype).max)


def fp8_cast_meta(dtype: torch.dtype) -> dict:
    """What a quantizing kernel's cast to `dtype` takes (fp8/tl.py's `_fp8_ready`): the format's
    mantissa bits and smallest normal exponent, and whether the kernels run under Triton's
    interpreter, whose cast they must round for."""
    fmt = dict(MANTISSA=3, MIN_EXP=-6) if dtype == torch.float8_e4m3fn else dict(MANTISSA=2, MIN_EXP=-14)
    return dict(fmt, INTERPRETED=device_info.interpreter_active())


# ----------------------------------------------------------------------------------------------
# Quantization
# ----------------------------------------------------------------------------------------------


def group_shape(recipe: str, shape: tuple[int, int], block: tuple[int, int] | None) -> tuple[int, int]:
    """The (rows, columns) one scale covers in a 2-D (R, C) tensor quantized with `recipe`."""
    R, C = shape
    if recipe == "tensor":
        return R, C
    if recipe == "row":
        return 1, C
    return block


def check_quantize(x, recipe: str, block, dtype) -> tuple[int, int]:
    """quantize_fp8's arguments; returns the (rows, columns) one scale covers."""
    _check_dense("quantize_fp8", "x", x)
    if recipe not in RECIPES:
        raise ValueError(f"quantize_fp8: expected recipe to be one of {RECIPES}, but got {recipe!r}")
    if x.dtype not in EPILOGUE_DTYPES:
        raise TypeError(
            f"quantize_fp8: expected x of dtype bfloat16, float16 or float32, but got {dtype_name(x.dtype)}"
        )
    if dtype not in FP8_DTYPES:
        raise TypeError(f"quantize_fp8: expected dtype float8_e4m3fn or float8_e5m2, but got {dtype}")
    if x.dim() < 1:
        raise ValueError("quantize_fp8: expected x to have 1 or more dimensions, (..., K), but got a scalar")
    if recipe == "block" and block is None:
        block = (1, SCALE_BLOCK)
    if recipe != "block":
        if block is not None:
            raise ValueError(f"quantize_fp8: block applies to recipe 'block' only, but recipe is {recipe!r}")
        return group_shape(recipe, (math.prod(x.shape[:-1]), x.shape[-1]), None)
    if block not in ((1, SCALE_BLOCK), (SCALE_BLOCK, SCALE_BLOCK)):
        raise ValueError(
            f"quantize_fp8: expected block (1, 128) (activations) or (128, 128) (weights), but got {block!r}"
        )
    if block[0] > 1 and x.dim() != 2:
        raise ValueError(
            f"quantize_fp8: 128 x 128 blocks quantize a 2D weight (N, K), but x has shape {tuple(x.shape)}"
        )
    return block


def scale_shape(x_shape: tuple[int, ...], recipe: str, group: tuple[int, int]) -> tuple[int, ...]:
    """The scale tensor's shape for x of `x_shape` (..., K): a 0-d tensor, (..., 1), or the groups'
    grid (..., ceil(K / 128)), (ceil(N / 128), ceil(K / 128)) for weight blocks."""
    *lead, K = x_shape
    if recipe == "tensor":
        return ()
    if recipe == "row":
        return (*lead, 1)
    if group[0] == 1:
        return (*lead, math.ceil(K / group[1]))
    return (math.ceil(lead[0] / group[0]), math.ceil(K / group[1]))


def reference_quantize(x: torch.Tensor, recipe: str = "row", block=None, dtype=torch.float8_e4m3fn):
    """(x_fp8, scale) as `quantize_fp8` computes them, in torch, with the same fp32 arithmetic: per
    group, scale = max(|x|, TINY) / fp8_max, then each element x / scale, clamped to the fp8
    range, rounded to nearest even."""
    group = check_quantize(x, recipe, block, dtype)
    shape = scale_shape(tuple(x.shape), recipe, group)
    if x.numel() == 0:
        return x.to(dtype), torch.full(shape, TINY / fp8_max(dtype), device=x.device)
    K = x.shape[-1]
    x2 = x.reshape(-1, K).float()
    R = x2.shape[0]
    gr, gc = group
    # Pad to whole groups with zeros (which change no maximum), take each group's, and spread it back.
    padded = x2.new_zeros(math.ceil(R / gr) * gr, math.ceil(K / gc) * gc)
    padded[:R, :K] = x2
    grid = padded.abs().view(padded.shape[0] // gr, gr, padded.shape[1] // gc, gc).amax(dim=(1, 3))
    # Divided by a tensor on grid's device, not a Python number: torch's CUDA division by a
    # number multiplies by its reciprocal, one ulp off the kernel's IEEE division (div_rn).
    scale = grid.clamp_min(TINY) / grid.new_tensor(fp8_max(dtype))
    spread = scale.repeat_interleave(gr, 0).repeat_interleave(gc, 1)[:R, :K]
    limit = fp8_max(dtype)
    q = (x2 / spread).clamp(-limit, limit).to(dtype).view(x.shape)
    return q, scale.reshape(shape)


# ----------------------------------------------------------------------------------------------
# The scaled GEMM
# ----------------------------------------------------------------------------------------------


def recipe_of(a, b, scale_a, scale_b) -> str:
    """Which recipe a call's scales follow, from their shapes (as torch._scaled_mm reads them);
    a ValueError naming the three accepted pairs otherwise."""
    M, K = a.shape
    N = b.shape[1]
    shapes = (tuple(scale_a.shape), tuple(scale_b.shape))
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return "tensor"  # where a row or block pair is also one element each, it computes the same
    if shapes == ((M, 1), (1, N)):
        return "row"
    if K % SCALE_BLOCK == 0 and shapes == ((M, K // SCALE_BLOCK), (math.ceil(N / SCALE_BLOCK), K // SCALE_BLOCK)):
        return "block"
    block_note = "" if K % SCALE_BLOCK == 0 else f" (needs K % 128 == 0; K is {K})"
    raise ValueError(
        f"scaled_mm: scale_a of shape {shapes[0]} and scale_b of shape {shapes[1]} follow no recipe for a "
        f"{M}x{K} and b {K}x{N}; expected one element each (tensor-wise), ({M}, 1) and (1, {N}) (row-wise), "
        f"or ({M}, {K // SCALE_BLOCK}) and ({math.ceil(N / SCALE_BLOCK)}, {K // SCALE_BLOCK}) (block-wise, 1x128 "
        f"and 128x128){block_note}"
    )


def given_recipe(recipe: str | None, found: str, a, b, scale_a, scale_b) -> str:
    """The recipe a call runs: `found` (recipe_of's) unless the caller named one. A named recipe
    must be found's, or, where both scales are one element (which recipe_of reads as "tensor"), any
    whose shapes those are: a block-wise call at K = 128 and N <= 128 is one element each at M = 1,
    and computed tensor-wise it would round otherwise than its rows do in a batch."""
    if recipe is None:
        return found
    if recipe not in RECIPES:
        raise ValueError(f"scaled_mm: expected recipe to be None or one of {RECIPES}, but got {recipe!r}")
    M, K = a.shape
    N = b.shape[1]
    shapes = (tuple(scale_a.shape), tuple(scale_b.shape))
    fits = {
        "tensor": scale_a.numel() == 1 and scale_b.numel() == 1,
        "row": shapes == ((M, 1), (1, N)) or (found == "tensor" and M == 1 and N == 1),
        "block": K % SCALE_BLOCK == 0
        and scale_a.numel() == M * (K // SCALE_BLOCK)
        and scale_b.numel() == math.ceil(N / SCALE_BLOCK) * (K // SCALE_BLOCK),
    }
    if recipe != found and not (found == "tensor" and fits[recipe]):
        raise ValueError(f"scaled_mm: recipe={recipe!r} was given, but scale_a of shape {tuple(scale_a.shape)} and "
                         f"scale_b of shape {tuple(scale_b.shape)} are {found}-wise scales")  # fmt: skip
    return recipe


def check_scaled_mm(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype) -> str:
    """scaled_mm's arguments, before anything launches; returns the recipe."""
    named = (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b))
    for name, t in named:
        _check_dense("scaled_mm", name, t)
    for name, t in named[:2]:
        if t.dtype not in FP8_DTYPES:
            raise TypeError(
                f"scaled_mm: expected {name} of dtype float8_e4m3fn or float8_e5m2, but got {dtype_name(t.dtype)}"
            )
        if t.dim() != 2:
            raise ValueError(f"scaled_mm: expected {name} to be 2D, but got shape {tuple(t.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"scaled_mm: a ({a.shape[0]}x{a.shape[1]}) and b ({b.shape[0]}x{b.shape[1]}) can't be multiplied"
        )
    M, K = a.shape
    N = b.shape[1]
    # torch._scaled_mm's layouts, which fp8 WGMMA reads in place: both operands K-major.
    if K > 1 and a.stride(1) != 1:
        raise ValueError(
            f"scaled_mm: expected a to be row-major (stride (K, 1) or wider rows), but got strides {a.stride()}"
        )
    if K > 1 and b.stride(0) != 1:
        raise ValueError(
            f"scaled_mm: expected b to be column-major, the transpose of an (N, K) weight (weight.T), but got "
            f"strides {b.stride()}"
        )
    for name, t in named[2:]:
        if t.dtype != torch.float32:
            raise TypeError(f"scaled_mm: expected {name} of dtype float32, but got {dtype_name(t.dtype)}")
    for name, t in named[1:]:
        if t.device != a.device:
            raise ValueError(f"scaled_mm: expected {name} on {a.device}, the device of a, but got {t.device}")
    recipe = recipe_of(a, b, scale_a, scale_b)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"scaled_mm: expected out_dtype bfloat16, float16 or float32, but got {out_dtype}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"scaled_mm: expected activation to be one of {ACTIVATIONS}, but got {activation!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not abs(alpha) < float("inf"):
        raise TypeError(f"scaled_mm: expected alpha to be a finite real number, but got {alpha!r}")
    for name, t, shape in (("bias", bias, (N,)), ("residual", residual, (M, N))):
        if t is None:
            continue
        _check_dense("scaled_mm", name, t)
        if tuple(t.shape) != shape:
            raise ValueError(f"scaled_mm: expected {name} of shape {shape}, but got {tuple(t.shape)}")
        if t.dtype not in EPILOGUE_DTYPES:
            raise TypeError(f"scaled_mm: expected {name} of dtype bfloat16, float16 or float32, but got {t.dtype}")
        if t.device != a.device:
            raise ValueError(f"scaled_mm: expected {name} on {a.device}, the device of a, but got {t.device}")
    return recipe


def dequantize(t: torch.Tensor, scale: torch.Tensor, recipe: str, weight_blocks: bool = False) -> torch.Tensor:
    """An fp8 (R, C) operand times its scales, in float64. `weight_blocks`: the block recipe's
    scale covers 128 x 128 (b's weight, given as (K, N) = weight.T), else 1 x 128 of a row."""
    t = t.double()
    if recipe == "tensor":
        return t * scale.double().reshape(())
    if recipe == "row":
        return t * scale.double()
    if weight_blocks:  # scale (ceil(N/128), K/128) over weight (N, K) = t.T
        spread = scale.double().repeat_interleave(SCALE_BLOCK, 0)[: t.shape[1]].repeat_interleave(SCALE_BLOCK, 1)
        return t * spread[:, : t.shape[0]].T
    return t * scale.double().repeat_interleave(SCALE_BLOCK, 1)[:, : t.shape[1]]


def reference_scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16, activation=None,
                        residual=None, alpha=1.0) -> torch.Tensor:  # fmt: skip
    """What scaled_mm computes, in float64: activation(alpha * (scale_a a) @ (scale_b b) + bias) +
    residual, rounded once to out_dtype. The tests' and benchmarks' reference."""
    recipe = recipe_of(a, b, scale_a, scale_b)
    a64, b64 = dequantize(a, scale_a, recipe), dequantize(b, scale_b, recipe, weight_blocks=True)
    return reference_linear(a64, b64.T, bias, activation, residual, alpha, out_dtype)
