"""`bench model` on the CPU: its settings, the families' configurations, the rows, the checks and
the targets, the command line; and where transformers is installed, each family's module layout
(built on the meta device at its real dimensions), tritongemm.patch on it, and every phase end to
end on tiny models (the Triton interpreter). The GPU run itself: `tritongemm bench model`."""

import csv
import importlib.util
import math

import pytest
import torch

from tritongemm.bench import model as M
from tritongemm.bench.report import csv_fields
from tritongemm.cli import main

ON_CPU = not torch.cuda.is_available()
cpu_only = pytest.mark.skipif(not ON_CPU, reason="the refusals of a machine without a GPU")
# The tiny models live on the CPU, which tritongemm serves under the Triton interpreter only.
tiny_on_cpu = pytest.mark.skipif(not ON_CPU, reason="tiny CPU models, served under the interpreter only")
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (an optional extra: pip install transformers)",
)

COLUMNS = ["device", "dtype", "model", "layers", "phase", "batch", "tokens", "new_tokens", "provider", "ms",
           "tokens_per_s", "ratio_to_torch", "max_rel_err", "loss_rel_err", "max_grad_rel_err", "matching_tokens",
           "status"]  # fmt: skip

# family: architecture, hidden, MLP, query heads, key/value heads (None: as many as query heads)
FAMILY_DIMS = {
    "llama-3-8b": ("LlamaForCausalLM", 4096, 14336, 32, 8),
    "qwen2-7b": ("Qwen2ForCausalLM", 3584, 18944, 28, 4),
    "pythia-1.4b": ("GPTNeoXForCausalLM", 2048, 8192, 16, None),
}
# family: layer 0's nn.Linear modules (name suffix: out features, in features, bias), then the
# order its MLP's modules run in
LAYER_LINEARS = {
    "llama-3-8b": (
        {"q_proj": (4096, 4096, False), "k_proj": (1024, 4096, False), "v_proj": (1024, 4096, False),
         "o_proj": (4096, 4096, False), "gate_proj": (14336, 4096, False), "up_proj": (14336, 4096, False),
         "down_proj": (4096, 14336, False)},
        ["gate_proj", "act_fn", "up_proj", "down_proj"],
    ),
    "qwen2-7b": (
        {"q_proj": (3584, 3584, True), "k_proj": (512, 3584, True), "v_proj": (512, 3584, True),
         "o_proj": (3584, 3584, False), "gate_proj": (18944, 3584, False), "up_proj": (18944, 3584, False),
         "down_proj": (3584, 18944, False)},
        ["gate_proj", "act_fn", "up_proj", "down_proj"],
    ),
    "pythia-1.4b": (
        {"query_key_value": (6144, 2048, True), "dense": (2048, 2048, True), "dense_h_to_4h": (8192, 2048, True),
         "dense_4h_to_h": (2048, 8192, True)},
        ["dense_h_to_4h", "act", "dense_4h_to_h"],
    ),
}  # fmt: skip
TINY = {
    "llama-3-8b": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2),
    "qwen2-7b": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2),
    "pythia-1.4b": dict(hidden_size=64, intermediate_size=256, num_attention_heads=4),
}
TINY_VOCAB = 256
TINY_SETTINGS = (M.Setting("prefill", 2, 8), M.Setting("generate", 1, 8, 4), M.Setting("train", 2, 8))


def tiny_models(family: str, providers=("torch", "tritongemm")) -> dict:
    config = M.model_config(family, 2, vocab_size=TINY_VOCAB) | TINY[family]
    torch.manual_seed(0)
    return M.build_models(family, config, device="cpu", dtype=torch.float32, providers=providers)


def counting_timer(calls: list):
    def timer(fn):
        calls.append(fn)
        fn()
        return 1.0

    return timer


# ----------------------------------------------------------------------------------------------
# Pure parts
# ----------------------------------------------------------------------------------------------


