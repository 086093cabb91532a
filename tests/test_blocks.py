"""Fused transformer blocks (tritongemm/blocks/): GatedMLP against torch's three GEMMs and two
elementwise ops, its gradients, its state_dict in transformers' keys, and patch(fuse=True) on
tiny transformers models. On the CPU under the interpreter (fp16, fp32); on a GPU every dtype."""

import zlib

import pytest
import torch
import torch.nn.functional as F
from cases import DEVICE, DTYPES, ON_GPU, ON_HOPPER

import tritongemm
from tritongemm.bench.report import csv_fields
from tritongemm.blocks import GatedMLP, QKVProjection, RMSNorm
from tritongemm.blocks.gated_pair import gated_pair
from tritongemm.core.epilogue import activate_torch
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.patching.fuse import why_not_fused


def rand(*shape, dtype=torch.float32, seed="", scale=1.0):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}{dtype}{seed}".encode()))
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=DEVICE)


def unfused(x, gate, up, down, activation, residual=None):
    """The block as transformers computes it, in float64."""
    x, gate, up, down = (t.double() for t in (x, gate, up, down))
    y = F.linear(activate_torch(F.linear(x, gate), activation) * F.linear(x, up), down)
    return y if residual is None else y + residual.double()


class LlamaMLP(torch.nn.Module):
    """transformers' gated MLP, as a stand-in named like it (fuse recognizes classes by name)."""

    def __init__(self, hidden, intermediate, act=None, bias=False):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = torch.nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = torch.nn.Linear(intermediate, hidden, bias=bias)
        self.act_fn = act or torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
