"""`quantize_fp8_pair(x, recipe)`: x's fp8 copy and its transpose's, from one read of x.

A training step's backward GEMMs read transposes: dX = dY W reads W along N, dW = dYᵀ X reads
dY and X along M, while the forward reads X and W along K and dX reads dY along N. Each fp8
operand must be row-major along the axis its GEMM reduces over (the fp8 MMA reads both operands
K-major), so a tensor and its transpose are two fp8 copies, scaled along different axes in the
row recipe. Quantizing each on its own reads the tensor twice a copy (`quantize_fp8`: the absmax,
then the cast). Here the cast pass writes both copies from one read of each tile, the second
through a transposed store, and the scales come from a first pass that finds every row's and every
column's absmax at once (atomic maxima): two reads of x for two copies instead of four.

- "row": q (R, C) with one scale per row (R, 1), qt (C, R) = xᵀ's with one per column of x (C, 1).
- "tensor": one absmax, so qt is exactly q's transpose; both scales are the one 0-d scale.
- "block": 128 x 128 blocks (a weight's), each scaled by its own absmax, found in the cast pass
  itself (a program's tile is one block): one read of x. qt's blocks are q's transposed, its scale
  grid the transpose of q's.

Every value equals `quantize_fp8(x, recipe)` and `quantize_fp8(x.T, recipe)` (block: with block
(128, 128)) bit for bit: the same floor, the same correctly rounded quotients (fp8/tl.py's
`_fp8_ready`), the same rounding.
"""

from __future__ import annotations

import torch

from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts


def _build():
    """fp8/pair_build.py, imported on the first plan: it imports the kernels, and with them
    Triton, which reads TRITON_INTERPRET when a kernel is decorated."""
    from tritongemm.fp8 import pair_build

    return pair_build


def quantize_fp8_pair(x: torch.Tensor, recipe: str = "row", dtype: torch.dtype = torch.float8_e4m3fn):
    """(q, scale, qt, scale_t): x (R, C) quantized along its rows (q, row-major) and xᵀ quantized
    along its rows (qt (C, R), row-major), as `quantize_fp8(x, recipe)` and `quantize_fp8(x.T,
    recipe)` would give them (block: 128 x 128 blocks), from one cast pass over x."""
    key = ("quantize_fp8_pair", recipe, dtype, tensor_facts(x)) if isinstance(x, torch.Tensor) else None
    return planned(key, lambda: _build().plan_pair(x, recipe, dtype))(x)


def quantize_fp8_transposed(x: torch.Tensor, recipe: str = "row", dtype: torch.dtype = torch.float8_e4m3fn):
    """(qt, scale_t): `quantize_fp8(x.T, recipe)` (block: 128 x 128 blocks), made by the pair's
    kernels with q left unwritten: x read in tiles, row-major, and xᵀ's copy written through the
    transposed store, where quantize_fp8 of the view x.T reads x across its rows. A backward's Wᵀ."""
    key = ("quantize_fp8_transposed", recipe, dtype, tensor_facts(x)) if isinstance(x, torch.Tensor) else None
    return planned(key, lambda: _build().plan_pair(x, recipe, dtype, write_q=False))(x)