def test_settings_are_the_issues_phases():
    assert [(s.phase, s.batch, s.tokens, s.new_tokens) for s in M.SETTINGS] == [
        ("prefill", 1, 2048, 0), ("prefill", 4, 1024, 0), ("generate", 1, 128, 64), ("train", 2, 1024, 0)
    ]  # fmt: skip
    assert {s.phase for s in M.SETTINGS} == set(M.PHASES)
    generate, train = M.SETTINGS[2], M.SETTINGS[3]
    assert generate.label == "generate 1 x 128 + 64 new" and generate.tokens_per_call == 64
    assert train.label == "train 2 x 1024" and train.tokens_per_call == 2048


@pytest.mark.parametrize("family", list(FAMILY_DIMS))
def test_family_configs_have_the_released_models_dimensions(family):
    architecture, hidden, mlp, heads, kv_heads = FAMILY_DIMS[family]
    config = M.model_config(family, 3)
    assert M.FAMILIES[family].architecture == architecture
    assert (config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]) == (hidden, mlp, heads)
    assert config.get("num_key_value_heads") == kv_heads
    assert (config["num_hidden_layers"], config["vocab_size"]) == (3, M.VOCAB_SIZE)
    assert config["attn_implementation"] == "sdpa" and config["tie_word_embeddings"] is False
    assert all(v == 0.0 for k, v in config.items() if "dropout" in k) and "attention_dropout" in config


def test_config_and_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match="--layers: expected one of 2, 3, 4, but got 5"):
        M.model_config("llama-3-8b", 5)
    with pytest.raises(ValueError, match="--models: expected names from llama-3-8b, .* but got 'gpt2'"):
        M.model_config("gpt2")
    with pytest.raises(ValueError, match="--phases: expected names from prefill, generate, train, but got 'decode'"):
        M.check_arguments(phases=("decode",))
    with pytest.raises(ValueError, match="--providers must include torch, the reference, but got tritongemm"):
        M.check_arguments(providers=("tritongemm",))
    with pytest.raises(ValueError, match="--models: .* but got none"):
        M.check_arguments(families=())
    M.check_arguments(("qwen2-7b",), ("train",), ("torch", "tritongemm+compile"), 4)


def test_rows_derive_throughput_and_ratio():
    generate = M.Setting("generate", 1, 128, 64)
    outcomes = {
        "torch": M.Outcome(400.0, M.Agreement(0.0, matching_tokens=64), "ok"),
        "tritongemm": M.Outcome(200.0, M.Agreement(3e-3, matching_tokens=17), "ok"),
        "torch.compile": M.Outcome(None, M.Agreement(), "error: compile failed"),
        "tritongemm+compile": M.Outcome(None, M.Agreement(0.5, matching_tokens=0), "wrong"),
    }
    rows = M.make_rows("H100", "bfloat16", "qwen2-7b", 2, generate, outcomes)
    assert [r.provider for r in rows] == list(outcomes) and {r.model for r in rows} == {"qwen2-7b"}
    torch_row, ours, compiled, wrong = rows
    assert torch_row.tokens_per_s == pytest.approx(64 / 0.4) and torch_row.ratio_to_torch == 1.0
    assert ours.tokens_per_s == pytest.approx(64 / 0.2) and ours.ratio_to_torch == 2.0
    assert (ours.max_rel_err, ours.matching_tokens, ours.loss_rel_err, ours.new_tokens) == (3e-3, 17, None, 64)
    assert compiled.ms is None and compiled.ratio_to_torch is None and compiled.status == "error: compile failed"
    assert wrong.max_rel_err == 0.5 and wrong.tokens_per_s is None
    assert list(M.ModelRow.__dataclass_fields__) == COLUMNS == M.COLUMNS
    train = M.make_rows("H100", "bfloat16", "llama-3-8b", 2, M.Setting("train", 2, 1024),
                        {"torch": M.Outcome(10.0, M.Agreement(0.0, 0.0, 0.0), "ok")})  # fmt: skip
    assert train[0].tokens_per_s == pytest.approx(2048 / 10e-3) and train[0].max_grad_rel_err == 0.0


