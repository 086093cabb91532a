"""Bad input: each case gets an error, raised before any launch, that names the argument, the
value given and what was expected."""

import re

import pytest
import torch
from cases import DEVICE

import tritongemm
from tritongemm import MatmulConfig

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")


def t(*shape, dtype=torch.float16):
    return torch.randn(*shape, device=DEVICE).to(dtype)


a, b = t(3, 2), t(2, 5)
base = t(10, 10)

# (id, call, exception type, regex the message must match)
BAD_INPUTS = [
    ("dtype_mismatch", lambda: tritongemm.matmul(a, t(2, 5, dtype=torch.float32)), TypeError,
     r"same dtype, but got a: float16 != b: float32"),
    ("int_dtype", lambda: tritongemm.matmul(torch.ones(3, 2, dtype=torch.int32, device=DEVICE), b), TypeError,
     r"a has dtype int32, but only float16, bfloat16 and float32"),
    ("fp64_dtype", lambda: tritongemm.matmul(a, t(2, 5, dtype=torch.float64)), TypeError,
     r"b has dtype float64"),
    ("bool_dtype", lambda: tritongemm.matmul(torch.ones(3, 2, dtype=torch.bool, device=DEVICE), b), TypeError,
     r"a has dtype bool"),
    ("not_tensor", lambda: tritongemm.matmul([[1.0]], b), TypeError, r"expected a to be a torch.Tensor, but got list"),
    ("a_1d", lambda: tritongemm.matmul(t(3), b), ValueError, r"expected a to have 2 or more dimensions, \(\.\.\., M, K\), but got a 1D tensor of shape \(3,\)"),
    ("b_3d", lambda: tritongemm.matmul(a, t(1, 2, 5)), ValueError, r"expected b to be a 2D tensor \(K, N\), but got a 3D tensor of shape \(1, 2, 5\) \(with a of shape \(3, 2\)\); batched GEMM"),
    ("inner_mismatch", lambda: tritongemm.matmul(t(3, 2), t(4, 5)), ValueError,
     r"mat1 and mat2 shapes cannot be multiplied \(3x2 and 4x5\)"),
    ("unknown_kernel", lambda: tritongemm.matmul(a, b, kernel="fastest"), ValueError,
     r"unknown kernel 'fastest'; expected 'auto' or one of \['naive', 'grouped', 'persistent'"),
    ("kernel_not_str", lambda: tritongemm.matmul(a, b, kernel=3), TypeError, r"expected kernel to be a str, but got int"),
    ("config_type", lambda: tritongemm.matmul(a, b, config={"BLOCK_M": 64}), TypeError,
     r"expected config to be None, a MatmulConfig or 'autotune'"),
    ("autotune_elsewhere", lambda: tritongemm.matmul(a, b, kernel="naive", config="autotune"), ValueError,
     r"config='autotune' is available for kernel 'grouped' only, but kernel is 'naive'"),
    ("out_shape", lambda: tritongemm.matmul(a, b, out=t(5, 3)), ValueError, r"expected out to have shape \(3, 5\), but got \(5, 3\)"),
    ("out_dtype", lambda: tritongemm.matmul(a, b, out=t(3, 5, dtype=torch.float32)), TypeError,
     r"expected out to have dtype float16, but got float32"),
    ("out_not_tensor", lambda: tritongemm.matmul(a, b, out=1), TypeError, r"expected out to be a torch.Tensor"),
    ("out_overlaps_a", lambda: tritongemm.matmul(base[:3, :3], base[:3, :3], out=base[:3, :3]), ValueError,
     r"out overlaps the memory of input a"),
    ("out_overlaps_b", lambda: tritongemm.matmul(base[:3, :3], base[3:6, :3], out=base[4:7, 1:4]), ValueError,
     r"out overlaps the memory of input b"),
    ("out_overlaps_itself", lambda: tritongemm.matmul(a, b, out=t(1, 5).expand(3, 5)), ValueError,
     r"out has strides \(0, 1\) for shape \(3, 5\), so several of its elements share memory"),
    ("out_requires_grad", lambda: tritongemm.matmul(a, b, out=t(3, 5).requires_grad_(True)), RuntimeError,
     r"out=... arguments don't support automatic differentiation"),
    # torch.matmul's own rule: with out=, a result that autograd would need can't be tracked
    ("out_with_a_requiring_grad", lambda: tritongemm.matmul(t(3, 2).requires_grad_(True), b, out=t(3, 5)), RuntimeError,
     r"out=\.\.\. arguments don't support automatic differentiation, but a requires grad"),
    ("out_with_both_requiring_grad", lambda: tritongemm.matmul(t(3, 2).requires_grad_(True), t(2, 5).requires_grad_(True), out=t(3, 5)),
     RuntimeError, r"but a and b require grad"),
    ("a_0d", lambda: tritongemm.matmul(torch.tensor(1.0, dtype=torch.float16, device=DEVICE), b), ValueError, r"expected a to have 2 or more dimensions, \(\.\.\., M, K\), but got a 0D tensor of shape \(\)"),
    ("complex_dtype", lambda: tritongemm.matmul(a, torch.ones(2, 5, dtype=torch.complex64, device=DEVICE)), TypeError,
     r"b has dtype complex64, but only float16, bfloat16 and float32"),
    ("a_sparse_coo", lambda: tritongemm.matmul(a.to_sparse(), b), TypeError,
     r"a has layout torch.sparse_coo, but only dense \(torch.strided\) tensors are supported; pass a.to_dense\(\)"),
    ("b_sparse_csr", lambda: tritongemm.matmul(a, b.to_sparse_csr()), TypeError, r"b has layout torch.sparse_csr"),
    ("out_sparse", lambda: tritongemm.matmul(a, b, out=t(3, 5).to_sparse()), TypeError,
     r"out has layout torch.sparse_coo, but only a dense \(torch.strided\) out is supported"),
    ("out_negated_view", lambda: tritongemm.matmul(a.float(), b.float(), out=torch.zeros(3, 5, dtype=torch.complex64, device=DEVICE).conj().imag),
     ValueError, r"out is a negated view"),
    ("meta_tensors", lambda: tritongemm.matmul(torch.empty(3, 2, device="meta"), torch.empty(2, 5, device="meta")), ValueError,
     r"expected CUDA tensors, but got tensors on meta"),
]  # fmt: skip


