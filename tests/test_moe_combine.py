"""MoE's weighted un-permute on the grouped path (grouped/moe.py `combine`): each token's rows,
found in expert order, times its routing weights, summed; against float64 for ragged sorts, top-1
to top-8, widths past one column block, row-padded inputs and weights of another dtype; its
operator's gradients and torch.compile graph; a tiny Hugging Face MoE model's inference forward
through it against its eager experts. CPU: the interpreter (fp32, fp16); GPU: every dtype."""

from __future__ import annotations

import zlib

import pytest
import torch
from cases import DEVICE, DTYPES, ON_GPU
from moe_models import TINY_MOE, tiny_moe_model

import tritongemm
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.grouped import moe
from tritongemm.grouped.moe import moe_combine_op

BACKEND = "inductor" if ON_GPU else "aot_eager"


def rand(*shape, dtype=torch.float32, seed=""):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}{dtype}{seed}".encode()))
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)


def sorted_pairs(tokens, top_k, experts=5):
    """The sort of the pairs by a random expert each, as moe.experts_forward takes it."""
    gen = torch.Generator().manual_seed(tokens * 131 + top_k)
    ids = torch.randint(0, experts, (tokens * top_k,), generator=gen).to(DEVICE)
    return torch.sort(ids).indices


def reference(rows, order, weights):
    """Pair t * top_k + j's row is rows[i] where order[i] is that pair; summed over j in float64."""
    tokens, top_k = weights.shape
    inverse = torch.argsort(order)
    picked = rows.double()[inverse].view(tokens, top_k, -1)
    return (picked * weights.double().unsqueeze(-1)).sum(1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weights_dtype", [torch.float32, "rows'"], ids=["fp32-weights", "rows-dtype-weights"])
@pytest.mark.parametrize(
    "tokens, top_k, hidden, pad",
    [(5, 2, 40, 0), (9, 8, 64, 0), (1, 1, 600, 0), (7, 3, 33, 8), (13, 6, 1030, 2)],
    ids=["top2", "top8", "two-column-blocks", "padded-rows", "odd-wide"],
)
def test_against_float64(tokens, top_k, hidden, pad, dtype, weights_dtype):
    rows = rand(tokens * top_k, hidden + pad, dtype=dtype)[:, :hidden]
    order = sorted_pairs(tokens, top_k)
    weights = rand(tokens, top_k, dtype=dtype if weights_dtype == "rows'" else weights_dtype, seed="w").softmax(-1)
    out = moe.combine(rows, order, weights)
    assert out.shape == (tokens, hidden) and out.dtype == dtype
    assert rel_error(out, reference(rows, order, weights)) <= tolerance(dtype, top_k)


@pytest.mark.parametrize("tokens, top_k, hidden", [(0, 2, 16), (3, 2, 0)], ids=["no-tokens", "no-columns"])
def test_empty_problems_give_zeros(tokens, top_k, hidden):
    rows, order = rand(tokens * top_k, hidden), sorted_pairs(tokens, top_k)
    out = moe.combine(rows, order, rand(tokens, top_k, seed="w"))
    assert out.shape == (tokens, hidden) and not out.any()


def test_a_second_call_reuses_the_plan_with_new_values():
    rows, order, weights = rand(12, 24), sorted_pairs(6, 2), rand(6, 2, seed="w")
    moe.combine(rows, order, weights)
    rows2, order2, weights2 = rand(12, 24, seed=2), sorted_pairs(6, 2).flip(0), rand(6, 2, seed="w2")
    out = moe.combine(rows2, order2, weights2)
    assert rel_error(out, reference(rows2, order2, weights2)) <= tolerance(torch.float32, 2)


@pytest.mark.parametrize(
    "index, message",
    [(0, "expected 6 x 2 rows and sort order"), (1, "expected 2-D rows and weights"), (2, "integer sort order")],
)
def test_bad_arguments_are_refused(index, message):
    rows, order, weights = rand(12, 24), sorted_pairs(6, 2), rand(6, 2)
    bad = [(rows[:11], order, weights), (rows, order, weights.reshape(-1)), (rows, order.float(), weights)][index]
    with pytest.raises((ValueError, TypeError), match=message):
        moe.combine(*bad)
    with pytest.raises((ValueError, TypeError), match=message):
        moe_combine_op(*bad)


def reference_autograd(rows, order, weights):
    """combine in torch's ops on float64 leaves: the gradients to compare with."""
    rows64, weights64 = rows.detach().double().requires_grad_(), weights.detach().double().requires_grad_()
    return reference(rows64, order, weights64), rows64, weights64


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gradients_through_the_operator(compiled):
    """Where autograd records, the un-permute is the operator, with its backward; torch.compile
    takes it whole (fullgraph)."""
    tokens, top_k, hidden = 7, 3, 40
    rows = rand(tokens * top_k, hidden).requires_grad_()
    weights = rand(tokens, top_k, seed="w").softmax(-1).requires_grad_()
    order, grad = sorted_pairs(tokens, top_k), rand(tokens, hidden, seed="g")
    fn = torch.compile(moe._combined, fullgraph=True, backend=BACKEND) if compiled else moe._combined
    out = fn(rows, order, weights)
    out.backward(grad)
    expected, rows64, weights64 = reference_autograd(rows, order, weights)
    expected.backward(grad.double())
    bound = tolerance(torch.float32, hidden)
    assert rel_error(out, expected) <= bound
    assert rel_error(rows.grad, rows64.grad) <= bound and rel_error(weights.grad, weights64.grad) <= bound


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "tokens, top_k, hidden, layout",
    [(5, 2, 40, "plain"), (9, 8, 64, "plain"), (1, 1, 600, "plain"), (7, 3, 33, "padded"), (13, 6, 1030, "plain"),
     (6, 2, 24, "column-strided"), (6, 3, 24, "strided-order")],
    ids=["top2", "top8", "two-column-blocks", "padded-rows", "odd-wide", "column-strided", "strided-order"],
)  # fmt: skip
def test_the_backward_kernel_computes_what_torchs_ops_do(tokens, top_k, hidden, layout, dtype):
    """Eager, combine's backward is one kernel; torch.compile traces the same arithmetic as torch
    ops (combine_grads_torch). Both against float64, each within the dtype's bound, with rows
    padded past their width, a gradient whose columns are not contiguous, or a sort order that is
    a strided view (both copied first)."""
    pad = 8 if layout == "padded" else 0
    rows = rand(tokens * top_k, hidden + pad, dtype=dtype)[:, :hidden]
    grad = rand(tokens, hidden + pad, dtype=dtype, seed="g")[:, :hidden]
    if layout == "column-strided":
        grad = rand(hidden, tokens, dtype=dtype, seed="g").T
    order, weights = sorted_pairs(tokens, top_k), rand(tokens, top_k, seed="w").softmax(-1)
    if layout == "strided-order":
        order = torch.stack([order, order.flip(0)], 1)[:, 0]
    needs = (True, False, True)
    d_rows, _, d_weights = moe.combine_grads(grad, rows, order, weights, needs)
    torch_rows, _, torch_weights = moe.combine_grads_torch(grad, rows, order, weights, needs)
    expected, rows64, weights64 = reference_autograd(rows, order, weights)
    expected.backward(grad.double())
    for got, mine, want in ((d_rows, torch_rows, rows64.grad), (d_weights, torch_weights, weights64.grad)):
        assert got.dtype == mine.dtype and got.shape == mine.shape
        bound = tolerance(dtype, hidden)
        assert rel_error(got, want) <= bound and rel_error(mine, want) <= bound


