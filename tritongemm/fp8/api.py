"""`quantize_fp8` and `scaled_mm`: the fp8 family's public calls, checked before anything launches.

The hot path is linear's (dense/linear.py): the first call for a problem checks it, chooses and
compiles (fp8/build.py), and keeps a function that only allocates and launches in the plan cache,
under a key of every fact those steps read; a later call with that key runs it, checking nothing
again.
"""

from __future__ import annotations

import torch

from tritongemm.core.checks import invariant_kernel
from tritongemm.core.config import MatmulConfig
from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts


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
    batch_invariant: bool = False,
    recipe: str | None = None,
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
        kernel: "auto" (the measured choice of `dispatch.fp8.choose`), "fp8_grouped" (the `triton.language`
            rung, any input), "fp8_swap_ab" (the same computing C.T's tiles, for a few tokens),
            "fp8_tma" (the Gluon rung: Hopper, one fp8 dtype for a and b,
            bf16 or fp16 out, TMA-aligned operands), "fp8_ws" (its warp-specialized persistent
            successor for tensor- and row-wise scales), "fp8_block" (the same for block scales,
            K a multiple of 128) or "fp8_odd_width" (tensor- and row-wise scales on tiles of 96 to
            192 columns, odd_width.py's); config: a MatmulConfig for it
            (BLOCK_K = 128 under block scales), None for the default; with "auto" it takes the
            `tl` rung.
        batch_invariant: each row of the result the same bits whatever the other rows of a are
            (kernel "auto" and config None only): K unsplit, one kernel class for every M
            (dispatch/fp8.py `choose_invariant`). The scales are the caller's: a row-wise
            recipe's row scale depends on that row alone, a tensor-wise one on the whole batch.
        recipe: the recipe the scales follow, or None to read it from their shapes. Where both
            are one element, which reads as tensor-wise, a block-wise call (K = 128, N <= 128) or
            a row-wise one (N = 1) at M = 1 names its own here, so that its rows are computed
            as they are in a batch (batch_invariant=True; `Fp8Linear` does).
    """
    if batch_invariant is not False:
        kernel = invariant_kernel(kernel, batch_invariant, "scaled_mm")
    key = _scaled_mm_key(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype, kernel, config)
    key = key if key is None or recipe is None else (*key, recipe)
    call = planned(
        key,
        lambda: plan_scaled_mm(
            a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype, kernel, config, recipe
        ),  # fmt: skip
    )
    return call(a, b, scale_a, scale_b, bias, residual)


def plan_quantize(x, recipe, block=None, dtype=torch.float8_e4m3fn):
    """`call(x) -> (x_fp8, scale)` for tensors like x (every fact of `tensor_facts`), checked and
    compiled once (fp8/build.py)."""
    return _build().quantize_call(x, recipe, block, dtype)


def plan_scaled_mm(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype, kernel, config, recipe=None):
    """`call(a, b, scale_a, scale_b, bias, residual) -> c` for tensors like these (every fact of
    `tensor_facts`), checked, chosen and compiled once (fp8/build.py)."""
    return _build().scaled_mm_call(a, b, scale_a, scale_b, bias, residual, activation, alpha, out_dtype, kernel, config,
                                   recipe)  # fmt: skip


def _build():
    """fp8/build.py, imported on the first plan: it imports the kernels, and with them Triton, whose
    decoration of a kernel reads TRITON_INTERPRET (a program may set it after import tritongemm)."""
    from tritongemm.fp8 import build

    return build


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
