"""NaN and Inf: inputs that hold them give NaN / +-Inf exactly where IEEE arithmetic puts them and
torch.matmul (cuBLAS on a GPU) does, and results past a dtype's range overflow to +-Inf.

Runs every kernel available on the device: the `triton.language` rungs under the interpreter on
the CPU (fp16, fp32), all six on an H100 (bf16 too). The operands are views into storage padded
with NaN, so a kernel that reads past a view shows up as a NaN where none belongs.
"""

import math

import pytest
import torch
from cases import DEVICE, DTYPES

import tritongemm
from tritongemm.core.reference import reference_matmul, rel_error, tolerance

pytestmark = [
    # numpy, under the interpreter, warns about the very overflows these tests make on purpose
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

NAN, INF = math.nan, math.inf
AVAILABLE = [k for k in tritongemm.kernels(DEVICE, family="matmul") if k["available"]]
PARAMS = [
    pytest.param(k["name"], dtype, id=f"{k['name']}-{str(dtype).removeprefix('torch.')}")
    for k in AVAILABLE
    for dtype in DTYPES
    if str(dtype).removeprefix("torch.") in k["dtypes"]
]


def padded(values: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """A copy of `values` as a view into NaN-filled storage: 5 spare elements before it and 7
    after each row (the storage rows are the columns when transposed)."""
    rows, cols = values.shape
    outer, inner = (cols, rows) if transposed else (rows, cols)
    storage = torch.full((5 + outer * (inner + 7) + 7,), NAN, dtype=values.dtype, device=DEVICE)
    view = torch.as_strided(storage, (outer, inner), (inner + 7, 1), 5)
    view = view.T if transposed else view
    view.copy_(values)
    return view


def nonfinite_pattern(t: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"NaN": t.isnan(), "+Inf": t.isposinf(), "-Inf": t.isneginf()}


def assert_same_pattern(result: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    for name, mask in nonfinite_pattern(expected).items():
        got = nonfinite_pattern(result)[name]
        wrong = (got != mask).nonzero().tolist()
        assert not wrong, (
            f"{name} positions differ from {what} at (row, col) {wrong[:8]}{' ...' if len(wrong) > 8 else ''}; "
            f"result {result[tuple(wrong[0])].item()} vs {what} {expected[tuple(wrong[0])].item()}"
        )


def planted_operands(dtype: torch.dtype, M=37, N=41, K=43):
    """Random a (M, K), b (K, N) with NaN, +Inf, -Inf and zeros planted so that every IEEE case
    occurs: x * NaN, Inf * finite (either sign), Inf * 0 = NaN, Inf - Inf = NaN."""
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(M, K, generator=gen)
    b = torch.randn(K, N, generator=gen)
    a[3, 5] = NAN  # row 3 of C: all NaN
    a[7, 2] = INF  # row 7: +-Inf by the sign of b[2, j] ...
    b[2, 10:14] = 0  # ... and NaN where it meets a zero
    a[11, 8], a[11, 9] = INF, -INF  # row 11: NaN where b[8, j] and b[9, j] have one sign, else +-Inf
    a[20, 0], a[20, 1] = INF, INF  # row 20: +Inf + +Inf stays Inf where b's signs agree
    b[4, 17] = NAN  # column 17: all NaN
    b[6, 25] = -INF  # column 25: -+Inf by the sign of a[i, 6]
    a[30, 6] = 0  # ... NaN in row 30
    b[40, 33] = INF  # column 33 meets a's Inf rows too
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("transposed", [False, True], ids=["nn", "tt"])
@pytest.mark.parametrize("kernel, dtype", PARAMS)
def test_nan_and_inf_propagate_like_ieee_and_torch(kernel, dtype, transposed):
    a_values, b_values = planted_operands(dtype)
    a, b = padded(a_values.to(DEVICE), transposed), padded(b_values.to(DEVICE), transposed)
    result = tritongemm.matmul(a, b, kernel=kernel)

    reference = reference_matmul(a, b)  # fp64: what IEEE arithmetic gives, free of rounding
    assert_same_pattern(result, reference, "the fp64 reference")
    assert_same_pattern(result, torch.matmul(a.contiguous(), b.contiguous()), "torch.matmul")
    finite = reference.isfinite()
    assert finite.sum() > finite.numel() // 2, "the planted values should leave most of C finite"
    err = rel_error(result[finite], reference[finite])
    assert err <= tolerance(dtype, a.shape[1]), f"finite part: relative error {err:.3e}"


# Per dtype: an operand value v with 64 * v * v past the largest finite value (for bf16 and fp32
# the fp32 accumulator itself overflows), and one whose 64 products stay finite (fp16: 57600 =
# 64 * 3 * 300, exact; the maximum is 65504).
OVERFLOW = {torch.float16: (300.0, 3.0), torch.bfloat16: (1e19, 1e10), torch.float32: (1e19, 1e10)}


@pytest.mark.parametrize("kernel, dtype", PARAMS)
def test_results_past_the_dtype_range_are_inf(kernel, dtype):
    big, ok = OVERFLOW[dtype]
    K = 64
    a = torch.full((3, K), big, device=DEVICE)
    a[1] = -big
    a[2] = ok
    b = torch.full((K, 5), big, device=DEVICE)
    b[:, 4] = -big
    a, b = a.to(dtype), b.to(dtype)
    result = tritongemm.matmul(padded(a), padded(b), kernel=kernel)

    assert_same_pattern(result, torch.matmul(a, b), "torch.matmul")
    assert result[0, :4].isposinf().all() and result[0, 4].isneginf(), result[0]
    assert result[1, :4].isneginf().all() and result[1, 4].isposinf(), result[1]
    assert rel_error(result[2], reference_matmul(a, b)[2]) <= tolerance(dtype, K), result[2]


@pytest.mark.parametrize("kernel, dtype", PARAMS)
def test_k_zero_gives_zeros_whatever_out_held(kernel, dtype):
    a = torch.empty(4, 0, dtype=dtype, device=DEVICE)
    b = torch.empty(0, 6, dtype=dtype, device=DEVICE)
    out = torch.full((4, 6), NAN, dtype=dtype, device=DEVICE)
    tritongemm.matmul(a, b, out=out, kernel=kernel)
    assert (out == 0).all() and torch.equal(out, torch.matmul(a, b))
