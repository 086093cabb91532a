"""`bench epilogue` and `bench model` on the CPU: the epilogue suite's problems, a wrong provider
reported and never timed, the smoke run's files, and the model suite's pure parts (its settings,
configuration and rows) plus its refusal to run without a GPU."""

import csv
import json

import pytest
import torch

import tritongemm
from tritongemm.bench import epilogue as E
from tritongemm.bench import model as M
from tritongemm.cli import main

ON_CPU = not torch.cuda.is_available()
cpu_only = pytest.mark.skipif(not ON_CPU, reason="the CPU's smoke run and refusals: a GPU runs the real suites")
needs_linear = pytest.mark.skipif(
    not hasattr(tritongemm, "linear"), reason="tritongemm.linear (the fused-epilogue API) is not in this tree yet"
)

EPILOGUE_COLUMNS = ["device", "dtype", "m", "n", "k", "epilogue", "provider", "timing", "ms", "tflops",
                    "ratio_to_unfused"]  # fmt: skip
MODEL_COLUMNS = ["device", "dtype", "layers", "phase", "batch", "tokens", "provider", "ms", "tokens_per_s",
                 "ratio_to_torch", "max_rel_err", "status"]  # fmt: skip


# ----------------------------------------------------------------------------------------------
# bench epilogue
# ----------------------------------------------------------------------------------------------


def test_epilogue_suite_covers_the_llama_projections():
    problems, note = E.plan_problems(None, None, on_gpu=True)
    assert note == "" and {p.epilogue for p in problems} == set(E.EPILOGUES)
    assert {p.dtype for p in problems} == {"float16", "bfloat16"}
    gate_up, down = E.LLAMA_8B["gate_up"], E.LLAMA_8B["down"]
    for epilogue, weight in (("bias+gelu", gate_up), ("bias+silu", gate_up), ("bias+residual", down)):
        swept = [p.M for p in problems if (p.epilogue, (p.N, p.K), p.dtype) == (epilogue, weight, "bfloat16")]
        assert swept == list(E.TOKENS)
    residual = {(p.N, p.K) for p in problems if p.epilogue == "bias+residual"}
    assert residual == {E.LLAMA_8B["o"], E.LLAMA_8B["down"], E.LLAMA_70B["down"]}  # o and down projections
    assert {(p.N, p.K) for p in problems if p.epilogue != "bias+residual"} == {gate_up, E.LLAMA_70B["up"]}
    assert len(problems) == len(set(problems))
    only_bf16, _ = E.plan_problems(None, ("bfloat16",), on_gpu=True)
    assert {p.dtype for p in only_bf16} == {"bfloat16"} and len(only_bf16) < len(problems)


def test_epilogue_shapes_run_every_epilogue_and_the_cpu_refuses_what_it_cannot_run():
    problems, _ = E.plan_problems([(8, 4096, 4096)], ("bfloat16",), on_gpu=True)
    assert [(p.epilogue, p.M, p.N, p.K, p.dtype) for p in problems] == [
        (e, 8, 4096, 4096, "bfloat16") for e in E.EPILOGUES
    ]
    problems, note = E.plan_problems(None, None, on_gpu=False)
    assert "smoke test" in note and {p.dtype for p in problems} == {"float32"}
    assert all(p.M * p.N * p.K <= 64**3 for p in problems)
    with pytest.raises(ValueError, match="bfloat16 does not run on the CPU"):
        E.plan_problems(None, ("bfloat16",), on_gpu=False)
    with pytest.raises(ValueError, match="128x128x128 is too large"):
        E.plan_problems([(128, 128, 128)], None, on_gpu=False)
    with pytest.raises(ValueError, match="expected epilogues from .* but got 'bias\\+relu'"):
        E.plan_problems(None, None, ("bias+relu",), on_gpu=True)


def test_epilogue_problem_counts_the_residual_as_traffic():
    plain, residual = (
        E.EpilogueProblem("bias+silu", 4, 8, 16, "float16"),
        E.EpilogueProblem("bias+residual", 4, 8, 16, "float16"),
    )
    assert plain.flops == residual.flops == 2 * 4 * 8 * 16
    assert residual.bytes - plain.bytes == 4 * 8 * 2


