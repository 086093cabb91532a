"""Bad input: each case gets an error, raised before any launch, that names the argument, the
value given and what was expected."""

import re

import pytest
import torch
from cases import DEVICE

import tritongemm
from tritongemm import MatmulConfig


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
    ("a_1d", lambda: tritongemm.matmul(t(3), b), ValueError, r"expected a to be a 2D tensor, but got a 1D tensor of shape \(3,\)"),
    ("b_3d", lambda: tritongemm.matmul(a, t(1, 2, 5)), ValueError, r"expected b to be a 2D tensor, but got a 3D"),
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
    from tritongemm.ladder import _tiles

    monkeypatch.setattr(_tiles, "INTERPRETED", False)
    with pytest.raises(ValueError, match=re.escape("set TRITON_INTERPRET=1 before importing tritongemm")):
        tritongemm.matmul(torch.randn(3, 2), torch.randn(2, 5), kernel="naive")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU to have tensors on two devices")
def test_device_mismatch():
    with pytest.raises(ValueError, match=r"same device, but got a on cuda:0 and b on cpu"):
        tritongemm.matmul(torch.randn(3, 2, device="cuda"), torch.randn(2, 5))
