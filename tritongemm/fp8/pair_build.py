"""quantize_fp8_pair's kernels and plans (the idea: fp8/pair.py): built on a problem's first
call, imported then, since decorating a kernel imports Triton, which reads TRITON_INTERPRET."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongemm.fp8.recipes import SCALE_BLOCK, TINY, fp8_cast_meta, fp8_max, scale_shape
from tritongemm.fp8.tl import _absmax_kernel, _fp8_ready, _reciprocal, max_magnitude_into
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tiling import cdiv

PAIR_RECIPES = ("tensor", "row", "block")
_TENSOR, _ROW, _BLOCK = 0, 1, 2
# The cast pass's tiles (4 warps; the block recipe's tile is its block), by recipe, from
# scripts/probes/fp8_training/kernel_probe.py on the H200 (GB/s of reads and writes, 4096 x 4096 to
# 14336 x 4096 bf16; a copy runs at 3.7-4.1 TB/s): the row recipe's two casts a value at 2.5-2.8 TB/s
# in 32 x 128 tiles (2.0-2.3 in 128 x 64); the tensor recipe's one cast at 2.8-3.2 in 128 x 64.
_CAST_TILE = {"tensor": (128, 64), "row": (32, 128), "block": (SCALE_BLOCK, SCALE_BLOCK)}
# The row recipe's maxima pass, 4 warps: 3.5-3.9 TB/s of reads in 256 x 64 tiles, 3.3-3.8 in 128 x 64,
# 1.5-3.3 in the other tiles and with 8 warps (absmax_probe.py, H200, triton 3.6, 4096 x 4096 to 14336 x 4096).
_ROW_COL_ABSMAX_TILE = (256, 64)
_ABSMAX_TILE = (32, 128)  # the tensor recipe's absmax pass, as quantize_fp8's


# fmt: off
@triton.jit
def _row_col_absmax_kernel(
    x_ptr, rmax_ptr, cmax_ptr,  # x (R, C); the row and column maxima, zeroed by the host
    R, C, stride_xr, stride_xc,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # fmt: on
    """Each tile's row and column maxima of |x|, max-reduced into rmax and cmax (fp8/tl.py's
    `max_magnitude_into`: one relaxed integer atomic a value)."""
    offs_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)  # x may have any strides
    rows_in, cols_in = offs_r < R, offs_c < C
    x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc,
                mask=rows_in[:, None] & cols_in[None, :], other=0.0)  # fmt: skip
    a = tl.abs(x.to(tl.float32))
    max_magnitude_into(rmax_ptr + offs_r, tl.max(a, 1), rows_in)
    max_magnitude_into(cmax_ptr + offs_c, tl.max(a, 0), cols_in)


# fmt: off
@triton.jit
def _quantize_pair_kernel(
    x_ptr, q_ptr, qt_ptr,  # x (R, C) any strides; q (R, C) and qt (C, R), row-major
    s_ptr, st_ptr,  # q's and qt's scales (row: (R,) and (C,); tensor: one; block: the grid and its transpose)
    rmax_ptr, cmax_ptr,  # the first pass's maxima (row: per row and column; tensor: rmax_ptr's one)
    R, C, stride_xr, stride_xc,
    SCALES: tl.constexpr,  # 0 tensor, 1 row, 2 block (the tile is one block)
    WRITE_Q: tl.constexpr,  # False: qt alone (xᵀ's copy, which a backward makes of the weight)
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr,
    INTERPRETED: tl.constexpr,  # under Triton's interpreter (recipes.fp8_cast_meta)
):
    # fmt: on
    """One tile of x, read once, cast twice: into q's rows and, transposed, into qt's."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    offs_r = pid_r.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = pid_c.to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    rows_in, cols_in = offs_r < R, offs_c < C
    mask = rows_in[:, None] & cols_in[None, :]
    x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask, other=0.0)
    x = x.to(tl.float32)
    fp8 = qt_ptr.dtype.element_ty
    if SCALES == 1:  # each copy its own scales, its own cast
        s_rows = tl.math.div_rn(tl.maximum(tl.load(rmax_ptr + offs_r, mask=rows_in, other=0.0), 1e-12), FP8_MAX)
        s_cols = tl.math.div_rn(tl.maximum(tl.load(cmax_ptr + offs_c, mask=cols_in, other=0.0), 1e-12), FP8_MAX)
        if WRITE_Q:
            y = _fp8_ready(x, s_rows[:, None], _reciprocal(s_rows)[:, None], FP8_MAX, MANTISSA, MIN_EXP, INTERPRETED)
            tl.store(q_ptr + offs_r[:, None] * C + offs_c[None, :], y.to(fp8), mask=mask)
            if pid_c == 0:
                tl.store(s_ptr + offs_r, s_rows, mask=rows_in)
        yt = _fp8_ready(x, s_cols[None, :], _reciprocal(s_cols)[None, :], FP8_MAX, MANTISSA, MIN_EXP, INTERPRETED)
        yt = yt.to(fp8)
        if pid_r == 0:
            tl.store(st_ptr + offs_c, s_cols, mask=cols_in)
    else:  # one scale: one cast, stored twice
        if SCALES == 0:
            amax = tl.load(rmax_ptr)
        else:
            amax = tl.max(tl.max(tl.abs(x), 1), 0)
        scale = tl.math.div_rn(tl.maximum(amax, 1e-12), FP8_MAX)
        inv_scale = _reciprocal(scale)
        yt = _fp8_ready(x, scale, inv_scale, FP8_MAX, MANTISSA, MIN_EXP, INTERPRETED).to(fp8)
        if WRITE_Q:
            tl.store(q_ptr + offs_r[:, None] * C + offs_c[None, :], yt, mask=mask)
            if x_ptr.dtype.element_ty == tl.float32:
                # Triton 3.6 miscompiled qt's copy for fp32 x when one fp8 tensor fed both stores (the
                # H200: 25-45% of qt's bytes wrong, q's right; bf16 and fp16 x, and qt alone, right):
                # qt's from its own read of the tile (from L1/L2, after q's store), as the row recipe's.
                x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask, other=0.0)
                yt = _fp8_ready(x, scale, inv_scale, FP8_MAX, MANTISSA, MIN_EXP, INTERPRETED).to(fp8)
        if SCALES == 2:
            if WRITE_Q:
                tl.store(s_ptr + pid_r * tl.num_programs(1) + pid_c, scale)
            tl.store(st_ptr + pid_c * tl.num_programs(0) + pid_r, scale)
        elif (pid_r == 0) & (pid_c == 0):
            tl.store(st_ptr, scale)
    tl.store(qt_ptr + offs_c[None, :] * R + offs_r[:, None], yt, mask=mask)


