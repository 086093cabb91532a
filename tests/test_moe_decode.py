"""MoE experts at decode (grouped/moe_decode.py): the two launches against a float64 loop over
each token's experts, for either weight layout, every gated activation, tokens that share an
expert and the last expert; a tiny Hugging Face MoE model's decode step through them against its
eager experts, eagerly and compiled (the `tritongemm::moe_decode` operator, which Inductor calls
directly); shapes refused naming the argument. CPU: the interpreter (fp32, fp16); GPU: every dtype."""

from __future__ import annotations

import zlib

import pytest
import torch
from cases import DEVICE, DTYPES, ON_GPU
from moe_models import TINY_MOE, tiny_moe_model

import tritongemm
from tritongemm.core.epilogue import GLU_ACTIVATIONS, activate_torch
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.grouped import moe_decode
from tritongemm.grouped.moe_decode import experts_decode, moe_decode_op, serves


def rand(*shape, dtype=torch.float32, seed=""):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}{dtype}{seed}".encode()))
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)


def experts_weights(experts, hidden, width, dtype, stored_transposed: bool):
    """grouped_mm's b of both projections, (experts, in, out): a transposed view of (experts, out,
    in) weights, as transformers stores them by default, or stored so (`is_transposed`)."""
    gate_up = rand(experts, 2 * width, hidden, dtype=dtype, seed="gu") / hidden**0.5
    down = rand(experts, hidden, width, dtype=dtype, seed="d") / width**0.5
    if stored_transposed:
        return gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
    return gate_up.transpose(1, 2), down.transpose(1, 2)


def reference(x, gate_up, down, ids, weights, glu):
    """Each token's experts in float64, one at a time."""
    x, gate_up, down, weights = (t.double() for t in (x, gate_up, down, weights))
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            gate, up = (x[t] @ gate_up[ids[t, j]]).chunk(2)
            out[t] += weights[t, j] * (activate_torch(gate, glu) * up) @ down[ids[t, j]]
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("glu", GLU_ACTIVATIONS)
@pytest.mark.parametrize("stored_transposed", [False, True], ids=["out-in", "in-out"])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
def test_against_a_float64_loop_over_each_tokens_experts(tokens, stored_transposed, glu, dtype):
    experts, hidden, width, top_k = 6, 72, 40, 3  # widths past one block of columns, odd block counts
    x = rand(tokens, hidden, dtype=dtype, seed="x")
    gate_up, down = experts_weights(experts, hidden, width, dtype, stored_transposed)
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(DEVICE)
    ids[0, 0] = experts - 1  # the last expert's weights, at the end of the allocation
    if tokens > 1:
        ids[1, 0] = ids[0, 1]  # two tokens that share an expert
    weights = torch.softmax(rand(tokens, top_k, seed="w"), -1)
    y = experts_decode(x, gate_up, down, ids, weights, glu)
    assert y.shape == (tokens, hidden) and y.dtype == dtype
    # h is rounded to the dtype between the two products: the bound of both K's, twice
    bound = 2 * tolerance(dtype, max(hidden, width))
    assert rel_error(y, reference(x, gate_up, down, ids, weights, glu)) <= bound


def test_the_path_serves_half_a_pair_an_expert_or_fewer():
    assert serves(1, 2, 8) and serves(2, 2, 8) and not serves(3, 2, 8)  # Mixtral: 1-2 tokens
    assert serves(8, 8, 128) and not serves(9, 8, 128) and not serves(0, 8, 128)  # Qwen3-MoE: 1-8


def test_a_pair_routed_to_no_expert_adds_nothing():
    """An index outside [0, experts) (a sentinel some routers write for a dropped pair) reads no
    weights and adds nothing, as the grouped path's histc drops it."""
    x = rand(2, 24, seed="x")
    gate_up, down = experts_weights(4, 24, 16, torch.float32, False)
    ids = torch.tensor([[0, 4], [-1, 2]], device=DEVICE)
    weights = torch.softmax(rand(2, 2, seed="w"), -1)
    kept = torch.tensor([[1.0, 0.0], [0.0, 1.0]], device=DEVICE)
    expected = reference(x, gate_up, down, ids.clamp(0, 3), weights * kept, "silu")
    y = experts_decode(x, gate_up, down, ids, weights, "silu")
    assert rel_error(y, expected) <= 2 * tolerance(torch.float32, 24)


def test_weights_of_another_dtype_and_int32_ids():
    x = rand(2, 24, seed="x")
    gate_up, down = experts_weights(4, 24, 16, torch.float32, False)
    ids = torch.tensor([[0, 3], [3, 1]], dtype=torch.int32, device=DEVICE)
    weights = torch.softmax(rand(2, 2, seed="w"), -1).to(torch.bfloat16)
    y = experts_decode(x, gate_up, down, ids, weights, "silu")
    assert rel_error(y, reference(x, gate_up, down, ids.long(), weights, "silu")) <= 2 * tolerance(torch.float32, 24)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "down": a["down"][:, :-1]}, "expected down of shape"),
        (lambda a: {**a, "top_k_weights": a["top_k_weights"][:, :1]}, "expected top_k_weights of shape"),
        (lambda a: {**a, "gate_up": a["gate_up"][:, :, :-1]}, "an even number"),
        (lambda a: {**a, "down": a["down"].double()}, "of one dtype"),
        (lambda a: {**a, "top_k_index": a["top_k_index"].float()}, "top_k_index of an integer dtype"),
        (lambda a: {**a, "x": a["x"][None]}, r"expected x \(tokens, hidden\)"),
        (lambda a: {**a, "glu": "relu"}, "expected glu to be one of"),
    ],
    ids=["down", "weights", "odd-pair", "dtype", "ids-dtype", "x-3d", "glu"],
)
@pytest.mark.parametrize("call", ["function", "operator"])
def test_bad_shapes_are_refused_naming_the_argument(change, message, call):
    """By experts_decode as its plan is built, and by the operator's fake as a graph is traced."""
    args = change(decode_args())
    with pytest.raises((ValueError, TypeError), match=message):
        if call == "function":
            experts_decode(*args.values())
        else:
            with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
                moe_decode_op(*args.values())


