"""What kernel="auto" chooses (plan._choose_kernel), on the CPU: every kernel is made available
with its GPU dtypes, as on an H100, so the choice alone is tested; meta tensors stand for operands
of any size. Whether the choices are fast is for the benchmarks to say (BENCHMARKS.md)."""

import pytest
import torch

from tritongemm import plan, registry

F16, F32 = torch.float16, torch.float32


@pytest.fixture(autouse=True)
def as_on_an_h100(monkeypatch):
    monkeypatch.setattr(registry.KernelInfo, "available_on", lambda self, device: True)
    monkeypatch.setattr(registry.KernelInfo, "dtypes_on", lambda self, device: self.dtypes)


def operand(rows, cols, dtype=F16, row_stride=None):
    """A (rows, cols) meta tensor whose rows are row_stride elements apart (default: cols)."""
    storage = torch.empty(rows * (row_stride or cols), device="meta", dtype=dtype)
    return storage.as_strided((rows, cols), (row_stride or cols, 1))


def choose(a, b, out_dtype=None) -> str:
    return plan._choose_kernel("auto", a, b, out_dtype or a.dtype).name


def test_aligned_operands_take_the_top_rung():
    assert choose(operand(256, 512), operand(512, 384)) == "tma_persistent_pipelined"
    assert choose(operand(256, 512), operand(384, 512).T) == "tma_persistent_pipelined"  # a weight's view


def test_decode_sized_m_takes_the_grouped_rung():
    assert choose(operand(16, 4096), operand(4096, 4096)) == "grouped"


def test_what_tma_cannot_take():
    assert choose(operand(256, 512, F32), operand(512, 384, F32)) == "persistent"  # TMA rungs: fp16/bf16
    assert choose(operand(256, 512), operand(512, 384), out_dtype=F32) == "persistent"  # C in the inputs' dtype


@pytest.mark.parametrize(
    "M, N, K, expected",
    [
        (64, 64, 100, "persistent"),  # 2 * 64 * 64 * 100 FLOPs: the copy would cost more than it saves
        (12345, 4567, 2345, "tma_persistent_pipelined"),  # issue 14's case: 0.15x untouched, 2.6x copied
        (1024, 1024, 1000, "tma_persistent_pipelined"),  # 2**31 FLOPs, past STAGING_MIN_FLOPS
    ],
)
def test_misaligned_rows_are_copied_for_large_problems_only(M, N, K, expected):
    """Rows of K fp16 elements with K not a multiple of 8: not 16-byte aligned, so TMA needs a copy."""
    assert choose(operand(M, K), operand(K, N, row_stride=N + 1)) == expected


def test_no_copy_serves_a_dimension_past_what_a_descriptor_takes():
    a, b = operand(2**31, 24, row_stride=25), operand(24, 64)
    assert choose(a, b) == "persistent"
