"""MoE experts at decode (grouped/moe_decode.py): the two launches against a float64 loop over
each token's experts, for either weight layout, every gated activation, tokens that share an
expert and the last expert; a tiny Hugging Face MoE model's decode step through them against its
eager experts; shapes refused naming the argument. CPU: the interpreter (fp32, fp16); GPU: every dtype."""

from __future__ import annotations

import zlib

import pytest
import torch
from cases import DEVICE, DTYPES, ON_GPU
from moe_models import TINY_MOE, tiny_moe_model

import tritongemm
from tritongemm.epilogue import GLU_ACTIVATIONS, activate_torch
from tritongemm.grouped import moe_decode
from tritongemm.grouped.moe_decode import experts_decode, serves
from tritongemm.reference import rel_error, tolerance


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
    ],
    ids=["down", "weights", "odd-pair", "dtype", "ids-dtype"],
)
def test_bad_shapes_are_refused_naming_the_argument(change, message):
    gate_up, down = experts_weights(3, 16, 8, torch.float32, False)
    args = dict(x=rand(2, 16), gate_up=gate_up, down=down, top_k_index=torch.tensor([[0, 1], [2, 0]], device=DEVICE),
                top_k_weights=rand(2, 2))  # fmt: skip
    args = change(args)
    with pytest.raises((ValueError, TypeError), match=message):
        experts_decode(*args.values(), glu="silu")


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