def decode_args(tokens=2, experts=3, hidden=16, width=8, top_k=2) -> dict:
    gate_up, down = experts_weights(experts, hidden, width, torch.float32, False)
    ids = torch.stack([torch.arange(top_k) + t for t in range(tokens)]) % experts
    weights = torch.softmax(rand(tokens, top_k, seed="w"), -1)
    return dict(x=rand(tokens, hidden), gate_up=gate_up, down=down, top_k_index=ids.to(DEVICE), top_k_weights=weights,
                glu="silu")  # fmt: skip


def test_the_operator_passes_opcheck():
    torch.library.opcheck(moe_decode_op, tuple(decode_args().values()))


def test_the_operator_has_no_backward():
    args = decode_args()
    args["x"].requires_grad_()
    with pytest.raises(RuntimeError, match="moe_decode has no backward"):
        moe_decode_op(*args.values()).sum().backward()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_inductor_calls_the_implementation_directly(dynamic):
    """inductor.py's lowering: the generated code calls experts_decode's plan itself, not the
    operator through the dispatcher: at a call site (inductor.Site, into Inductor's buffer) in a
    graph of static shapes, through the direct call in one of symbolic shapes. Inductor's CPU
    backend on the CPU."""
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(lambda *a: moe_decode_op(*a) * 2, backend="inductor", dynamic=dynamic)
    codes = []
    for tokens in (2, 2, 3):
        args = decode_args(tokens=tokens)
        out, code = run_and_get_code(compiled, *args.values())
        codes += code
        assert rel_error(out, 2 * reference(*args.values())) <= 2 * tolerance(torch.float32, 16)
    code = "\n".join(codes)
    expected = "tritongemm_direct_moe_decode(" if dynamic else "tritongemm_Site('moe_decode'"
    assert expected in code and "tritongemm.moe_decode.default(" not in code


@pytest.mark.skipif(ON_GPU, reason="tiny fp32 models for the interpreter; the H100 runs bench model's")
@pytest.mark.parametrize("architecture", list(TINY_MOE))
def test_a_moe_models_decode_step_runs_the_two_launches(architecture, monkeypatch):
    """A patched model's decode step (one new token, no autograd) goes through experts_decode,
    and its logits match transformers' eager experts; a prompt of more pairs than the path
    serves, or a call that records autograd, takes the grouped path."""
    model = tiny_moe_model(architecture).eval()
    config = model.config
    calls = []

    def counted(*args):
        calls.append(args[0].shape[0])
        return experts_decode(*args)

    monkeypatch.setattr(moe_decode, "experts_decode", counted)
    prompt, step = torch.randint(0, 128, (1, 9)), torch.randint(0, 128, (1, 1))
    experts = getattr(config, "num_local_experts", getattr(config, "num_experts", None))
    assert serves(1, 2, experts) and not serves(9, 2, experts)
    results = {}
    for implementation in ("eager", "tritongemm"):
        if implementation == "tritongemm":
            tritongemm.patch(model)
        else:
            model.set_experts_implementation(implementation)
        with torch.no_grad():
            results[implementation] = (model(prompt).logits, model(step).logits)
    assert calls == [1] * config.num_hidden_layers  # the step's token; the prompt went grouped
    for got, expected in zip(results["tritongemm"], results["eager"]):
        assert rel_error(got, expected.double()) <= 1e-5
    model(step).logits.sum().backward()  # autograd recording: grouped, with gradients
    assert len(calls) == config.num_hidden_layers


@pytest.mark.skipif(ON_GPU, reason="tiny fp32 models for the interpreter; the H100 runs bench model's compiled rows")
@pytest.mark.parametrize("architecture", list(TINY_MOE))
def test_a_compiled_moe_models_decode_step_runs_the_operator(architecture, monkeypatch):
    """torch.compile of a patched model's decode step: its graph holds the moe_decode operator
    (which runs experts_decode) where eager would take the two launches, and its logits are
    transformers' eager experts'; the prompt's graph holds the grouped path."""
    model = tiny_moe_model(architecture).eval()
    prompt, step = torch.randint(0, 128, (1, 9)), torch.randint(0, 128, (1, 1))
    with torch.no_grad():
        model.set_experts_implementation("eager")
        expected = model(prompt).logits, model(step).logits
        tritongemm.patch(model)
        calls = []
        monkeypatch.setattr(moe_decode, "experts_decode", lambda *args: calls.append(1) or experts_decode(*args))
        compiled = torch.compile(model, backend="aot_eager", dynamic=False)
        got = compiled(prompt).logits, compiled(step).logits
    assert len(calls) == model.config.num_hidden_layers  # the step's layers; the prompt went grouped
    for g, e in zip(got, expected):
        assert rel_error(g, e.double()) <= 1e-5