def check_pair(x: torch.Tensor, recipe: str, dtype: torch.dtype) -> None:
    if recipe not in PAIR_RECIPES:
        raise ValueError(f"quantize_fp8_pair: expected recipe to be one of {PAIR_RECIPES}, but got {recipe!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"quantize_fp8_pair: expected x of 2 dimensions (R, C), but got {got}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"quantize_fp8_pair: expected x of dtype bfloat16, float16 or float32, but got {x.dtype}")
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"quantize_fp8_pair: expected dtype float8_e4m3fn or float8_e5m2, but got {dtype}")


def plan_pair(x: torch.Tensor, recipe: str, dtype: torch.dtype, write_q: bool = True):
    """`call(x) -> (q, scale, qt, scale_t)` for tensors like x, checked and compiled once;
    without write_q, `call(x) -> (qt, scale_t)`."""
    check_pair(x, recipe, dtype)
    R, C = x.shape
    floor = TINY / fp8_max(dtype)
    group = (SCALE_BLOCK, SCALE_BLOCK) if recipe == "block" else None  # read by the block recipe's shape only
    s_shape, st_shape = scale_shape((R, C), recipe, group), scale_shape((C, R), recipe, group)
    if R * C == 0:

        def empty(x):
            q, qt = x.new_empty((R, C), dtype=dtype), x.new_empty((C, R), dtype=dtype)
            s = torch.full(s_shape, floor, dtype=torch.float32, device=x.device)
            st = s if recipe == "tensor" else torch.full(st_shape, floor, device=x.device)
            return (q, s, qt, st) if write_q else (qt, st)

        return empty
    tile = _CAST_TILE[recipe]
    grid = (cdiv(R, tile[0]), cdiv(C, tile[1]))
    scales = {"tensor": _TENSOR, "row": _ROW, "block": _BLOCK}[recipe]
    meta = dict(SCALES=scales, WRITE_Q=write_q, BLOCK_R=tile[0], BLOCK_C=tile[1], FP8_MAX=fp8_max(dtype),
                **fp8_cast_meta(dtype),
                num_warps=8 if recipe == "block" else 4)  # fmt: skip
    q, qt = x.new_empty((R, C), dtype=dtype), x.new_empty((C, R), dtype=dtype)
    s, st = x.new_empty(s_shape, dtype=torch.float32), x.new_empty(st_shape, dtype=torch.float32)
    # The column maxima start 16-byte aligned, as the kernels were compiled for (Triton specializes a
    # pointer on it): at R = 9 an unpadded offset gave "misaligned address" on the H200.
    rows_padded = cdiv(R, 32) * 32
    rmax, cmax = x.new_zeros((R,), dtype=torch.float32), x.new_zeros((C,), dtype=torch.float32)
    sizes = (R, C, *x.stride())
    cast = compile_launch(_quantize_pair_kernel, grid, (x, q, qt, s, st, rmax, cmax, *sizes), meta, x.device)
    if recipe == "row":
        br, bc = _ROW_COL_ABSMAX_TILE
        absmax = compile_launch(_row_col_absmax_kernel, (cdiv(R, br), cdiv(C, bc)), (x, rmax, cmax, *sizes),
                                dict(BLOCK_R=br, BLOCK_C=bc, num_warps=4), x.device)  # fmt: skip
    elif recipe == "tensor":
        absmax_grid = (cdiv(R, _ABSMAX_TILE[0]), cdiv(C, _ABSMAX_TILE[1]))
        absmax = compile_launch(_absmax_kernel, absmax_grid, (x, rmax, *sizes),
                                dict(BLOCK_R=_ABSMAX_TILE[0], BLOCK_C=_ABSMAX_TILE[1]), x.device)  # fmt: skip

    def call(x):
        qt = x.new_empty((C, R), dtype=dtype)
        st = x.new_empty(st_shape, dtype=torch.float32)
        # Without write_q, q and s are not written: qt and st stand in (the pointers' dtypes the compiled kernel's).
        q = x.new_empty((R, C), dtype=dtype) if write_q else qt
        s = x.new_empty(s_shape, dtype=torch.float32) if write_q and recipe != "tensor" else st
        if recipe == "row":  # every row's and column's absmax, into zeros (one allocation, one fill)
            maxima = x.new_zeros((rows_padded + C,), dtype=torch.float32)
            rmax, cmax = maxima[:R], maxima[rows_padded:]
            absmax(x, rmax, cmax, *sizes)
        elif recipe == "tensor":  # the whole tensor's
            rmax = cmax = x.new_zeros((), dtype=torch.float32)
            absmax(x, rmax, *sizes)
        else:  # each block's, in the cast pass
            rmax = cmax = st  # not read
        cast(x, q, qt, s, st, rmax, cmax, *sizes)
        return (q, s, qt, st) if write_q else (qt, st)

    return call
