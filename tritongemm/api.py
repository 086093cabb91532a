"""The public entry points: `matmul` and `kernels`."""

from __future__ import annotations

import contextlib

import torch

from tritongemm import checks, registry
from tritongemm.config import MatmulConfig

# kernel="auto" takes the first of these that runs on the device, computes the dtype and accepts
# the operands as laid out (Gluon/TMA kernels refuse misaligned or non-unit-stride operands).
# Order from the committed H100 benchmarks (BENCHMARKS.md).
AUTO_ORDER = ("tma_persistent_pipelined", "persistent", "grouped", "naive")
# Decode-sized M (a few tokens) is one row of mostly-padding tiles and memory-bound: the grouped
# kernel measured 0.63-0.93x cuBLAS at M = 1 and 16 on the llm suite, the TMA kernels 0.56-0.79x
# and the persistent one 0.34-0.41x (H100, fp16 and bf16).
SKINNY_M = 16
AUTO_ORDER_SKINNY = ("grouped", "tma_persistent_pipelined", "naive")


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    kernel: str = "auto",
    config: MatmulConfig | str | None = None,
) -> torch.Tensor:
    """C = a @ b for 2D a (M, K) and b (K, N), computed by one of tritongemm's kernels.

    Args:
        a, b: float16, bfloat16 or float32 tensors of one dtype on one CUDA device, with any
            strides (transposed, sliced, padded views are read in place). CPU tensors work
            when TRITON_INTERPRET=1 was set before tritongemm was imported (`triton.language`
            kernels only; slow, for testing). float32 follows torch's TF32 switch,
            ``torch.backends.cuda.matmul.allow_tf32``: when it is True (torch's default is
            False) the products run in TF32 on the tensor cores, as torch.matmul does.
        out: optional (M, N) tensor of the operands' dtype and device to write into; it must
            not overlap a or b. Any strides.
        kernel: "auto" (the fastest available for the device and operands) or a name from
            ``tritongemm.kernels()``. The Gluon/TMA kernels need 16-byte aligned operands with
            a unit-stride last dimension (b may be a transposed (N, K) weight); when named
            explicitly they copy operands that break this into contiguous tensors, and "auto"
            passes such operands to a `triton.language` kernel instead.
        config: None (the kernel's default for this shape and dtype), a MatmulConfig, or
            "autotune" (kernel "grouped" only: tries the seed lesson's five configs per shape).

    Returns:
        out, or a new (M, N) tensor of the operands' dtype. M or N = 0 gives an empty result
        without a launch; K = 0 gives zeros.

    Supports autograd when out is None: the backward pass runs two more tritongemm GEMMs.
    """
    checks.check_operands(a, b)
    # The kernels read raw memory: a negated view (the .imag of a conjugate) must be materialized.
    a, b = a.resolve_neg(), b.resolve_neg()
    info = _resolve_kernel(kernel, a, b)
    checks.check_config(info, config)
    if out is not None:
        checks.check_out(out, a, b)
    elif torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _MatmulFunction.apply(a, b, info.name, config)
    return _matmul(a, b, out, info, config)


def kernels(device: torch.device | str | None = None) -> list[dict]:
    """The ladder, bottom to top: each kernel's name, idea, dtypes, needs, and whether it runs on
    `device` (default: the current CUDA device, else the CPU)."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    return [info.describe() | {"available": info.available_on(device)} for info in registry.all_kernels()]


def _resolve_kernel(name: str, a: torch.Tensor, b: torch.Tensor) -> registry.KernelInfo:
    if not isinstance(name, str):
        raise TypeError(f"matmul: expected kernel to be a str, but got {type(name).__name__}")
    if name != "auto":
        info = registry.get(name)
        checks.check_kernel_dtype(info, a.dtype)
        checks.check_device(info, a.device)
        return info
    order = AUTO_ORDER_SKINNY if a.shape[0] <= SKINNY_M else AUTO_ORDER
    candidates = [registry.get(n) for n in order]
    for info in candidates:
        if info.available_on(a.device) and a.dtype in info.dtypes and info.unsupported_reason(a, b) is None:
            return info
    checks.check_device(candidates[-1], a.device)  # raises the most helpful error
    raise AssertionError("unreachable: the naive kernel takes any operands its device takes")


def _matmul(a, b, out, info: registry.KernelInfo, config) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0 or K == 0:
        result = out if out is not None else torch.empty((M, N), dtype=a.dtype, device=a.device)
        return result.zero_()
    if config is None:
        config = info.default_config(a.dtype, M, N, K, a.device)

    # The kernel's own operands: a, b and out as given where it can use them, else copies.
    a, b, c = info.prepare(a, b, out)
    device_guard = torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext()
    with device_guard:
        info.launch(a, b, c, config)
    if out is None:
        return c if c.is_contiguous() else c.contiguous()
    if c is not out:
        out.copy_(c)
    else:  # written behind autograd's back: bump the version as an in-place op would, so that a
        torch.autograd.graph.increment_version(out)  # backward that saved `out` raises, not misleads
    return out


class _MatmulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, kernel, config):
        ctx.save_for_backward(a, b)
        ctx.kernel = kernel
        return _matmul(a, b, None, registry.get(kernel), config)

    @staticmethod
    def backward(ctx, grad_c):
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        # The forward config fits (M, N, K); the backward GEMMs have other shapes.
        if ctx.needs_input_grad[0]:
            grad_a = matmul(grad_c, b.T, kernel=ctx.kernel)  # (M, N) @ (N, K)
        if ctx.needs_input_grad[1]:
            grad_b = matmul(a.T, grad_c, kernel=ctx.kernel)  # (K, M) @ (M, N)
        return grad_a, grad_b, None, None
