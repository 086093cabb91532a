"""Fused transformer blocks (tritongemm/blocks/): GatedMLP against torch's three GEMMs and two
elementwise ops, its gradients, its state_dict in transformers' keys, and patch(fuse=True) on
tiny transformers models. On the CPU under the interpreter (fp16, fp32); on a GPU every dtype."""

import zlib

import pytest
import torch
import torch.nn.functional as F
from cases import DEVICE, DTYPES, ON_GPU, ON_HOPPER

import tritongemm
from tritongemm.blocks import GatedMLP
from tritongemm.blocks.fuse import why_not_fused
from tritongemm.blocks.gated_pair import gated_pair
from tritongemm.epilogue import activate_torch
from tritongemm.reference import rel_error, tolerance


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


def test_gated_mlp_gradients_match_torch():
    H, inner = 32, 24
    mlp = GatedMLP(H, inner, "silu", device=DEVICE)
    x = rand(11, H, seed="x").requires_grad_()
    weights = rand(11, H, seed="w")
    (mlp(x) * weights).sum().backward()
    x64 = x.detach().double().requires_grad_()
    params = [p.detach().double().requires_grad_() for p in (mlp.gate_up_weight, mlp.down_proj.weight)]
    gate, up = params[0].chunk(2)
    (unfused(x64, gate, up, params[1], "silu") * weights.double()).sum().backward()
    bound = tolerance(torch.float32, 64)
    assert rel_error(x.grad, x64.grad) <= bound
    assert rel_error(mlp.gate_up_weight.grad, params[0].grad) <= bound
    assert rel_error(mlp.down_proj.weight.grad, params[1].grad) <= bound


@pytest.mark.skipif(
    not ON_HOPPER, reason="rung 9's gated epilogue is Gluon: an sm_90 GPU (test_gluon_compile compiles it)"
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gated_mlp_on_rung_9s_gated_epilogue(dtype):
    """kernel="tma_warp_specialized": the pair through rung 9 (blocks/gated_pair.py), forward and
    gradients against the block in fp64; odd rows, an intermediate size off every tile."""
    H, inner = 256, 600
    mlp = GatedMLP(H, inner, "silu", device=DEVICE, dtype=dtype, kernel="tma_warp_specialized")
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
def test_rung_9s_gated_pair_has_no_interpreter_path():
    mlp = GatedMLP(16, 8, "silu", kernel="tma_warp_specialized")
    with torch.no_grad(), pytest.raises(ValueError, match="'tma_warp_specialized' has no interpreter path"):
        mlp(rand(2, 16))


def test_gated_pair_names_its_kernels():
    with pytest.raises(ValueError, match=r"expected kernel to be one of \('auto', 'tma_warp_specialized'\)"):
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


def test_patch_fuse_refuses_fp8():
    with pytest.raises(ValueError, match="fuse=True"):
        tritongemm.patch(torch.nn.Sequential(LlamaMLP(8, 8)), fuse=True, fp8="row")


TINY = {  # transformers architectures whose MLP is gated, at a few dozen features
    "LlamaForCausalLM": "LlamaConfig",
    "Qwen2ForCausalLM": "Qwen2Config",
    "GemmaForCausalLM": "GemmaConfig",  # GeGLU (tanh)
    "MistralForCausalLM": "MistralConfig",
}


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
    model.zero_grad()

    tritongemm.patch(model, fuse=True)
    report = model.tritongemm_patch_report
    assert report.fused == ["model.layers.0.mlp", "model.layers.1.mlp"] and not report.not_fused
    assert all(isinstance(layer.mlp, GatedMLP) for layer in model.model.layers)
    assert "fused 2 gated MLPs" in str(report)
    out = model(ids, labels=ids)
    out.loss.backward()
    assert rel_error(out.logits, ref_logits.double()) <= 1e-5
    assert rel_error(model.model.layers[0].mlp.down_proj.weight.grad, ref_grad.double()) <= 1e-4
    assert sorted(model.state_dict()) == sorted(keys)  # the same keys (down_proj first within an MLP now)
    model.load_state_dict(model.state_dict())
    tritongemm.patch(model, fuse=True)
    assert model.tritongemm_patch_report.fused == []


@pytest.mark.parametrize("dtype", [torch.float32], ids=str)
def test_gated_mlp_under_torch_compile(dtype):
    mlp = GatedMLP(32, 24, "silu", device=DEVICE, dtype=dtype)
    x = rand(6, 32, dtype=dtype, seed="c").requires_grad_()
    compiled = torch.compile(mlp, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    y = compiled(x)
    y.sum().backward()
    assert rel_error(y, mlp(x).double()) <= tolerance(dtype, 32)
    assert x.grad is not None and torch.isfinite(x.grad).all()


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
        assert list(next(csv.DictReader(f))) == mlp.COLUMNS
    assert {p.tokens for p in mlp.SUITE} >= {1, 16, 2048, 8192} and {p.model for p in mlp.SUITE} == set(mlp.MODELS)