def test_agreement_compares_logits_loss_gradients_and_tokens():
    ref = {"logits": torch.ones(2, 3), "loss": torch.tensor(4.0), "tokens": torch.tensor([[1, 2, 3, 4]]),
           "grads": {"a.weight": torch.ones(3, 3), "b.bias": torch.ones(3), "unused": None}}  # fmt: skip
    seen = {"logits": ref["logits"] * 1.01, "loss": torch.tensor(4.2), "tokens": torch.tensor([[1, 2, 9, 4]]),
            "grads": {"a.weight": torch.ones(3, 3) * 1.03, "b.bias": torch.ones(3), "unused": None}}  # fmt: skip
    found = M.agreement(seen, ref)
    assert found.max_rel_err == pytest.approx(0.01, rel=1e-4) and found.loss_rel_err == pytest.approx(0.05)
    assert found.max_grad_rel_err == pytest.approx(0.03, rel=1e-4) and found.matching_tokens == 2
    assert not found.ok()  # the loss is off by 5%
    seen["grads"]["b.bias"] = None  # a gradient that never came is as wrong as can be
    assert M.agreement(seen, ref).max_grad_rel_err == math.inf
    assert M.Agreement(1e-2, 1e-3, 4e-2).ok() and not M.Agreement(1e-2, 1e-3, 6e-2).ok() and M.Agreement().ok()
    prefill = M.agreement({"logits": ref["logits"]}, {"logits": ref["logits"]})
    assert prefill == M.Agreement(max_rel_err=0.0)


def test_rel_error_is_relative_and_catches_nan():
    ref = torch.ones(2, 3, 4)
    assert M.rel_error(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-4)
    assert M.rel_error(ref.clone().fill_(float("nan")), ref) == float("inf")
    assert M.matching_prefix(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 2], [3, 4]])) == 2
    assert M.matching_prefix(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 2], [5, 4]])) == 0


def _rows(ms: dict, status: dict | None = None, model: str = "pythia-1.4b") -> list:
    status = status or {}
    outcomes = {p: M.Outcome(t, M.Agreement(0.0), status.get(p, "ok")) for p, t in ms.items()}
    return M.make_rows("H100", "bfloat16", model, 2, M.Setting("prefill", 4, 1024), outcomes)


def test_targets_compare_eager_with_eager_and_compiled_with_compiled():
    meets = _rows({"torch": 10.0, "tritongemm": 9.0, "torch.compile": 5.0, "tritongemm+compile": 5.0})
    assert M.target_misses(meets) == []
    slow = _rows({"torch": 10.0, "tritongemm": 12.5, "torch.compile": 5.0, "tritongemm+compile": 4.0})
    assert M.target_misses(slow) == ["miss: pythia-1.4b prefill 4 x 1024: tritongemm 0.800x torch (bar 1.00x)"]
    wrong = _rows({"torch": 10.0, "tritongemm": 9.0, "torch.compile": 5.0, "tritongemm+compile": None},
                  {"tritongemm+compile": "wrong"})  # fmt: skip
    assert M.target_misses(wrong) == ["miss: pythia-1.4b prefill 4 x 1024: tritongemm+compile wrong, torch.compile ok"]
    assert M.target_misses(_rows({"torch": 10.0, "tritongemm": 9.0, "tritongemm+compile": 2.0})) == []


def test_table_and_plot_show_every_model_and_phase(tmp_path):
    rows = _rows({"torch": 10.0, "tritongemm": 12.5, "torch.compile": 5.0, "tritongemm+compile": None},
                 {"tritongemm+compile": "error: compile failed"})  # fmt: skip
    generate = {"torch": M.Outcome(400.0, M.Agreement(0.0, matching_tokens=64), "ok"),
                "tritongemm": M.Outcome(300.0, M.Agreement(1e-3, matching_tokens=12), "ok")}  # fmt: skip
    rows += M.make_rows("H100", "bfloat16", "llama-3-8b", 2, M.Setting("generate", 1, 128, 64), generate)
    table = M.format_table(rows).splitlines()
    assert table[0].split()[:4] == ["model", "phase", "setting", "provider"]
    assert any("error: compile failed" in line for line in table)
    (line,) = [line for line in table if "llama-3-8b" in line and "tritongemm" in line]
    assert line.split()[:9] == ["llama-3-8b", "generate", "1", "x", "128", "+", "64", "new", "tritongemm"]
    assert line.split()[-2:] == ["12", "ok"]
    assert M.plot_rows(rows, tmp_path / "m.png", "t").stat().st_size > 10_000


# ----------------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------------


