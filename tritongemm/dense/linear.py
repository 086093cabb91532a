"""`tritongemm.linear`: `torch.nn.functional.linear` with its epilogue in the GEMM's store.

    y = activation(alpha * x @ weight.T + bias) + residual

One kernel writes y, where torch writes the GEMM's output, reads it back for the bias and the
activation, and again for the residual. The call path is matmul's (dense/matmul.py): x folds to
2-D, `weight.T` is the (K, N) operand as a view (no copy: every kernel reads a transposed B), and
the plan's key also holds the epilogue and its tensors' layouts (epilogue.Fused). In an op file's
order: the direct path, the `torch.ops.tritongemm.linear` operator, autograd, the public function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tritongemm.core import checks, operators, registry
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Epilogue, Fused, activate_torch, activation_backward
from tritongemm.core.operators import LIB, config_of, label_of, register_autograd
from tritongemm.core.plans import planned
from tritongemm.core.problem import Gemm, allow_tf32, requires_grad, tensor_facts
from tritongemm.dense.matmul import lookup
from tritongemm.dense.plan import Plan

# ----------------------------------------------------------------------------------------------
# The direct path: a call planned once per problem
# ----------------------------------------------------------------------------------------------


# How the eager backward gets the pre-activation z that an activation's derivative reads:
# "store" has the forward's epilogue write it beside y (QuACK's store_preact; M x N of out_dtype
# held until the backward, what torch keeps for F.gelu(F.linear(...)) too), "recompute" runs the
# GEMM again in the backward (no memory, one more GEMM). Which is faster is for the H100 to say
# (docs/epilogue.md); "store" costs a write of M x N where "recompute" costs 2MNK FLOPs.
PREACT = "store"


def direct_linear(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config) -> torch.Tensor:
    """`linear` without autograd, on the hot path: the backward's GEMMs (a training step runs the
    same ones every step) and the operator's implementation. On the H100, Pythia-1.4B's eager
    train step spent 325 us of host time per linear's backward when these planned every call."""
    return planned_call(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config, False).run(
        x, weight, bias, residual
    )[0]


def planned_call(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config, store_preact: bool):
    """The LinearCall (an EmptyLinear for M, N or K = 0) for these arguments: the hot path's, when
    a call like this one was seen before (every fact in `call_key`: its checks passed then), else
    checked and planned now and remembered."""
    key = call_key(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config, store_preact)

    def build():
        checked_dtype, info = checks.linear(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config)
        return LinearCall.build(
            x, weight, bias, residual, activation, alpha, checked_dtype, kernel, info, config, store_preact
        )

    return planned(key, build)


def call_key(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config, store_preact) -> tuple | None:
    """Every fact of a linear call that its checks and its plan read, as given (before any fold):
    each tensor's dtype, device, shape, strides, alignment and negation, the epilogue's
    arguments, the kernel and config, and fp32's TF32 switch. None where a fact can't be read (not
    tensors) or alpha is not a plain int or float (True == 1 in a key, but the checks refuse it):
    the checks then say what is wrong, as they do for an unhashable argument (core/plans.py)."""
    if type(alpha) not in (int, float):
        return None
    try:
        key = ("linear", tensor_facts(x), tensor_facts(weight), tensor_facts(bias), tensor_facts(residual),
               activation, float(alpha), out_dtype, kernel, config, store_preact,
               x.dtype == torch.float32 and allow_tf32())  # fmt: skip
    except (AttributeError, RuntimeError, TypeError):
        return None
    return key


