"""tritongemm inside PyTorch: N-D activations, the `torch.ops.tritongemm.mm` operator (opcheck,
fake shapes, autograd) and `torch.compile(fullgraph=True)` of code that calls `matmul`.

On the CPU the kernels run under the interpreter in fp32 and compile uses the "aot_eager"
backend; on a GPU the same tests run in fp16 and bf16 with the default backend (Inductor), plus
`mode="reduce-overhead"` (CUDA graphs).
"""

import pytest
import torch
from cases import DEVICE, ON_GPU

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import reference_matmul, rel_error, tolerance

DTYPES = (torch.float16, torch.bfloat16) if ON_GPU else (torch.float32,)
BACKEND = "inductor" if ON_GPU else "aot_eager"
SMALL = MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_SIZE_M=2, num_warps=4, num_stages=1)
KERNEL = "auto" if ON_GPU else "grouped"  # the interpreter runs tl kernels; a GPU runs what auto picks


def rand(*shape, dtype=torch.float32, requires_grad=False):
    return torch.randn(*shape, device=DEVICE).to(dtype).requires_grad_(requires_grad)


def check(result, a, b, dtype):
    expected = reference_matmul(a.reshape(-1, a.shape[-1]), b).view(*a.shape[:-1], b.shape[1])
    assert result.shape == expected.shape and result.dtype == dtype
    assert rel_error(result, expected) <= tolerance(dtype, a.shape[-1])


# ---------------------------------------------------------------------------------------------
# N-D activations, as torch.matmul takes them
# ---------------------------------------------------------------------------------------------

ND_SHAPES = [(2, 7, 24), (3, 1, 5, 24), (1, 24), (4, 0, 24)]