@cpu_only
def test_bench_model_needs_a_gpu(capsys):
    assert M.requirements_error() == M.GPU_HINT
    assert main(["bench", "model", "--models", "pythia-1.4b"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"tritongemm: error: {M.GPU_HINT}"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        M.run_model()
    with pytest.raises(ValueError, match="must include torch"):  # the arguments first, as the CLI checks them
        M.run_model(providers=("tritongemm",))


def test_bench_model_says_how_to_install_transformers(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name))
    assert "pip install transformers" in M.requirements_error()


@pytest.mark.parametrize(
    "argv, expected",
    [
        ("", dict(families=tuple(M.FAMILIES), phases=M.PHASES, providers=M.PROVIDERS, layers=2, name="model")),
        ("--models qwen2-7b,pythia-1.4b --phases train --providers torch,tritongemm --layers 3 --name m2 --no-plot",
         dict(families=("qwen2-7b", "pythia-1.4b"), phases=("train",), providers=("torch", "tritongemm"), layers=3,
              name="m2", plot=False)),
    ],
)  # fmt: skip
def test_bench_model_passes_its_options_to_run_model(argv, expected, monkeypatch, tmp_path):
    given = {}
    monkeypatch.setattr(M, "requirements_error", lambda: None)
    monkeypatch.setattr(M, "run_model", lambda **kwargs: given.update(kwargs))
    assert main(["bench", "model", "--out-dir", str(tmp_path), *argv.split()]) == 0
    assert given == dict(out_dir=str(tmp_path), plot=True) | expected


# ----------------------------------------------------------------------------------------------
# With transformers: the models
# ----------------------------------------------------------------------------------------------


@needs_transformers
@pytest.mark.parametrize("family", list(LAYER_LINEARS))
def test_each_family_is_built_from_plain_linears_at_its_dimensions(family):
    """At the real dimensions, on the meta device (no memory): every projection a plain nn.Linear
    (what patch replaces) of the released model's shape and bias, and no dropout."""
    import transformers

    info = M.FAMILIES[family]
    config = getattr(transformers, info.config)(**M.model_config(family, 2))
    with torch.device("meta"):
        model = getattr(transformers, info.architecture)(config)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert {type(m) for m in linears.values()} == {torch.nn.Linear}
    assert linears["lm_head"].weight.shape == (M.VOCAB_SIZE, config.hidden_size)
    layer0 = {n.rsplit(".", 1)[-1]: m for n, m in linears.items() if ".0." in n}
    assert {n: (*m.weight.shape, m.bias is not None) for n, m in layer0.items()} == LAYER_LINEARS[family][0]
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert model.config._attn_implementation == "sdpa"


@needs_transformers
@tiny_on_cpu
@pytest.mark.parametrize("family", list(LAYER_LINEARS))
def test_patch_replaces_every_linear_of_each_family(family):
    """Tiny, on the CPU: patch replaces every nn.Linear with tritongemm's, sharing the parameters;
    the MLP runs its modules in the order that makes it gated SiLU or Linear -> GELU -> Linear."""
    import tritongemm.nn

    models = tiny_models(family)
    base, patched = models["torch"], models["tritongemm"]
    names = [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)]
    assert patched.tritongemm_patch_report.replaced == names and patched.tritongemm_patch_report.skipped == {}
    assert all(type(patched.get_submodule(n)) is tritongemm.nn.Linear for n in names)
    assert all(p is q for p, q in zip(base.parameters(), patched.parameters()))
    assert list(tiny_models(family, ("tritongemm", "torch"))) == ["torch", "tritongemm"]  # the reference first
    mlp = next(m for n, m in base.named_modules() if n.endswith("layers.0.mlp"))
    ran = []
    for name, child in mlp.named_children():
        child.register_forward_hook(lambda *_, name=name: ran.append(name))
    with torch.no_grad():
        base(input_ids=torch.zeros(1, 4, dtype=torch.long))
    assert ran == LAYER_LINEARS[family][1]
    activation = mlp.get_submodule(ran[1])
    assert ("GELU" if family == "pythia-1.4b" else "SiLU") in type(activation).__name__


