"""Offsets past 2**31: the `triton.language` rungs switch their index math to int64 (INT64, see
ladder/_host.needs_int64) when a tensor spans that many elements. These tests check the choice
and the int64 path itself on the CPU; tests/gpu/test_large_index.py runs real > 2**31-element
operands on an H100.
"""

import pytest
import torch
import triton
import triton.language as tl
from cases import DEVICE, LADDER, Case, check_matmul

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.primitives.tl import host as _host
from tritongemm.primitives.tl.tiles import tile_offsets

SMALL = MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_SIZE_M=2, num_warps=4, num_stages=1)


def meta(shape, stride) -> torch.Tensor:
    """A tensor with this geometry and no memory behind it (max_offset reads shapes and strides)."""
    return torch.empty_strided(shape, stride, device="meta", dtype=torch.float16)


@pytest.mark.parametrize(
    "shape, stride, expected",
    [
        ((65536, 32768), (32768, 1), False),  # 2**31 elements: the last offset is 2**31 - 1
        ((65537, 32768), (32768, 1), True),
        ((32768, 65537), (1, 32768), True),  # transposed
        ((3, 100), (2**30 + 8, 1), True),  # 3 rows, 2**30 apart: a huge leading dimension
        ((2**20, 4096), (0, 1), False),  # stride-0 rows (expand) span no memory
        ((2**31 + 1, 1), (1, 1), True),  # M itself past 2**31
    ],
)
def test_needs_int64(shape, stride, expected):
    assert _host.needs_int64(meta(shape, stride)) is expected


def test_a_storage_offset_is_not_an_index():
    """The kernels get data_ptr(), which already includes the storage offset: a small view far
    into a big buffer needs no int64 index math."""
    view = torch.empty(0, device="meta", dtype=torch.float16).as_strided((100, 200), (200, 1), 2**32)
    assert view.storage_offset() == 2**32 and not _host.needs_int64(view)


@triton.jit
def _tile_offsets_kernel(out_m_ptr, out_n_ptr, pid_m, pid_n, BLOCK: tl.constexpr, INT64: tl.constexpr):
    offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK, BLOCK, INT64)
    tl.store(out_m_ptr + tl.arange(0, BLOCK), offs_m)
    tl.store(out_n_ptr + tl.arange(0, BLOCK), offs_n)