@pytest.mark.parametrize("call, exc, pattern", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_out_disjoint_slices_of_one_storage_are_fine():
    out = tritongemm.matmul(base[:3, :3], base[3:6, :3].T.contiguous().T, out=base[6:9, 0:3].clone())
    assert out.shape == (3, 3)


@pytest.mark.parametrize(
    "field, value, pattern",
    [
        ("BLOCK_M", 48, r"BLOCK_M must be a power of two >= 16 .* but got BLOCK_M=48"),
        ("BLOCK_N", 8, r"BLOCK_N must be a power of two >= 16 \(tl.dot needs at least 16"),
        ("BLOCK_K", 0, r"BLOCK_K must be a power of two"),
        ("BLOCK_K", 32.0, r"BLOCK_K must be a power of two"),
        ("GROUP_SIZE_M", 0, r"GROUP_SIZE_M must be an int >= 1, but got 0"),
        ("num_warps", 3, r"num_warps must be 1, 2, 4, 8 or 16, but got 3"),
        ("num_stages", 0, r"num_stages must be an int >= 1, but got 0"),
        ("scheduler", "random", r"scheduler must be one of \('grouped', 'chunked'\), but got 'random'"),
    ],
)
def test_invalid_config_is_rejected(field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        MatmulConfig(**{field: value})


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the CPU path's message; on a GPU CPU tensors are a different case"
)
def test_cpu_tensors_need_the_interpreter(monkeypatch):
    from tritongemm.core import device_info

    monkeypatch.setattr(device_info, "interpreter_active", lambda: False)
    with pytest.raises(ValueError, match=re.escape("set TRITON_INTERPRET=1 before importing tritongemm")):
        tritongemm.matmul(torch.randn(3, 2), torch.randn(2, 5), kernel="naive")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU to have tensors on two devices")
def test_device_mismatch():
    with pytest.raises(ValueError, match=r"same device, but got a on cuda:0 and b on cpu"):
        tritongemm.matmul(torch.randn(3, 2, device="cuda"), torch.randn(2, 5))


# ---------------------------------------------------------------------------------------------
# What is not an error: autograd off, negated views, in-place writes seen by autograd
# ---------------------------------------------------------------------------------------------


def test_out_and_inputs_requiring_grad_are_fine_without_autograd():
    """As torch.matmul: under no_grad nothing needs tracking, so out= is allowed."""
    x, w = t(3, 2).requires_grad_(True), t(2, 5).requires_grad_(True)
    with torch.no_grad():
        out = tritongemm.matmul(x, w, out=t(3, 5).requires_grad_(True))
    assert torch.allclose(out.float(), x.detach().float() @ w.detach().float(), rtol=1e-2, atol=1e-2)


def test_negated_views_are_read_as_their_values():
    """x.conj().imag of a complex x is a float32 view with the negative bit: the kernels read raw
    memory, so matmul must materialize it rather than compute with the unnegated values."""
    x = torch.randn(4, 3, dtype=torch.complex64, device=DEVICE).conj().imag
    assert x.is_neg()
    eye = torch.eye(3, device=DEVICE)
    assert torch.equal(tritongemm.matmul(x, eye), x.resolve_neg())
    assert torch.equal(tritongemm.matmul(eye[:, :3], x.T), x.T.resolve_neg())


def test_writing_out_counts_as_an_in_place_change_for_autograd():
    """A tensor autograd saved for backward and then overwritten through out= must make backward
    raise, as torch's in-place ops do, not silently use the new values."""
    x = torch.randn(3, 2, device=DEVICE, requires_grad=True)
    w = torch.randn(2, 5, device=DEVICE)
    y = x @ w  # saves w for x's gradient
    version = w._version
    tritongemm.matmul(torch.randn(2, 4, device=DEVICE), torch.randn(4, 5, device=DEVICE), out=w)
    assert w._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU for an out on another device")
def test_out_on_another_device():
    with pytest.raises(ValueError, match=r"expected out to be on cuda:0, like the operands, but it is on cpu"):
        tritongemm.matmul(torch.randn(3, 2, device="cuda"), torch.randn(2, 5, device="cuda"), out=torch.empty(3, 5))


_TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not _TWO_GPUS, reason="needs 2 GPUs: tensors on one while the other is the current device")
@pytest.mark.parametrize(
    "kernel",
    [k["name"] for k in tritongemm.kernels(family="matmul") if k["available"] and not k["experimental"]] + ["auto"],
)
def test_operands_on_a_gpu_that_is_not_the_current_one(kernel):
    """The kernel must run on the operands' GPU (its SM count, its stream), not the current one."""
    for data_device, current in ((0, 1), (1, 0)):
        # K = 72 and N = 96: rows of 16-byte multiples, so the TMA kernels take them as they are.
        a_ = torch.randn(130, 72, device=f"cuda:{data_device}", dtype=torch.float16)
        b_ = torch.randn(72, 96, device=f"cuda:{data_device}", dtype=torch.float16)
        with torch.cuda.device(current):
            c = tritongemm.matmul(a_, b_, kernel=kernel)
            torch.cuda.synchronize(data_device)
        assert c.device == a_.device
        assert torch.allclose(c.float(), a_.float() @ b_.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(not _TWO_GPUS, reason="needs 2 GPUs for operands on different GPUs")
def test_operands_on_two_gpus():
    with pytest.raises(ValueError, match=r"same device, but got a on cuda:0 and b on cuda:1"):
        tritongemm.matmul(torch.randn(3, 2, device="cuda:0"), torch.randn(2, 5, device="cuda:1"))
    with pytest.raises(ValueError, match=r"expected out to be on cuda:0, like the operands, but it is on cuda:1"):
        a, b = torch.randn(3, 2, device="cuda:0"), torch.randn(2, 5, device="cuda:0")
        tritongemm.matmul(a, b, out=torch.empty(3, 5, device="cuda:1"))


CPU_ONLY = [
    # The interpreter computes bf16 dots on raw bit patterns: refused, never computed wrongly.
    ("bf16_auto", lambda: tritongemm.matmul(t(3, 2, dtype=torch.bfloat16), t(2, 5, dtype=torch.bfloat16)), TypeError,
     r"the operands are bfloat16 CPU tensors, but the Triton interpreter computes bfloat16 dots wrongly .* takes "
     r"float16, float32 only; use a CUDA GPU for bfloat16, or convert with \.to\(torch\.float32\)"),
    ("bf16_named", lambda: tritongemm.matmul(t(3, 2, dtype=torch.bfloat16), t(2, 5, dtype=torch.bfloat16), kernel="grouped"),
     TypeError, r"bfloat16 CPU tensors"),
    ("autotune_on_cpu", lambda: tritongemm.matmul(a, b, kernel="grouped", config="autotune"), ValueError,
     r"config='autotune' times each candidate config on a GPU, but the operands are CPU tensors; pass config=None"),
]  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors under the interpreter only")
@pytest.mark.parametrize("call, exc, pattern", [c[1:] for c in CPU_ONLY], ids=[c[0] for c in CPU_ONLY])
def test_bad_input_on_the_cpu_raises(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_kernels_say_what_runs_where():
    listed = {k["name"]: k for k in tritongemm.kernels("cpu", family="matmul")}
    assert listed["grouped"]["interpreter_dtypes"] == ["float16", "float32"]
    assert listed["tma_pipelined"]["interpreter_dtypes"] == [] and not listed["tma_pipelined"]["available"]
    assert "Gluon" in listed["tma_pipelined"]["unavailable"]
