"""tritongemm.linear: the fused epilogue (bias, activation, alpha, residual, out_dtype) on every
rung, against one fp64 torch reference (epilogue.reference_linear); its gradients against
torch autograd; the operator, torch.compile, bad arguments, and the plan key's epilogue facts.

On the CPU the `triton.language` rungs run under the interpreter (float16, float32); on the GPU
every rung, the Gluon ones included, in float16, bfloat16 and float32.
"""

from __future__ import annotations

import gc
import weakref
import zlib

import pytest
import torch
import torch.nn.functional as F
from cases import DEVICE, DTYPES, HOPPER, LADDER, ON_GPU, ON_HOPPER

import tritongemm
from tritongemm.core.epilogue import ACTIVATIONS, activate_torch, reference_linear
from tritongemm.core.plans import PlanCache
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.dense import linear as fused
from tritongemm.dense.matmul import lookup
from tritongemm.dense.plan import problem_key

KERNELS = LADDER + (HOPPER if ON_HOPPER else ()) + ("auto",)
TMA_DTYPES = (torch.float16, torch.bfloat16)
# (bias, residual, alpha): the epilogue's parts, alone and together
PARTS = [(False, False, 1.0), (True, False, 1.0), (False, True, 1.0), (True, True, -0.75)]


def rand(*shape, dtype=torch.float32, seed="", scale=1.0):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}{dtype}{seed}".encode()))
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=DEVICE)


def inputs(lead, N, K, dtype, bias, residual, seed=""):
    x = rand(*lead, K, dtype=dtype, seed=seed)
    w = rand(N, K, dtype=dtype, seed=seed, scale=max(K, 1) ** -0.5)  # unit-scale outputs: activations bend
    b = rand(N, dtype=dtype, seed=seed) if bias else None
    r = rand(*lead, N, dtype=dtype, seed=seed) if residual else None
    return x, w, b, r


def check(x, w, b, r, activation, alpha, kernel="auto", out_dtype=None, **kwargs):
    y = tritongemm.linear(x, w, b, activation=activation, residual=r, alpha=alpha, out_dtype=out_dtype,
                          kernel=kernel, **kwargs)  # fmt: skip
    expected = reference_linear(x, w, b, activation, r, alpha, out_dtype)
    assert y.shape == expected.shape and y.dtype == expected.dtype and y.device == x.device
    err, bound = rel_error(y, expected), tolerance(x.dtype, x.shape[-1])
    assert err <= bound, f"{kernel} {activation} {x.dtype}: relative error {err:.3e} > {bound:.3e}"
    return y


def _skip_unsupported(kernel, dtype):
    if kernel in HOPPER and dtype not in TMA_DTYPES:
        pytest.skip("the TMA kernels compute float16 and bfloat16")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("bias, residual, alpha", PARTS, ids=["plain", "bias", "residual", "all"])
def test_every_epilogue_on_every_rung(bias, residual, alpha, activation, kernel, dtype):
    _skip_unsupported(kernel, dtype)
    lead, N, K = ((3, 37), 72, 40) if ON_GPU else ((2, 5), 24, 16)
    check(*inputs(lead, N, K, dtype, bias, residual, f"{kernel}{activation}"), activation, alpha, kernel)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", [((1,), 7, 13), ((13,), 1, 5), ((3, 1, 9), 5, 3), ((), 6, 4)], ids=str)
