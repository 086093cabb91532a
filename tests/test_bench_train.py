"""`bench train` on the CPU: its providers and arguments, the rows and their ratios, the command
line; and where transformers is installed, a tiny Llama-shaped model's training step through the
harness under the Triton interpreter (bf16 patch and each fp8 recipe checked, a wrong provider
caught and left untimed). The GPU run itself: `tritongemm bench train`."""

import importlib.util

import pytest
import torch

import tritongemm
from tritongemm.bench import model as M
from tritongemm.bench import train as T
from tritongemm.cli import main

ON_CPU = not torch.cuda.is_available()
tiny_on_cpu = pytest.mark.skipif(not ON_CPU, reason="tiny CPU models, served under the interpreter only")
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (an optional extra: pip install transformers)",
)
# block-wise needs widths of 128: the tiny model's are
TINY = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4)
TINY_VOCAB = 256


def test_every_eager_provider_has_its_compiled_twin_and_recipe():
    assert T.PROVIDERS[:2] == ("torch", "torch.compile")
    for eager in T.EAGER:
        twin = "torch.compile" if eager == "torch" else f"{eager}+compile"
        assert twin in T.PROVIDERS and T.eager_of(twin) == eager and T.recipe_of(twin) == T.recipe_of(eager)
    assert [T.recipe_of(p) for p in ("torch", "tritongemm", "tritongemm-fp8-block", "torchao-fp8-row+compile")] == [
        "bf16", "bf16", "block", "rowwise"
    ]  # fmt: skip


def test_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match="--providers must include torch"):
        T.check_arguments(providers=("tritongemm",))
    with pytest.raises(ValueError, match="--models: expected names from .* but got 'gpt'"):
        T.check_arguments(families=("gpt",))
    with pytest.raises(ValueError, match="--providers: expected names from .* but got 'fp8'"):
        T.check_arguments(providers=("torch", "fp8"))


def test_rows_derive_throughput_and_both_ratios():
    results = {"torch": [20.0, (0, 0, 0), "ok"], "torch.compile": [16.0, (0.01, 0, 0.02), "ok"],
               "tritongemm-fp8-row": [12.5, (0.05, 0.001, 0.1), "ok"],
               "torchao-fp8-row": [None, None, T.TORCHAO_HINT]}  # fmt: skip
    rows = T.make_rows("H200", "llama-3-8b", 4, M.Setting("train", 2, 2048), results, tuple(results))
    fp8 = rows[2]
    assert fp8.tokens_per_s == pytest.approx(4096 / 12.5e-3) and fp8.ratio_to_torch == pytest.approx(1.6)
    assert fp8.ratio_to_torch_compile == pytest.approx(1.28) and fp8.recipe == "row"
    assert rows[3].ms is None and rows[3].ratio_to_torch is None and rows[3].status == T.TORCHAO_HINT
    table = T.format_table(rows)
    assert "tritongemm-fp8-row" in table and "1.280" in table and T.TORCHAO_HINT in table


def test_fp8_is_held_to_fp8_bounds_and_bf16_to_bf16s():
    fp8_like = (0.26, 0.0007, 0.6)  # torchao's own recipes on the H200
    assert T.within_bounds("tritongemm-fp8-row", fp8_like) and not T.within_bounds("tritongemm", fp8_like)
    assert not T.within_bounds("tritongemm-fp8-tensor+compile", (0.05, 0.001, 1.4))  # a wrong transpose
    assert not T.within_bounds("torchao-fp8-row", (0.05, 0.05, 0.1))  # the loss stays tight
    compiled = (0.024, 1.6e-5, 0.0565)  # torch.compile's own bf16 step at 4 layers
    assert T.within_bounds("torch.compile", compiled, layers=4) and not T.within_bounds("torch.compile", compiled, 2)
    rerouted = (8.7e-2, 1.8e-4, 0.17)  # the H200's 4-layer Mixtral shape, bf16: near-tied tokens change experts
    assert T.within_bounds("tritongemm", rerouted, moe=True) and not T.within_bounds("tritongemm", rerouted)
    assert not T.within_bounds("tritongemm", (0.5, 1e-3, 1.0), moe=True)  # a broken kernel still is


@pytest.mark.skipif(not ON_CPU, reason="the refusal of a machine without a GPU")
def test_bench_train_needs_a_gpu(capsys):
    assert main(["bench", "train"]) == 2
    assert "bench train: needs a CUDA GPU" in capsys.readouterr().err


def test_bench_train_refuses_options_it_does_not_take(capsys):
    assert main(["bench", "train", "--phases", "train"]) == 2
    assert "bench train: --phases does not apply" in capsys.readouterr().err


def _tiny(providers):
    config = M.family_config("llama-3-8b", 1, vocab_size=TINY_VOCAB, dims=M.FAMILIES["llama-3-8b"].dims | TINY)
    torch.manual_seed(0)
    base = M.build_base("llama-3-8b", config, device="cpu", dtype=torch.float32).train()
    models, unavailable = T.build_models(base, providers)
    inputs = M.make_inputs(M.Setting("train", 2, 8), TINY_VOCAB, "cpu")
    return base, models, unavailable, inputs


