"""`bench epilogue` on the CPU: the suite's problems, a wrong provider reported and never timed,
the smoke run's files; and the options that the suites with their own module refuse. `bench
model`'s tests are in test_bench_model.py."""

import csv
import json

import pytest
import torch

import tritongemm
from tritongemm.bench import epilogue as E
from tritongemm.bench.report import csv_fields
from tritongemm.cli import main

ON_CPU = not torch.cuda.is_available()
cpu_only = pytest.mark.skipif(not ON_CPU, reason="the CPU's smoke run and refusals: a GPU runs the real suites")
needs_linear = pytest.mark.skipif(
    not hasattr(tritongemm, "linear"), reason="tritongemm.linear (the fused-epilogue API) is not in this tree yet"
)

EPILOGUE_COLUMNS = ["device", "dtype", "m", "n", "k", "epilogue", "provider", "timing", "ms", "tflops",
                    "ratio_to_unfused"]  # fmt: skip


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
    assert reader.fieldnames == csv_fields(EPILOGUE_COLUMNS)
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


@pytest.mark.parametrize(
    "argv, names",
    [
        ("bench epilogue --kernels naive", "--kernels does not apply"),
        ("bench epilogue --layers 3", "--layers does not apply"),
        ("bench model --shapes 8,8,8", "--shapes does not apply"),
        ("bench ladder --layers 3", "--layers applies to bench model"),
        ("bench model --layers 5", "argument --layers"),
        ("bench epilogue --phases train", "--phases does not apply"),
        ("bench ladder --models qwen2-7b", "--models applies to bench model"),
        ("bench model --models gpt2", "argument --models"),
        ("bench model --phases decode", "argument --phases"),
        ("bench model --providers tritongemm", "--providers must include torch"),
    ],
)
def test_new_suites_reject_options_they_do_not_take(argv, names, capsys):
    assert main(argv.split()) == 2
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert out == "" and line.startswith("tritongemm") and names in line