def test_gated_mlp_computes_the_block(activation, dtype):
    H, inner = 48, 40
    mlp = GatedMLP(H, inner, activation, device=DEVICE, dtype=dtype)
    x, residual = rand(2, 7, H, dtype=dtype, seed=activation), rand(2, 7, H, dtype=dtype, seed="res")
    y = mlp(x)
    assert y.shape == (2, 7, H) and y.dtype == dtype
    bound = 2 * tolerance(dtype, max(H, inner))  # two GEMMs, the second on the first's rounded output
    assert rel_error(y, unfused(x, mlp.gate_weight, mlp.up_weight, mlp.down_proj.weight, activation)) <= bound
    y = mlp(x, residual=residual)
    assert rel_error(y, unfused(x, mlp.gate_weight, mlp.up_weight, mlp.down_proj.weight, activation, residual)) <= bound


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
def test_gated_mlp_gradients_match_torch(activation, dtype):
    """The training path (_GatedPair): the pair kept from one GEMM, gated and differentiated by
    primitives/glu.py's kernels; odd rows and an intermediate size off every tile."""
    H, inner = 32, 24
    mlp = GatedMLP(H, inner, activation, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        mlp.gate_up_weight.mul_(4)  # unit-scale pairs, so that the activation bends
    x = rand(11, H, dtype=dtype, seed="x").requires_grad_()
    weights = rand(11, H, dtype=dtype, seed="w")
    y = mlp(x)
    (y * weights).sum().backward()
    x64 = x.detach().double().requires_grad_()
    params = [p.detach().double().requires_grad_() for p in (mlp.gate_up_weight, mlp.down_proj.weight)]
    gate, up = params[0].chunk(2)
    expected = unfused(x64, gate, up, params[1], activation)
    (expected * weights.double()).sum().backward()
    bound = 2 * tolerance(dtype, 64)  # two GEMMs, the second on the first's rounded output
    assert rel_error(y, expected) <= bound
    assert rel_error(x.grad, x64.grad) <= 2 * bound
    assert rel_error(mlp.gate_up_weight.grad, params[0].grad) <= 2 * bound
    assert rel_error(mlp.down_proj.weight.grad, params[1].grad) <= bound


@pytest.mark.skipif(not ON_HOPPER, reason="the rungs' gated epilogue is Gluon: it needs an sm_90 GPU")
@pytest.mark.parametrize("kernel", ["tma_persistent_pipelined", "tma_warp_specialized"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gated_mlp_on_a_rungs_gated_epilogue(kernel, dtype):
    """The pair through rung 6's or 9's gated epilogue (blocks/gated_pair.py), forward and
    gradients against the block in fp64; odd rows, an intermediate size off every tile."""
    H, inner = 256, 600
    mlp = GatedMLP(H, inner, "silu", device=DEVICE, dtype=dtype, kernel=kernel)
    with torch.no_grad():
        mlp.gate_up_weight.mul_(4)  # unit-scale pairs, so that SiLU bends
    x = rand(3, 37, H, dtype=dtype, seed="ws").requires_grad_()
    weights = rand(3, 37, H, dtype=dtype, seed="ws-w")
    y = mlp(x)
    (y * weights).sum().backward()
    x64 = x.detach().double().requires_grad_()
    params = [p.detach().double().requires_grad_() for p in (mlp.gate_up_weight, mlp.down_proj.weight)]
    gate, up = params[0].chunk(2)
    expected = unfused(x64, gate, up, params[1], "silu")
    (expected * weights.double()).sum().backward()
    bound = 2 * tolerance(dtype, max(H, inner))
    assert rel_error(y, expected) <= bound
    for got, want in ((x.grad, x64.grad), (mlp.gate_up_weight.grad, params[0].grad)):
        assert rel_error(got, want) <= 2 * bound
    with torch.no_grad():
        assert rel_error(mlp(x), expected) <= bound  # the inference path, no autograd


@pytest.mark.skipif(ON_GPU, reason="the CPU's refusal")
def test_the_rungs_gated_pair_has_no_interpreter_path():
    mlp = GatedMLP(16, 8, "silu", kernel="tma_warp_specialized")
    with torch.no_grad(), pytest.raises(ValueError, match="'tma_warp_specialized' has no interpreter path"):
        mlp(rand(2, 16))


def test_gated_pair_names_its_kernels():
    with pytest.raises(ValueError, match=r"expected kernel to be one of \('auto', 'tma_persistent_pipelined', 'tma_w"):
        gated_pair(rand(2, 16), rand(16, 16), "silu", kernel="grouped")


def test_from_mlp_and_the_state_dict_keep_transformers_keys():
    torch.manual_seed(0)
    original = LlamaMLP(32, 40).to(DEVICE)
    fused = GatedMLP.from_mlp(original, "silu")
    assert fused.down_proj.weight is original.down_proj.weight  # shared, not copied
    assert torch.equal(fused.gate_weight, original.gate_proj.weight)
    assert fused.gate_weight.data_ptr() == fused.gate_up_weight.data_ptr()  # a view of the joined weight
    assert set(fused.state_dict()) == set(original.state_dict()) == {
        "gate_proj.weight", "up_proj.weight", "down_proj.weight"}  # fmt: skip
    x = rand(5, 32, seed="x")
    assert rel_error(fused(x), original(x).double()) <= 2 * tolerance(torch.float32, 40)
    fresh = GatedMLP(32, 40, device=DEVICE)
    fresh.load_state_dict(original.state_dict())
    assert torch.equal(fresh.gate_up_weight, fused.gate_up_weight)
    back = LlamaMLP(32, 40).to(DEVICE)
    back.load_state_dict(fused.state_dict())
    assert all(torch.equal(back.state_dict()[k], v) for k, v in original.state_dict().items())


def test_gated_mlp_refuses_an_activation_it_cannot_fuse():
    with pytest.raises(ValueError, match="expected activation to be one of"):
        GatedMLP(8, 8, "relu")


def test_why_not_fused_names_the_reason():
    assert why_not_fused(LlamaMLP(8, 8)) is None
    assert "with a bias" in why_not_fused(LlamaMLP(8, 8, bias=True))
    assert "ReLU" in why_not_fused(LlamaMLP(8, 8, act=torch.nn.ReLU()))

    class MyMLP(LlamaMLP):
        pass

    assert "not a class known" in why_not_fused(MyMLP(8, 8))


class LlamaAttention(torch.nn.Module):
    """transformers' attention projections, as a stand-in named like it: q, k, v of one input."""

    def __init__(self, hidden, q_out, kv_out, bias=False):
        super().__init__()
        self.q_proj = torch.nn.Linear(hidden, q_out, bias=bias)
        self.k_proj = torch.nn.Linear(hidden, kv_out, bias=bias)
        self.v_proj = torch.nn.Linear(hidden, kv_out, bias=bias)

    def forward(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)


def _unfused_qkv(attention, x):
    return [F.linear(x.double(), w.double(), None if b is None else b.double()) for w, b in attention]


@pytest.mark.parametrize("bias", [False, True])
def test_qkv_projection_is_one_gemm_for_one_input(bias):
    attention = LlamaAttention(32, 48, 16, bias=bias).to(DEVICE)
    weights = [(p.weight.detach().clone(), None if p.bias is None else p.bias.detach().clone())
               for p in (attention.q_proj, attention.k_proj, attention.v_proj)]  # fmt: skip
    fused, left = tritongemm.patching.fuse.fuse_qkv(attention_parent := torch.nn.ModuleDict({"self_attn": attention}))
    assert fused == ["self_attn"] and not left and isinstance(attention.q_proj, QKVProjection)
    x = rand(3, 5, 32, seed="qkv")
    with _count_linear_calls() as launches:
        outputs = attention(x)
    assert launches.count == 1 and attention.q_proj._kept is None
    for got, want in zip(outputs, _unfused_qkv(weights, x)):
        assert got.shape == want.shape and rel_error(got, want) <= tolerance(torch.float32, 32)
    # Another order, another input, an input modified in place between the calls: each still right.
    x2 = rand(3, 5, 32, seed="qkv2")
    want = _unfused_qkv(weights, x2)
    with _count_linear_calls() as launches:
        k2, q, v2 = attention.k_proj(x2), attention.q_proj(x), attention.v_proj(x2)
        x2.mul_(2)
        k3 = attention.k_proj(x2)
    # One input's outputs are kept at a time: x2's, then x's (x2's v dropped), x2's again for v2;
    # x2 changed in place: a new one for k3.
    assert launches.count == 4
    assert rel_error(k2, want[1]) <= 1e-5 and rel_error(v2, want[2]) <= 1e-5
    assert rel_error(q, _unfused_qkv(weights, x)[0]) <= 1e-5
    assert rel_error(k3, _unfused_qkv(weights, x2)[1]) <= 1e-5
    assert attention.q_proj.weight.shape == (48, 32) and attention.v_proj.weight.shape == (16, 32)
    assert (attention.k_proj.bias is None) == (not bias)
    assert sorted(attention_parent.state_dict()) == sorted(
        f"self_attn.{p}.{t}"
        for p in ("q_proj", "k_proj", "v_proj")
        for t in (("weight", "bias") if bias else ("weight",))
    )


def test_qkv_projection_in_inference_mode_and_under_compile():
    attention = LlamaAttention(16, 32, 8).to(DEVICE)
    weights = [(p.weight.detach().clone(), None) for p in (attention.q_proj, attention.k_proj, attention.v_proj)]
    tritongemm.patching.fuse.fuse_qkv(torch.nn.ModuleDict({"a": attention}))
    x = rand(4, 16, seed="inference")
    with torch.inference_mode(), _count_linear_calls() as launches:
        outputs = attention(x)
    assert launches.count == 1
    compiled = torch.compile(attention, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    for got, want in zip(compiled(x), _unfused_qkv(weights, x)):
        assert rel_error(got, want) <= tolerance(torch.float32, 16)
    for got, want in zip(outputs, _unfused_qkv(weights, x)):
        assert rel_error(got, want) <= tolerance(torch.float32, 16)


def test_why_not_qkv_names_the_reason():
    from tritongemm.patching.fuse import why_not_qkv

    assert why_not_qkv(LlamaAttention(8, 8, 4)) is None
    mixed = LlamaAttention(8, 8, 4)
    mixed.k_proj = torch.nn.Linear(8, 4, bias=True)
    assert "some of q_proj, k_proj and v_proj have a bias" in why_not_qkv(mixed)
    half = LlamaAttention(8, 8, 4)
    half.v_proj.half()
    assert "differ in in_features, dtype or device" in why_not_qkv(half)

    class CrossAttention(LlamaAttention):
        pass

    assert "not a class known" in why_not_qkv(CrossAttention(8, 8, 4))


def test_patch_fuse_takes_a_model_patched_before():
    """patch(model) then patch(model, fuse=True): the projections are tritongemm Linears by then,
    which the fusion takes as it takes nn.Linear."""
    model = torch.nn.ModuleDict({"mlp": LlamaMLP(16, 24), "self_attn": LlamaAttention(16, 16, 8)}).to(DEVICE)
    tritongemm.patch(model)
    tritongemm.patch(model, fuse=True)
    report = model.tritongemm_patch_report
    assert report.fused == ["mlp"] and report.fused_qkv == ["self_attn"] and not report.not_fused


def test_patch_fuse_with_fp8_fuses_the_norms_only():
    """fp8 layers are not joined into blocks: each gated MLP's projections become Fp8Linears, the
    norms one kernel each (a stand-in norm: tests/test_rms_norm.py's)."""
    from test_rms_norm import LlamaRMSNorm

    from tritongemm.fp8.linear import Fp8Linear

    model = torch.nn.ModuleDict({"mlp": LlamaMLP(128, 128), "norm": LlamaRMSNorm(128)}).to(DEVICE)
    tritongemm.patch(model, fuse=True, fp8="row")
    report = model.tritongemm_patch_report
    assert report.fused_norms == ["norm"] and report.fused == [] and report.fused_qkv == []
    assert not isinstance(model["mlp"], GatedMLP) and isinstance(model["mlp"].gate_proj, Fp8Linear)


TINY = {  # transformers architectures whose MLP is gated, at a few dozen features
    "LlamaForCausalLM": "LlamaConfig",
    "Qwen2ForCausalLM": "Qwen2Config",
    "GemmaForCausalLM": "GemmaConfig",  # GeGLU (tanh)
    "MistralForCausalLM": "MistralConfig",
    "Qwen3ForCausalLM": "Qwen3Config",  # RMSNorms on q and k per head too
}


class _count_linear_calls:
    """Counts tritongemm.dense.linear.linear calls within a `with` block (each a GEMM launch):
    the blocks' (which look it up on dense.linear) and tritongemm.Linear's (dense/module.py, which
    imports the function itself)."""

    def __enter__(self):
        import tritongemm.dense.linear as fused_module
        import tritongemm.dense.module as module_module

        self.count, self._modules, self._linear = 0, (fused_module, module_module), fused_module.linear

        def counting(*args, **kwargs):
            self.count += 1
            return self._linear(*args, **kwargs)

        for module in self._modules:
            module.linear = counting
        return self

    def __exit__(self, *exc):
        for module in self._modules:
            module.linear = self._linear


@pytest.mark.skipif(ON_GPU, reason="tiny fp32 models for the interpreter; the H100 runs bench model's")
@pytest.mark.parametrize("architecture", list(TINY))
def test_patch_fuse_on_transformers_models(architecture):
    """Every layer's MLP becomes a GatedMLP; logits and gradients match the unpatched model, the
    state_dict keeps its keys and loads back; patching again changes nothing."""
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, TINY[architecture])(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).train()
    ids = torch.randint(0, 128, (2, 9))
    keys = list(model.state_dict())
    out = model(ids, labels=ids)
    out.loss.backward()
    ref_logits = out.logits.detach()
    ref_grad = model.model.layers[0].mlp.down_proj.weight.grad.clone()
    attention = model.model.layers[0].self_attn
    ref_qkv_grad = torch.cat([getattr(attention, p).weight.grad for p in ("q_proj", "k_proj", "v_proj")])
    ref_norm_grad = model.model.layers[0].input_layernorm.weight.grad.clone()
    norms = [name for name, module in model.named_modules() if type(module).__name__.endswith("RMSNorm")]
    model.zero_grad()

    tritongemm.patch(model, fuse=True)
    report = model.tritongemm_patch_report
    assert report.fused == ["model.layers.0.mlp", "model.layers.1.mlp"] and not report.not_fused
    assert report.fused_qkv == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert all(isinstance(layer.mlp, GatedMLP) for layer in model.model.layers)
    assert all(isinstance(layer.self_attn.q_proj, QKVProjection) for layer in model.model.layers)
    assert "fused 2 gated MLPs into GatedMLP, 2 attention q/k/v projections" in str(report)
    assert len(norms) >= 5 and report.fused_norms == norms  # two a layer and the model's (Qwen3: and q's, k's)
    assert isinstance(model.model.norm, RMSNorm)
    joined = model.model.layers[0].self_attn.q_proj
    calls = []
    joined.register_forward_hook(lambda *_: calls.append("q"))
    launches = _count_linear_calls()
    with launches:
        out = model(ids, labels=ids)
    out.loss.backward()
    assert rel_error(out.logits, ref_logits.double()) <= 1e-5
    assert rel_error(model.model.layers[0].mlp.down_proj.weight.grad, ref_grad.double()) <= 1e-4
    assert rel_error(joined.qkv_weight.grad, ref_qkv_grad.double()) <= 1e-4
    assert rel_error(model.model.layers[0].input_layernorm.weight.grad, ref_norm_grad.double()) <= 1e-4
    # per layer: the q/k/v GEMM, o_proj, the gated pair's (not a linear) and down_proj; and lm_head
    assert launches.count == 2 * 3 + 1 and calls == ["q"]
    assert joined._kept is None  # k and v took theirs: nothing is held after the forward
    assert sorted(model.state_dict()) == sorted(keys)  # the same keys (down_proj first within an MLP now)
    model.load_state_dict(model.state_dict())
    tritongemm.patch(model, fuse=True)
    again = model.tritongemm_patch_report
    assert again.fused == [] and again.fused_qkv == [] and again.fused_norms == []


@pytest.mark.parametrize("recipe", ["row", "block"])
def test_with_fp8_a_layers_norms_quantize_for_the_layers_they_feed(recipe, monkeypatch):
    """patch(fp8=..., fuse=True) on a tiny Llama: each layer's two norms quantize their output for
    q, k, v and for gate, up in their own kernel, so no Fp8Linear group quantizes its input; the
    logits are those of each group quantizing it: the same bits under the interpreter; on the GPU
    the norm's kernel that quantizes may round an output's last bit otherwise (tests/test_rms_norm.py),
    and its quantization with it."""
    transformers = pytest.importorskip("transformers")
    import tritongemm.fp8.linear as fp8_linear
    from tritongemm.patching.fp8 import quantize_in_norms

    config = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, vocab_size=128,
    )  # fmt: skip
    torch.manual_seed(0)
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    model = transformers.LlamaForCausalLM(config).eval().to(device=DEVICE, dtype=dtype)
    tritongemm.patch(model, fp8=recipe, fuse=True)
    report = model.tritongemm_patch_report
    assert report.quantized_in_norms == [
        f"model.layers.{i}.{norm} -> {block}" for i in (0, 1)
        for norm, block in (("input_layernorm", "self_attn"), ("post_attention_layernorm", "mlp"))
    ]  # fmt: skip
    assert "4 of them made by the RMSNorm before them" in str(report)
    quantized = []
    counting = lambda x, recipe: quantized.append(x.shape) or quantize(x, recipe)  # noqa: E731
    quantize = fp8_linear.quantize_fp8
    monkeypatch.setattr(fp8_linear, "quantize_fp8", counting)
    ids = torch.randint(0, 128, (2, 9), device=DEVICE)
    with torch.no_grad():
        logits = model(ids).logits
        assert quantized == []
        for layer in model.model.layers:
            layer.input_layernorm.fp8_share = layer.post_attention_layernorm.fp8_share = None
        expected = model(ids).logits
    assert len(quantized) == 4  # each group of each layer, once
    assert torch.equal(logits, expected) if not ON_GPU else rel_error(logits, expected.double()) <= 2e-2
    # Under inference mode the groups keep nothing (no version counter): the norms don't offer.
    quantize_in_norms(model)
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, expected)
    assert len(quantized) == 4 + 2 * (3 + 2)  # each layer of q, k, v and of gate, up quantizes its own input


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32], ids=str)
def test_gated_mlp_under_torch_compile(dtype):
    """Training traces the pair's GEMM (the `mm` operator) and the gating in torch; inference the
    `gated_pair` operator. Both against the eager module, gradients too."""
    mlp = GatedMLP(32, 24, "silu", device=DEVICE, dtype=dtype)
    x = rand(6, 32, dtype=dtype, seed="c").requires_grad_()
    compiled = torch.compile(mlp, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    bound = 2 * tolerance(dtype, 32)
    y = compiled(x)
    y.sum().backward()
    grads = x.grad, mlp.gate_up_weight.grad
    x.grad = mlp.gate_up_weight.grad = None
    expected = mlp(x)
    expected.sum().backward()
    assert rel_error(y, expected.double()) <= bound
    assert rel_error(grads[0], x.grad.double()) <= 2 * bound
    assert rel_error(grads[1], mlp.gate_up_weight.grad.double()) <= 2 * bound
    with torch.no_grad():
        assert rel_error(compiled(x), expected.double()) <= bound


@pytest.mark.parametrize("rows", [5, 128] if ON_HOPPER else [5])  # 128: rung 6's gated epilogue
def test_a_static_inference_graph_keeps_the_pairs_plan_at_its_site(rows, monkeypatch):
    """GatedMLP's inference forward compiled by Inductor with static shapes: the gated pair and
    the down projection are call sites (inductor.Site) writing into Inductor's buffers, which plan
    once and launch their kept plans on later runs. Inductor's CPU backend on the CPU (fp16)."""
    from torch._inductor.utils import run_and_get_code

    from tritongemm.blocks import gated_pair as pair_module

    dtype = torch.bfloat16 if ON_GPU else torch.float16
    mlp = GatedMLP(64, 40, "silu", device=DEVICE, dtype=dtype)
    planned = []
    real = pair_module.planned_pair
    monkeypatch.setattr(pair_module, "planned_pair", lambda *a: planned.append(1) or real(*a))
    compiled = torch.compile(mlp, fullgraph=True, backend="inductor", dynamic=False)
    bound = 2 * tolerance(dtype, 64)
    with torch.no_grad():
        x = rand(rows, 64, dtype=dtype, seed="s0")
        y, (code,) = run_and_get_code(compiled, x)
        assert "tritongemm_Site('gated_pair'" in code and "tritongemm_Site('linear'" in code
        assert rel_error(y, mlp(x).double()) <= bound
        first = len(planned)
        for step in range(3):
            x = rand(rows, 64, dtype=dtype, seed=f"s{step + 1}")
            assert rel_error(compiled(x), mlp(x).double()) <= bound
    assert len(planned) == first + 3  # the eager module's calls only: the site kept its plan


def test_a_float32_pairs_plan_follows_torchs_tf32_switch(monkeypatch):
    """The row-group kernel's float32 products follow torch's TF32 switch as the plan is built
    (ladder/_host.input_precision): a call after the switch moved gets a plan of its own."""
    from tritongemm.blocks import gated_pair as pair_module

    built = []
    real = pair_module._build
    monkeypatch.setattr(pair_module, "_build", lambda *a: built.append(1) or real(*a))
    rows, weight = rand(5, 8, seed="tf32"), rand(12, 8, seed="tf32w")
    tritongemm.plans.clear()  # no plan for these operands from another test
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        for allow in (False, True, False):
            torch.backends.cuda.matmul.allow_tf32 = allow
            gated_pair(rows, weight, "silu")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    assert len(built) == 2  # one plan a setting: the third call finds the first's


def test_the_gated_pair_operator_passes_opcheck_and_checks_its_arguments():
    op = torch.ops.tritongemm.gated_pair.default
    torch.library.opcheck(op, (rand(5, 8, seed="oc"), rand(12, 8, seed="ocw"), "gelu"))
    with pytest.raises(ValueError, match=r"weight \(2I, H\), but got shapes \(5, 8\) and \(12, 7\)"):
        op(rand(5, 8), rand(12, 7), "silu")
    with pytest.raises(ValueError, match="expected activation to be one of .* but got 'relu'"):
        op(rand(5, 8), rand(12, 8), "relu")


def test_the_gated_pair_operator_refuses_a_backward():
    weight = rand(16, 8, seed="op").requires_grad_()
    h = torch.ops.tritongemm.gated_pair(rand(3, 8, seed="rows"), weight, "silu")
    with pytest.raises(RuntimeError, match="tritongemm::gated_pair has no backward"):
        h.sum().backward()


def test_the_state_dict_halves_share_no_storage(tmp_path):
    """safetensors refuses tensors that share storage, and savers that dedupe tied weights would
    drop one half: the state_dict's gate and up weights are copies."""
    safetensors = pytest.importorskip("safetensors.torch")
    mlp = GatedMLP(16, 24, device=DEVICE)
    state = mlp.state_dict()
    gate, up = state["gate_proj.weight"], state["up_proj.weight"]
    assert gate.untyped_storage().data_ptr() != up.untyped_storage().data_ptr()
    safetensors.save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "mlp.safetensors"))
    loaded = GatedMLP(16, 24, device=DEVICE)
    loaded.load_state_dict(safetensors.load_file(str(tmp_path / "mlp.safetensors"), device=str(DEVICE)))
    assert torch.equal(loaded.gate_up_weight, mlp.gate_up_weight)


@pytest.mark.skipif(ON_GPU, reason="the CPU's smoke run (the H100 runs the suite)")
def test_bench_mlp_checks_times_and_writes(tmp_path):
    import csv

    from tritongemm.bench import mlp

    rows = mlp.run_mlp(out_dir=tmp_path, rounds=1)
    assert {r.provider for r in rows} == {"torch", "tritongemm"}  # no compiler to time on the CPU
    assert all(r.status == "ok" for r in rows) and {r.direction for r in rows} == set(mlp.DIRECTIONS)
    with open(tmp_path / "mlp-cpu.csv") as f:
        assert list(next(csv.DictReader(f))) == csv_fields(mlp.COLUMNS)
    assert {p.tokens for p in mlp.SUITE} >= {1, 16, 2048, 8192} and {p.model for p in mlp.SUITE} == set(mlp.MODELS)
