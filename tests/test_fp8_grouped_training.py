"""fp8 grouped GEMMs for MoE training (fp8/grouped.py): the per-group transposed quantizer bit for
bit against quantize_fp8's reference, the scaled grouped GEMMs and fp8_grouped_linear's forward
and gradients against fp64 products of the very fp8 operands they were given. On the CPU under
Triton's interpreter (conftest.py), on a GPU as they are."""

from __future__ import annotations

import re

import pytest
import torch
from moe_models import VOCAB, tiny_moe_model

import tritongemm
from tritongemm.core.reference import fp8_tolerance, rel_error
from tritongemm.fp8.grouped import quantize_fp8_segments_t, scaled_grouped_mm
from tritongemm.fp8.grouped_training import fp8_grouped_linear
from tritongemm.fp8.recipes import reference_quantize

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E4M3 = torch.float8_e4m3fn
# Against the exact products of the unquantized tensors: e4m3's rounding (test_fp8_training's bound).
FP8_VS_EXACT = 0.08


def ends(sizes) -> torch.Tensor:
    return torch.tensor(sizes, device=DEVICE).cumsum(0).to(torch.int32)


def random(*shape, dtype=torch.bfloat16, seed=0) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.logspace(-2, 2, shape[-1]).reshape(*([1] * (len(shape) - 1)), -1)
    return x.to(dtype).to(DEVICE)


