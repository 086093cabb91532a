"""RMSNorm (tritongemm/blocks/rms_norm.py) against the fp64 torch formula: both of transformers'
forms, forward and gradients, odd widths and row counts, rows that keep to themselves, the
fallbacks, and fuse_norms' choices. On the CPU under the interpreter (fp16, fp32); on a GPU
every dtype."""

import zlib

import pytest
import torch
from cases import DEVICE, DTYPES, ON_GPU
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tritongemm.blocks import RMSNorm
from tritongemm.blocks.rms_norm import MAX_WIDTH, kernel_serves, rms_norm_reference
from tritongemm.core.reference import rel_error
from tritongemm.patching.fuse import fuse_norms, why_not_norm

FORMS = {"llama": (0.0, True), "gemma": (1.0, False), "offset_cast": (1.0, True), "fp32_weight": (0.0, False)}
# Largest rel_error of an output rounded once or twice to the dtype (x̂, then the weight's product).
BOUND = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# (leading shape, width): one row, rows of 128 packed 32 a program (Qwen3's q/k norms), odd
# widths, more row blocks than the backward's programs, no rows at all.
SHAPES = [((1,), 4096), ((3, 5), 24), ((70,), 128), ((33,), 1000), ((2, 3), 130), ((600,), 40), ((0,), 24)]


def rand(*shape, dtype=torch.float32, seed=""):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}{dtype}{seed}".encode()))
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)