@needs_transformers
@tiny_on_cpu
@pytest.mark.parametrize("family", list(TINY))
def test_every_phase_end_to_end_on_a_tiny_model(family):
    """The harness on the CPU (the Triton interpreter, fp32): the patched copy agrees with eager
    torch in every phase, generate makes all its tokens, every provider is timed once a round."""
    timed = []
    models = tiny_models(family)
    for setting in TINY_SETTINGS:
        outcomes = M.measure_setting(models, setting, vocab_size=TINY_VOCAB, device="cpu", rounds=1,
                                     timer=counting_timer(timed))  # fmt: skip
        assert [o.status for o in outcomes.values()] == ["ok", "ok"] and outcomes["tritongemm"].ms == 1.0
        found = outcomes["tritongemm"].agreement
        assert found.max_rel_err < 1e-4
        if setting.phase == "generate":
            assert found.matching_tokens == setting.new_tokens and found.loss_rel_err is None
        if setting.phase == "train":
            assert found.loss_rel_err < 1e-5 and found.max_grad_rel_err < 1e-4
            assert all(p.grad is None for p in models["torch"].parameters())  # nothing left behind
        assert not models["torch"].training
    assert len(timed) == 2 * len(TINY_SETTINGS)


@needs_transformers
@tiny_on_cpu
def test_the_fused_provider_agrees_in_every_phase():
    """tritongemm-fused: each gated MLP a GatedMLP (its gate and up weights joined, a copy); its
    train gradients are read from the joined weight's halves under eager torch's names."""
    models = tiny_models("llama-3-8b", providers=("torch", "tritongemm-fused"))
    from tritongemm.blocks import GatedMLP

    assert isinstance(models["tritongemm-fused"].model.layers[0].mlp, GatedMLP)
    for setting in TINY_SETTINGS:
        outcomes = M.measure_setting(models, setting, vocab_size=TINY_VOCAB, device="cpu", rounds=1,
                                     timer=counting_timer([]))  # fmt: skip
        assert [o.status for o in outcomes.values()] == ["ok", "ok"], setting
        if setting.phase == "train":
            assert outcomes["tritongemm-fused"].agreement.max_grad_rel_err < 1e-4


class _Skewed(torch.nn.Module):
    """A wrong lm_head: twice the logits plus one."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return 2 * self.linear(x) + 1


class _Raises(torch.nn.Module):
    def forward(self, *args, **kwargs):
        raise RuntimeError("no kernel for this\nsecond line")


@needs_transformers
def test_a_wrong_or_failing_provider_is_reported_and_not_timed():
    base = tiny_models("llama-3-8b", providers=("torch",))["torch"]
    wrong, failing = M.sharing_copy(base), M.sharing_copy(base)
    wrong.lm_head = _Skewed(wrong.lm_head)
    failing.model.norm = _Raises()
    models = {"torch": base, "tritongemm": wrong, "torch.compile": failing}
    for setting in TINY_SETTINGS:
        timed = []
        outcomes = M.measure_setting(models, setting, vocab_size=TINY_VOCAB, device="cpu", rounds=2,
                                     timer=counting_timer(timed))  # fmt: skip
        assert [o.status for o in outcomes.values()] == ["ok", "wrong", "error: no kernel for this"], setting
        assert outcomes["tritongemm"].ms is None and outcomes["tritongemm"].agreement.max_rel_err > 0.5
        assert len(timed) == 2  # eager torch alone, once a round
    outcomes = M.measure_setting({"torch": failing, "tritongemm": base}, TINY_SETTINGS[0], vocab_size=TINY_VOCAB,
                                 device="cpu", rounds=1, timer=counting_timer([]))  # fmt: skip
    assert [o.status for o in outcomes.values()] == [
        "error: no kernel for this",
        "error: no reference: eager torch failed",
    ]


def test_rows_of_a_run_are_written_with_the_columns(tmp_path):
    from tritongemm.bench.report import write_results

    rows = _rows({"torch": 10.0, "tritongemm": 9.0})
    csv_path, _ = write_results(rows, {"device": "H100"}, tmp_path, "model", columns=M.COLUMNS)
    with csv_path.open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == csv_fields(COLUMNS) and [r["model"] for r in reader] == ["pythia-1.4b"] * 2


@needs_transformers
@tiny_on_cpu
def test_the_fp8_providers_run_prefill_and_generate_and_sit_out_training():
    """The fp8 copies are patch(model, fp8=...) of the same model: checked against eager torch with
    fp8's bound (a few percent here), timed in prefill and generate; in train their row says why
    it has no time. Llama's tiny layers: in_features 64 and 128, so "block" keeps the 128s alone."""
    models = tiny_models("llama-3-8b", ("torch", *M.FP8_PROVIDERS))
    assert list(models) == ["torch", *M.FP8_PROVIDERS]
    block = models["tritongemm-fp8-block"].tritongemm_patch_report
    assert block.replaced and all("multiple of 128" in why for why in block.skipped.values())
    for setting in TINY_SETTINGS:
        timed = []
        outcomes = M.measure_setting(models, setting, vocab_size=TINY_VOCAB, device="cpu", rounds=1,
                                     timer=counting_timer(timed))  # fmt: skip
        for provider in M.FP8_PROVIDERS:
            found = outcomes[provider]
            if setting.phase == "train":
                assert found.status == M.FP8_INFERENCE_ONLY and found.ms is None
            else:
                assert found.status == "ok" and found.ms == 1.0
                assert 1e-4 < found.agreement.max_rel_err <= M.FP8_MAX_REL_ERR  # quantized, not broken
    rows = M.make_rows("cpu", "float32", "llama-3-8b", 2, TINY_SETTINGS[0], outcomes)
    assert [r.provider for r in rows] == ["torch", *M.FP8_PROVIDERS]


