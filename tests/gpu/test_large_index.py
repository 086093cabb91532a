"""Sizes that break 32-bit indexing, on a GPU: every kernel given operands of more than 2**31
elements, offsets past 2**31, or more rows than int32 holds either computes the right answer or
refuses with a ValueError before launching (a rung that can't take the input; "auto" must
always compute). Each test needs several GiB of free GPU memory and skips, saying so, without.

The `large` marker (tests/conftest.py) runs these one at a time whatever -n is, each once its
memory is free: ``PYTHONPATH=. python3 -m pytest -m large tests`` (about 2 minutes on the H100).

The results are too big for an fp64 reference of the whole product: they are checked on sampled
rows / columns (the first, the last, the ones around the 2**31 boundaries, random ones), and
every element is checked to have been written (C starts as NaN).
"""

import pytest
import torch

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import fp8_tolerance, reference_matmul, rel_error, tolerance

ON_GPU = torch.cuda.is_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.large(gib=10),
    pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU with tens of GiB of memory"),
]
KERNELS = ["auto"] + [
    k["name"]
    for k in (tritongemm.kernels(family="matmul") if ON_GPU else [])
    if k["available"] and not k["experimental"]
]
F16 = torch.float16


def run_or_refuse(kernel: str, a, b, config=None) -> torch.Tensor | None:
    """C (NaN-poisoned out) or None when a named rung refused the input with a ValueError."""
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=a.dtype, device=a.device)
    try:
        tritongemm.matmul(a, b, out=out, kernel=kernel, config=config)
    except ValueError as e:
        if kernel == "auto":
            raise AssertionError(f"kernel='auto' refused valid operands: {e}") from e
        print(f"{kernel} refused: {e}")
        return None
    except torch.OutOfMemoryError as e:
        oom = str(e).splitlines()[0]  # failing outside the handler frees what matmul had allocated
    else:
        torch.cuda.synchronize()
        return out
    del out
    pytest.fail(f"{kernel} ran out of GPU memory instead of refusing the input before allocating: {oom}")


def check_sampled(c, a, b, rows=None, cols=None) -> None:
    assert not c.isnan().any(), "some elements of C were not written"
    if rows is not None:
        rows = torch.tensor(sorted({r % a.shape[0] for r in rows}), device=a.device)
        ref, got = reference_matmul(a[rows], b), c[rows]
    else:
        cols = torch.tensor(sorted({j % b.shape[1] for j in cols}), device=a.device)
        ref, got = reference_matmul(a, b[:, cols]), c[:, cols]
    err = rel_error(got, ref)
    assert err <= tolerance(a.dtype, a.shape[1]), f"relative error {err:.3e} on the sampled rows/columns"


def samples(n: int, boundary: int) -> list[int]:
    gen = torch.Generator().manual_seed(n)
    edges = [0, 1, boundary - 1, boundary, boundary + 1, n - 2, n - 1]
    return edges + torch.randint(0, n, (24,), generator=gen).tolist()


# ---------------------------------------------------------------------------------------------
# One operand of more than 2**31 elements (65600 x 32768 fp16, 4.3 GB)
# ---------------------------------------------------------------------------------------------

BIG, DEEP, SMALL_N = 65600, 32768, 128
ROW_PAST = 2**31 // DEEP  # the first row of A whose offsets pass 2**31


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_over_2_31_elements(kernel):
    a = torch.randn(BIG, DEEP, device="cuda", dtype=F16)
    b = torch.randn(DEEP, SMALL_N, device="cuda", dtype=F16)
    c = run_or_refuse(kernel, a, b)
    if c is not None:
        check_sampled(c, a, b, rows=samples(BIG, ROW_PAST))


