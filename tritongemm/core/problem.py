"""What a plan reads of a call's tensors (the facts its key holds), and the checked problem it is
built from.

A plan (a kernel chosen, a config, copies decided, a launch compiled) depends on an operand's
dtype, device, shape and strides, on whether its data pointer is 16-byte aligned (Triton
specializes on it, TMA requires it) and on whether it is a negated view; never on the pointer
itself. Every family's plan key is built from `tensor_facts`, so a call with other facts misses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def tensor_facts(t: torch.Tensor | None) -> tuple | None:
    """What a plan reads of an operand: dtype, device, shape, strides, whether its data pointer is
    16-byte aligned, whether it is a negated view."""
    if t is None:
        return None
    return t.dtype, t.device, t.shape, t.stride(), t.data_ptr() % 16 == 0, t.is_neg()


# What `torch.backends.cuda.matmul.allow_tf32` returns, read without its module's __getattr__:
# 0.06 us a call instead of 0.5 (measured on this repository's CPU machine), on every fp32 call.
allow_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", None) or (lambda: torch.backends.cuda.matmul.allow_tf32)


def requires_grad(*tensors) -> bool:
    """Whether any of the arguments is a tensor that requires grad (non-tensors are skipped)."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


@dataclass(frozen=True)
class Gemm:
    """One GEMM as its plan is built from it: C (M, N) = A (M, K) @ B (K, N), checked once
    (`checks.gemm` for matmul, `checks.linear` for linear's), so that the dispatch and the builder
    read it and check nothing again. Lives while its plan is built: a plan keeps no tensor."""

    a: torch.Tensor  # (M, K), a negated view resolved
    b: torch.Tensor  # (K, N), likewise
    out: torch.Tensor | None  # the caller's (M, N) output, its geometry checked; None: a fresh one
    out_dtype: torch.dtype  # C's: the operands' for matmul, linear's out_dtype
    kernel: str  # as asked: "auto" or a `matmul` kernel's name
    info: object  # that kernel's registry row (core.registry.KernelInfo); None for "auto"
    config: object  # None, a MatmulConfig or "autotune", as given
    fused: object = None  # linear's epilogue (core.epilogue.Fused), or None
    resolve_neg: bool = False  # a or b was a negated view: each call resolves it first

    @staticmethod
    def of(a, b, out, out_dtype, kernel, info, config, fused=None) -> Gemm:
        """The problem of checked operands, the one way to build one: a negated view
        (torch._neg_view) is resolved here, and the plan resolves it again on every call."""
        resolve_neg = a.is_neg() or b.is_neg()
        return Gemm(a.resolve_neg(), b.resolve_neg(), out, out_dtype, kernel, info, config, fused, resolve_neg)

    @property
    def M(self) -> int:
        return self.a.shape[0]

    @property
    def K(self) -> int:
        return self.a.shape[1]

    @property
    def N(self) -> int:
        return self.b.shape[1]

    @property
    def empty(self) -> bool:
        """Nothing to launch: an empty result, or a zero sum when K = 0."""
        return self.M == 0 or self.N == 0 or self.K == 0