def test_the_backward_kernel_on_empty_problems():
    for tokens, top_k, hidden in ((0, 2, 16), (3, 2, 0)):
        rows, order = rand(tokens * top_k, hidden), sorted_pairs(tokens, top_k)
        weights, grad = rand(tokens, top_k, seed="w"), rand(tokens, hidden, seed="g")
        d_rows, _, d_weights = moe.combine_grads(grad, rows, order, weights, (True, False, True))
        assert d_rows.shape == rows.shape and d_weights.shape == weights.shape
        assert not d_rows.any() and not d_weights.any()


def test_the_operator_passes_opcheck():
    rows, order, weights = rand(12, 24), sorted_pairs(6, 2), rand(6, 2, seed="w")
    torch.library.opcheck(moe_combine_op, (rows, order, weights))
    torch.library.opcheck(moe_combine_op, (rows.requires_grad_(), order, weights.requires_grad_()))


def test_inductor_calls_the_implementation_directly():
    """inductor.py's lowering: the generated code calls combine's implementation, not the operator
    through the dispatcher (Inductor's CPU backend on the CPU)."""
    from torch._inductor.utils import run_and_get_code

    rows, order, weights = rand(12, 24), sorted_pairs(6, 2), rand(6, 2, seed="w")
    compiled = torch.compile(lambda r, o, w: moe_combine_op(r, o, w) * 2, backend="inductor")
    out, codes = run_and_get_code(compiled, rows, order, weights)
    assert rel_error(out, 2 * reference(rows, order, weights)) <= tolerance(torch.float32, 2)
    code = "\n".join(codes)
    assert "tritongemm_direct_moe_combine(" in code and "tritongemm.moe_combine.default(" not in code


