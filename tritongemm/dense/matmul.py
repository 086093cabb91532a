"""`tritongemm.matmul`: C = a @ b by one of tritongemm's kernels, and the `torch.ops.tritongemm.mm`
operator that a compiled graph holds, in one file, in the order of an op file here: the direct
path, the operator, autograd, the public function.

One call path, top to bottom: an N-D `a` is folded into 2-D; the problem's launch plan is looked
up (checked, chosen and compiled on the problem's first call: dense/build.py, kept in the plan
cache); then launched. Under `torch.compile` the call becomes the operator instead, whose
implementation runs this same path when the compiled graph executes.
"""

from __future__ import annotations

import math

import torch

from tritongemm.core import checks, operators, registry
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Fused
from tritongemm.core.operators import LIB, config_of, label_of, register_autograd
from tritongemm.core.plans import PLANS, PlanCache
from tritongemm.core.problem import Gemm
from tritongemm.dense.plan import Plan, problem_key

# ----------------------------------------------------------------------------------------------
# The direct path: a plan per problem, built on its first call
# ----------------------------------------------------------------------------------------------


def lookup(a, b, out, kernel, config, fused: Fused | None = None, cache: PlanCache = PLANS,
           problem: Gemm | None = None) -> Plan:  # fmt: skip
    """The plan for this call's problem, checked and built on a miss (`cache`: the one every call
    shares; the tests pass their own). `problem`: the call's, where a caller checked it already
    (linear's, whose checks cover its GEMM's)."""
    try:
        key = problem_key(a, b, out, kernel, config, fused)
    except (AttributeError, RuntimeError, TypeError):  # not a strided tensor: the checks say so
        key = None

    def build() -> Plan:
        return _build(checks.gemm(a, b, out, kernel, config, fused) if problem is None else problem)

    return cache.planned(key, build)


def _build(problem: Gemm) -> Plan:
    # Planning imports the kernels, and with them Triton: on the first plan, not at import (a
    # kernel's decoration reads TRITON_INTERPRET, which a program may set after import tritongemm).
    from tritongemm.dense import build

    return build.build_plan(problem)


def _matmul_nd(a: torch.Tensor, b, out, kernel, config) -> torch.Tensor:
    """(..., M, K) @ (K, N): fold the leading dimensions into M, as torch.matmul does; the folded
    problem is checked as its plan is built, and the errors name the folded (M', K) operand, as
    torch.matmul's do."""
    *batch, M, K = a.shape
    a2 = a.reshape(math.prod(batch) * M, K)  # a view whenever the strides allow; else a copy, as torch.matmul
    # makes. Sizes, not -1: a reshape cannot infer -1 when K = 0.
    if out is None:
        c = matmul(a2, b, kernel=kernel, config=config)
        return c.view(*batch, M, c.shape[1])
    checks.check_operands(a, b)  # out's shape (..., M, N) reads b's
    N = b.shape[1]
    checks.check_out_shape(out, (*batch, M, N))
    try:
        out2 = out.view(math.prod(batch) * M, N)
    except RuntimeError:  # out's leading dimensions don't fold: compute, then copy in
        checks.check_out(out, a, b, shape=(*batch, M, N))
        checks.check_out_call(out, a, b)
        return out.copy_(matmul(a2, b, kernel=kernel, config=config).view(out.shape))
    matmul(a2, b, out=out2, kernel=kernel, config=config)
    return out


# ----------------------------------------------------------------------------------------------
# The operator
# ----------------------------------------------------------------------------------------------


# The kernel's argument is `kernel_name`: Inductor passes an operator's arguments by name to a
# function whose first parameter is `kernel`, and a `kernel` argument collides with it.
LIB.define("mm(Tensor a, Tensor b, str kernel_name='auto', str? config=None) -> Tensor")