def test_odd_shapes_and_ranks(shape, kernel):
    """Odd sizes on every axis; x of 1, 2 and 3 dimensions (F.linear's (..., K))."""
    dtype = torch.float16 if kernel in HOPPER else torch.float32
    lead, N, K = shape
    check(*inputs(lead, N, K, dtype, True, True, kernel), "gelu", 1.0, kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_strided_operands(kernel):
    """x a sliced view, weight a transposed view, a strided bias, a residual with padded rows:
    each read where it lies (TMA kernels copy what they can't take)."""
    dtype = torch.float16 if kernel in HOPPER else torch.float32
    x = rand(9, 40, dtype=dtype, seed="x")[:, 3:27]  # (9, 24), rows 40 apart
    w = rand(24, 16, dtype=dtype, seed="w").T  # (16, 24), K-major storage
    b = rand(32, dtype=dtype, seed="b")[::2]  # stride 2
    r = rand(9, 24, dtype=dtype, seed="r")[:, 5:21]  # (9, 16), rows 24 apart
    check(x, w, b, r, "silu", 0.5, kernel)


@pytest.mark.parametrize("negated", ["x", "weight", "bias", "residual"])
def test_negated_views_are_read_as_their_values(negated):
    """torch._neg_view (what conj/neg views leave) on any operand: its values, on the first call
    and on a planned one, on the general path and the launch-as-given one."""
    dtype = torch.float16 if ON_GPU else torch.float32
    tensors = dict(zip(("x", "weight", "bias", "residual"), inputs((3, 5), 16, 24, dtype, True, True, "neg")))
    tensors[negated] = torch._neg_view(-tensors[negated])
    for _ in range(2):
        check(*tensors.values(), "gelu", 0.5)


@pytest.mark.parametrize("kernel", LADDER + ("auto",))
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float32], ids=str)
def test_float32_output_of_half_inputs(dtype, kernel):
    x, w, b, _ = inputs((4, 11), 20, 24, dtype, True, False, kernel)
    r = rand(4, 11, 20, dtype=torch.float32, seed="r32")  # a residual stream kept in fp32
    y = check(x, w, b, r, "gelu_tanh", 2.0, kernel, out_dtype=torch.float32)
    assert y.dtype == torch.float32


@pytest.mark.skipif(not ON_HOPPER, reason="the TMA kernels run on sm_90 only")
def test_tma_kernels_refuse_a_float32_output():
    x, w, b, _ = inputs((8,), 16, 16, torch.float16, True, False)
    with pytest.raises(TypeError, match="writes the output in the inputs' dtype"):
        tritongemm.linear(x, w, b, out_dtype=torch.float32, kernel="tma_pipelined")