@dataclass(frozen=True)
class LinearCall:
    """One linear problem, planned: its GEMM's plan (core/plans.py) and how a call's tensors fold into
    the GEMM's (M, K) and (K, N) operands and (M, N) epilogue tensors, decided once. A call whose
    `call_key` matches runs it without checks, choices or new objects."""

    plan: Plan
    lead: tuple[int, ...]  # x.shape[:-1]: the output is (*lead, N)
    M: int
    K: int
    N: int
    fold: bool  # x is not (M, K) as it is: fold its leading dimensions (a view where strides allow)
    out_dtype: torch.dtype
    store_preact: bool  # also write the pre-activation z, for the backward
    # The call's own tensors serve the plan's launch as they are (see `_serves_as_given`): `run`
    # then allocates y and launches, nothing else.
    as_given: bool

    @staticmethod
    def build(x, weight, bias, residual, activation, alpha, out_dtype, kernel, info, config, store_preact):
        """The call of a problem `checks.linear` checked (`info`: the kernel's row, None for "auto")."""
        prepared = _prepare(x, weight, bias, residual, activation, alpha, out_dtype, store_preact)
        if prepared is None:
            *lead, K = x.shape
            return EmptyLinear(tuple(lead), weight.shape[0], activation, out_dtype, store_preact)
        x2, b, fused, lead = prepared
        gemm = Gemm.of(x2, b, None, out_dtype, kernel, info, config, fused)  # checks.linear checked these
        plan = lookup(x2, b, None, kernel, config, fused, problem=gemm)
        M, K = x2.shape
        as_given = _serves_as_given(plan, x, x2, b, bias, residual, fused, out_dtype)
        return LinearCall(plan, tuple(lead), M, K, b.shape[1], x.dim() != 2, out_dtype, store_preact, as_given)

    def run(self, x, weight, bias, residual) -> tuple:
        """(y, z) as `_linear` returns them."""
        plan = self.plan
        if self.as_given and (plan.device_index is None or torch._C._cuda_getDevice() == plan.device_index):
            shape = (*self.lead, self.N)
            y = x.new_empty(shape, dtype=self.out_dtype)
            preact = x.new_empty(shape, dtype=self.out_dtype) if self.store_preact else None
            plan.launch(x, weight, y, bias, residual, preact)
            return y, preact
        M, N = self.M, self.N
        x2 = x.reshape(M, self.K) if self.fold else x  # a view whenever the strides allow, as in matmul
        if bias is not None:  # the kernels read the bias as a contiguous row (a no-op when it is one)
            bias = bias.contiguous().resolve_neg()
        if residual is not None:
            residual = residual.resolve_neg()
            residual = residual.reshape(M, N) if self.fold else residual
        preact = x2.new_empty((M, N), dtype=self.out_dtype) if self.store_preact else None
        y = self.plan.run(x2, weight.T, None, bias, residual, preact)
        if not self.fold:
            return y, preact
        return y.view(*self.lead, N), None if preact is None else preact.view(*self.lead, N)


def _serves_as_given(plan: Plan, x, x2, b, bias, residual, fused: Fused, out_dtype) -> bool:
    """Whether a call's own tensors can go to `plan.launch` as they are: x for its (M, K) view,
    the weight for its transpose, a fresh (..., N) y for the plan's (M, N) output, the bias and
    residual unchanged. A launch reads a tensor's data pointer alone (its sizes and strides are the
    plan's), so a view that starts where the tensor does serves for it: true here when x folds to
    a view, nothing needs a copy or a negation resolved, and the plan writes a fresh contiguous
    output. The call key holds every fact this reads, so it holds for every call with that key.
    Each tensor op skipped is 2-5 us of host time on the H100 machine, on every decode step's
    every linear."""
    if plan.resolve_neg or plan.compact or not isinstance(plan.config, MatmulConfig):  # "autotune" reads c.shape
        return False
    if x2.data_ptr() != x.data_ptr() or fused.bias is not bias:
        return False
    if residual is not None and (residual.is_neg() or fused.residual.data_ptr() != residual.data_ptr()):
        return False
    a, b_given, c = plan.prepare(x2, b, None)
    return a is x2 and b_given is b and c.is_contiguous() and c.dtype == out_dtype


def _prepare(x, weight, bias, residual, activation, alpha, out_dtype, store_preact: bool):
    """(x2, b, fused, lead): the GEMM's (M, K) and (K, N) operands as views, the epilogue with its
    tensors folded to (M, N), and x's leading shape; None for an empty problem."""
    *lead, K = x.shape
    N = weight.shape[0]
    M = math.prod(lead)
    if M == 0 or N == 0 or K == 0:
        return None
    x2 = x.reshape(M, K)  # a view whenever the strides allow, as in matmul
    if bias is not None and bias.stride(0) != 1:  # the kernels read the bias as a contiguous row
        bias = bias.contiguous()
    bias = None if bias is None else bias.resolve_neg()
    residual = None if residual is None else residual.resolve_neg().reshape(M, N)
    preact = x2.new_empty((M, N), dtype=out_dtype) if store_preact else None
    spec = Epilogue(activation, float(alpha), bias is not None, residual is not None, store_preact)
    return x2, weight.T, Fused(spec, bias, residual, out_dtype, preact), lead


@dataclass(frozen=True)
class EmptyLinear:
    """A linear problem with M, N or K = 0, planned: no kernel. M or N = 0 is an empty result; K = 0
    a zero sum whose epilogue (bias, activation, residual) may be not zero, computed in torch."""

    lead: tuple[int, ...]  # x.shape[:-1]
    N: int
    activation: str | None
    out_dtype: torch.dtype
    store_preact: bool
    as_given = False  # no launch for a call's tensors to go to (inductor.py asks)

    def run(self, x, weight, bias, residual) -> tuple:
        """(y, z) as `LinearCall.run` returns them."""
        shape = (*self.lead, self.N)
        z = x.new_zeros(shape, dtype=torch.float32) + (0.0 if bias is None else bias.float())
        y = activate_torch(z, self.activation) + (0.0 if residual is None else residual.float())
        return y.to(self.out_dtype), z.to(self.out_dtype) if self.store_preact else None