@pytest.mark.parametrize("pid", [2**31 // 64 - 1, 2**31 // 64, 2**32 // 64 + 5])
def test_tile_offsets_do_not_wrap_with_int64(pid):
    """pid_m * BLOCK_M itself passes 2**31 when M does (naive's pid_m is a plain int32 program id)."""
    out_m = torch.zeros(64, dtype=torch.int64, device=DEVICE)
    out_n = torch.zeros(64, dtype=torch.int64, device=DEVICE)
    _tile_offsets_kernel[(1,)](out_m, out_n, pid, pid, BLOCK=64, INT64=True)
    expected = pid * 64 + torch.arange(64, device=DEVICE)
    assert torch.equal(out_m, expected) and torch.equal(out_n, expected)


def _force_int64(monkeypatch, module) -> list:
    """Makes `module.needs_int64` answer True (the INT64 variant) and records each question; plans
    are cleared, since one another test built for the same geometry would not ask."""
    calls = []

    def always(*tensors):
        calls.append(tensors)
        return True

    monkeypatch.setattr(module, "needs_int64", always)
    tritongemm.plans.clear()
    return calls


@pytest.mark.parametrize("kernel", LADDER)
@pytest.mark.parametrize(
    "case",
    [Case(37, 41, 43, "tt", SMALL), Case(17, 33, 17, "padded", SMALL), Case(53, 7, 29, "offset", SMALL)],
    ids=str,
)
def test_int64_path_matches_reference(case, kernel, monkeypatch):
    """The INT64 variant of every rung, forced on small shapes: same masks, same answers."""
    calls = _force_int64(monkeypatch, _host)
    check_matmul(case, kernel, torch.float32)
    assert calls, "the launcher no longer asks _host.needs_int64"


@pytest.mark.large(gib=6)
@pytest.mark.parametrize("kernel", LADDER)
def test_a_k_step_past_2_31_elements(kernel):
    """A transposed A whose columns are 2**25 elements apart: one BLOCK_K = 64 step along K moves
    2**31 elements, which wraps in int32 even though every offset the kernel needs is valid.
    The storage is 2**31 elements (4 GiB) that are never touched but for the 4 x 65 used."""
    M, K, N, col_stride = 4, 65, 8, 2**25
    try:
        storage = torch.empty((K - 1) * col_stride + M, dtype=torch.float16, device=DEVICE)
    except (RuntimeError, MemoryError) as e:  # a CPU without overcommit, a small GPU
        pytest.skip(f"could not reserve 4 GiB of address space: {e}")
    a = storage.as_strided((M, K), (1, col_stride))
    a.copy_(torch.randn(M, K, device=DEVICE))
    b = torch.randn(K, N, device=DEVICE, dtype=torch.float16)
    assert _host.needs_int64(a)
    c = tritongemm.matmul(a, b, kernel=kernel, config=SMALL.with_(BLOCK_K=64))
    assert rel_error(c, reference_matmul(a, b)) <= tolerance(torch.float16, K)


def test_naive_refuses_a_grid_it_cannot_launch():
    """CUDA grids hold at most 65535 programs along y, where naive puts the column tiles."""
    a = torch.randn(1, 16, device=DEVICE)
    b = torch.empty(16, 65536 * 16 + 1, device=DEVICE)
    with pytest.raises(ValueError, match=r"naive: N = 1048577 makes 65537 column tiles of BLOCK_N = 16, but a CUDA"):
        tritongemm.matmul(a, b, kernel="naive", config=MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16))


# ---------------------------------------------------------------------------------------------
# fp8: the activation's quantization and the tl scaled GEMMs
# ---------------------------------------------------------------------------------------------


@pytest.mark.large(gib=6)
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_quantizing_rows_2_30_elements_apart(recipe):
    """Row 2 of x starts 2**31 + 16 elements in: the quantize kernels' row offsets must not wrap
    (they did in int32, an illegal address at a prefill's 131072 x 18944 MLP activation)."""
    from tritongemm.fp8.recipes import reference_quantize

    K, row_stride = 256, 2**30 + 8
    try:
        storage = torch.empty(2 * row_stride + K, dtype=torch.bfloat16, device=DEVICE)
    except (RuntimeError, MemoryError) as e:  # a CPU without overcommit, a small GPU
        pytest.skip(f"could not reserve 4 GiB of address space: {e}")
    x = storage.as_strided((3, K), (row_stride, 1))
    x.copy_(torch.randn(3, K, device=DEVICE))
    assert _host.needs_int64(x)
    q, scale = tritongemm.quantize_fp8(x, recipe)
    ref, ref_scale = reference_quantize(x.contiguous(), recipe)
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8)) and torch.equal(scale, ref_scale)


@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
@pytest.mark.parametrize("kernel", ["fp8_grouped", "fp8_swap_ab"])
def test_fp8_int64_path_matches_reference(kernel, recipe, monkeypatch):
    """The fp8 tl kernels' INT64 variant, forced on a small problem: the same answer."""
    from tritongemm.core.reference import fp8_tolerance
    from tritongemm.fp8 import build
    from tritongemm.fp8.recipes import reference_scaled_mm

    calls = _force_int64(monkeypatch, build)
    x, w = torch.randn(24, 256, device=DEVICE), torch.randn(40, 256, device=DEVICE) / 16
    block = recipe == "block"
    a, sa = tritongemm.quantize_fp8(x, recipe)
    b, sb = tritongemm.quantize_fp8(w, recipe, block=(128, 128) if block else None)
    sb = sb.T if recipe == "row" else sb  # (1, N) for b = w.T; a block grid and one scalar as they are
    y = tritongemm.scaled_mm(a, b.T, sa, sb, out_dtype=torch.float32, kernel=kernel)
    ref = reference_scaled_mm(a, b.T, sa, sb, out_dtype=torch.float64)
    assert calls, "scaled_mm's tl launcher no longer asks needs_int64"
    assert rel_error(y, ref) <= fp8_tolerance(torch.float32, 256)
