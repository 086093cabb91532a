"""fp8/grouped.py's kernel and plans: built on a problem's first call, imported then, since
decorating a kernel imports Triton, which reads TRITON_INTERPRET."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongemm.fp8.recipes import TINY, fp8_cast_meta, fp8_max
from tritongemm.fp8.tl import _fp8_ready, _reciprocal
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tiling import cdiv

# A program's columns, and the rows it reads at a time down its group's rows (twice: the maxima,
# then the cast). Not yet timed on a GPU.
_SEGMENT_TILE = (64, 64)


# fmt: off
@triton.jit
def _segments_transposed_kernel(
    x_ptr, qt_ptr, st_ptr,  # x (R, C) any strides; qt (C, R) row-major; st (G, C): group g's column scales
    offs_ptr,  # (G,) int32: group g is rows [offs[g - 1], offs[g]) of x (offs[-1] = 0)
    R, C, stride_xr, stride_xc,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr,
    INTERPRETED: tl.constexpr,  # under Triton's interpreter (recipes.fp8_cast_meta)
):
    # fmt: on
    """Program (g, j): columns [j * BLOCK_C, ...) of group g's rows. Pass 1 finds each column's
    absmax over the group's rows, pass 2 writes each value over its column's scale into qt,
    transposed, so that qt's row c holds column c of every group, each group's stretch K-major."""
    g = tl.program_id(0)
    start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    end = tl.minimum(tl.load(offs_ptr + g), R)  # offsets past x's rows (unchecked on the device) read nothing past it
    offs_c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)  # qt may pass 2**31 elements
    cols_in = offs_c < C
    amax = tl.zeros([BLOCK_C], dtype=tl.float32)
    for first in range(start, end, BLOCK_R):
        offs_r = tl.arange(0, BLOCK_R).to(tl.int64) + first
        mask = (offs_r < end)[:, None] & cols_in[None, :]
        x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask, other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), 0))
    scale = tl.math.div_rn(tl.maximum(amax, 1e-12), FP8_MAX)  # recipes.TINY's floor, as every recipe's
    inv_scale = _reciprocal(scale)
    tl.store(st_ptr + g * C + offs_c, scale, mask=cols_in)
    fp8 = qt_ptr.dtype.element_ty
    for first in range(start, end, BLOCK_R):
        offs_r = tl.arange(0, BLOCK_R).to(tl.int64) + first
        mask = (offs_r < end)[:, None] & cols_in[None, :]
        x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask, other=0.0)
        y = _fp8_ready(x.to(tl.float32), scale[None, :], inv_scale[None, :], FP8_MAX, MANTISSA, MIN_EXP, INTERPRETED)
        tl.store(qt_ptr + offs_c[None, :] * R + offs_r[:, None], y.to(fp8), mask=mask)


def plan_segments_transposed(x: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype):
    """`call(x, offs) -> (qt, scale_t)` for tensors like these (checked by the caller)."""
    R, C = x.shape
    G = offs.shape[0]
    if G * C == 0:
        return lambda x, offs: (x.new_empty((C, R), dtype=dtype), x.new_empty((G, C), dtype=torch.float32))
    if R == 0:  # every group empty: each column's scale is the floor's
        floor = TINY / fp8_max(dtype)
        return lambda x, offs: (x.new_empty((C, 0), dtype=dtype), x.new_full((G, C), floor, dtype=torch.float32))
    block_r, block_c = _SEGMENT_TILE
    meta = dict(BLOCK_R=block_r, BLOCK_C=block_c, FP8_MAX=fp8_max(dtype), **fp8_cast_meta(dtype), num_warps=4)
    qt, st = x.new_empty((C, R), dtype=dtype), x.new_empty((G, C), dtype=torch.float32)
    sizes = (R, C, *x.stride())
    launch = compile_launch(_segments_transposed_kernel, (G, cdiv(C, block_c)), (x, qt, st, offs, *sizes), meta,
                            x.device)  # fmt: skip

    def call(x, offs):
        qt, st = x.new_empty((C, R), dtype=dtype), x.new_empty((G, C), dtype=torch.float32)
        launch(x, qt, st, offs, *sizes)
        return qt, st

    return call
