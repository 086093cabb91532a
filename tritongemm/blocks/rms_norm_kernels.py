"""The kernels behind `RMSNorm` (rms_norm.py, which says what they compute and why) and their
launchers, compiled once per problem and kept in plan.PLANS. Imported on a norm's first call, not
with tritongemm: Triton reads TRITON_INTERPRET when a kernel is decorated."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from tritongemm.plan import PLANS, tensor_facts

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
    M, N, stride_xm, stride_ym, eps,
    OFFSET: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr, KEEP_RSTD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x, rstd, x_hat = _normalized(x_ptr, rows, cols, mask, N, stride_xm, eps)
    if CAST_BEFORE_WEIGHT:
        x_hat = x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32) + OFFSET
    y = x_hat * w[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if KEEP_RSTD:
        tl.store(rstd_ptr + rows, rstd, mask=rows < M)


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


# Whether Triton decorated these kernels for its CPU interpreter (TRITON_INTERPRET=1 at their import).
INTERPRETED = isinstance(_rms_norm_forward_kernel, InterpretedFunction)


# ----------------------------------------------------------------------------------------------
# Launchers: compiled once per problem (the plan key holds every fact they read)
# ----------------------------------------------------------------------------------------------


def _blocks(N: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for rows of N."""
    block_n = triton.next_power_of_2(N)
    block_m = max(1, min(32, ROW_ELEMENTS // block_n))
    return block_m, block_n, max(1, min(16, block_m * block_n // 512))


def _forward_plan(x, weight, y_dtype, eps, offset, cast, keep_rstd):
    from tritongemm.fast_launch import compile_launch

    M, N = x.shape
    y_like = torch.empty((M, N), dtype=y_dtype, device=x.device)
    rstd_like = torch.empty(M if keep_rstd else 1, dtype=torch.float32, device=x.device)
    if M == 0:
        return lambda x, weight: (torch.empty_like(y_like), torch.empty_like(rstd_like))
    block_m, block_n, warps = _blocks(N)
    meta = dict(OFFSET=offset, CAST_BEFORE_WEIGHT=cast, KEEP_RSTD=keep_rstd, BLOCK_M=block_m, BLOCK_N=block_n,
                num_warps=warps)  # fmt: skip
    args = (x, weight, y_like, rstd_like, M, N, x.stride(0), N, eps)
    launch = compile_launch(_rms_norm_forward_kernel, (triton.cdiv(M, block_m),), args, meta, x.device)

    def call(x, weight):
        y, rstd = torch.empty_like(y_like), torch.empty_like(rstd_like)
        launch(x, weight, y, rstd, M, N, x.stride(0), N, eps)
        return y, rstd

    return call


def _backward_plan(dy, x, weight, rstd, offset, cast):
    from tritongemm import device_info
    from tritongemm.fast_launch import compile_launch

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
    y_dtype = torch.promote_types(x.dtype, weight.dtype) if cast else x.dtype
    key = ("rms_norm", eps, offset, cast, keep_rstd, y_dtype, tensor_facts(x), tensor_facts(weight))
    call = PLANS.find_key(key)
    if call is None:
        call = _forward_plan(x, weight, y_dtype, eps, offset, cast, keep_rstd)
        PLANS.remember(key, call)
    return call(x, weight)


def norm_backward(dy, x, weight, rstd, offset, cast):
    """(dx, dw) from dy and the forward's rows and rstd."""
    key = ("rms_norm_backward", offset, cast, tensor_facts(dy), tensor_facts(x), tensor_facts(weight))
    call = PLANS.find_key(key)
    if call is None:
        call = _backward_plan(dy, x, weight, rstd, offset, cast)
        PLANS.remember(key, call)
    return call(dy, x, weight, rstd)