def dequantized_segments(qt, st, offs) -> torch.Tensor:
    """qt (C, R) times each group's column scales, transposed back: fp64 (R, C), rows past offs[-1] 0."""
    R = qt.shape[1]
    out = torch.zeros(R, qt.shape[0], dtype=torch.float64, device=qt.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = (qt[:, start:end].double() * st[g].double()[:, None]).T
        start = end
    return out


@pytest.mark.parametrize("sizes, tail, C", [((5, 0, 70), 3, 33), ((1,), 0, 64), ((0, 0), 2, 7), ((130, 2), 0, 129)],
                         ids=str)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_each_groups_column_is_quantized_as_quantize_fp8_quantizes_it(sizes, tail, C, dtype):
    """Group g's stretch of column c, qt[c, start:end], equals reference_quantize of that stretch
    of x.T as a row, scale included; an empty group's scales are the floor's."""
    offs = ends(sizes)
    R = sum(sizes) + tail
    x = random(R, C, dtype=dtype, seed=R + C)
    qt, st = quantize_fp8_segments_t(x, offs)
    assert qt.shape == (C, R) and qt.dtype == E4M3 and st.shape == (len(sizes), C) and st.dtype == torch.float32
    start = 0
    for g, end in enumerate(offs.tolist()):
        want_q, want_s = reference_quantize(x[start:end].T.contiguous(), "row")
        assert torch.equal(st[g], want_s.view(-1)), g
        assert torch.equal(qt[:, start:end].view(torch.uint8), want_q.view(torch.uint8)), g
        start = end


def test_no_rows_give_the_floors_scales():
    qt, st = quantize_fp8_segments_t(torch.zeros(0, 5, device=DEVICE), ends((0, 0)))
    assert qt.shape == (5, 0) and torch.equal(st, torch.full((2, 5), 1e-12 / 448, device=DEVICE))


def test_a_strided_x_gives_its_contiguous_copys_result():
    offs = ends((3, 9))
    base = random(40, 12, seed=3)
    x = base[::2, 1:]  # every other row, one column off
    qt, st = quantize_fp8_segments_t(x, offs)
    want_qt, want_st = quantize_fp8_segments_t(x.contiguous(), offs)
    assert torch.equal(qt[:, :12].view(torch.uint8), want_qt[:, :12].view(torch.uint8)) and torch.equal(st, want_st)


@pytest.mark.parametrize("sizes, tail", [((5, 0, 28), 3), ((1,), 0), ((0, 17), 0)], ids=str)
def test_scaled_row_groups_match_fp64_of_their_operands(sizes, tail):
    offs = ends(sizes)
    M, K, N, G = sum(sizes) + tail, 40, 24, len(sizes)
    aq, sa = reference_quantize(random(M, K, seed=1), "row")
    wq, sw = reference_quantize(random(G * N, K, seed=2), "row")
    b = wq.view(G, N, K).transpose(1, 2)
    y = scaled_grouped_mm(aq, b, sa.view(-1), sw.view(G, N), offs)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    a64, b64 = aq.double() * sa.double(), (wq.double() * sw.double()).view(G, N, K)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            assert rel_error(y[start:end], a64[start:end] @ b64[g].T) <= fp8_tolerance(y.dtype, K), g
        start = end
    assert not y[start:].any()  # rows past the last group's end


def test_scaled_k_groups_match_fp64_of_their_operands():
    sizes = (5, 0, 31)
    offs = ends(sizes)
    T, N, K, G = sum(sizes) + 2, 20, 12, len(sizes)
    dyt, sdy = quantize_fp8_segments_t(random(T, N, seed=4), offs)
    xt, sx = quantize_fp8_segments_t(random(T, K, seed=5), offs)
    dw = scaled_grouped_mm(dyt, xt.T, sdy, sx, offs, torch.float32)
    assert dw.shape == (G, N, K) and dw.dtype == torch.float32
    dy64, x64 = dequantized_segments(dyt, sdy, offs), dequantized_segments(xt, sx, offs)
    start = 0
    for g, end in enumerate(offs.tolist()):
        want = dy64[start:end].T @ x64[start:end]
        if end > start:
            assert rel_error(dw[g], want) <= fp8_tolerance(dw.dtype, end - start), g
        else:
            assert not dw[g].any(), g  # an empty group's gradient is zeros
        start = end


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_fp8_grouped_linear_forward_and_gradients_match_fp64_of_their_fp8_operands(dtype):
    """Each of the three GEMMs against fp64 of the quantized operands it read: the forward of X's
    and W's row copies, dX of dY's row copy and W's per-expert column copy, dW of dY's and X's
    per-group column copies. And each within fp8's error of the plain fp64 product."""
    sizes = (9, 0, 21, 2)
    offs = ends(sizes)
    T, K, N, G = sum(sizes) + 3, 48, 40, len(sizes)  # 3 rows past the last group: no expert's
    x = random(T, K, dtype=dtype, seed=6).requires_grad_()
    w = random(G, N, K, dtype=dtype, seed=7).requires_grad_()
    dy = random(T, N, dtype=dtype, seed=8)
    y = fp8_grouped_linear(x, w, offs)
    y.backward(dy)
    assert y.dtype == dtype and x.grad.dtype == dtype and w.grad.dtype == dtype

    def per_group(fn):
        out, start = [], 0
        for g, end in enumerate(offs.tolist()):
            out.append(fn(g, start, end))
            start = end
        return out

    xq, sx = reference_quantize(x.detach(), "row")
    wq, sw = reference_quantize(w.detach().reshape(G * N, K), "row")
    x64, w64 = xq.double() * sx.double(), (wq.double() * sw.double()).view(G, N, K)
    tail = torch.zeros(T - offs[-1].item(), N, dtype=torch.float64, device=DEVICE)
    want_y = torch.cat(per_group(lambda g, s, e: x64[s:e] @ w64[g].T) + [tail])
    assert rel_error(y, want_y) <= fp8_tolerance(dtype, K)

    dyq, sdy = reference_quantize(dy, "row")
    dy64 = dyq.double() * sdy.double()
    wt, swt = quantize_fp8_segments_t(w.detach().reshape(G * N, K), ends((N,) * G))
    w_cols = dequantized_segments(wt, swt, ends((N,) * G)).view(G, N, K)
    want_dx = torch.cat(per_group(lambda g, s, e: dy64[s:e] @ w_cols[g]) + [tail[:, :1].expand(-1, K)])
    assert rel_error(x.grad, want_dx) <= fp8_tolerance(dtype, N)

    dyt, sdyt = quantize_fp8_segments_t(dy, offs)
    xt, sxt = quantize_fp8_segments_t(x.detach(), offs)
    dy_seg, x_seg = dequantized_segments(dyt, sdyt, offs), dequantized_segments(xt, sxt, offs)
    want_dw = torch.stack(per_group(lambda g, s, e: dy_seg[s:e].T @ x_seg[s:e]))
    assert rel_error(w.grad, want_dw) <= fp8_tolerance(dtype, max(sizes))
    assert not w.grad[1].any()  # the empty expert's

    exact = [x.detach().double(), w.detach().double(), dy.double()]
    plain_y = torch.cat(per_group(lambda g, s, e: exact[0][s:e] @ exact[1][g].T) + [tail])
    plain_dx = torch.cat(per_group(lambda g, s, e: exact[2][s:e] @ exact[1][g]) + [tail[:, :1].expand(-1, K)])
    plain_dw = torch.stack(per_group(lambda g, s, e: exact[2][s:e].T @ exact[0][s:e]))
    for got, want in ((y, plain_y), (x.grad, plain_dx), (w.grad, plain_dw)):
        assert rel_error(got, want) <= FP8_VS_EXACT


def test_compile_fullgraph_gives_the_eager_steps_results():
    """Under torch.compile(fullgraph=True) each quantization and grouped GEMM is one node
    (fp8/graph_ops.py) and AOTAutograd traces the backward: the eager step's output and gradients
    bit for bit. aot_eager on the CPU (no C++ compiler needed); Inductor on a GPU."""
    offs = ends((6, 0, 11))
    x0, w0, dy = random(17, 32, seed=11), random(3, 24, 32, seed=12), random(17, 24, seed=13)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    results = []
    for fn in (fp8_grouped_linear, torch.compile(fp8_grouped_linear, fullgraph=True, backend=backend)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = fn(x, w, offs)
        y.backward(dy)
        results.append((y.detach(), x.grad, w.grad))
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


@pytest.mark.parametrize("x_grad, w_grad, copies", [(False, True, 1), (True, False, 1), (True, True, 2)])
def test_only_the_gradients_asked_for_are_computed(x_grad, w_grad, copies, monkeypatch):
    """A frozen weight (or input) gets no gradient, and the forward makes only the per-group copy
    the asked-for gradient reads (W's for dX, X's for dW)."""
    from tritongemm.fp8 import graph_ops

    calls = []
    direct = graph_ops.graph_or_direct_grouped

    def counting():
        quantize, segments_t, mm = direct()
        return quantize, lambda *args: calls.append(1) or segments_t(*args), mm

    monkeypatch.setattr("tritongemm.fp8.grouped_training.graph_or_direct_grouped", counting)
    offs = ends((4, 4))
    x, w = random(8, 16, seed=9).requires_grad_(x_grad), random(2, 8, 16, seed=10).requires_grad_(w_grad)
    y = fp8_grouped_linear(x, w, offs)
    assert len(calls) == copies  # in the forward
    y.sum().backward()
    assert (x.grad is not None) == x_grad and (w.grad is not None) == w_grad
    if x_grad:
        assert x.grad.any()
    if w_grad:
        assert w.grad.any()


def test_the_operators_fakes_match_their_outputs():
    """torch.library.opcheck of the two graph operators (fp8/graph_ops.py): the fakes' shapes,
    dtypes and strides those of the real outputs, AOTAutograd's dispatch alike. offs ends at R:
    columns of qt past offs[-1] are left unwritten, which opcheck would read as a difference."""
    from tritongemm.fp8.graph_ops import scaled_grouped_mm_op, segments_t_op

    offs = ends((5, 0, 7))
    x = random(12, 24, seed=14)
    tests = ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(segments_t_op, (x, offs), test_utils=tests)
    xq, sx = reference_quantize(x, "row")
    wq, sw = reference_quantize(random(3 * 8, 24, seed=15), "row")
    b = wq.view(3, 8, 24).transpose(1, 2)
    torch.library.opcheck(scaled_grouped_mm_op, (xq, b, sx.view(-1), sw.view(3, 8), offs, torch.bfloat16),
                          test_utils=tests)  # fmt: skip
    xt, sxt = quantize_fp8_segments_t(x, offs)
    torch.library.opcheck(scaled_grouped_mm_op, (xt, xt.T, sxt, sxt, offs, torch.float32), test_utils=tests)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: quantize_fp8_segments_t(torch.zeros(4, 4, device=DEVICE), torch.tensor([4], device=DEVICE)),
         "expected offs, a 1-D int32 tensor of group ends, but got torch.int64"),
        (lambda: quantize_fp8_segments_t(torch.zeros(4, dtype=torch.bfloat16), ends((4,))),
         "expected x, a 2-D bfloat16, float16 or float32 tensor"),
        (lambda: scaled_grouped_mm(torch.zeros(4, 8, device=DEVICE), torch.zeros(1, 8, 4, device=DEVICE),
                                   torch.ones(4, device=DEVICE), torch.ones(1, 4, device=DEVICE), ends((4,))),
         "expected a of an fp8 dtype, but got torch.float32"),
        (lambda: scaled_grouped_mm(torch.zeros(4, 8, device=DEVICE).to(E4M3),
                                   torch.zeros(1, 8, 4, device=DEVICE).to(E4M3), torch.ones(4, 1, device=DEVICE),
                                   torch.ones(1, 4, device=DEVICE), ends((4,))),
         r"expected scale_a contiguous of shape \(4,\), but got \(4, 1\)"),
        (lambda: fp8_grouped_linear(torch.zeros(4, 8, device=DEVICE), torch.zeros(2, 3, 8, device=DEVICE), ends((4,))),
         r"expected weight of shape \(1, N, 8\)"),
    ],
    ids=["offs dtype", "x rank", "a dtype", "scale_a shape", "weight groups"],
)  # fmt: skip
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.parametrize("architecture", ["MixtralForCausalLM", "Qwen3MoeForCausalLM"])
def test_the_fp8_experts_match_the_bf16_experts_on_the_same_routing(architecture):
    """One experts module, the same tokens and router choices: fp8/grouped.py's experts_forward
    against grouped/moe.py's, output and every gradient within e4m3's error."""
    from tritongemm.fp8.grouped_training import experts_forward
    from tritongemm.grouped import moe

    model = tiny_moe_model(architecture).to(DEVICE)
    experts = next(m for m in model.modules() if hasattr(m, "num_experts") and hasattr(m, "down_proj"))
    g = torch.Generator().manual_seed(2)
    tokens, top_k = 24, model.config.num_experts_per_tok
    hidden = torch.randn(tokens, model.config.hidden_size, generator=g).to(DEVICE)
    index = torch.stack([torch.randperm(experts.num_experts, generator=g)[:top_k] for _ in range(tokens)]).to(DEVICE)
    weights = torch.rand(tokens, top_k, generator=g).to(DEVICE)
    results = []
    for forward in (moe.experts_forward, experts_forward):
        experts.zero_grad()
        x = hidden.clone().requires_grad_()
        out = forward(experts, x, index, weights)
        out.backward(torch.ones_like(out))
        grads = {n: p.grad.clone() for n, p in experts.named_parameters()}
        results.append((out.detach(), x.grad, grads))
    (ref, ref_dx, ref_grads), (got, dx, grads) = results
    assert rel_error(got, ref.double()) <= FP8_VS_EXACT and rel_error(dx, ref_dx.double()) <= FP8_VS_EXACT
    assert grads.keys() == ref_grads.keys() and grads
    for name in grads:
        assert rel_error(grads[name], ref_grads[name].double()) <= FP8_VS_EXACT, name