TINY_MOE = {
    "mixtral-8x7b-moe": dict(hidden_size=64, intermediate_size=96, num_local_experts=4, num_attention_heads=4,
                             num_key_value_heads=2),
    "qwen3-30b-moe": dict(hidden_size=64, moe_intermediate_size=32, intermediate_size=96, num_experts=8,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}  # fmt: skip


@needs_transformers
@tiny_on_cpu
@pytest.mark.parametrize("family", list(TINY_MOE))
def test_the_moe_families_run_every_phase_with_their_experts_providers(family):
    """torch runs transformers' eager experts, hf-grouped_mm its grouped ones, tritongemm patch's
    (grouped_mm): all agree in prefill, generate and train, and the issue's bar is against hf-grouped_mm."""
    config = M.model_config(family, 2, vocab_size=TINY_VOCAB) | TINY_MOE[family]
    torch.manual_seed(0)
    models = M.build_models(family, config, device="cpu", dtype=torch.float32,
                            providers=("torch", "tritongemm", "hf-grouped_mm"))  # fmt: skip
    assert list(models) == ["torch", "tritongemm", "hf-grouped_mm"]
    assert models["torch"].config._experts_implementation == "eager"
    assert models["tritongemm"].tritongemm_patch_report.experts == "tritongemm"
    for setting in TINY_SETTINGS:
        outcomes = M.measure_setting(models, setting, vocab_size=TINY_VOCAB, device="cpu", rounds=1,
                                     timer=counting_timer([]))  # fmt: skip
        assert [o.status for o in outcomes.values()] == ["ok"] * 3, outcomes
        assert outcomes["tritongemm"].agreement.max_rel_err < 1e-4
    rows = M.make_rows("cpu", "float32", family, 2, TINY_SETTINGS[0], outcomes)
    slower = [r for r in rows if r.provider == "tritongemm"][0]
    slower.ms = 2 * [r for r in rows if r.provider == "hf-grouped_mm"][0].ms
    assert any("vs" not in m and "hf-grouped_mm (bar 1.10x)" in m for m in M.target_misses(rows))


@needs_transformers
@pytest.mark.parametrize("family", list(TINY_MOE))
def test_a_moe_models_fused_providers_are_held_to_transformers_grouped_experts(family):
    """The fused patch runs on a MoE family eagerly and compiled, and each is held to the issue's
    bar against transformers' grouped experts timed alike (eager against eager, compiled against
    compiled), as the plain patch is."""
    config = M.model_config(family, 2, vocab_size=TINY_VOCAB) | TINY_MOE[family]
    providers = ("torch", "hf-grouped_mm", "hf-grouped_mm+compile", "tritongemm-fused", "tritongemm-fused+compile")
    models = M.build_models(family, config, device="cpu", dtype=torch.float32, providers=providers)
    assert list(models) == ["torch", "hf-grouped_mm", "hf-grouped_mm+compile", "tritongemm-fused",
                            "tritongemm-fused+compile"]  # fmt: skip
    assert models["tritongemm-fused+compile"]._orig_mod is models["tritongemm-fused"]
    rows = _rows({"torch": 10.0, "hf-grouped_mm": 5.0, "hf-grouped_mm+compile": 4.0, "tritongemm-fused": 5.0,
                  "tritongemm-fused+compile": 3.0}, model=family)  # fmt: skip
    miss = f"miss: {family} prefill 4 x 1024: tritongemm-fused 1.000x hf-grouped_mm (bar 1.10x)"
    assert M.target_misses(rows) == [miss]


class _Scaled(torch.nn.Module):
    """An lm_head whose logits are `factor` times the linear's: a relative error of |factor - 1|."""

    def __init__(self, linear: torch.nn.Linear, factor: float):
        super().__init__()
        self.linear, self.factor = linear, factor

    def forward(self, x):
        return self.factor * self.linear(x)


@needs_transformers
@pytest.mark.parametrize("reference_error", [0.15, 0.4])
def test_a_moe_models_compiled_providers_are_checked_against_transformers_compiled(reference_error):
    """A MoE model's compiled rows: hf-grouped_mm+compile within its own bound of eager torch, the
    other compiled providers within the MoE bound of it, where they would fail against eager torch."""
    base = tiny_models("llama-3-8b", providers=("torch",))["torch"]
    reference, ours = M.sharing_copy(base), M.sharing_copy(base)
    reference.lm_head = _Scaled(reference.lm_head, 1 + reference_error)
    ours.lm_head = _Scaled(ours.lm_head, (1 + reference_error) * 1.01)
    models = {"torch": base, "tritongemm+compile": ours, "hf-grouped_mm+compile": reference}
    kwargs = dict(vocab_size=TINY_VOCAB, device="cpu", rounds=1, timer=counting_timer([]),
                  bound_factor=M.MOE_BOUND_FACTOR)  # fmt: skip
    outcomes = M.measure_setting(models, TINY_SETTINGS[0], moe=True, **kwargs)
    if reference_error < M.COMPILED_MOE_REFERENCE_MAX_REL_ERR:
        assert [o.status for o in outcomes.values()] == ["ok", "ok", "ok"]
        assert abs(outcomes["tritongemm+compile"].agreement.max_rel_err - 0.01) < 1e-3
        assert abs(outcomes["hf-grouped_mm+compile"].agreement.max_rel_err - reference_error) < 1e-3
    else:
        assert [o.status for o in outcomes.values()] == ["ok", "error: hf-grouped_mm+compile failed", "wrong"]
    dense = M.measure_setting(models, TINY_SETTINGS[0], **kwargs)  # not a MoE model: eager torch for all
    assert dense["tritongemm+compile"].status == "wrong"


@needs_transformers
@pytest.mark.parametrize("error", [0.15, 0.4])
def test_a_moe_models_fused_provider_has_the_compiled_references_bound(error):
    """On a MoE model the fused patch rounds the router's input as a compiler does: its logits are
    held to COMPILED_MOE_REFERENCE_MAX_REL_ERR of eager torch there, to the dense bound elsewhere."""
    base = tiny_models("llama-3-8b", providers=("torch",))["torch"]
    fused = M.sharing_copy(base)
    fused.lm_head = _Scaled(fused.lm_head, 1 + error)
    models = {"torch": base, "tritongemm-fused": fused}
    kwargs = dict(vocab_size=TINY_VOCAB, device="cpu", rounds=1, timer=counting_timer([]))
    moe = M.measure_setting(models, TINY_SETTINGS[0], moe=True, bound_factor=M.MOE_BOUND_FACTOR, **kwargs)
    assert moe["tritongemm-fused"].status == ("ok" if error < M.COMPILED_MOE_REFERENCE_MAX_REL_ERR else "wrong")
    assert M.measure_setting(models, TINY_SETTINGS[0], **kwargs)["tritongemm-fused"].status == "wrong"
