"""patch(fuse=True)'s last step: a pre-norm decoder layer's residual adds in o_proj's and down_proj's
stores (blocks/residual.py). Tiny transformers models from configs, against the unpatched model."""

import copy
import threading

import pytest
import torch
from cases import DEVICE, ON_GPU

import tritongemm
from tritongemm.blocks import GatedMLP
from tritongemm.blocks import residual as residual_module
from tritongemm.blocks.residual import ResidualLinear, why_not_residuals
from tritongemm.core.reference import rel_error

transformers = pytest.importorskip("transformers")

# On the CPU fp32 under the interpreter; on the GPU bf16, whose two roundings (torch: the GEMM's
# output, then the add's; fused: the sum's once) differ by an ulp of the sum.
DTYPE = torch.bfloat16 if ON_GPU else torch.float32
BOUND = 2e-2 if ON_GPU else 1e-5
ARCHITECTURES = {  # pre-norm decoder layers: gated MLPs, and a MoE block (whose add stays)
    "LlamaForCausalLM": "LlamaConfig",
    "Qwen2ForCausalLM": "Qwen2Config",
    "GemmaForCausalLM": "GemmaConfig",
    "MistralForCausalLM": "MistralConfig",
    "MixtralForCausalLM": "MixtralConfig",
}


def tiny_model(architecture: str) -> torch.nn.Module:
    config = getattr(transformers, ARCHITECTURES[architecture])(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=128,
    )  # fmt: skip
    torch.manual_seed(0)
    return getattr(transformers, architecture)(config).to(device=DEVICE, dtype=DTYPE).train()


class _residual_calls:
    """Records, within a `with` block, whether each tritongemm.dense.linear.linear call had a residual."""

    def __enter__(self):
        import tritongemm.dense.linear as fused_module

        self.calls, self._module, self._linear = [], fused_module, fused_module.linear

        def recording(*args, residual=None, **kwargs):
            self.calls.append(residual is not None)
            return self._linear(*args, residual=residual, **kwargs)

        fused_module.linear = recording
        return self

    def __exit__(self, *exc):
        self._module.linear = self._linear


def forward_and_grads(model, ids):
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return out.logits.detach(), grads


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_the_residual_adds_move_into_the_stores(architecture):
    """Every layer's o_proj adds the attention's residual in its store, and a GatedMLP's down_proj
    the MLP's; logits, gradients and greedy tokens are the unpatched model's, the state_dict's keys
    too."""
    model = tiny_model(architecture)
    ids = torch.randint(0, 128, (2, 9), device=DEVICE)
    logits, grads = forward_and_grads(model, ids)
    model.eval()
    with torch.no_grad():
        tokens = model.generate(ids[:1, :5], max_new_tokens=4, do_sample=False)
    keys = sorted(model.state_dict())

    tritongemm.patch(model, fuse=True)
    report = model.tritongemm_patch_report
    assert report.fused_residuals == ["model.layers.0", "model.layers.1"] and not report.not_fused
    assert "the residual adds of 2 decoder layers into their GEMMs" in str(report)
    assert all(isinstance(layer.self_attn.o_proj, ResidualLinear) for layer in model.model.layers)
    gated = isinstance(model.model.layers[0].mlp, GatedMLP)
    assert gated == (architecture != "MixtralForCausalLM")

    model.train()
    with _residual_calls() as recorded:
        fused_logits, fused_grads = forward_and_grads(model, ids)
    # per layer: q/k/v (or the experts' router), o_proj with the residual, down_proj with it where
    # the MLP is gated; lm_head without
    assert recorded.calls.count(True) == 2 * (1 + gated)
    assert rel_error(fused_logits, logits.double()) <= BOUND
    shared = fused_grads.keys() & grads.keys()  # the joined q/k/v and gate/up weights are test_blocks'
    assert "model.layers.0.self_attn.o_proj.weight" in shared and "model.layers.0.input_layernorm.weight" in shared
    assert max(rel_error(fused_grads[n], grads[n].double()) for n in shared) <= 10 * BOUND
    assert residual_module._HANDOFF.pending is None
    model.eval()
    with torch.no_grad():  # bf16 on the GPU: a random tiny model's near-ties may flip either way
        generated = model.generate(ids[:1, :5], max_new_tokens=4, do_sample=False)
    assert torch.equal(generated, tokens) or ON_GPU
    assert sorted(model.state_dict()) == keys

    tritongemm.patch(model, fuse=True)  # again: nothing more to do
    assert model.tritongemm_patch_report.fused_residuals == [] and not model.tritongemm_patch_report.not_fused


