"""The gated pair's elementwise kernels (primitives/glu.py), h = act(g) * u and its backward,
against torch's activations in fp64: every activation, odd widths and a width past one block,
a strided pair, empty rows. CPU: the interpreter (fp16, fp32); a GPU: every dtype, each output
allocated where a NaN-filled block was just freed (the caching allocator hands it back), so an
unwritten element fails the check."""

import zlib

import pytest
import torch
from cases import DEVICE, DTYPES

from tritongemm.core.epilogue import GLU_ACTIVATIONS, activate_torch
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.primitives.glu import BLOCK, glu_backward, glu_forward

# (rows, width, row stride of the pair beyond 2 * width)
SHAPES = [(1, 3, 0), (3, 5, 0), (7, BLOCK + 76, 0), (4, 24, 8), (0, 16, 0)]


def rand(*shape, dtype, seed, scale=3.0):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}{dtype}{seed}".encode()))
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=DEVICE)


def make_pair(rows, width, pad, dtype, seed):
    """(rows, 2 * width) [g | u] at unit scale and beyond, where every activation bends; `pad`
    extra columns per row make its row stride longer than its width."""
    return rand(rows, 2 * width + pad, dtype=dtype, seed=seed)[:, : 2 * width]


def poison_next(shape, dtype) -> None:
    """Free a NaN block of this size: CUDA's caching allocator gives it to the next allocation."""
    torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", GLU_ACTIVATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_glu_forward_and_backward_match_torch(shape, activation, dtype):
    rows, width, pad = shape
    pair = make_pair(rows, width, pad, dtype, f"{activation}")
    grad = rand(rows, width, dtype=dtype, seed="grad", scale=1.0)

    ref_pair = pair.double().requires_grad_()
    gate, up = ref_pair.chunk(2, dim=-1)
    expected = activate_torch(gate, activation) * up
    expected.backward(grad.double())

    poison_next((rows, width), dtype)
    h = glu_forward(pair, activation)
    poison_next((rows, 2 * width), dtype)
    d_pair = glu_backward(grad, pair, activation, dtype)
    assert h.shape == (rows, width) and h.dtype == dtype
    assert d_pair.shape == (rows, 2 * width) and d_pair.dtype == dtype
    bound = tolerance(dtype, 1)  # one rounding of an fp32 result
    assert rel_error(h, expected) <= bound
    assert rel_error(d_pair, ref_pair.grad) <= bound


def test_glu_backward_writes_another_dtype():
    """grouped_mm's backward hands an fp32 pair and wants its operands' dtype back."""
    pair = make_pair(5, 40, 0, torch.float32, "f32")
    grad = rand(5, 40, dtype=torch.float16, seed="g16", scale=1.0)
    ref_pair = pair.double().requires_grad_()
    gate, up = ref_pair.chunk(2, dim=-1)
    (torch.nn.functional.silu(gate) * up).backward(grad.double())
    d_pair = glu_backward(grad, pair, "silu", torch.float16)
    assert d_pair.dtype == torch.float16
    assert rel_error(d_pair, ref_pair.grad) <= tolerance(torch.float16, 1)


def test_glu_refuses_what_it_cannot_compute():
    pair = torch.zeros(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="expected activation to be one of .* but got 'relu'"):
        glu_forward(pair, "relu")
    with pytest.raises(ValueError, match=r"a pair of shape \(M, 2I\) with unit column stride, but got shape \(2, 7\)"):
        glu_forward(pair[:, :7], "silu")
    with pytest.raises(ValueError, match=r"unit column stride, but got shape \(8, 2\) and strides \(1, 8\)"):
        glu_forward(pair.T, "silu")
    with pytest.raises(ValueError, match=r"expected grad of shape \(2, 4\), but got \(2, 3\)"):
        glu_backward(torch.zeros(2, 3, device=DEVICE), pair, "silu", torch.float32)