def test_a_wrong_epilogue_provider_is_reported_and_not_timed():
    timed = []

    def timer(fn, use_graph):
        timed.append(fn)
        fn()
        return 2.0

    def unfused(x, weight, bias, residual):
        return torch.nn.functional.linear(x, weight, bias) + residual

    def off_by_one(x, weight, bias, residual):
        return unfused(x, weight, bias, residual) + 1

    def crashes(x, weight, bias, residual):
        raise RuntimeError("no kernel for this\nsecond line")

    providers = [("cublas+torch", unfused), ("off_by_one", off_by_one), ("crashes", crashes)]
    problem = E.EpilogueProblem("bias+residual", 5, 24, 40, "float32")
    rows = E.measure_epilogue(problem, device="cpu", device_name="cpu", l2_bytes=0, providers=providers,
                              timings=("graph",), timers={"graph": timer})  # fmt: skip
    by_provider = {r.provider: r for r in rows}
    assert by_provider["cublas+torch"].status == "ok" and by_provider["cublas+torch"].ratio_to_unfused == 1.0
    assert by_provider["cublas+torch"].ms == 2.0 and by_provider["cublas+torch"].max_rel_err < 1e-6
    assert by_provider["off_by_one"].status == "wrong" and by_provider["off_by_one"].ms is None
    assert by_provider["crashes"].status == "error: no kernel for this" and by_provider["crashes"].ms is None
    assert len(timed) == 3  # only the correct provider, once per round