def mm_impl(a: torch.Tensor, b: torch.Tensor, kernel_name: str = "auto", config: str | None = None) -> torch.Tensor:
    """a (..., M, K) @ b (K, N) -> (..., M, N) by a tritongemm kernel. `config`: None, "autotune"
    or a `MatmulConfig.short()` label (an operator takes strings, not Python objects)."""
    # The public function takes its direct path here: a graph's run is not traced (is_compiling()
    # is False), and the operator's own autograd (below) differentiates it.
    with torch.no_grad():
        return matmul(a, b, kernel=kernel_name, config=config_of(config))


LIB.impl("mm", mm_impl, "CompositeExplicitAutograd")
mm_op = torch.ops.tritongemm.mm.default


@torch.library.register_fake("tritongemm::mm", lib=LIB)
def _mm_fake(a, b, kernel_name="auto", config=None):
    operators.traced()
    checks.check_operands(a, b)
    if kernel_name not in registry.POLICIES:
        registry.get(kernel_name)  # an unknown name fails while tracing, not when the graph runs
    config_of(config)
    return a.new_empty((*a.shape[:-1], b.shape[1]))  # contiguous, as the real one returns


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


def gemm_grads(grad_c, a, b, needs_grad: tuple[bool, bool], mm) -> tuple:
    """dA = dC @ B^T and dB = A^T @ dC, computed by `mm`, for a (..., M, K) and b (K, N); the
    leading dimensions of a and dC fold into the reduction of dB.

    Each gradient comes out in its operand's layout, as torch's own mm backward does: for a
    column-major b (a weight's `.T`, the usual case) dB is computed as (dC^T @ A)^T, so that it
    reaches the (N, K) weight contiguous. Computed the other way, autograd copies the (K, N)
    gradient into the weight's layout, a strided transpose: ~1 ms a step for each gate/up weight
    of Llama-3-8B at 2048 tokens (H100, scripts/probes/model/model_profile.py, compiled GatedMLP)."""
    grad_a = grad_b = None
    if needs_grad[0]:
        if a.dim() == 2 and _column_major(a):
            grad_a = mm(b, grad_c.T).T  # ((K, N) @ (N, M))^T: (M, K) in a's layout
        else:
            grad_a = mm(grad_c, b.T)  # (..., M, N) @ (N, K)
    if needs_grad[1]:
        rows = math.prod(a.shape[:-1])  # not -1: a reshape cannot infer it when K or N is 0
        a_rows, grad_rows = a.reshape(rows, a.shape[-1]), grad_c.reshape(rows, grad_c.shape[-1])
        if _column_major(b):
            grad_b = mm(grad_rows.T, a_rows).T  # ((N, M') @ (M', K))^T: (K, N) in b's layout
        else:
            grad_b = mm(a_rows.T, grad_rows)  # (K, M') @ (M', N)
    return grad_a, grad_b


def _column_major(t: torch.Tensor) -> bool:
    """A 2-D tensor laid out column by column (the transpose of a contiguous one), by torch's own
    test in its mm backward (strides (1, rows))."""
    return t.stride(0) == 1 and t.stride(1) == t.shape[0]


def _setup_context(ctx, inputs, output):
    a, b, kernel, _ = inputs
    ctx.save_for_backward(a, b)
    ctx.kernel = kernel


def _backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    # The forward's config fits (M, N, K); the backward GEMMs have other shapes.
    grad_a, grad_b = gemm_grads(grad_c, a, b, ctx.needs_input_grad[:2], lambda x, y: mm_op(x, y, ctx.kernel))
    return grad_a, grad_b, None, None


register_autograd(mm_op, mm_impl, _setup_context, _backward)


class _MatmulFunction(torch.autograd.Function):
    """Eager autograd for 2-D matmul; under torch.compile the operator's autograd serves."""

    @staticmethod
    def forward(ctx, a, b, plan, kernel):
        ctx.save_for_backward(a, b)
        ctx.kernel = kernel
        return plan.run(a, b, None)

    @staticmethod
    def backward(ctx, grad_c):
        a, b = ctx.saved_tensors
        # The forward's config fits (M, N, K); the backward GEMMs have other shapes.
        mm = lambda x, y: matmul(x, y, kernel=ctx.kernel)  # noqa: E731
        grad_a, grad_b = gemm_grads(grad_c, a, b, ctx.needs_input_grad[:2], mm)
        return grad_a, grad_b, None, None


