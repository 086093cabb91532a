"""Every `triton.language` rung against the fp64 reference, on shapes that hit every boundary.

On the CPU these run under the Triton interpreter (fp16, fp32, small shapes); on a GPU the same
table runs with bf16 too, plus the large shapes marked slow.
"""

import dataclasses

import pytest
import torch
from cases import DEVICE, DTYPES, HOPPER, LADDER, LAYOUTS, ON_GPU, ON_HOPPER, Case, check_matmul, make_operands

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.ladder.grouped import LESSON_CONFIGS

# A small tile so that small shapes straddle tile edges: 16 rows, 32 columns, 16 deep.
SMALL = MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_SIZE_M=2, num_warps=4, num_stages=1)

BOUNDARY = [
    Case(1, 1, 1, config=SMALL),
    Case(1, 17, 15, config=SMALL),
    Case(17, 1, 16, config=SMALL),
    Case(15, 31, 15, config=SMALL),  # one under the tile on every axis
    Case(16, 32, 16, config=SMALL),  # exactly one tile
    Case(17, 33, 17, config=SMALL),  # one over on every axis
    Case(16, 33, 15, config=SMALL),
    Case(17, 32, 31, config=SMALL),
    Case(31, 63, 33, config=SMALL),
    Case(37, 41, 43, config=SMALL),  # primes
    Case(53, 7, 29, config=SMALL),
    Case(3, 5, 257, config=SMALL),  # long K, tiny output
    Case(5, 7, 0, config=SMALL),  # K = 0: zeros
    Case(0, 5, 7, config=SMALL),  # empty output
    Case(5, 0, 7, config=SMALL),
    Case(208, 416, 304),  # the seed tests' shape, default config
]
LAYOUT_CASES = [Case(37, 41, 43, layout, SMALL) for layout in LAYOUTS]
# 5 x 4 tiles of 16x16: GROUP_SIZE_M 3 and 8 leave a partial last group.
GROUP_CASES = [Case(70, 50, 20, config=SMALL.with_(BLOCK_N=16, GROUP_SIZE_M=g)) for g in (1, 3, 8)]
GPU_CASES = [
    Case(2000, 1000, 2000),
    Case(2000, 1000, 2000, "nt"),
    Case(1000, 2000, 2000, "tn"),
    Case(1000, 2000, 2000, "tt"),
    Case(4097, 4095, 513),
    Case(128, 4096, 4096),
    *[Case(999, 1001, 1003, config=c) for c in LESSON_CONFIGS],
]

CASES = BOUNDARY + LAYOUT_CASES + [pytest.param(c, marks=pytest.mark.slow) for c in GPU_CASES if ON_GPU]

# The Gluon kernels through the API, on an sm_90 GPU: fp16/bf16 only, and WGMMA tiles start at 64
# rows, so they run the small-tile cases with HOPPER_SMALL. Their own tests are in tests/gpu/.
HOPPER_SMALL = MatmulConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_SIZE_M=2, num_warps=4, num_stages=3)
KERNEL_DTYPES = [(k, d) for k in LADDER for d in DTYPES] + [
    (k, d) for k in (HOPPER if ON_HOPPER else ()) for d in (torch.float16, torch.bfloat16)
]


@pytest.mark.parametrize("kernel, dtype", KERNEL_DTYPES, ids=lambda v: str(v).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case, kernel, dtype):
    if kernel in HOPPER and case.config is not None and case.config.BLOCK_M < 64:
        case = dataclasses.replace(case, config=HOPPER_SMALL)
    check_matmul(case, kernel, dtype)


@pytest.mark.parametrize("kernel", ["grouped", "persistent"])
@pytest.mark.parametrize("case", GROUP_CASES, ids=str)
def test_group_sizes(case, kernel):
    check_matmul(case, kernel, torch.float16)


@pytest.mark.parametrize("allow_tf32", [False, True])
@pytest.mark.parametrize("kernel", LADDER)
def test_fp32_follows_tf32_switch(kernel, allow_tf32):
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    check_matmul(Case(65, 47, 300, config=SMALL), kernel, torch.float32)


def test_auto_without_out_allocates_result():
    a, b = make_operands(Case(37, 41, 43), torch.float16)
    c = tritongemm.matmul(a, b)
    assert c.shape == (37, 41) and c.dtype == torch.float16 and c.device.type == DEVICE.type
    assert rel_error(c, reference_matmul(a, b)) <= tolerance(torch.float16, 43)


def test_out_with_strides_is_written_in_place():
    a, b = make_operands(Case(37, 41, 43), torch.float32)
    out_t = torch.full((41, 37), float("nan"), device=DEVICE)
    result = tritongemm.matmul(a, b, out=out_t.T, kernel="grouped", config=SMALL)
    assert result.data_ptr() == out_t.data_ptr()
    assert rel_error(out_t.T, reference_matmul(a, b)) <= tolerance(torch.float32, 43)


@pytest.mark.parametrize("shape", [(0, 5, 7), (5, 0, 7), (0, 0, 0), (4, 6, 0)])
def test_degenerate_shapes_launch_nothing(shape, monkeypatch):
    from tritongemm.ladder import naive

    monkeypatch.setattr(naive, "_naive_kernel", None)  # any launch would raise TypeError
    M, N, K = shape
    c = tritongemm.matmul(torch.randn(M, K, device=DEVICE), torch.randn(K, N, device=DEVICE), kernel="naive")
    assert c.shape == (M, N) and (c == 0).all()


def test_k_zero_overwrites_out_with_zeros():
    a = torch.randn(6, 0, device=DEVICE, dtype=torch.float16)
    b = torch.randn(0, 9, device=DEVICE, dtype=torch.float16)
    out = torch.full((6, 9), float("nan"), device=DEVICE, dtype=torch.float16)
    tritongemm.matmul(a, b, out=out)
    assert (out == 0).all()


@pytest.mark.parametrize("kernel", LADDER)
def test_autograd_matches_reference(kernel):
    a, b = make_operands(Case(23, 29, 31), torch.float32)
    a.requires_grad_(True)
    b.requires_grad_(True)
    grad_c = torch.randn(23, 29, device=DEVICE)
    tritongemm.matmul(a, b, kernel=kernel).backward(grad_c)
    a64, b64 = a.detach().double().requires_grad_(True), b.detach().double().requires_grad_(True)
    (a64 @ b64).backward(grad_c.double())
    assert rel_error(a.grad, a64.grad) <= tolerance(torch.float32, 29)
    assert rel_error(b.grad, b64.grad) <= tolerance(torch.float32, 23)


@pytest.mark.skipif(not ON_GPU, reason="autotuning times kernels, which needs a GPU")
def test_grouped_autotune():
    a, b = make_operands(Case(777, 555, 333), torch.float16)
    out = torch.full((777, 555), float("nan"), dtype=torch.float16, device=DEVICE)
    tritongemm.matmul(a, b, out=out, kernel="grouped", config="autotune")
    assert rel_error(out, reference_matmul(a, b)) <= tolerance(torch.float16, 333)


@pytest.mark.parametrize("M, expected", [(1, "swap_ab"), (128, "swap_ab"), (129, "grouped")])
def test_auto_picks_by_shape_on_this_device(M, expected):
    # a transposed: no TMA kernel takes it, and a problem this small isn't worth a copy
    a, b = make_operands(Case(M, 40, 32, "tn"), torch.float16)
    assert tritongemm.dense.matmul.lookup(a, b, None, "auto", None).kernel == expected
