"""`RMSNorm`: transformers' RMSNorm in one kernel forward and one backward.

Eager transformers normalizes with eight torch kernels (x to fp32, its square, the mean, the
epsilon, rsqrt, the scaling, the cast back, the weight), each a pass over an fp32 copy of x, and
autograd runs about a dozen more backward. A decoder layer has two norms before its GEMMs, and
the model one after them. On the H100 (2-layer Llama-3-8B shape, 2048 tokens,
scripts/probes/model/model_profile.py) the five norms took ~0.6 ms of a 4.3 ms prefill and ~2 ms of a 14 ms
training step, more than the GEMM fusions of this package win; torch.compile's Inductor fuses
them into one kernel each, which is most of what it gains over eager.

Two forms, by where the weight is applied (transformers' classes of each: fuse.py):
- Llama's (Qwen2/3, Mistral, Mixtral): y = weight * cast(x * rstd), the normalized x rounded to
  x's dtype before the weight multiplies it, the product in the promoted dtype of the two.
- Gemma's: y = cast(x * rstd * (1 + weight)), all in fp32; its weight is stored as an offset from 1.

rstd = 1 / sqrt(mean(x^2) + eps) per row, in fp32. The forward keeps rstd (4 bytes a row) for the
backward: dx = rstd * (dn - x̂ * mean(dn * x̂)) with dn = dy * w, and dw = sum over rows of dy * x̂
(x̂ rounded as the forward rounds it), from per-program partial sums that one torch sum adds up.
The kernels are in rms_norm_kernels.py, imported on a norm's first call.

Under torch.compile the module runs the torch formula (`rms_norm_reference`), which Inductor fuses
itself, so a compiled model keeps what the compiler does best; so do tensors no kernel serves
(float64, CPU without the interpreter, rows wider than MAX_WIDTH).
"""

from __future__ import annotations

import torch

from tritongemm.core import device_info

MAX_WIDTH = 32768  # a row in registers: past this it would spill (Llama-3-405B's hidden size is 16384)
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INTERPRETER_DTYPES = (torch.float16, torch.float32)  # as the GEMMs': the CPU has no bf16 path here


class _RMSNormFunction(torch.autograd.Function):
    """The norm of rows (M, N) when autograd records: rstd kept, the backward one kernel."""

    @staticmethod
    def forward(ctx, rows, weight, eps, offset, cast):
        y, rstd = _kernels().norm_forward(rows, weight, eps, offset, cast, keep_rstd=True)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.offset, ctx.cast = offset, cast
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        rows, weight, rstd = ctx.saved_tensors
        dy = dy if dy.stride(-1) == 1 else dy.contiguous()
        dx, dw = _kernels().norm_backward(dy, rows, weight, rstd, ctx.offset, ctx.cast)
        return dx, (dw if ctx.needs_input_grad[1] else None), None, None, None


# ----------------------------------------------------------------------------------------------
# The torch formula and the module
# ----------------------------------------------------------------------------------------------


def _kernels():
    """rms_norm_kernels.py, imported on a norm's first call: its kernels import Triton, whose
    decoration reads TRITON_INTERPRET (a program may set it after import tritongemm)."""
    from tritongemm.blocks import rms_norm_kernels

    return rms_norm_kernels


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, cast: bool) -> torch.Tensor:
    """transformers' two forms, op for op: Llama's (`cast`, offset 0) and Gemma's (offset 1); the
    other two pairings as the kernels compute them."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if cast:
        return (weight if offset == 0 else offset + weight) * normed.to(x.dtype)
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
    if x.device.type != "cpu" or x.dtype not in INTERPRETER_DTYPES:
        return False
    return device_info.interpreter_active()


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
        # The fp8 layers this norm feeds (fp8/linear.py's SharedQuantization, set by patch): the
        # forward quantizes its output for them in its own kernel, saving them a launch and a
        # read of the output, where that group can take it (row or 1 x 128 block recipe).
        self.fp8_share = None

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
            share = self.fp8_share
            # An inference tensor has no version counter, so the group keeps nothing for it.
            if share is not None and share.takes(rows.shape[1]) and not x.is_inference():
                y, q, scale = _kernels().norm_forward_quantized(
                    rows, self.weight, self.eps, self.offset, self.cast, share.recipe
                )
                y = y.view(*x.shape[:-1], y.shape[-1])
                share.offer(y, (q, scale))
                return y
            y, _ = _kernels().norm_forward(rows, self.weight, self.eps, self.offset, self.cast, keep_rstd=False)
        return y.view(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, offset={self.offset}, cast={self.cast}"
