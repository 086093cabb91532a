"""fp8 GEMMs for Hopper: `scaled_mm` (torch._scaled_mm's conventions, with linear's fused
epilogue) and `quantize_fp8`, for the tensor-, row- and block-wise scaling recipes (recipes.py).

    >>> from tritongemm.fp8 import quantize_fp8, scaled_mm
    >>> x_fp8, sx = quantize_fp8(x, "row")          # per token
    >>> w_fp8, sw = quantize_fp8(weight, "row")     # per output channel, once
    >>> y = scaled_mm(x_fp8, w_fp8.T, sx, sw.T, bias=bias, activation="gelu")

Hopper's fp8 MMA does twice the work per cycle of bf16. The family's first rung is a
`triton.language` kernel (tl.py), which the CPU runs under the interpreter; the Gluon WGMMA
rungs that share the bf16 rungs' building blocks are the next.
"""

from tritongemm.fp8.api import quantize_fp8, scaled_mm
from tritongemm.fp8.recipes import RECIPES, reference_quantize, reference_scaled_mm

__all__ = ["quantize_fp8", "scaled_mm", "RECIPES", "reference_quantize", "reference_scaled_mm"]
