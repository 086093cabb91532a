"""`RMSNorm`: transformers' RMSNorm in one kernel forward and one backward.

Eager transformers normalizes with eight torch kernels (x to fp32, its square, the mean, the
epsilon, rsqrt, the scaling, the cast back, the weight), each a pass over an fp32 copy of x, and
autograd runs about a dozen more backward. A decoder layer has two norms before its GEMMs, and
the model one after them. On the H100 (2-layer Llama-3-8B shape, 2048 tokens,
scripts/model_profile.py) the five norms took ~0.6 ms of a 4.3 ms prefill and ~2 ms of a 14 ms
training step, more than the GEMM fusions of this package win; torch.compile's Inductor fuses
them into one kernel each, which is most of what it gains over eager.

Two forms, by where the weight is applied (transformers' classes of each: fuse.py):
- Llama's (Qwen2/3, Mistral, Mixtral): y = weight * cast(x * rstd), the normalized x rounded to
  x's dtype before the weight multiplies it, the product in the promoted dtype of the two.
- Gemma's: y = cast(x * rstd * (1 + weight)), all in fp32; its weight is stored as an offset from 1.

rstd = 1 / sqrt(mean(x^2) + eps) per row, in fp32. The forward keeps rstd (4 bytes a row) for the
backward: dx = rstd * (dn - x̂ * mean(dn * x̂)) with dn = dy * w, and dw = sum over rows of dy * x̂
(x̂ rounded as the forward rounds it), from per-program partial sums that one torch sum adds up.

Under torch.compile the module runs the torch formula (`rms_norm_reference`), which Inductor fuses
itself, so a compiled model keeps what the compiler does best; so do tensors no kernel serves
(float64, CPU without the interpreter, rows wider than MAX_WIDTH).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from tritongemm.plan import PLANS, tensor_facts

MAX_WIDTH = 32768  # a row in registers: past this it would spill (Llama-3-405B's hidden size is 16384)
ROW_ELEMENTS = 4096  # elements a program holds at once: rows of 128 (Qwen3's q/k norms) go 32 a program
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INTERPRETER_DTYPES = (torch.float16, torch.float32)  # as the GEMMs': the CPU has no bf16 path here


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


_INTERPRETED = isinstance(_rms_norm_forward_kernel, InterpretedFunction)


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


def _forward(x, weight, eps, offset, cast, keep_rstd):
    y_dtype = torch.promote_types(x.dtype, weight.dtype) if cast else x.dtype
    key = ("rms_norm", eps, offset, cast, keep_rstd, y_dtype, tensor_facts(x), tensor_facts(weight))
    call = PLANS.find_key(key)
    if call is None:
        call = _forward_plan(x, weight, y_dtype, eps, offset, cast, keep_rstd)
        PLANS.remember(key, call)
    return call(x, weight)


def _backward(dy, x, weight, rstd, offset, cast):
    key = ("rms_norm_backward", offset, cast, tensor_facts(dy), tensor_facts(x), tensor_facts(weight))
    call = PLANS.find_key(key)
    if call is None:
        call = _backward_plan(dy, x, weight, rstd, offset, cast)
        PLANS.remember(key, call)
    return call(dy, x, weight, rstd)


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, weight, eps, offset, cast):
        y, rstd = _forward(rows, weight, eps, offset, cast, keep_rstd=True)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.offset, ctx.cast = offset, cast
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        rows, weight, rstd = ctx.saved_tensors
        dy = dy if dy.stride(-1) == 1 else dy.contiguous()
        dx, dw = _backward(dy, rows, weight, rstd, ctx.offset, ctx.cast)
        return dx, (dw if ctx.needs_input_grad[1] else None), None, None, None


# ----------------------------------------------------------------------------------------------
# The torch formula and the module
# ----------------------------------------------------------------------------------------------


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, cast: bool) -> torch.Tensor:
    """transformers' two forms, op for op: Llama's (`cast`, offset 0) and Gemma's (offset 1)."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if cast:
        return weight * normed.to(x.dtype)
    return (normed * (offset + weight.float())).to(x.dtype)


def kernel_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernels take x and weight (else the module computes the torch formula, which
    also raises torch's errors for a weight of the wrong size). CPU tensors run where these
    kernels were decorated for the interpreter: TRITON_INTERPRET=1 before tritongemm's import."""
    width = x.shape[-1]
    if not 0 < width <= MAX_WIDTH or weight.shape != (width,) or weight.stride(0) != 1 or weight.device != x.device:
        return False
    if weight.dtype not in KERNEL_DTYPES:
        return False
    if x.is_cuda:
        return x.dtype in KERNEL_DTYPES
    return x.device.type == "cpu" and _INTERPRETED and x.dtype in INTERPRETER_DTYPES


class RMSNorm(torch.nn.Module):
    """y = norm(x) scaled by `weight`, over x's last axis, as transformers' RMSNorm computes it
    (`offset` 0 and `cast` True: Llama's; offset 1, cast False: Gemma's), forward and backward one
    kernel each. `from_norm` takes a transformers module's weight (the same Parameter) and eps; the
    state_dict keeps its one key, `weight`."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, offset: float = 0.0, cast: bool = True,
                 device=None, dtype=None) -> None:  # fmt: skip
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((hidden_size,), 1.0 - offset, device=device, dtype=dtype))
        self.eps, self.offset, self.cast = float(eps), float(offset), cast

    @classmethod
    def from_norm(cls, norm: torch.nn.Module, eps: float, offset: float, cast: bool) -> RMSNorm:
        new = cls(norm.weight.shape[0], eps, offset=offset, cast=cast, device="meta")
        new.weight = norm.weight
        new.train(norm.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() or not kernel_serves(x, self.weight):
            return rms_norm_reference(x, self.weight, self.eps, self.offset, self.cast)
        rows = x.reshape(-1, x.shape[-1])
        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        if torch.is_grad_enabled() and (rows.requires_grad or self.weight.requires_grad):
            y = _RMSNormFunction.apply(rows, self.weight, self.eps, self.offset, self.cast)
        else:
            y, _ = _forward(rows, self.weight, self.eps, self.offset, self.cast, keep_rstd=False)
        return y.view(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, offset={self.offset}, cast={self.cast}"