def linear_grads(grad_y, x, weight, bias, residual_dtype, activation, alpha, needs_grad, lin, preact=None) -> tuple:
    """(dx, dweight, dbias, dresidual) of y = activation(alpha * x @ weight.T + bias) + residual,
    with `lin(x, weight, bias, activation, alpha, out_dtype)` computing the GEMMs (eager: the
    direct path; compiled: the operator). The activation's derivative reads the pre-activation
    z: `preact` where the forward stored it, else recomputed here, in grad_y's dtype as stored."""
    N, K = weight.shape
    grad_x = grad_weight = grad_bias = grad_residual = None
    if needs_grad[3]:
        grad_residual = grad_y.to(residual_dtype)
    grad_z = grad_y
    if activation is not None:
        z = lin(x, weight, bias, None, alpha, grad_y.dtype) if preact is None else preact
        grad_z = activation_backward(grad_y, z, activation)
    if needs_grad[2]:  # one reduction kernel, F.linear's: a half tensor is summed in fp32, rounded once
        grad_bias = grad_z.reshape(-1, N).sum(0, dtype=bias.dtype)
    grad_z = grad_z.to(x.dtype)
    if needs_grad[0]:  # dz @ weight, scaled: linear with weight.T as its (K, N) weight
        grad_x = lin(grad_z, weight.T, None, None, alpha, x.dtype)
    if needs_grad[1]:  # dz^T @ x over every leading dimension: (N, M') @ (M', K)
        rows = math.prod(x.shape[:-1])
        grad_weight = lin(grad_z.reshape(rows, N).T, x.reshape(rows, K).T, None, None, alpha, weight.dtype)
    return grad_x, grad_weight, grad_bias, grad_residual


def backward_kernel(kernel: str) -> str:
    """The kernel the backward's GEMMs use: the forward's, unless it writes the inputs' dtype only
    (a Gluon kernel), as the recomputed pre-activation of an fp32 output is not; then "auto"."""
    return kernel if kernel in registry.POLICIES or registry.get(kernel).any_out_dtype else "auto"


# ----------------------------------------------------------------------------------------------
# The operator
# ----------------------------------------------------------------------------------------------


LIB.define(
    "linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? residual=None, str? activation=None, "
    "float alpha=1.0, ScalarType? out_dtype=None, str kernel_name='auto', str? config=None) -> Tensor"
)


def linear_impl(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    activation: str | None = None,
    alpha: float = 1.0,
    out_dtype: torch.dtype | None = None,
    kernel_name: str = "auto",
    config: str | None = None,
) -> torch.Tensor:
    """`tritongemm.linear` (its keyword arguments positional, `config` as for `mm`), on linear's hot
    path: a compiled graph calls it with the same facts every time. Nothing here records autograd
    (the operator's own, below, differentiates it): the output is a fresh tensor."""
    return direct_linear(x, weight, bias, residual, activation, alpha, out_dtype, kernel_name, config_of(config))


LIB.impl("linear", linear_impl, "CompositeExplicitAutograd")
linear_op = torch.ops.tritongemm.linear.default


@torch.library.register_fake("tritongemm::linear", lib=LIB)
def _linear_fake(x, weight, bias=None, residual=None, activation=None, alpha=1.0, out_dtype=None,
                 kernel_name="auto", config=None):  # fmt: skip
    operators.traced()
    out_dtype = checks.check_linear(x, weight, bias, residual, activation, alpha, out_dtype)
    if kernel_name not in registry.POLICIES:
        registry.get(kernel_name)
    config_of(config)
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=out_dtype)


def _setup_linear_context(ctx, inputs, output):
    x, weight, bias, residual, activation, alpha, _, kernel, _ = inputs
    ctx.save_for_backward(x, weight, bias)  # not the residual: its gradient is grad_y's
    ctx.residual_dtype = None if residual is None else residual.dtype
    ctx.activation, ctx.alpha, ctx.kernel = activation, alpha, backward_kernel(kernel)