# ----------------------------------------------------------------------------------------------
# The public function
# ----------------------------------------------------------------------------------------------


def traced_matmul(a, b, out, kernel, config) -> torch.Tensor:
    """`tritongemm.matmul` while torch.compile traces it: the operator, then out= as a copy. out's
    shape, dtype, device and autograd are checked as in eager mode; what eager mode also refuses
    (a negated or self-overlapping out, one aliasing the inputs) `copy_` handles as torch does."""
    label = label_of(config)
    if out is not None:
        checks.check_operands(a, b)
        checks.check_out_metadata(out, a, (*a.shape[:-1], b.shape[1]))
        checks.check_out_grad(out, a, b)
    result = mm_op(a, b, kernel, label)
    if out is None:
        return result
    return out.copy_(result)


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    kernel: str = "auto",
    config: MatmulConfig | str | None = None,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """C = a @ b for a (..., M, K) and a 2D b (K, N), computed by one of tritongemm's kernels.

    Args:
        a: (M, K), or (..., M, K) as `torch.matmul` takes it (an activation of shape
            (batch, seq, hidden)): the leading dimensions fold into M, without a copy whenever
            they can be viewed so, and the result is (..., M, N).
        b: (K, N). a and b are float16, bfloat16 or float32 tensors of one dtype on one CUDA
            device, with any strides (transposed, sliced, padded views are read in place). CPU
            tensors work when TRITON_INTERPRET=1 was set before tritongemm was imported
            (`triton.language` kernels only; slow, for testing). float32 follows torch's TF32
            switch, ``torch.backends.cuda.matmul.allow_tf32``: when it is True (torch's default
            is False) the products run in TF32 on the tensor cores, as torch.matmul does.
        out: optional tensor of the result's shape, dtype and device to write into; it must
            not overlap a or b. Any strides.
        kernel: "auto" (the fastest available for the device and operands) or a name from
            ``tritongemm.kernels(family="matmul")``. The Gluon/TMA kernels need 16-byte aligned operands with
            a unit-stride last dimension (either operand may be a transposed view); when named
            explicitly they copy operands that break this into contiguous tensors, and "auto"
            passes such operands to a `triton.language` kernel instead, or, for a problem large
            enough to repay the copy, to a TMA kernel with aligned copies (dispatch.STAGING_MIN_FLOPS).
        config: None (the kernel's default for this shape and dtype), a MatmulConfig, or
            "autotune" (kernel "grouped" only: tries the seed lesson's five configs per shape).
        batch_invariant: each row of the result the same bits whatever the other rows of a are,
            however many (kernel "auto" and config None only): K is never split, and the
            kernels chosen for different M share their arithmetic (dispatch/invariant.py, and
            docs/batch-invariance.md for what it costs). The backward's GEMMs are invariant too.

    Returns:
        out, or a new tensor of the operands' dtype. M or N = 0 gives an empty result without
        a launch; K = 0 gives zeros.

    Supports autograd when out is None (the backward pass runs two more tritongemm GEMMs) and
    `torch.compile` (through the `torch.ops.tritongemm.mm` operator).
    """
    if batch_invariant is not False:
        kernel = checks.invariant_kernel(kernel, batch_invariant, "matmul")
    if torch.compiler.is_compiling():
        return traced_matmul(a, b, out, kernel, config)
    if isinstance(a, torch.Tensor) and a.dim() > 2:
        return _matmul_nd(a, b, out, kernel, config)
    plan = lookup(a, b, out, kernel, config)
    if out is not None:
        checks.check_out_call(out, a, b)
    elif torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _MatmulFunction.apply(a, b, plan, kernel)
    return plan.run(a, b, out)