@pytest.mark.parametrize("M, N, K", [(0, 5, 3), (4, 0, 3), (4, 5, 0)])
def test_empty_problems(M, N, K):
    """K = 0 is a zero sum: the output is the epilogue of zeros, activation(bias) + residual."""
    x, w, b, r = inputs((M,), N, K, torch.float32, True, True)
    y = tritongemm.linear(x, w, b, activation="silu", residual=r)
    expected = activate_torch(torch.zeros(M, N, device=DEVICE) + b, "silu") + r
    assert y.shape == (M, N) and torch.allclose(y, expected)


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_stored_pre_activation_is_alpha_x_w_plus_b(kernel):
    """STORE_PREACT: the same kernel writes y and z = alpha * x @ w.T + b, the activation's input."""
    dtype = torch.float16 if kernel in HOPPER else torch.float32
    x, w, b, r = inputs((3, 7), 24, 16, dtype, True, True, kernel)
    y, z = fused.planned_call(x, w, b, r, "silu", 0.5, dtype, kernel, None, True).run(x, w, b, r)
    assert rel_error(y, reference_linear(x, w, b, "silu", r, 0.5)) <= tolerance(dtype, 16)
    assert z.shape == y.shape and z.dtype == dtype
    assert rel_error(z, reference_linear(x, w, b, None, None, 0.5)) <= tolerance(dtype, 16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("preact", ["store", "recompute"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_gradients_match_torch_autograd(activation, preact, dtype, monkeypatch):
    """Against autograd through the fp64 reference; half inputs round the pre-activation and dz to
    their dtype once each, as torch's own F.gelu(F.linear(...)) does, within the GEMM's bound."""
    monkeypatch.setattr(fused, "PREACT", preact)
    x, w, b, r = inputs((2, 5), 12, 16, dtype, True, True, activation)
    leaves = [t.requires_grad_() for t in (x, w, b, r)]
    y = tritongemm.linear(x, w, b, activation=activation, residual=r, alpha=0.5)
    grad_y = rand(*y.shape, dtype=dtype, seed="grad")
    got = torch.autograd.grad(y, leaves, grad_y)
    z = 0.5 * (x.double() @ w.double().T) + b.double()
    expected = torch.autograd.grad(activate_torch(z, activation) + r.double(), leaves, grad_y.double())
    for name, g, e in zip(("x", "weight", "bias", "residual"), got, expected):
        assert g.dtype == dtype and rel_error(g, e) <= tolerance(dtype, 16), name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_bias_gradient_is_f_linears_to_the_bit(dtype):
    """The bias's gradient is one reduction over the rows, the one F.linear's backward runs (a
    half tensor summed in fp32, rounded once): the same bits as torch's, on (batch, seq, hidden)."""
    x, w, b, _ = inputs((3, 67), 40, 16, dtype, True, False)
    grad_y = rand(3, 67, 40, dtype=dtype, seed="grad")
    (got,) = torch.autograd.grad(tritongemm.linear(x, w, b.requires_grad_()), [b], grad_y)
    (expected,) = torch.autograd.grad(F.linear(x, w, b), [b], grad_y)
    assert got.dtype == dtype and torch.equal(got, expected)


def test_gradients_of_some_inputs_only():
    x, w, b, _ = inputs((6,), 8, 16, torch.float32, True, False)
    w.requires_grad_()
    y = tritongemm.linear(x, w, b, activation="relu")
    (grad_w,) = torch.autograd.grad(y.sum(), [w])
    expected = torch.autograd.grad(torch.relu(x.double() @ w.double().T + b.double()).sum(), [w])[0]
    assert rel_error(grad_w, expected) <= tolerance(torch.float32, 6)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda x, w, b: tritongemm.linear(x, w, b, activation="tanh"), ValueError, "expected activation to be one"),
        (lambda x, w, b: tritongemm.linear(x, w, b[:-1]), ValueError, r"expected bias of shape \(8,\)"),
        (lambda x, w, b: tritongemm.linear(x, w, b.double()), TypeError, "expected bias to have dtype float32"),
        (lambda x, w, b: tritongemm.linear(x, w, residual=x), ValueError, r"expected residual of shape \(6, 8\)"),
        (lambda x, w, b: tritongemm.linear(x, w, out_dtype=torch.float16), TypeError, "expected out_dtype"),
        (lambda x, w, b: tritongemm.linear(x, w, alpha="2"), TypeError, "expected alpha to be a finite real"),
        (lambda x, w, b: tritongemm.linear(x, w, alpha=float("nan")), TypeError, "finite real number"),
        (lambda x, w, b: tritongemm.linear(x, w.T), ValueError, "shapes cannot be multiplied"),
        (lambda x, w, b: tritongemm.linear(x, w[0]), ValueError, "expected weight to be a 2D tensor"),
        (lambda x, w, b: tritongemm.linear(x, w.half()), TypeError, "same dtype"),
        (lambda x, w, b: tritongemm.linear(x, w, b, kernel="nope"), ValueError, "nope"),
    ],
    ids=[
        "activation",
        "bias_shape",
        "bias_dtype",
        "residual_shape",
        "out_dtype",
        "alpha",
        "alpha_nan",
        "k_mismatch",
        "weight_1d",
        "weight_dtype",
        "kernel",
    ],  # fmt: skip
)
def test_bad_arguments_are_refused_before_any_launch(call, error, message):
    x, w, b, _ = inputs((6,), 8, 16, torch.float32, True, False)
    with pytest.raises(error, match=message):
        call(x, w, b)


def test_the_epilogue_is_in_the_plan_key():
    """A plan is reused only for the same epilogue and the same layouts of its tensors."""
    from tritongemm.core.epilogue import Epilogue, Fused

    x, w, b, r = inputs((6,), 8, 16, torch.float32, True, True)

    def key(spec, bias=b, residual=r, out_dtype=torch.float32):
        return problem_key(x, w.T, None, "auto", None, Fused(spec, bias, residual, out_dtype))

    base = Epilogue("gelu", 1.0, True, True)
    assert key(base) == key(base, bias=b.clone(), residual=r.clone())  # new data: a hit
    for other in (
        key(Epilogue("silu", 1.0, True, True)),
        key(Epilogue("gelu", 2.0, True, True)),
        key(Epilogue("gelu", 1.0, False, True), bias=None),
        key(base, residual=rand(8, 6, seed="t").T),  # other strides
        key(base, bias=rand(9, seed="o")[1:]),  # an unaligned bias
        key(base, out_dtype=torch.float16),
        problem_key(x, w.T, None, "auto", None),  # matmul's plan
    ):
        assert other != key(base)