@pytest.mark.large(gib=14)
@pytest.mark.parametrize("kernel", KERNELS)
def test_transposed_a_over_2_31_elements(kernel):
    a = torch.randn(DEEP, BIG, device="cuda", dtype=F16).T  # (BIG, DEEP), column-major
    b = torch.randn(DEEP, SMALL_N, device="cuda", dtype=F16)
    c = run_or_refuse(kernel, a, b)
    if c is not None:
        check_sampled(c, a, b, rows=samples(BIG, 2**31 // DEEP))


@pytest.mark.large(gib=14)
@pytest.mark.parametrize("b_layout", ["row", "k_major"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_b_over_2_31_elements(kernel, b_layout):
    a = torch.randn(SMALL_N, DEEP, device="cuda", dtype=F16)
    if b_layout == "row":
        b = torch.randn(DEEP, BIG, device="cuda", dtype=F16)
    else:
        b = torch.randn(BIG, DEEP, device="cuda", dtype=F16).T  # an (N, K) weight, as nn.Linear's
    c = run_or_refuse(kernel, a, b)
    if c is not None:
        check_sampled(c, a, b, cols=samples(BIG, 2**31 // DEEP))


@pytest.mark.parametrize("kernel", KERNELS)
def test_c_over_2_31_elements(kernel):
    a = torch.randn(BIG, 64, device="cuda", dtype=F16)
    b = torch.randn(64, DEEP, device="cuda", dtype=F16)
    c = run_or_refuse(kernel, a, b)
    if c is not None:
        check_sampled(c, a, b, rows=samples(BIG, ROW_PAST))


@pytest.mark.parametrize("kernel", KERNELS)
def test_exactly_2_31_elements(kernel):
    """65536 x 32768: the last offset is 2**31 - 1, the int32 path's last legal one."""
    a = torch.randn(65536, DEEP, device="cuda", dtype=F16)
    b = torch.randn(DEEP, SMALL_N, device="cuda", dtype=F16)
    c = run_or_refuse(kernel, a, b)
    if c is not None:
        check_sampled(c, a, b, rows=samples(65536, 65535))


# ---------------------------------------------------------------------------------------------
# Small products far into big buffers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("misalign", [0, 3], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_storage_offset_past_2_31(kernel, misalign):
    buf = torch.full((2**31 + 2**20,), float("nan"), device="cuda", dtype=F16)
    start = 2**31 + 64 + misalign
    a = buf[start : start + 100 * 200].view(100, 200).normal_()
    b = buf[start + 20480 : start + 20480 + 200 * 72].view(200, 72).normal_()
    assert a.storage_offset() > 2**31
    c = run_or_refuse(kernel, a, b)
    if c is not None:
        assert rel_error(c, reference_matmul(a, b)) <= tolerance(F16, 200)


@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_2_30_elements_apart(kernel):
    """A leading dimension of 2**30 + 8: 3 rows span more than 2**31 elements of a 4 GiB buffer."""
    buf = torch.full((2 * (2**30 + 8) + 256,), float("nan"), device="cuda", dtype=F16)
    a = buf.as_strided((3, 100), (2**30 + 8, 1)).normal_()
    b = torch.randn(100, 40, device="cuda", dtype=F16)
    c = run_or_refuse(kernel, a, b)
    if c is not None:
        assert rel_error(c, reference_matmul(a, b)) <= tolerance(F16, 100)


# ---------------------------------------------------------------------------------------------
# More rows than int32 holds, and grids past CUDA's limits
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kernel",
    # The Gluon rungs copy A and C into 16-byte rows (8x their size, 2 x 32 GiB) before their
    # descriptors refuse the 2**31-row dimension: on the H100 that fits only on an idle GPU.
    [pytest.param(k, marks=pytest.mark.large(gib=72 if k.startswith("tma") else 20)) for k in KERNELS],
)
def test_more_than_2_31_rows(kernel):
    """M = 2**31 + 100, K = N = 1: the row index itself passes int32 (pid_m * BLOCK_M wraps unless
    widened first). TMA descriptors take dims below 2**31, so the Gluon rungs must refuse."""
    M = 2**31 + 100
    a = torch.randn(M, 1, device="cuda", dtype=F16)
    b = torch.randn(1, 1, device="cuda", dtype=F16)
    c = run_or_refuse(kernel, a, b)
    if c is not None:
        check_sampled(c, a, b, rows=samples(M, 2**31))


@pytest.mark.parametrize("kernel", KERNELS)
def test_more_than_65535_column_tiles(kernel):
    """N / BLOCK_N = 65536 tiles: a 2D grid with the column tiles on its y axis (limit 65535)
    can't launch; such a rung must refuse, the 1D-grid ones compute it."""
    N = 65536 * 64
    a = torch.randn(64, 64, device="cuda", dtype=F16)
    b = torch.randn(64, N, device="cuda", dtype=F16)
    config = None if kernel == "auto" else MatmulConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)
    c = run_or_refuse(kernel, a, b, config)
    if c is not None:
        check_sampled(c, a, b, cols=samples(N, 65535 * 64))


# ---------------------------------------------------------------------------------------------
# fp8: the activation's quantization and scaled_mm past 2**31 elements
# ---------------------------------------------------------------------------------------------

FP8_KERNELS = ["auto"] + [
    k["name"] for k in (tritongemm.kernels(family="scaled_mm") if ON_GPU else []) if k["available"]
]


@pytest.mark.large(gib=16)
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_quantizing_an_activation_over_2_31_elements(recipe):
    """A prefill's MLP activation: 131072 tokens (256 sequences of 512) x Qwen2-7B's 18944, 2.5e9
    elements. The quantize kernel's int32 row offsets wrapped here (an illegal address on the
    H200, bench decode's batch 256); every sampled row must equal the reference's."""
    from tritongemm.fp8.recipes import reference_quantize

    x = torch.randn(131072, 18944, device="cuda", dtype=torch.bfloat16)
    q, scale = tritongemm.quantize_fp8(x, recipe)
    torch.cuda.synchronize()
    rows = torch.tensor(sorted({r % x.shape[0] for r in samples(x.shape[0], 2**31 // x.shape[1])}), device="cuda")
    if recipe == "tensor":  # one scale, from the whole tensor's absmax: checked, then applied to the rows
        # Divided by a tensor: torch's CUDA division by a Python number multiplies by its
        # reciprocal, an ulp off the kernel's IEEE division (as fp8.recipes.reference_quantize notes).
        fp8_max = torch.tensor(torch.finfo(torch.float8_e4m3fn).max, device="cuda")
        assert scale.item() == (x.abs().max().float() / fp8_max).item()
        ref = (x[rows].float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    else:
        ref, ref_scale = reference_quantize(x[rows], recipe)
        assert torch.equal(scale[rows], ref_scale)
    assert torch.equal(q[rows].view(torch.uint8), ref.view(torch.uint8))


@pytest.mark.parametrize("kernel", FP8_KERNELS)
def test_scaled_mm_with_c_over_2_31_elements(kernel):
    """C of 65600 x 32768 (2.1e9 elements) from K = 128: every fp8 kernel computes it or refuses."""
    from tritongemm.fp8.recipes import reference_scaled_mm

    a, scale_a = tritongemm.quantize_fp8(torch.randn(BIG, 128, device="cuda", dtype=torch.bfloat16), "row")
    b, scale_b = tritongemm.quantize_fp8(torch.randn(DEEP, 128, device="cuda", dtype=torch.bfloat16), "row")
    try:
        c = tritongemm.scaled_mm(a, b.T, scale_a, scale_b.T, kernel=kernel)
    except ValueError as e:
        assert kernel != "auto", f"kernel='auto' refused valid operands: {e}"
        return
    torch.cuda.synchronize()
    rows = torch.tensor(sorted({r % BIG for r in samples(BIG, ROW_PAST)}), device="cuda")
    ref = reference_scaled_mm(a[rows], b.T, scale_a[rows], scale_b.T)
    assert rel_error(c[rows], ref) <= fp8_tolerance(torch.bfloat16, 128)
