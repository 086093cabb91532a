"""quantize_fp8_pair: both fp8 copies, x's and xᵀ's, equal quantize_fp8's of x and of x.T bit for
bit (the recipes' torch reference too), on odd shapes, strided inputs, both fp8 formats and empty
tensors; bad arguments refused by name. CPU under the interpreter, and the GPU."""

from __future__ import annotations

import pytest
import torch
from cases import DEVICE, ON_GPU

from tritongemm.fp8.api import quantize_fp8
from tritongemm.fp8.pair import quantize_fp8_pair
from tritongemm.fp8.recipes import reference_quantize

SHAPES = {"tensor": [(1, 1), (70, 200), (129, 65)], "row": [(1, 7), (70, 200), (129, 65)],
          "block": [(128, 128), (130, 300), (256, 384)]}  # fmt: skip


def _expected(x, recipe, dtype):
    block = (128, 128) if recipe == "block" else None
    return (*quantize_fp8(x, recipe, block=block, dtype=dtype), *quantize_fp8(x.T, recipe, block=block, dtype=dtype))


def _same(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(
            g.view(torch.uint8) if g.dtype.itemsize == 1 else g, w.view(torch.uint8) if w.dtype.itemsize == 1 else w
        )


@pytest.mark.parametrize("recipe", list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_both_copies_equal_quantize_fp8_of_x_and_its_transpose(recipe, dtype):
    gen = torch.Generator().manual_seed(0)
    for R, C in SHAPES[recipe]:
        x = (torch.randn(R, C, generator=gen) * 3).to(DEVICE)
        x[R // 2, C // 3] = 500.0  # an outlier: its row's and its column's scales
        got = quantize_fp8_pair(x, recipe, dtype)
        _same(got, _expected(x, recipe, dtype))
        q, s, qt, st = got
        ref_q, ref_s = reference_quantize(x.T.contiguous(), recipe, (128, 128) if recipe == "block" else None, dtype)
        assert torch.equal(qt.float(), ref_q.float()) and torch.equal(st, ref_s)


@pytest.mark.parametrize("recipe", ["tensor", "row"])
def test_a_strided_input_is_read_in_place(recipe):
    base = torch.randn(90, 300, device=DEVICE)
    for x in (base[:, 10:210], base.T[5:80], base[::2]):  # a slice, a transposed view, every other row
        _same(quantize_fp8_pair(x, recipe), _expected(x.contiguous(), recipe, torch.float8_e4m3fn))


def test_bf16_input_and_an_all_zero_tensor():
    x = torch.randn(64, 96, device=DEVICE).to(torch.float16)
    _same(quantize_fp8_pair(x, "row"), _expected(x, "row", torch.float8_e4m3fn))
    z = torch.zeros(33, 17, device=DEVICE)
    q, s, qt, st = quantize_fp8_pair(z, "row")
    assert not q.float().any() and not qt.float().any() and torch.isfinite(s).all() and torch.isfinite(st).all()


def test_an_empty_tensor_gives_empty_copies_and_floor_scales():
    q, s, qt, st = quantize_fp8_pair(torch.empty(0, 16, device=DEVICE), "row")
    assert q.shape == (0, 16) and qt.shape == (16, 0) and s.shape == (0, 1) and st.shape == (16, 1)


@pytest.mark.parametrize(
    "args,error,match",
    [
        ((torch.zeros(4, 4), "int8"), ValueError, "expected recipe to be one of"),
        ((torch.zeros(2, 4, 4), "row"), ValueError, r"expected x of 2 dimensions \(R, C\), but got \(2, 4, 4\)"),
        ((torch.zeros(4, 4, dtype=torch.float64), "row"), TypeError, "expected x of dtype"),
        ((torch.zeros(4, 4), "row", torch.float16), TypeError, "expected dtype float8_e4m3fn or float8_e5m2"),
    ],
)
def test_bad_arguments_are_refused_by_name(args, error, match):
    x, *rest = args
    with pytest.raises(error, match=match):
        quantize_fp8_pair(x.to(DEVICE), *rest)


@pytest.mark.parametrize("recipe", list(SHAPES))
def test_the_transposed_copy_alone_equals_quantize_fp8_of_the_transpose(recipe):
    from tritongemm.fp8.pair import quantize_fp8_transposed

    gen = torch.Generator().manual_seed(1)
    block = (128, 128) if recipe == "block" else None
    for R, C in SHAPES[recipe]:
        x = (torch.randn(R, C, generator=gen) * 2).to(DEVICE)
        _same(quantize_fp8_transposed(x, recipe), quantize_fp8(x.T, recipe, block=block))


def test_row_counts_that_leave_the_column_maxima_unaligned_are_served():
    """The column maxima follow the row maxima in one buffer: at R = 9 they had started 36 bytes
    in, not the 16-byte alignment the kernel was compiled for (a misaligned address on the H200)."""
    for R in (1, 9, 33):
        x = torch.randn(R, 40, device=DEVICE)
        _same(quantize_fp8_pair(x, "row"), _expected(x, "row", torch.float8_e4m3fn))


@pytest.mark.skipif(not ON_GPU, reason="the interpreter's cast to fp8 turns NaN into a number; the GPU's keeps it")
@pytest.mark.parametrize("recipe", list(SHAPES))
def test_a_nan_stays_nan_in_every_copy(recipe):
    """A NaN in x is NaN in q and qt (and in quantize_fp8's copy), as in torch's clamp: not a
    finite +-448 that would let a diverged step's loss look finite."""
    x = torch.randn(128, 256, device=DEVICE)
    x[5, 70] = float("nan")
    q, _, qt, _ = quantize_fp8_pair(x, recipe)
    alone, _ = quantize_fp8(x, recipe, block=(128, 128) if recipe == "block" else None)
    assert q.float()[5, 70].isnan() and qt.float()[70, 5].isnan() and alone.float()[5, 70].isnan()