@pytest.mark.parametrize("architecture", ["MixtralForCausalLM", "Qwen3MoeForCausalLM"])
def test_patch_trains_a_moe_models_experts_in_fp8(architecture):
    """patch(model, fp8_training=Fp8TrainingConfig(experts="fp8")) selects the fp8 experts
    implementation: a training step's loss is within 2% of the unpatched model's, every expert
    weight stays the model's parameter, gets a gradient, and moves with an optimizer step.
    (Per-gradient bounds are the test above's: here every Linear is fp8 too, and a token near a
    tie between experts may change its route.)"""
    model = tiny_moe_model(architecture).to(DEVICE)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    model.set_experts_implementation("eager")
    ref_loss = model(ids, labels=ids).loss.item()
    experts = {n: p for n, p in model.named_parameters() if "experts" in n}
    tritongemm.patch(model, fp8_training=tritongemm.nn.Fp8TrainingConfig("row", experts="fp8"))
    assert model.tritongemm_patch_report.experts == "tritongemm-fp8-row"
    assert all(p is experts[n] for n, p in model.named_parameters() if "experts" in n)  # the same parameters
    out = model(ids, labels=ids)
    out.loss.backward()
    assert abs(out.loss.item() - ref_loss) / ref_loss < 0.02
    assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.any() for p in experts.values())
    before = {n: p.detach().clone() for n, p in experts.items()}
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(not torch.equal(before[n], p) for n, p in experts.items())


@pytest.mark.parametrize("recipe", ["row", "tensor", "block"])
def test_every_recipe_trains_the_experts_on_the_bf16_grouped_gemms_unless_asked(recipe):
    model = tiny_moe_model("MixtralForCausalLM").to(DEVICE)
    tritongemm.patch(model, fp8_training=recipe)
    report = model.tritongemm_patch_report.experts
    assert report.startswith("tritongemm (bf16 experts; Fp8TrainingConfig('row', experts='fp8')")
    assert model.config._experts_implementation == "tritongemm"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(experts="fp4"), "expected experts to be one of ('bf16', 'fp8'), but got 'fp4'"),
        (dict(recipe="tensor", experts="fp8"), "experts='fp8' trains with recipe 'row' and an fp8 weight gradient"),
        (dict(wgrad="bf16", experts="fp8"), "an fp8 weight gradient, but got wgrad='bf16'"),
    ],
)
def test_fp8_experts_are_refused_where_they_cannot_train(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tritongemm.nn.Fp8TrainingConfig(**kwargs)