def test_plans_keep_no_epilogue_tensor_alive():
    cache = PlanCache()
    x, w, b, r = inputs((6,), 8, 16, torch.float32, True, True)
    from tritongemm.core.epilogue import Epilogue, Fused

    fused = Fused(Epilogue("relu", 1.0, True, True), b, r, torch.float32)
    lookup(x, w.T, None, "grouped", None, fused, cache=cache).run(x, w.T, None, b, r)
    refs = [weakref.ref(t) for t in (b, r)]
    del fused, b, r
    gc.collect()
    assert all(ref() is None for ref in refs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_operator_and_fake_shapes(dtype):
    x, w, b, r = inputs((2, 3), 8, 16, dtype, True, True)
    args = (x, w, b, r, "silu", 2.0, None, "auto", None)
    torch.library.opcheck(torch.ops.tritongemm.linear.default, args)
    for t in (x, w, b, r):
        t.requires_grad_()
    torch.library.opcheck(torch.ops.tritongemm.linear.default, args)
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fx, fw = mode.from_tensor(x.detach()), mode.from_tensor(w.detach())
    with mode:
        y = torch.ops.tritongemm.linear(fx, fw, None, None, "gelu", 1.0, None)
    assert y.shape == (2, 3, 8) and y.dtype == dtype


def test_the_operator_without_autograd_still_reaches_a_dispatch_mode():
    """The operator's Autograd kernel runs the implementation itself, skipping the dispatcher's
    second trip, only for a backend's own tensors with no dispatch mode: a mode (a tracer's, a
    profiler's) still sees the operator, and what it runs is still right."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x, w, b, _ = inputs((2, 3), 8, 16, torch.float32, True, False)
    with torch.no_grad(), Log():
        y = torch.ops.tritongemm.linear(x, w, b, None, "gelu")
    assert torch.ops.tritongemm.linear.default in seen
    assert rel_error(y, reference_linear(x, w, b, "gelu", None, 1.0, None)) <= tolerance(torch.float32, 16)


COMPILE_MODES = (
    [dict(backend="inductor"), dict(backend="inductor", mode="reduce-overhead")]
    if ON_GPU
    else [dict(backend="aot_eager")]
)


@pytest.mark.parametrize("options", COMPILE_MODES, ids=lambda o: o.get("mode", o["backend"]))
def test_torch_compile_fullgraph_forward_and_backward(options):
    def block(x, w, b, r):
        return tritongemm.linear(x, w, b, activation="gelu", residual=r, alpha=0.5)

    compiled = torch.compile(block, fullgraph=True, dynamic=True, **options)
    for M in (5, 9):
        x, w, b, r = inputs((M,), 8, 16, torch.float32, True, True, f"compile{M}")
        leaves = [t.requires_grad_() for t in (x, w, b, r)]
        got = compiled(x, w, b, r)
        grads = torch.autograd.grad(got.sum(), leaves)
        eager = block(x, w, b, r)
        expected_grads = torch.autograd.grad(eager.sum(), leaves)
        assert rel_error(got, eager.detach()) <= tolerance(torch.float32, 16)
        for g, e in zip(grads, expected_grads):
            assert rel_error(g, e) <= tolerance(torch.float32, 16)


def test_a_second_derivative_is_refused_not_wrong():
    """The backward runs tritongemm GEMMs, which autograd does not differentiate again."""
    x, w, b, _ = inputs((4,), 8, 16, torch.float32, True, False)
    x.requires_grad_()
    (grad_x,) = torch.autograd.grad(tritongemm.linear(x, w, b, activation="gelu").sum(), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad|has no grad"):
        torch.autograd.grad(grad_x.sum(), [x])


def test_a_planned_call_is_still_checked_where_the_plan_key_says_nothing():
    """The hot path runs a plan built for exactly the call's facts without checking again; what
    the key can't tell apart must still be refused."""
    x, w, b, r = inputs((2, 3), 8, 16, torch.float32, True, True)
    tritongemm.linear(x, w, b, residual=r, alpha=2)  # plans the problem
    hits = tritongemm.plans.info()["hits"]
    tritongemm.linear(x, w, b, residual=r, alpha=2.0)
    assert tritongemm.plans.info()["hits"] == hits + 1  # the second call took the hot path
    with pytest.raises(TypeError, match="alpha"):
        tritongemm.linear(x, w, b, residual=r, alpha=True)  # True == 1 == 1.0 in a key
    with pytest.raises(ValueError, match=r"residual of shape \(2, 3, 8\)"):
        tritongemm.linear(x, w, b, residual=r.reshape(3, 2, 8))  # folds to the same (6, 8)
    with pytest.raises(ValueError, match="activation"):
        tritongemm.linear(x, w, b, activation="swish", residual=r)
    with pytest.raises(TypeError, match="out_dtype"):
        tritongemm.linear(x, w, b, residual=r, out_dtype=torch.float64)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
def test_a_second_call_runs_its_planned_call_without_checks(grad, monkeypatch):
    """The hot path: a call like one seen before (every fact in fused.call_key) runs the
    LinearCall planned then, checking nothing again, with autograd or without; and computes
    what the first call did."""
    from tritongemm.core import checks

    x, w, b, r = inputs((2, 3), 8, 16, torch.float32, True, True)
    w.requires_grad_(grad)
    first = tritongemm.linear(x, w, b, residual=r, activation="gelu")
    if grad:  # plans the backward's GEMMs too: a training step's second step checks nothing either
        first.sum().backward()
        w.grad = None

    def refuse(*args):
        raise AssertionError("checked again")

    monkeypatch.setattr(checks, "check_linear", refuse)
    second = tritongemm.linear(x, w, b, residual=r, activation="gelu")
    assert torch.equal(first.detach(), second.detach()) and second.requires_grad == grad
    if grad:  # the planned call stored the pre-activation for the backward: gradients flow
        second.sum().backward()
        assert w.grad is not None and torch.isfinite(w.grad).all()
    with pytest.raises(AssertionError, match="checked again"):  # another layout of x: a new call
        tritongemm.linear(x.transpose(0, 1), w, b, residual=r.transpose(0, 1), activation="gelu")


def test_a_call_whose_tensors_serve_as_they_are_launches_them_as_they_are():
    """LinearCall.as_given: x that folds to a view, a contiguous bias and residual go to the
    launch as they are (no fold, no transpose, no copies); a call that needs any of those takes
    the general path. Both compute the same thing, checked against the fp64 reference."""
    x, w, b, r = inputs((2, 3), 8, 16, torch.float32, True, True)

    def planned(x, b, r):
        check(x, w, b, r, "gelu", 1.0)
        key = fused.call_key(x, w, b, r, "gelu", 1.0, None, "auto", None, False)
        return tritongemm.plans.find(key)

    assert planned(x, b, r).as_given
    assert not planned(x.transpose(0, 1), b, r.transpose(0, 1)).as_given  # folds to a copy
    assert not planned(x, torch._neg_view(b), r).as_given  # the kernel reads a resolved negation
    assert not planned(x, torch.stack([b, b], 1)[:, 0], r).as_given  # a strided bias: a copy
    assert not planned(x, b, r.transpose(0, 1).contiguous().transpose(0, 1)).as_given  # folds to a copy


@pytest.mark.skipif(not ON_GPU, reason="shared memory is a GPU's")
def test_a_float32_output_too_big_for_the_default_stages_plans_twice():
    """bf16 -> fp32 on the persistent rung: its default 128 x 256 tile with 3 stages needs 272 KB
    beside the fp32 epilogue (H100: 227). The plan takes fewer stages, and a second problem of the
    same specialization (whose binary Triton then marks unloadable without raising) does too."""
    for M in (2048, 4096):
        x, w, b, _ = inputs((M,), 4096, 64, torch.bfloat16, True, False)
        check(x, w, b, None, "gelu", 1.0, "persistent", out_dtype=torch.float32)