def _counting_timer(calls):
    def timer(fn):  # the harness has run each step twice already: the interpreter is slow
        calls.append(fn)
        return 1.0

    return timer


@needs_transformers
@tiny_on_cpu
def test_a_tiny_models_step_through_the_harness():
    """bf16 patch within bf16 bounds of eager torch; each fp8 recipe within fp8's, its gradients
    neither exact nor far off; every nn.Linear trained in fp8; each correct provider timed."""
    providers = ("torch", "tritongemm", *T.FP8_TRAINING)
    base, models, unavailable, inputs = _tiny(providers)
    assert not unavailable
    for provider in T.FP8_TRAINING:
        linears = [m for n, m in models[provider].named_modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(type(m).__name__ == "Fp8TrainingLinear" for m in linears)
    timed = []
    results = T.measure(models, {}, inputs, list(M.linear_parameters(base)), rounds=1, timer=_counting_timer(timed))
    assert [r[2] for r in results.values()] == ["ok"] * len(providers) and len(timed) == len(providers)
    assert max(results["tritongemm"][1]) < 1e-4
    for provider in T.FP8_TRAINING:
        logits, loss, grads = results[provider][1]
        assert 1e-4 < grads <= T.FP8_MAX_GRAD_REL_ERR and logits <= T.FP8_MAX_REL_ERR_TRAIN, provider


@needs_transformers
@tiny_on_cpu
def test_a_tiny_moe_models_experts_train_in_fp8_through_the_harness(monkeypatch):
    """On a MoE family a provider of Fp8TrainingConfig("row", experts="fp8") trains the experts in
    fp8 too (the bf16 reference's experts: transformers' eager loop here, its grouped_mm on the GPU)
    and passes fp8's bounds; recipe_of still reads its recipe."""
    pytest.importorskip("transformers.integrations.moe", reason="transformers 5.x's experts interface")
    monkeypatch.setitem(T.FP8_TRAINING, "tritongemm-fp8-row", tritongemm.nn.Fp8TrainingConfig("row", experts="fp8"))
    tiny = dict(hidden_size=64, moe_intermediate_size=32, intermediate_size=96, num_experts=8, num_experts_per_tok=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    config = M.family_config("qwen3-30b-moe", 1, vocab_size=TINY_VOCAB, dims=M.FAMILIES["qwen3-30b-moe"].dims | tiny)
    torch.manual_seed(0)
    base = M.build_base("qwen3-30b-moe", config, device="cpu", dtype=torch.float32).train()
    base.set_experts_implementation("eager")
    providers = ("torch", "tritongemm-fp8-row")
    models, unavailable = T.build_models(base, providers)
    assert not unavailable
    assert models["tritongemm-fp8-row"].tritongemm_patch_report.experts == "tritongemm-fp8-row"
    assert T.recipe_of("tritongemm-fp8-row+compile") == "row"
    experts_of = [m.config._experts_implementation for m in (models["torch"], models["tritongemm-fp8-row"])]
    assert experts_of == ["eager", "tritongemm-fp8-row"]  # the reference's own: the copy's config is its own
    inputs = M.make_inputs(M.Setting("train", 2, 8), TINY_VOCAB, "cpu")
    results = T.measure(models, {}, inputs, list(M.linear_parameters(base)), rounds=1, timer=_counting_timer([]))
    assert [r[2] for r in results.values()] == ["ok", "ok"], results


class _Skewed(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) * 1.5


@needs_transformers
@tiny_on_cpu
def test_a_wrong_provider_is_reported_and_not_timed():
    base, models, _, inputs = _tiny(("torch", "tritongemm"))
    models["tritongemm"].model.norm = _Skewed(models["tritongemm"].model.norm)
    timed = []
    results = T.measure(models, {}, inputs, list(M.linear_parameters(base)), rounds=2, timer=_counting_timer(timed))
    assert [r[2] for r in results.values()] == ["ok", "wrong"] and results["tritongemm"][0] is None
    assert len(timed) == 2  # eager torch alone, once a round


@pytest.mark.parametrize(
    "argv, expected",
    [
        ("", dict(families=T.FAMILIES_DEFAULT, providers=T.PROVIDERS, layers=T.LAYERS, name="train")),
        ("--models qwen3-30b-moe --providers torch,tritongemm-fp8-row --layers 2 --name t2 --no-plot",
         dict(families=("qwen3-30b-moe",), providers=("torch", "tritongemm-fp8-row"), layers=2, name="t2",
              plot=False)),
    ],
)  # fmt: skip
def test_bench_train_passes_its_options_to_run_train(argv, expected, monkeypatch, tmp_path):
    given = {}
    monkeypatch.setattr(T, "requirements_error", lambda: None)
    monkeypatch.setattr(T, "run_train", lambda **kwargs: given.update(kwargs))
    assert main(["bench", "train", "--out-dir", str(tmp_path), *argv.split()]) == 0
    assert given == dict(out_dir=str(tmp_path), plot=True) | expected
