"""The kernels behind `RMSNorm` (rms_norm.py, which says what they compute and why) and their
launchers, compiled once per problem and kept in core.plans.PLANS. Imported on a norm's first call, not
with tritongemm: Triton reads TRITON_INTERPRET when a kernel is decorated."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongemm.core import device_info
from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts
from tritongemm.fp8.recipes import fp8_cast_meta, fp8_max
from tritongemm.fp8.tl import _fp8_ready, _reciprocal
from tritongemm.primitives.launch import compile_launch

ROW_ELEMENTS = 4096  # elements a program holds at once: rows of 128 (Qwen3's q/k norms) go 32 a program


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _normalized(x_ptr, rows, cols, mask, N, stride_xm, eps):
    """x's block in fp32, its rows' rstd, and x̂ = x * rstd."""
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    return x, rstd, x * rstd[:, None]


@triton.jit
def _rms_norm_forward_kernel(
    x_ptr, w_ptr, y_ptr, rstd_ptr,  # (M, N), (N,), (M, N), (M,) fp32
    q_ptr, s_ptr,  # QUANT: y's fp8 copy (M, N) and its scales, (M, 1) or (M, N / 128) fp32
    M, N, stride_xm, stride_ym, stride_sm, eps,
    OFFSET: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr, KEEP_RSTD: tl.constexpr,
    QUANT: tl.constexpr,  # "none", or fp8 quantize_fp8's recipe of y as stored: "row" or "block" (1 x 128)
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr,  # QUANT's fp8 format
    INTERPRETED: tl.constexpr,  # under Triton's interpreter (recipes.fp8_cast_meta)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x, rstd, x_hat = _normalized(x_ptr, rows, cols, mask, N, stride_xm, eps)
    if CAST_BEFORE_WEIGHT:
        x_hat = x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32) + OFFSET
    y = (x_hat * w[None, :]).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y, mask=mask)
    if KEEP_RSTD:
        tl.store(rstd_ptr + rows, rstd, mask=rows < M)
    if QUANT != "none":
        # quantize_fp8's arithmetic on the rows as stored (fp8/tl.py), while they are in
        # registers: the program holds whole rows, so a row's or a 1 x 128 block's absmax is here.
        y = y.to(tl.float32)  # padding columns are 0: no absmax, no store
        if QUANT == "row":
            scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(y), axis=1), 1e-12), FP8_MAX)
            q = _fp8_ready(y, scale[:, None], _reciprocal(scale)[:, None], FP8_MAX, MANTISSA, MIN_EXP, INTERPRETED)
            tl.store(s_ptr + rows * stride_sm, scale, mask=rows < M)
        else:
            GROUPS: tl.constexpr = BLOCK_N // 128
            blocks = tl.reshape(y, (BLOCK_M, GROUPS, 128))
            scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(blocks), axis=2), 1e-12), FP8_MAX)
            inv_scale = _reciprocal(scale)[:, :, None]
            q = _fp8_ready(blocks, scale[:, :, None], inv_scale, FP8_MAX, MANTISSA, MIN_EXP, INTERPRETED)
            q = tl.reshape(q, (BLOCK_M, BLOCK_N))
            groups = tl.arange(0, GROUPS)
            s_mask = (rows[:, None] < M) & (groups[None, :] < N // 128)
            tl.store(s_ptr + rows[:, None] * stride_sm + groups[None, :], scale, mask=s_mask)
        tl.store(q_ptr + rows[:, None] * N + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_backward_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr,  # (M, N), (M, N), (N,), (M,), (M, N), (programs, N) fp32
    M, N, stride_dym, stride_xm, stride_dxm, blocks_per_program,
    OFFSET: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32) + OFFSET
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # Each program takes consecutive blocks of rows and adds up their share of dw in registers.
    for block in range(pid * blocks_per_program, (pid + 1) * blocks_per_program):
        rows = (block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x_hat = x * rstd[:, None]
        dn = dy * w[None, :]
        dx = rstd[:, None] * (dn - x_hat * (tl.sum(dn * x_hat, axis=1) / N)[:, None])
        tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if CAST_BEFORE_WEIGHT:
            x_hat = x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
        dw += dy * x_hat  # masked rows and columns load zeros: they add nothing
    tl.store(dw_ptr + pid * N + cols, tl.sum(dw, axis=0), mask=cols < N)


# ----------------------------------------------------------------------------------------------
# Launchers: compiled once per problem (the plan key holds every fact they read)
# ----------------------------------------------------------------------------------------------


def _blocks(N: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for rows of N."""
    block_n = triton.next_power_of_2(N)
    block_m = max(1, min(32, ROW_ELEMENTS // block_n))
    return block_m, block_n, max(1, min(16, block_m * block_n // 512))


def _forward_plan(x, weight, y_dtype, eps, offset, cast, keep_rstd, quantize=None):
    """`call(x, weight) -> (y, rstd)`, or with `quantize` ("row" or "block") `-> (y, q, scale)`:
    y's e4m3 copy and scales as `quantize_fp8(y, quantize)` gives them."""
    M, N = x.shape
    if quantize not in (None, "row", "block") or (quantize == "block" and N % 128):
        raise ValueError(f"norm_forward_quantized: takes recipe 'row', or 'block' with N % 128 == 0; got "
                         f"{quantize!r}, N = {N}")  # fmt: skip
    fp8 = torch.float8_e4m3fn
    y_like = torch.empty((M, N), dtype=y_dtype, device=x.device)
    rstd_like = torch.empty(M if keep_rstd else 1, dtype=torch.float32, device=x.device)
    q_like = torch.empty((M, N) if quantize else (1,), dtype=fp8, device=x.device)
    s_like = torch.empty((M, N // 128 if quantize == "block" else 1), dtype=torch.float32, device=x.device)
    if M == 0:
        if quantize:
            return lambda x, weight: (torch.empty_like(y_like), torch.empty_like(q_like), torch.empty_like(s_like))
        return lambda x, weight: (torch.empty_like(y_like), torch.empty_like(rstd_like))
    block_m, block_n, warps = _blocks(N)
    meta = dict(OFFSET=offset, CAST_BEFORE_WEIGHT=cast, KEEP_RSTD=keep_rstd, QUANT=quantize or "none",
                FP8_MAX=fp8_max(fp8), **fp8_cast_meta(fp8),
                BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)  # fmt: skip
    sizes = (M, N, x.stride(0), N, s_like.stride(0), eps)
    launch = compile_launch(_rms_norm_forward_kernel, (triton.cdiv(M, block_m),),
                            (x, weight, y_like, rstd_like, q_like, s_like, *sizes), meta, x.device)  # fmt: skip

    if quantize:

        def quantizing_call(x, weight):
            y, q, scale = torch.empty_like(y_like), torch.empty_like(q_like), torch.empty_like(s_like)
            launch(x, weight, y, rstd_like, q, scale, *sizes)  # rstd not kept: its buffer is not written
            return y, q, scale

        return quantizing_call

    def call(x, weight):
        y, rstd = torch.empty_like(y_like), torch.empty_like(rstd_like)
        launch(x, weight, y, rstd, q_like, s_like, *sizes)  # not quantizing: q and scale not written
        return y, rstd

    return call


def _backward_plan(dy, x, weight, rstd, offset, cast):
    M, N = x.shape
    if M == 0:
        return lambda dy, x, weight, rstd: (torch.empty_like(x), torch.zeros_like(weight))
    block_m, block_n, warps = _blocks(N)
    blocks = triton.cdiv(M, block_m)
    # Two programs an SM keep the loads in flight; more would only lengthen the partial sum.
    slots = 2 * device_info.sm_count(x.device) if x.is_cuda else 4
    per_program = triton.cdiv(blocks, min(blocks, slots))
    programs = triton.cdiv(blocks, per_program)
    dx_like = torch.empty((M, N), dtype=x.dtype, device=x.device)
    partial_like = torch.empty((programs, N), dtype=torch.float32, device=x.device)
    meta = dict(OFFSET=offset, CAST_BEFORE_WEIGHT=cast, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    args = (dy, x, weight, rstd, dx_like, partial_like, M, N, dy.stride(0), x.stride(0), N, per_program)
    launch = compile_launch(_rms_norm_backward_kernel, (programs,), args, meta, x.device)

    def call(dy, x, weight, rstd):
        dx, partial = torch.empty_like(dx_like), torch.empty_like(partial_like)
        launch(dy, x, weight, rstd, dx, partial, M, N, dy.stride(0), x.stride(0), N, per_program)
        return dx, partial.sum(0).to(weight.dtype)

    return call


def norm_forward(x, weight, eps, offset, cast, keep_rstd):
    """(y, rstd) for rows x (M, N) with unit column stride; rstd (M,) fp32 where `keep_rstd`."""
    return _planned_forward(x, weight, eps, offset, cast, keep_rstd, None)


def norm_forward_quantized(x, weight, eps, offset, cast, recipe):
    """(y, y_fp8, scale) for rows x (M, N) with unit column stride: y, the norm, and in the same
    kernel `quantize_fp8(y, recipe)`'s result, value for value ("row", or "block" with N a multiple
    of 128). y is `norm_forward`'s but for a last bit here and there on the GPU, where the compiler
    may sum a row's squares in another order in this kernel."""
    return _planned_forward(x, weight, eps, offset, cast, False, recipe)


def _planned_forward(x, weight, eps, offset, cast, keep_rstd, quantize):
    y_dtype = torch.promote_types(x.dtype, weight.dtype) if cast else x.dtype
    key = ("rms_norm", eps, offset, cast, keep_rstd, quantize, y_dtype, tensor_facts(x), tensor_facts(weight))
    call = planned(key, lambda: _forward_plan(x, weight, y_dtype, eps, offset, cast, keep_rstd, quantize))
    return call(x, weight)


def norm_backward(dy, x, weight, rstd, offset, cast):
    """(dx, dw) from dy and the forward's rows and rstd."""
    key = ("rms_norm_backward", offset, cast, tensor_facts(dy), tensor_facts(x), tensor_facts(weight))
    call = planned(key, lambda: _backward_plan(dy, x, weight, rstd, offset, cast))
    return call(dy, x, weight, rstd)