def test_a_residual_that_o_proj_does_not_take_is_added_by_the_layer():
    """The layer computes what it did whatever its attention does: an o_proj that is no longer a
    ResidualLinear, or one whose input does not fit, leaves the add to the layer."""
    model = tiny_model("LlamaForCausalLM").eval()
    ids = torch.randint(0, 128, (1, 7), device=DEVICE)
    with torch.no_grad():
        expected = model(ids).logits
        tritongemm.patch(model, fuse=True)
        layer = model.model.layers[0]
        layer.self_attn.o_proj = tritongemm.nn.Linear.from_linear(layer.self_attn.o_proj)
        with _residual_calls() as recorded:
            logits = model(ids).logits
    assert recorded.calls.count(True) == 3  # layer 1's o_proj and both down_projs
    assert rel_error(logits, expected.double()) <= BOUND
    assert residual_module._HANDOFF.pending is None


def test_the_handoff_is_cleared_when_attention_raises_and_stays_on_its_thread():
    model = tiny_model("LlamaForCausalLM").eval()
    tritongemm.patch(model, fuse=True)
    layer = model.model.layers[0]
    hidden = torch.randn(1, 5, 64, device=DEVICE, dtype=DTYPE)

    def raising(*args, **kwargs):
        raise RuntimeError("attention failed")

    layer.self_attn.forward = raising
    with pytest.raises(RuntimeError, match="attention failed"):
        layer(hidden, position_embeddings=model.model.rotary_emb(hidden, torch.arange(5, device=DEVICE)[None]))
    assert residual_module._HANDOFF.pending is None

    o_proj = model.model.layers[1].self_attn.o_proj
    x = torch.randn(1, 5, 64, device=DEVICE, dtype=DTYPE)
    residual_module.give(o_proj, torch.ones(1, 5, 64, device=DEVICE, dtype=DTYPE))
    plain = torch.nn.functional.linear(x.float(), o_proj.weight.float()).double()
    with torch.no_grad():
        other_thread = []
        worker = threading.Thread(target=lambda: other_thread.append(o_proj(x)))
        worker.start()
        worker.join()
        taken = o_proj(x)  # this thread's call takes it; the other's did not
    assert rel_error(other_thread[0], plain) <= BOUND
    assert rel_error(taken, plain + 1) <= BOUND
    assert residual_module.take_back() is None


def test_a_copy_of_a_fused_model_runs_its_own_layers():
    model = tiny_model("Qwen2ForCausalLM").eval()
    tritongemm.patch(model, fuse=True)
    twin = copy.deepcopy(model)
    assert twin.model.layers[0].forward.__self__ is twin.model.layers[0]
    ids = torch.randint(0, 128, (1, 6), device=DEVICE)
    with torch.no_grad():
        assert rel_error(twin(ids).logits, model(ids).logits.double()) <= BOUND


def test_why_not_residuals_names_the_reason():
    model = tiny_model("LlamaForCausalLM")
    layer = model.model.layers[0]
    # unpatched: o_proj is torch's and the MLP is not a GatedMLP, so neither add can move
    assert "not a tritongemm Linear, and its mlp is LlamaMLP, not a GatedMLP" in why_not_residuals(layer)

    class PostNormLayer(type(layer)):  # a layer that adds in another order (as Gemma 2's norms do)
        def forward(self, hidden_states, **kwargs):
            hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
            return hidden_states

    layer.__class__ = PostNormLayer
    assert "not the pre-norm pattern" in why_not_residuals(layer)

    class ScaledAttention(type(model.model.layers[1].self_attn)):
        def forward(self, hidden_states, **kwargs):
            attn_output = self.o_proj(hidden_states)
            return attn_output * 0.5, None

    other = model.model.layers[1]
    tritongemm.patch(other)  # o_proj a tritongemm Linear
    other.self_attn.__class__ = ScaledAttention
    assert "does not return o_proj's output as it is" in why_not_residuals(other)
    other.forward = lambda *args, **kwargs: None
    assert why_not_residuals(other) == "its forward is replaced on the instance"


@pytest.mark.skipif(ON_GPU, reason="aot_eager on the CPU; the H100's compiled rows run bench model")
def test_under_torch_compile_the_layer_runs_its_own_forward():
    model = tiny_model("LlamaForCausalLM").eval()
    ids = torch.randint(0, 128, (1, 7), device=DEVICE)
    with torch.no_grad():
        expected = model(ids).logits
        tritongemm.patch(model, fuse=True)
        with _residual_calls() as recorded:
            logits = torch.compile(model, backend="aot_eager")(ids).logits
    assert not any(recorded.calls)
    assert rel_error(logits, expected.double()) <= BOUND