@pytest.mark.parametrize("shape", ND_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nd_a(shape, dtype):
    a, b = rand(*shape, dtype=dtype), rand(24, 40, dtype=dtype)
    check(tritongemm.matmul(a, b, kernel=KERNEL), a, b, dtype)


def test_nd_folds_without_a_copy():
    a, b = rand(2, 7, 24), rand(24, 40)
    seen = []
    from tritongemm.dense import matmul as api

    real = api.lookup

    def spy(x, *args):
        seen.append(x)
        return real(x, *args)

    api.lookup, saved = spy, real
    try:
        tritongemm.matmul(a, b, kernel=KERNEL)
    finally:
        api.lookup = saved
    assert seen[0].data_ptr() == a.data_ptr() and seen[0].shape == (14, 24)


def test_nd_with_unfoldable_strides_matches_torch():
    a = rand(7, 2, 24).transpose(0, 1)  # (2, 7, 24) whose batch and M do not fold into one stride
    b = rand(24, 40)
    check(tritongemm.matmul(a, b, kernel=KERNEL), a, b, torch.float32)


def test_nd_out():
    a, b = rand(2, 7, 24), rand(24, 40)
    out = torch.full((2, 7, 40), float("nan"), device=DEVICE)
    assert tritongemm.matmul(a, b, out=out, kernel=KERNEL) is out
    check(out, a, b, torch.float32)
    strided = torch.full((7, 2, 40), float("nan"), device=DEVICE).transpose(0, 1)  # does not fold
    assert tritongemm.matmul(a, b, out=strided, kernel=KERNEL) is strided
    check(strided, a, b, torch.float32)
    with pytest.raises(ValueError, match=r"expected out to have shape \(2, 7, 40\), but got \(14, 40\)"):
        tritongemm.matmul(a, b, out=torch.empty(14, 40, device=DEVICE), kernel=KERNEL)


def test_nd_gradients():
    a, b = rand(2, 5, 24, requires_grad=True), rand(24, 40, requires_grad=True)
    grad = rand(2, 5, 40)
    tritongemm.matmul(a, b, kernel=KERNEL).backward(grad)
    a64, b64 = a.detach().double().requires_grad_(True), b.detach().double().requires_grad_(True)
    torch.matmul(a64, b64).backward(grad.double())
    assert rel_error(a.grad, a64.grad) <= tolerance(torch.float32, 40)
    assert rel_error(b.grad, b64.grad) <= tolerance(torch.float32, 10)


@pytest.mark.parametrize("through", ["matmul", "operator"])
def test_gradients_come_back_in_their_operands_layouts(through):
    """A weight's .T (column-major b) gets a gradient that is contiguous as the weight, as torch's
    mm backward gives it, so that autograd adds no transposing copy; a column-major a likewise."""
    weight, x = rand(40, 24, requires_grad=True), rand(24, 9, requires_grad=True)  # x.T: (9, 24), column-major
    grad = rand(9, 40)
    arriving = {}  # what autograd hands each leaf, before it would copy it into the leaf's layout
    for name, leaf in (("weight", weight), ("x", x)):
        leaf.register_hook(lambda g, name=name: arriving.setdefault(name, g))
    if through == "matmul":
        c = tritongemm.matmul(x.T, weight.T, kernel=KERNEL)
    else:
        c = torch.ops.tritongemm.mm.default(x.T, weight.T, KERNEL)
    c.backward(grad)
    assert arriving["weight"].is_contiguous() and arriving["x"].is_contiguous()
    expected = grad.double().T @ x.detach().double().T  # d weight = dC^T @ a: (40, 24)
    assert rel_error(weight.grad, expected) <= tolerance(torch.float32, 9)
    assert rel_error(x.grad, (grad.double() @ weight.detach().double()).T) <= tolerance(torch.float32, 40)


@pytest.mark.parametrize(
    "a_shape, b_shape", [((2, 3, 0), (0, 4)), ((3, 4), (4, 0)), ((3, 0), (0, 5)), ((2, 0, 4), (4, 5))]
)
def test_empty_dimensions_forward_and_backward(a_shape, b_shape):
    """Zero-sized M, N or K: zeros or empty results, and gradients of the right shape, as torch."""
    a, b = rand(*a_shape, requires_grad=True), rand(*b_shape, requires_grad=True)
    c = tritongemm.matmul(a, b, kernel=KERNEL)
    torch.testing.assert_close(c, torch.matmul(a.detach(), b.detach()))
    out = torch.full(c.shape, float("nan"), device=DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(tritongemm.matmul(a, b, out=out, kernel=KERNEL), torch.matmul(a, b))
    c.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    assert not a.grad.any() and not b.grad.any()


def test_batched_b_is_refused_naming_the_shapes():
    with pytest.raises(ValueError, match=r"b to be a 2D tensor \(K, N\), but got a 3D tensor of shape \(2, 24, 40\)"):
        tritongemm.matmul(rand(2, 7, 24), rand(2, 24, 40))


# ---------------------------------------------------------------------------------------------
# The operator
# ---------------------------------------------------------------------------------------------


def test_the_operator_is_registered_on_import():
    assert str(torch.ops.tritongemm.mm.default._schema) == (
        'tritongemm::mm(Tensor a, Tensor b, str kernel_name="auto", str? config=None) -> Tensor'
    )


OPCHECK_CASES = [((9, 24), (24, 40)), ((2, 5, 24), (24, 40)), ((40, 24), (40, 24))]


@pytest.mark.parametrize("a_shape, b_shape", OPCHECK_CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(a_shape, b_shape, dtype):
    a = rand(*a_shape, dtype=dtype, requires_grad=True)
    b = rand(*b_shape, dtype=dtype, requires_grad=True)
    if a_shape == b_shape:  # b as the transposed view of an (N, K) nn.Linear weight
        b = b.detach().T.requires_grad_(True)
    torch.library.opcheck(torch.ops.tritongemm.mm.default, (a, b), {"kernel_name": KERNEL})


@pytest.mark.parametrize("a_shape", [(9, 24), (2, 5, 24), (3, 0, 24)], ids=str)
def test_fake_shapes(a_shape):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(a_shape, device=DEVICE), torch.empty(24, 40, device=DEVICE)
        c = torch.ops.tritongemm.mm(a, b)
        assert c.shape == (*a_shape[:-1], 40) and c.dtype == a.dtype and c.is_contiguous()
        with pytest.raises(ValueError, match="shapes cannot be multiplied"):
            torch.ops.tritongemm.mm(a, torch.empty(23, 40, device=DEVICE))
        with pytest.raises(ValueError, match="unknown kernel 'fastest'"):
            torch.ops.tritongemm.mm(a, b, "fastest")


def test_operator_takes_a_config_label():
    a, b = rand(9, 24), rand(24, 40)
    check(torch.ops.tritongemm.mm(a, b, "grouped", SMALL.short()), a, b, torch.float32)
    with pytest.raises(ValueError, match="MatmulConfig.parse: expected a label like"):
        torch.ops.tritongemm.mm(a, b, "grouped", "big")


# ---------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------------


def counted(fn, **options):
    """torch.compile(fn, fullgraph=True) and a counter of the graphs Dynamo compiled."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend(BACKEND)
    return torch.compile(fn, backend=counter, fullgraph=True, **options), counter


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def layer(x, w, bias):
    """What a model does around a GEMM: a weight used transposed, a bias, an activation."""
    return torch.relu(tritongemm.matmul(x, w.T, kernel=KERNEL, config=None) + bias)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compile_fullgraph_matches_eager(dtype):
    x, w, bias = rand(2, 9, 24, dtype=dtype), rand(40, 24, dtype=dtype), rand(40, dtype=dtype)
    compiled, counter = counted(layer)
    expected = layer(x, w, bias)
    assert rel_error(compiled(x, w, bias), expected.double()) <= tolerance(dtype, 24)
    assert counter.frame_count == 1


def test_compile_with_config_and_out():
    def fn(x, w, out):
        return tritongemm.matmul(x, w, out=out, kernel="grouped", config=SMALL)

    x, w = rand(9, 24), rand(24, 40)
    out = torch.empty(9, 40, device=DEVICE)
    compiled, _ = counted(fn)
    assert compiled(x, w, out) is out
    check(out, x, w, torch.float32)


@pytest.mark.parametrize(
    "make_out, exc, pattern",
    [
        (lambda: torch.empty(2, 9, 40, device=DEVICE), ValueError, r"expected out to have shape \(9, 40\)"),
        (lambda: torch.empty(9, 40, device=DEVICE, dtype=torch.float16), TypeError, "expected out to have dtype"),
    ],
)
def test_compile_checks_out_as_eager_does(make_out, exc, pattern):
    def fn(x, w, out):
        return tritongemm.matmul(x, w, out=out, kernel=KERNEL)

    compiled, _ = counted(fn)
    with pytest.raises(exc, match=pattern):
        fn(rand(9, 24), rand(24, 40), make_out())
    with pytest.raises(Exception, match=pattern):  # raised while tracing, wrapped by Dynamo
        compiled(rand(9, 24), rand(24, 40), make_out())


def test_compile_dynamic_m_compiles_once():
    compiled, counter = counted(layer, dynamic=True)
    w, bias = rand(40, 24), rand(40)
    for m in (3, 9, 17, 33):
        x = rand(m, 24)
        torch.testing.assert_close(compiled(x, w, bias), layer(x, w, bias))
    assert counter.frame_count == 1


def test_compile_changing_m_does_not_recompile_per_m():
    """Without dynamic=True, Dynamo recompiles once with M symbolic, then never again."""
    compiled, counter = counted(layer)
    w, bias = rand(40, 24), rand(40)
    for m in (3, 9, 17, 33, 65):
        x = rand(m, 24)
        torch.testing.assert_close(compiled(x, w, bias), layer(x, w, bias))
    assert counter.frame_count <= 2


def test_compile_backward():
    def loss(x, w):
        return tritongemm.matmul(x, w.T, kernel=KERNEL).square().sum()

    x, w = rand(2, 9, 24, requires_grad=True), rand(40, 24, requires_grad=True)
    compiled, counter = counted(loss)
    compiled(x, w).backward()
    got = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    loss(x, w).backward()
    for g, expected in zip(got, (x.grad, w.grad)):
        torch.testing.assert_close(g, expected, rtol=1e-4, atol=1e-4)
    assert counter.frame_count == 1


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compile_reduce_overhead(dtype):
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    w, bias = rand(256, 512, dtype=dtype), rand(256, dtype=dtype)
    for step in range(4):  # warm-up, recording, then replays
        x = rand(64, 512, dtype=dtype)
        result = compiled(x, w, bias).clone()
        assert rel_error(result, layer(x, w, bias).double()) <= tolerance(dtype, 512), step


def test_inductor_calls_the_implementations_directly():
    """Inductor's generated code calls the operators' implementations itself (inductor.py), not
    `torch.ops.tritongemm.*` through the dispatcher; an operand the graph transposes is passed as
    the transposed view it is, with dynamic shapes. Inductor's CPU backend on the CPU, its GPU
    one on a GPU."""
    from torch._inductor.utils import run_and_get_code

    def fn(x, w, b):
        return tritongemm.linear(x, w, b), tritongemm.matmul(x, w.T, kernel=KERNEL)

    dtype = DTYPES[0]
    compiled = torch.compile(fn, backend="inductor", fullgraph=True, dynamic=True)
    for m in (3, 9):
        x, w, b = rand(2, m, 24, dtype=dtype), rand(40, 24, dtype=dtype), rand(40, dtype=dtype)
        (y, z), codes = run_and_get_code(compiled, x, w, b)
        expected = fn(x, w, b)
        assert rel_error(y, expected[0].double()) <= tolerance(dtype, 24)
        assert rel_error(z, expected[1].double()) <= tolerance(dtype, 24)
    code = "\n".join(codes)
    assert "tritongemm_direct_linear(" in code and "tritongemm_direct_mm(" in code
    assert "tritongemm.linear.default(" not in code and "tritongemm.mm.default(" not in code
    assert "tritongemm_Site(" not in code  # symbolic shapes: each call looks its plan up


SITE_DTYPE = torch.bfloat16 if ON_GPU else torch.float16  # sites serve 16-bit graphs


def site_fn(x, w, b, r):
    return tritongemm.linear(x, w, b, residual=r), tritongemm.matmul(x[0], w.T, kernel=KERNEL)


def site_args(offset=0):
    """(x, w, b, r) for site_fn; x `offset` elements into its storage (1: not 16-byte aligned)."""
    x = rand(offset + 2 * 5 * 24, dtype=SITE_DTYPE)[offset:].view(2, 5, 24)
    return x, rand(40, 24, dtype=SITE_DTYPE), rand(40, dtype=SITE_DTYPE), rand(2, 5, 40, dtype=SITE_DTYPE)


def check_site_fn(outputs, args):
    x, w, b, r = args
    y, z = outputs
    expected_y = (x.double() @ w.double().T + b.double() + r.double()).to(SITE_DTYPE)
    assert rel_error(y, expected_y.double()) <= tolerance(SITE_DTYPE, 24)
    assert rel_error(z, reference_matmul(x[0], w.T)) <= tolerance(SITE_DTYPE, 24)


def test_a_static_graph_keeps_its_plans_at_their_sites(monkeypatch):
    """In a graph of static shapes, `linear` and `mm` are sites (inductor.Site): called into the
    buffers Inductor allocates, they plan on their first run only, and launch the kept plan on
    later runs with new tensors; `tritongemm.plans.clear()` makes them plan again, and a tensor
    that is not 16-byte aligned takes the direct path, right. Inductor's CPU backend on the CPU,
    its GPU one on a GPU."""
    from torch._inductor.utils import run_and_get_code

    from tritongemm import inductor

    planned = []
    real_call, real_lookup = inductor.planned_call, inductor.lookup
    monkeypatch.setattr(inductor, "planned_call", lambda *a: planned.append("linear") or real_call(*a))
    monkeypatch.setattr(inductor, "lookup", lambda *a: planned.append("mm") or real_lookup(*a))
    compiled = torch.compile(site_fn, backend="inductor", fullgraph=True, dynamic=False)
    args = site_args()
    outputs, (code,) = run_and_get_code(compiled, *args)
    check_site_fn(outputs, args)
    assert "tritongemm_Site('linear'" in code and "tritongemm_Site('mm'" in code
    assert "out=" in code and "tritongemm_direct_linear(" not in code and "tritongemm_direct_mm(" not in code
    first = len(planned)
    for _ in range(3):  # new tensors of the same shapes: the kept plans
        args = site_args()
        check_site_fn(compiled(*args), args)
    assert len(planned) == first
    tritongemm.plans.clear()
    args = site_args()
    check_site_fn(compiled(*args), args)
    assert "linear" in planned[first:] and "mm" in planned[first:]
    args = site_args(offset=1)
    check_site_fn(compiled(*args), args)


def test_a_linear_whose_launch_needs_a_copy_stays_a_direct_call():
    """Rows of 41 16-bit elements aren't whole 16-byte multiples: a TMA kernel's output would be
    row-padded and copied, on every run, so the node is a direct call, not a site."""
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(lambda x, w: tritongemm.linear(x, w), backend="inductor", dynamic=False)
    x, w = rand(5, 24, dtype=SITE_DTYPE), rand(41, 24, dtype=SITE_DTYPE)
    y, (code,) = run_and_get_code(compiled, x, w)
    assert rel_error(y, reference_matmul(x, w.T)) <= tolerance(SITE_DTYPE, 24)
    assert "tritongemm_direct_linear(" in code and "tritongemm_Site(" not in code