def make_norm(width, form, dtype, eps=1e-5):
    norm = RMSNorm(width, eps, offset=FORMS[form][0], cast=FORMS[form][1], device=DEVICE, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(rand(width, seed="weight"))
    return norm


def weight_grad_error(norm, w64, x64, grad):
    """The weight's gradient against fp64's (w64.grad), relative to the size of its terms. It sums
    grad * x̂ over the rows, each term rounded (x̂ to the dtype), so its error scales with the
    terms, not with the sum: 473 rows of width 2 once summed terms of total size 322 to -0.07,
    which a bound relative to the sum alone calls a 2% error (the GPU fuzz's example)."""
    xhat = x64.detach() * torch.rsqrt(x64.detach().pow(2).mean(-1, keepdim=True) + 1e-5)
    terms = (grad.double() * xhat).reshape(-1, xhat.shape[-1])
    scale = max(w64.grad.norm().item(), terms.square().sum(0).sqrt().norm().item())  # the sum, or its terms' spread
    return (norm.weight.grad.double() - w64.grad).norm().item() / max(scale, 1e-30)


@pytest.mark.parametrize("lead, width", SHAPES, ids=str)
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_and_gradients_match_the_formula(lead, width, form, dtype):
    norm = make_norm(width, form, dtype)
    x = rand(*lead, width, dtype=dtype).requires_grad_(True)
    grad = rand(*lead, width, seed="grad")
    y = norm(x)
    y.backward(grad.to(y.dtype))
    x64, w64 = (t.detach().double().requires_grad_(True) for t in (x, norm.weight))
    expected = rms_norm_reference(x64, w64, 1e-5, *FORMS[form])
    expected.backward(grad.double())
    assert y.shape == x.shape and y.dtype == dtype
    bound = BOUND[dtype]
    assert rel_error(y, expected) <= bound
    assert rel_error(x.grad, x64.grad) <= bound
    assert weight_grad_error(norm, w64, x64, grad) <= bound * 4


@pytest.mark.parametrize("recipe, width", [("row", 200), ("row", 4096), ("block", 128), ("block", 384)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_norm_quantizes_its_output_as_quantize_fp8_does(recipe, width, dtype):
    """norm_forward_quantized: the norm's output (the formula's, within the dtype's bound) and, from
    the same kernel, quantize_fp8's e4m3 copy and scales of that output, bit for bit (384: a
    padded 1 x 128 block). The output itself may differ from norm_forward's in a last bit on the
    GPU: the compiler may sum a row's squares in another order in the kernel that also quantizes."""
    from tritongemm.blocks.rms_norm_kernels import norm_forward_quantized
    from tritongemm.fp8 import quantize_fp8

    norm = make_norm(width, "llama", dtype)
    x = rand(33, width, dtype=dtype) * 4
    y, q, scale = norm_forward_quantized(x, norm.weight, norm.eps, norm.offset, norm.cast, recipe)
    assert rel_error(y, rms_norm_reference(x.double(), norm.weight.double(), norm.eps, 0.0, True)) <= BOUND[dtype]
    q_expected, scale_expected = quantize_fp8(y, recipe)
    assert torch.equal(scale, scale_expected)
    assert q.dtype == q_expected.dtype and torch.equal(q.view(torch.uint8), q_expected.view(torch.uint8))
    odd = make_norm(200, "llama", dtype)
    with pytest.raises(ValueError, match="'block' with N % 128 == 0; got 'block', N = 200"):
        norm_forward_quantized(rand(3, 200, dtype=dtype), odd.weight, odd.eps, odd.offset, odd.cast, "block")


def test_a_row_keeps_to_itself():
    """A row of inf (its rstd 0, then NaN) or of zeros (rstd 1/sqrt(eps)) changes no other row."""
    norm = make_norm(40, "llama", torch.float32)
    x = rand(5, 40)
    x[1] = float("inf")
    x[3] = 0.0
    y = norm(x)
    expected = rms_norm_reference(x.double(), norm.weight.detach().double(), 1e-5, 0.0, True)
    for row in (0, 2, 4):
        assert rel_error(y[row], expected[row]) <= 1e-6
    assert y[1].isnan().all() and (y[3] == 0).all()


def test_weight_dtype_promotes_as_transformers():
    """Llama's form multiplies in the promoted dtype: an fp32 weight on fp16 activations gives fp32
    (transformers' `weight * x.to(input_dtype)`); Gemma's returns x's dtype."""
    x = rand(4, 24, dtype=torch.float16)
    llama, gemma = make_norm(24, "llama", torch.float32), make_norm(24, "gemma", torch.float32)
    assert llama(x).dtype == torch.float32 and gemma(x).dtype == torch.float16
    assert rel_error(llama(x), rms_norm_reference(x.double(), llama.weight.double(), 1e-5, 0.0, True)) <= 2e-3


def test_inference_keeps_no_rstd_and_matches_training():
    norm = make_norm(130, "llama", torch.float32)
    x = rand(7, 130)
    with torch.no_grad():
        y = norm(x)
    torch.testing.assert_close(y, norm(x.requires_grad_(True)).detach(), rtol=0, atol=0)


def test_what_the_kernel_does_not_take_runs_the_formula():
    """float64, rows wider than MAX_WIDTH, a weight of another size (torch's own error)."""
    x = rand(3, 24, dtype=torch.float64)
    norm = make_norm(24, "llama", torch.float64)
    assert not kernel_serves(x, norm.weight)
    torch.testing.assert_close(norm(x), rms_norm_reference(x, norm.weight, 1e-5, 0.0, True))
    wide = make_norm(MAX_WIDTH + 8, "llama", torch.float32)
    assert not kernel_serves(rand(1, MAX_WIDTH + 8), wide.weight)
    with pytest.raises(RuntimeError):
        make_norm(24, "llama", torch.float32)(rand(2, 25))


@settings(max_examples=60 if ON_GPU else 8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(0, 700 if ON_GPU else 90),
    width=st.integers(2, 6000 if ON_GPU else 700),  # one element normalizes to +-1: its dx is ill-conditioned
    form=st.sampled_from(list(FORMS)),
    dtype=st.sampled_from(DTYPES),
    strided=st.booleans(),
)
@example(rows=473, width=2, form="llama", dtype=torch.float16, strided=False)  # the weight's sum cancels to ~0
def test_fuzz_against_the_formula(rows, width, form, dtype, strided):
    """Random row counts and widths (power of two or not), both forms, every dtype, and rows that
    are views of a wider tensor (a row stride past the width, as Qwen3's q slices of a joined
    projection): forward and gradients within the dtype's bound of the fp64 formula."""
    norm = make_norm(width, form, dtype)
    base = rand(rows, width + (5 if strided else 0), dtype=dtype, seed="fuzz")
    x = base[:, :width].detach().requires_grad_(True)
    grad = rand(rows, width, seed="fuzz-grad")
    y = norm(x)
    y.backward(grad.to(y.dtype))
    x64, w64 = (t.detach().double().requires_grad_(True) for t in (x, norm.weight))
    expected = rms_norm_reference(x64, w64, 1e-5, *FORMS[form])
    expected.backward(grad.double())
    assert rel_error(y, expected) <= BOUND[dtype] and rel_error(x.grad, x64.grad) <= BOUND[dtype]
    assert weight_grad_error(norm, w64, x64, grad) <= BOUND[dtype] * 4


# ---------------------------------------------------------------------------------------------
# fuse_norms: which modules, and why not
# ---------------------------------------------------------------------------------------------


class LlamaRMSNorm(torch.nn.Module):
    """transformers' Llama RMSNorm, as a stand-in named like it (fuse recognizes classes by name)."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        output = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (output * (1.0 + self.weight.float())).type_as(x)


class Olmo2RMSNorm(LlamaRMSNorm):
    pass


class MistralRMSNorm(LlamaRMSNorm):
    """Named as a Llama-form class, computing Gemma's: the probe must catch it."""

    def forward(self, x):
        output = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (output * (1.0 + self.weight.float())).type_as(x)


def test_fuse_norms_takes_both_forms_and_keeps_the_weight():
    model = torch.nn.ModuleDict({"a": LlamaRMSNorm(40), "b": GemmaRMSNorm(24, eps=1e-5)}).to(DEVICE)
    with torch.no_grad():
        model["a"].weight.copy_(rand(40, seed="a"))
        model["b"].weight.copy_(rand(24, seed="b"))
    weights, keys = [model[k].weight for k in "ab"], list(model.state_dict())
    x = {"a": rand(3, 40), "b": rand(3, 24)}
    expected = {k: model[k](x[k]) for k in "ab"}
    fused, left = fuse_norms(model)
    assert fused == ["a", "b"] and not left
    assert all(isinstance(model[k], RMSNorm) for k in "ab") and [model[k].weight for k in "ab"] == weights
    assert list(model.state_dict()) == keys and model["b"].eps == 1e-5 and model["b"].offset == 1.0
    for k in "ab":
        assert rel_error(model[k](x[k]), expected[k].double()) <= 1e-6
    assert fuse_norms(model) == ([], {})  # fused once


def test_why_not_norm_names_the_reason():
    assert "not a class known" in why_not_norm(Olmo2RMSNorm(8))
    assert "computed something else" in why_not_norm(MistralRMSNorm(8).to(DEVICE).apply(_nonzero_weight))
    hooked = LlamaRMSNorm(8).to(DEVICE)
    hooked.register_forward_hook(lambda *_: None)
    assert "hooked" in why_not_norm(hooked)
    assert "does not run there" in why_not_norm(LlamaRMSNorm(8).to(DEVICE, torch.float64))


def _nonzero_weight(module):
    if isinstance(getattr(module, "weight", None), torch.nn.Parameter):
        with torch.no_grad():
            module.weight.copy_(rand(module.weight.shape[0], seed="nonzero"))


@pytest.mark.skipif(ON_GPU, reason="aot_eager on the CPU; the GPU's Inductor runs in bench model")
def test_under_torch_compile_it_traces_the_formula():
    norm = make_norm(24, "llama", torch.float32)
    x = rand(4, 24).requires_grad_(True)
    compiled = torch.compile(norm, backend="aot_eager", fullgraph=True)
    y = compiled(x)
    assert rel_error(y, rms_norm_reference(x.double(), norm.weight.double(), 1e-5, 0.0, True)) <= 1e-6
    y.sum().backward()
    assert x.grad is not None and norm.weight.grad is not None