@cpu_only
@needs_linear
def test_epilogue_smoke_run_writes_the_columns(tmp_path, capsys):
    argv = ["bench", "epilogue", "--shapes", "16,32,48", "--dtypes", "float32", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "under the Triton interpreter" in out and "torch (CPU)" in out
    with (tmp_path / "epilogue-cpu.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == EPILOGUE_COLUMNS
    assert {(r["epilogue"], r["provider"], r["timing"]) for r in rows} == {
        (e, p, t) for e in E.EPILOGUES for p in ("tritongemm", "cublas+torch") for t in ("graph", "eager")
    }
    assert all(float(r["ms"]) > 0 for r in rows)
    assert {r["ratio_to_unfused"] for r in rows if r["provider"] == "cublas+torch"} == {"1.0"}
    data = json.loads((tmp_path / "epilogue-cpu.json").read_text())
    assert {"device", "torch", "triton"} <= set(data["environment"])
    assert all(r["status"] == "ok" for r in data["rows"]) and len(data["rows"]) == len(rows)
    assert (tmp_path / "epilogue-cpu.png").stat().st_size > 10_000


@cpu_only
@needs_linear
def test_epilogue_smoke_run_writes_nothing_unless_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(E, "CPU_SMOKE_SHAPES", ((8, 16, 16),))
    assert main(["bench", "epilogue", "--timing", "eager", "--no-plot"]) == 0
    assert "No files written" in capsys.readouterr().out and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------
# bench model
# ----------------------------------------------------------------------------------------------


def test_model_settings_are_prefill_and_decode():
    prefill = [(s.batch, s.tokens) for s in M.SETTINGS if s.phase == "prefill"]
    decode = [(s.batch, s.tokens, s.context) for s in M.SETTINGS if s.phase == "decode"]
    assert sorted(prefill) == [(1, 512), (1, 2048), (8, 512), (8, 2048)]
    assert sorted(decode) == [(1, 1, 512), (8, 1, 512), (64, 1, 512)]
    assert M.Setting("decode", 8, 1, 512).label == "decode batch 8 x 1 on 512 cached"


def test_model_config_is_llama_3_8b_layers():
    config = M.llama_config(3)
    assert (config["hidden_size"], config["intermediate_size"]) == (4096, 14336)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["num_hidden_layers"]) == (32, 8, 3)
    assert config["attn_implementation"] == "sdpa"
    with pytest.raises(ValueError, match="--layers: expected one of 2, 3, 4, but got 5"):
        M.llama_config(5)


def test_model_rows_derive_throughput_and_ratio(tmp_path):
    decode = M.Setting("decode", 8, 1, 512)
    outcomes = {
        "torch": M.Outcome(4.0, 0.0, "ok"),
        "tritongemm": M.Outcome(2.0, 3e-3, "ok"),
        "torch.compile": M.Outcome(None, None, "error: compile failed"),
        "tritongemm+compile": M.Outcome(None, 0.5, "wrong"),
    }
    rows = M.make_rows("H100", "bfloat16", 2, decode, outcomes)
    assert [r.provider for r in rows] == list(outcomes)
    torch_row, ours, compiled, wrong = rows
    assert torch_row.tokens_per_s == pytest.approx(8 / 4e-3) and torch_row.ratio_to_torch == 1.0
    assert ours.tokens_per_s == pytest.approx(8 / 2e-3) and ours.ratio_to_torch == 2.0
    assert compiled.ms is None and compiled.ratio_to_torch is None and compiled.status == "error: compile failed"
    assert wrong.max_rel_err == 0.5 and wrong.tokens_per_s is None
    assert list(M.ModelRow.__dataclass_fields__)[: len(MODEL_COLUMNS)] == MODEL_COLUMNS == M.COLUMNS
    prefill = M.make_rows("H100", "bfloat16", 2, M.Setting("prefill", 8, 2048), {"torch": M.Outcome(10.0, 0.0, "ok")})
    assert prefill[0].tokens_per_s == pytest.approx(8 * 2048 / 10e-3) and prefill[0].context == 0

    from tritongemm.bench.plots import plot_model
    from tritongemm.bench.report import format_model_table

    table = format_model_table(rows + prefill).splitlines()
    assert table[0].startswith("phase") and any("error: compile failed" in line for line in table)
    assert plot_model(rows + prefill, tmp_path / "m.png", "t").stat().st_size > 10_000


def test_logits_error_is_relative_and_catches_nan():
    ref = torch.ones(2, 3, 4)
    assert M.logits_error(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-4)
    assert M.logits_error(ref.clone().fill_(float("nan")), ref) == float("inf")


@cpu_only
def test_bench_model_needs_a_gpu(capsys):
    assert M.requirements_error() == M.GPU_HINT
    assert main(["bench", "model"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"tritongemm: error: {M.GPU_HINT}"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        M.run_model()


def test_bench_model_says_how_to_install_transformers(monkeypatch):
    import importlib.util

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name))
    assert "pip install transformers" in M.requirements_error()


@pytest.mark.parametrize(
    "argv, names",
    [
        ("bench epilogue --kernels naive", "--kernels does not apply"),
        ("bench epilogue --layers 3", "--layers does not apply"),
        ("bench model --shapes 8,8,8", "--shapes does not apply"),
        ("bench ladder --layers 3", "--layers applies to bench model only"),
        ("bench model --layers 5", "argument --layers"),
    ],
)
def test_new_suites_reject_options_they_do_not_take(argv, names, capsys):
    assert main(argv.split()) == 2
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert out == "" and line.startswith("tritongemm") and names in line


@needs_linear
def test_model_measure_on_a_tiny_llama_on_the_cpu():
    """The harness end to end where transformers is installed: a 2-layer Llama of width 64, the
    patched copy checked against eager torch, decode cropping its cache back after each call."""
    pytest.importorskip("transformers")
    import tritongemm.nn

    def timer(fn):
        fn()
        return 1.0

    config = M.llama_config(2) | dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=256)  # fmt: skip
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.no_grad():
        models = M.build_models(config, device=device, dtype=torch.float32, providers=("torch", "tritongemm"))
        assert isinstance(models["tritongemm"].model.layers[0].mlp.up_proj, tritongemm.nn.Linear)
        assert models["tritongemm"].lm_head.weight is models["torch"].lm_head.weight  # shared, not copied
        for setting in (M.Setting("prefill", 2, 8), M.Setting("decode", 2, 1, 8)):
            outcomes = M.measure_setting(models, setting, vocab_size=256, device=device, rounds=1, timer=timer)
            assert [o.status for o in outcomes.values()] == ["ok", "ok"]
            assert outcomes["tritongemm"].max_rel_err < 1e-4 and outcomes["tritongemm"].ms == 1.0