@pytest.mark.skipif(ON_GPU, reason="tiny fp32 models for the interpreter; the H100 runs bench model's")
@pytest.mark.parametrize("architecture", list(TINY_MOE))
def test_a_moe_models_inference_forward_combines_in_one_kernel(architecture, monkeypatch):
    """Without autograd, the grouped path's un-permute is `combine`'s; the logits match
    transformers' eager experts (a loop of F.linear per expert)."""
    model = tiny_moe_model(architecture).eval()
    ids = torch.randint(0, 128, (2, 9))  # 18 tokens x top-2: the grouped path, not decode's
    with torch.no_grad():
        model.set_experts_implementation("eager")
        expected = model(ids).logits
        tritongemm.patch(model)
        calls = []
        monkeypatch.setattr(moe, "combine", lambda *args: calls.append(1) or combine(*args))
        logits = model(ids).logits
    assert len(calls) == model.config.num_hidden_layers
    assert rel_error(logits, expected.double()) <= 1e-5


combine = moe.combine


@pytest.mark.skipif(ON_GPU, reason="tiny fp32 models for the interpreter; the H100 runs bench model's compiled rows")
@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("architecture", list(TINY_MOE))
def test_a_compiled_moe_model_trains_through_the_operator(architecture, fuse, monkeypatch):
    """torch.compile (aot_eager on the CPU) of a patched tiny MoE model, plain or fused (q/k/v
    joined, the norms and residual adds fused: bench model's tritongemm-fused+compile): its graph
    calls the un-permute's operator, and its logits and gradients are the eager model's."""
    model = tiny_moe_model(architecture)
    tritongemm.patch(model, fuse=fuse)
    assert len(model.tritongemm_patch_report.fused_qkv) == (model.config.num_hidden_layers if fuse else 0)
    ids = torch.randint(0, 128, (2, 9))
    out = model(ids, labels=ids)
    out.loss.backward()
    expected = out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    calls = []
    monkeypatch.setattr(moe, "combine", lambda *args: calls.append(1) or combine(*args))
    out = torch.compile(model, backend="aot_eager")(ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert len(calls) >= model.config.num_hidden_layers
    assert grads.keys() == expected[1].keys()
    assert rel_error(out.logits, expected[0].double()) <= 1e-5
    assert max(rel_error(grads[n], expected[1][n].double()) for n in grads) <= 1e-5