def _linear_backward(ctx, grad_y):
    x, weight, bias = ctx.saved_tensors

    def lin(x, weight, bias, activation, alpha, out_dtype):
        return linear_op(x, weight, bias, None, activation, alpha, out_dtype, ctx.kernel, None)

    needs = ctx.needs_input_grad[:4]
    grads = linear_grads(grad_y, x, weight, bias, ctx.residual_dtype, ctx.activation, ctx.alpha, needs, lin)
    return *grads, None, None, None, None, None


register_autograd(linear_op, linear_impl, _setup_linear_context, _linear_backward)

# ----------------------------------------------------------------------------------------------
# Autograd and the public function
# ----------------------------------------------------------------------------------------------


class _LinearFunction(torch.autograd.Function):
    """Eager autograd for `linear`; under torch.compile the operator's autograd serves."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, activation, alpha, out_dtype, kernel, config, call):
        """`call`: the LinearCall (or EmptyLinear) planned for these inputs, with the pre-activation
        stored where an activation's derivative needs it."""
        y, z = call.run(x, weight, bias, residual)
        ctx.save_for_backward(x, weight, bias, z)  # not the residual: its gradient is grad_y's
        ctx.residual_dtype = None if residual is None else residual.dtype
        ctx.activation, ctx.alpha, ctx.kernel = activation, alpha, kernel
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # its GEMMs are not differentiated again
    def backward(ctx, grad_y):
        x, weight, bias, z = ctx.saved_tensors
        kernel = backward_kernel(ctx.kernel)  # the forward's config fits only the forward's shape

        def lin(x, weight, bias, activation, alpha, out_dtype):
            return direct_linear(x, weight, bias, None, activation, alpha, out_dtype, kernel, None)

        needs = ctx.needs_input_grad
        grads = linear_grads(grad_y, x, weight, bias, ctx.residual_dtype, ctx.activation, ctx.alpha, needs, lin, z)
        return *grads, None, None, None, None, None, None


def _autocast(x, weight, bias):
    """What F.linear does under torch.autocast: the GEMM in autocast's dtype, whatever the
    parameters' (an fp32 model trained with AMP). The residual keeps its dtype, as an add would."""
    dtype = torch.get_autocast_dtype(x.device.type)
    return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


# Whether any device's autocast is on, in one call: 0.06 us, where torch.is_autocast_enabled(
# x.device.type) takes 1 us (this repository's CPU machine), on every linear call.
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)


def traced_linear(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config) -> torch.Tensor:
    """`tritongemm.linear` while torch.compile traces it: the operator."""
    return linear_op(x, weight, bias, residual, activation, float(alpha), out_dtype, kernel, label_of(config))


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    out_dtype: torch.dtype | None = None,
    kernel: str = "auto",
    config: MatmulConfig | str | None = None,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """activation(alpha * x @ weight.T + bias) + residual, in one tritongemm kernel.

    Args:
        x: (..., K), float16, bfloat16 or float32, as `F.linear` takes it.
        weight: (N, K), as `nn.Linear` stores it; x's dtype and device.
        bias: optional (N,), x's dtype.
        activation: None, "relu", "gelu" (erf, as `F.gelu`), "gelu_tanh" (as
            `F.gelu(approximate="tanh")`) or "silu".
        residual: optional, the output's shape (..., N), added after the activation; x's dtype
            or out_dtype.
        alpha: scales x @ weight.T before the bias.
        out_dtype: the output's dtype: x's (default), or float32 for float16 / bfloat16 x.
        kernel, config: as for `matmul`. The Gluon (TMA) kernels write x's dtype only; "auto"
            takes a `triton.language` kernel for a float32 output of half-precision x.
        batch_invariant: as for `matmul`: each row of y the same bits whatever else x holds.

    The GEMM accumulates in fp32 and the whole epilogue runs in fp32 on the accumulator, rounded
    once at the store. Differentiable in x, weight, bias and residual, with tritongemm's GEMMs
    (the forward's epilogue also stores the pre-activation where the activation's derivative
    needs it), and traceable by `torch.compile` (through `torch.ops.tritongemm.linear`).
    """
    if batch_invariant is not False:
        kernel = checks.invariant_kernel(kernel, batch_invariant, "linear")
    if _any_autocast() and isinstance(x, torch.Tensor) and torch.is_autocast_enabled(x.device.type):
        x, weight, bias = _autocast(x, weight, bias)
    if torch.compiler.is_compiling():
        return traced_linear(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config)
    if not (torch.is_grad_enabled() and requires_grad(x, weight, bias, residual)):
        return direct_linear(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config)
    store_preact = activation is not None and PREACT == "store"
    call = planned_call(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config, store_preact)
    return _LinearFunction.apply(
        x, weight, bias, residual, activation, float(alpha), call.out_dtype, kernel, config, call
    )
