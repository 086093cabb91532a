"""The benchmark harness's own logic, on the CPU: suites, FLOP arithmetic, the result schema,
plots, a wrong kernel reported as failed and never timed, eager timing (the overhead suite:
test_bench_overhead.py)."""

import csv
import json

import pytest
import torch

from tritongemm.bench import SUITES, _plan, run_bench
from tritongemm.bench.measure import Row, eager_timer, measure_problem, wants_graph
from tritongemm.bench.report import COLUMNS, csv_fields, read_rows
from tritongemm.bench.suites import Problem, parse_shapes

REQUIRED_COLUMNS = {"device", "dtype", "layout", "m", "n", "k", "kernel", "config", "ms", "tflops",
                    "ratio_to_cublas", "max_rel_err"}  # fmt: skip


def test_suites_cover_what_the_seeds_measured():
    # and `overhead`, `epilogue`, `model`, measured apart
    assert set(SUITES) == {
        "ladder",
        "ksweep",
        "configs",
        "group",
        "llm",
        "decode-m",
        "invariant",
        "auto",
        "auto-transposed",
        "backward",
    }
    assert [p.K for p in SUITES["ksweep"].problems if p.dtype == "float16"] == [512, 1024, 2048, 4096, 8192, 16384]
    assert {p.dtype for p in SUITES["ksweep"].problems} == {"float16", "bfloat16"}
    assert [c.GROUP_SIZE_M for c in SUITES["group"].configs] == [1, 2, 4, 6, 8]
    assert len(SUITES["configs"].configs) == 6
    llm = SUITES["llm"].problems
    assert {p.M for p in llm} == {1, 16, 128, 2048, 8192} and {p.layout for p in llm} == {"nt"}
    assert {(p.N, p.K) for p in llm} == {(4096, 4096), (4096, 14336), (14336, 4096)}
    decode = SUITES["decode-m"].problems  # every M a decode step has, 1 to 256
    assert sorted({p.M for p in decode}) == [1, 2, 4, 8, 16, 32, 64, 128, 192, 256]
    assert {(p.N, p.K) for p in decode} == {(p.N, p.K) for p in llm} and {p.layout for p in decode} == {"nt"}


def test_auto_has_every_layout_and_backward_has_what_autograd_hands_over():
    auto = SUITES["auto"].problems
    assert {p.layout for p in auto} == {"nn", "nt", "tn", "tt"}
    shapes = lambda layout: {(p.M, p.N, p.K, p.dtype) for p in auto if p.layout == layout}  # noqa: E731
    assert shapes("tn") == shapes("tt") == shapes("nn")  # the transposed rows: the nn rows' shapes
    assert set(SUITES["auto-transposed"].problems) == {p for p in auto if p.layout in ("tn", "tt")}
    backward = SUITES["backward"].problems
    # y = x @ W.T with x (2048, 4096), W (14336, 4096): dX = dY @ W is 2048 x 4096 x 14336 (nn),
    # dW = dY^T @ X is 14336 x 4096 x 2048 with dY^T a transposed view (tn).
    assert Problem(2048, 4096, 14336, "bfloat16", "nn") in backward
    assert Problem(14336, 4096, 2048, "bfloat16", "tn") in backward
    assert {p.layout for p in backward} == {"nn", "tn"} and min(p.M for p in backward if p.layout == "nn") == 2048


def test_flops_and_labels():
    p = Problem(8192, 8192, 512, "float16")
    assert p.flops == 2 * 8192 * 8192 * 512
    assert p.label() == "8192x8192x512"
    assert wants_graph(Problem(1, 4096, 4096, "float16")) and not wants_graph(p)


@pytest.mark.parametrize("text, shapes", [("1,2,3", [(1, 2, 3)]), ("8x8x8; 4,5,6;", [(8, 8, 8), (4, 5, 6)])])
def test_parse_shapes(text, shapes):
    assert parse_shapes(text) == shapes


@pytest.mark.parametrize("text", ["", "1,2", "a,b,c", "1,2,3,4"])
def test_parse_shapes_rejects_garbage(text):
    with pytest.raises(ValueError, match="--shapes: expected"):
        parse_shapes(text)


def test_plan_on_gpu_selects_suite_problems_and_sweeps():
    plan = _plan("group", None, ("bfloat16",), None, "nn", on_gpu=True)
    assert [p.dtype for p in plan.problems] == ["bfloat16"] and len(plan.configs) == 5
    assert "tma_persistent_pipelined" in plan.kernels
    plan = _plan(None, "64,64,64", ("float16",), ("naive",), "nt", on_gpu=True)
    assert plan.problems == (Problem(64, 64, 64, "float16", "nt"),) and plan.kernels == ("naive",)
    with pytest.raises(ValueError, match="unknown suite 'fast'"):
        _plan("fast", None, None, None, "nn", on_gpu=True)


def test_wrong_kernel_is_reported_and_not_timed():
    timed = []

    def timer(fn, use_graph):
        timed.append(fn)
        fn()
        return 1.0

    providers = [
        ("cublas", "torch.matmul", lambda a, b, out: torch.matmul(a, b, out=out)),
        ("off_by_one", "x", lambda a, b, out: torch.matmul(a, b, out=out).add_(1)),
        ("crashes", "x", lambda a, b, out: 1 / 0),
    ]
    rows = measure_problem(Problem(20, 30, 40, "float32"), providers, device="cpu", device_name="cpu",
                           timer=timer, l2_bytes=0)  # fmt: skip
    by_kernel = {r.kernel: r for r in rows}
    assert by_kernel["cublas"].status == "ok" and by_kernel["cublas"].ratio_to_cublas == 1.0
    assert by_kernel["off_by_one"].status == "wrong" and by_kernel["off_by_one"].ms is None
    assert by_kernel["off_by_one"].max_rel_err > 0.01
    assert by_kernel["crashes"].status.startswith("error: division by zero") and by_kernel["crashes"].ms is None
    assert len(timed) == 3  # only cuBLAS was timed, once per round


def test_small_problems_rotate_input_sets():
    from tritongemm.bench.measure import input_sets

    sets = input_sets(Problem(64, 64, 64, "float16", "nt"), "cpu", l2_bytes=50 * 2**20)
    assert len(sets) == 16 and sets[0][1].stride() == (1, 64)  # b is a transposed view
    assert len({a.data_ptr() for a, _, _ in sets}) == 16
    assert len(input_sets(Problem(8192, 8192, 8192, "float16"), "meta", l2_bytes=50 * 2**20)) == 1


def test_run_writes_schema_and_plot(tmp_path):
    # On a CPU this is the interpreter smoke run (its own tiny shapes); on a GPU the shape given.
    rows = run_bench(shapes="48,40,80", dtypes=("float16",), kernels=("naive",), out_dir=tmp_path, name="smoke",
                     progress=False)  # fmt: skip
    assert {r.kernel for r in rows} == {"cublas", "naive"} and all(r.status == "ok" for r in rows)
    csv_rows = read_rows(tmp_path / "smoke.csv")
    assert REQUIRED_COLUMNS <= set(csv_rows[0]) and list(csv_rows[0]) == csv_fields(COLUMNS)
    assert len(csv_rows) == len(rows)
    data = json.loads((tmp_path / "smoke.json").read_text())
    assert {"device", "torch", "triton", "date"} <= set(data["environment"])
    assert (tmp_path / "smoke.png").stat().st_size > 10_000


def test_the_invariant_suite_times_the_mode_beside_auto_and_cublas(tmp_path):
    """bench invariant: batch_invariant's policy is a provider like "auto", its row's config the plan it chose."""
    from tritongemm.bench.suites import SUITES
    from tritongemm.core.registry import BATCH_INVARIANT

    suite = SUITES["invariant"]
    assert {p.M for p in suite.problems} == {1, 16, 64, 128, 512, 2048, 8192} and suite.kernels[-1] == BATCH_INVARIANT
    rows = run_bench(shapes="48,40,80", dtypes=("float16",), kernels=suite.kernels, out_dir=None, progress=False)
    invariant = [r for r in rows if r.kernel == BATCH_INVARIANT]
    assert {r.kernel for r in rows} == {"cublas", "auto", BATCH_INVARIANT} and all(r.status == "ok" for r in rows)
    assert invariant and all(r.config.startswith(("swap_ab", "grouped", "tma_persistent_pipelined")) for r in invariant)


def test_ratio_plot_is_written(tmp_path):
    from tritongemm.bench.plots import plot_ratios

    rows = [Row("gpu", "float16", "nn", 8, 8, 8, k, "default", 1.0, 1.0, r, 0.0, "ok")
            for k, r in (("cublas", 1.0), ("naive", 0.5))]  # fmt: skip
    assert plot_ratios(rows, tmp_path / "r.png", "t").stat().st_size > 10_000


def test_cli_lists_kernels_as_json(capsys):
    from tritongemm.cli import main

    assert main(["kernels", "--json"]) == 0
    assert '"name": "naive"' in capsys.readouterr().out


def test_markdown_pivot_puts_kernels_in_columns():
    from tritongemm.bench.report import markdown_pivot

    rows = [
        dict(dtype="float16", layout="nn", m="8", n="8", k="8", kernel=k, config="default", tflops=t, ratio_to_cublas=r,
             status="ok")
        for k, t, r in (("cublas", "100", "1.0"), ("naive", "50", "0.5"))
    ]  # fmt: skip
    table = markdown_pivot(rows).splitlines()
    assert table[0] == "| dtype | layout | M x N x K | cuBLAS | naive |"
    assert table[2] == "| float16 | nn | 8 x 8 x 8 | 100 | 50 (0.50) |"
    # Kernels' own defaults, each named: still one line a problem (no sweep of asked-for configs).
    rows[1]["config"] = "default 64x64x64 g8 w4 s4"
    rows.append(dict(rows[1], kernel="grouped", config="default 128x128x64 g8 w4 s4"))
    assert markdown_pivot(rows).splitlines()[2] == "| float16 | nn | 8 x 8 x 8 | 100 | 50 (0.50) | 50 (0.50) |"


def test_eager_timer_times_one_call_of_a_batch(monkeypatch):
    # A clock that each call moves by 1 ms exactly: the wall clock of a loaded CI machine (sleep
    # overshooting) made the batch sizes, and so this test, vary.
    from types import SimpleNamespace

    from tritongemm.bench import measure

    now = [0.0]
    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    calls = []

    def fn():
        calls.append(1)
        now[0] += 1e-3

    assert eager_timer(fn) == pytest.approx(1.0)
    # A warm-up call, then one batch sized to last 1.2 x 20 ms, then three rounds of that batch.
    assert len(calls) == 1 + 24 + 3 * 24


def test_eager_run_writes_eager_rows(tmp_path):
    rows = run_bench(shapes="48,40,80", dtypes=("float16",), kernels=("naive",), timing="eager", out_dir=tmp_path,
                     plot=False, progress=False)  # fmt: skip
    assert {r.kernel for r in rows} == {"cublas", "naive"}
    assert all(r.status == "ok" and r.timing == "eager" and r.ms > 0 for r in rows)
    (path,) = tmp_path.glob("*-eager.csv")  # custom-eager.csv, or custom-cpu-smoke-eager.csv on a CPU
    assert {r["timing"] for r in read_rows(path)} == {"eager"}
    with pytest.raises(ValueError, match="expected timing to be one of .* but got 'wall'"):
        run_bench(shapes="8,8,8", timing="wall", out_dir=None)


def test_old_csv_without_timing_reads_as_graph(tmp_path):
    from tritongemm.bench.report import markdown_pivot

    path = tmp_path / "old.csv"
    old_columns = [c for c in COLUMNS if c != "timing"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old_columns)
        writer.writeheader()
        for kernel, tflops, ratio in (("cublas", "100", "1.0"), ("naive", "50", "0.5")):
            writer.writerow(dict(device="gpu", dtype="float16", layout="nn", m=8, n=8, k=8, kernel=kernel,
                                 config="default", ms=1, tflops=tflops, ratio_to_cublas=ratio, max_rel_err=0,
                                 status="ok"))  # fmt: skip
    rows = read_rows(path)
    assert [r["timing"] for r in rows] == ["graph", "graph"] and list(rows[0]) == COLUMNS
    assert markdown_pivot(rows).splitlines()[2] == "| float16 | nn | 8 x 8 x 8 | 100 | 50 (0.50) |"


def test_kernel_only_and_eager_results_combine_into_one_file(tmp_path):
    from tritongemm.bench.report import combine_timings, write_results

    def row(m, kernel, timing, ratio):
        return Row("H100", "bfloat16", "nt", m, 4096, 4096, kernel, "x", 0.01, 3.0, ratio, 1e-3, "ok", timing)

    for timing, base in (("graph", "auto"), ("eager", "auto-eager")):
        rows = [row(m, k, timing, r) for m in (1, 16) for k, r in (("cublas", 1.0), ("auto", 1.05))]
        write_results(rows, {"device": "H100", "date": f"2026-11-23 {timing}"}, tmp_path, base)
    paths = combine_timings(tmp_path, "auto")
    combined = read_rows(tmp_path / "auto.csv")
    assert [r["timing"] for r in combined] == ["graph"] * 4 + ["eager"] * 4 and paths[-1].name == "auto.png"
    assert json.loads((tmp_path / "auto.json").read_text())["environment"]["eager_date"] == "2026-11-23 eager"
    with pytest.raises(ValueError, match="graph rows"):
        combine_timings(tmp_path, "auto")  # auto.csv now holds both: not a kernel-only run any more


def test_auto_scorecard_reads_the_newest_rows_against_issue_14s_bars(tmp_path):
    from tritongemm.bench.report import auto_scorecard, newest_rows, write_results

    def row(m, ratio, timing="graph", kernel="auto"):
        return Row("H100", "bfloat16", "nt", m, 4096, 4096, kernel, "cfg", 1.0, 1.0, ratio, 0.0, "ok", timing)

    old = [row(128, 0.52), row(4096, 1.10), row(4096, 0.80, "eager"), row(128, 1.0, kernel="cublas")]
    new = [row(128, 0.95)]  # a re-measure of the M = 128 row
    write_results(old, {}, tmp_path, "auto")
    write_results(new, {}, tmp_path, "auto-m128")
    rows = newest_rows(tmp_path / "auto.csv", tmp_path / "auto-m128.csv")
    assert sorted((r.m, r.timing, r.ratio_to_cublas) for r in rows if r.kernel == "auto") == [
        (128, "graph", 0.95), (4096, "eager", 0.80), (4096, "graph", 1.10)]  # fmt: skip
    card = auto_scorecard(rows)
    # graph: 0.95 is above the 0.90 worst bar but under M <= 128's 1.0; eager: 0.80 under 0.85
    assert "graph: 2 rows, geomean 1.02 (bar 1.05), worst 0.95 (bar 0.9)" in card
    assert "0.950 < 1.00  bfloat16  nt 128x4096x4096" in card
    assert "eager: 1 rows, geomean 0.80 (bar 1.0), worst 0.80 (bar 0.85)" in card
    assert "4096x4096x4096" in card.split("eager:")[1] and "4096x4096x4096" not in card.split("eager:")[0]


def test_a_suite_rewritten_with_its_remeasured_rows_says_which(tmp_path):
    from tritongemm.bench.report import rows_from_csv, write_remeasured, write_results

    def row(m, ratio, kernel="auto"):
        return Row("H100", "bfloat16", "nt", m, 4096, 4096, kernel, "cfg", 1.0, 1.0, ratio, 0.0, "ok", "graph")

    write_results([row(128, 1.0, "cublas"), row(128, 0.52), row(4096, 1.10)], {"date": "2026-11-22"}, tmp_path, "auto")
    rows = [row(128, 1.0, "cublas"), row(128, 0.95), row(128, 0.90, "grouped")]  # grouped: not the suite's
    write_results(rows, {"date": "2026-11-23"}, tmp_path, "auto-tuned")
    paths = write_remeasured(tmp_path / "auto.csv", tmp_path / "auto-tuned.csv")
    assert [p.name for p in paths] == ["auto.csv", "auto.json", "auto.png"]
    assert sorted((r.m, r.kernel, r.ratio_to_cublas) for r in rows_from_csv(tmp_path / "auto.csv")) == [
        (128, "auto", 0.95), (128, "cublas", 1.0), (4096, "auto", 1.10)]  # fmt: skip
    env = json.loads((tmp_path / "auto.json").read_text())["environment"]
    assert env["date"] == "2026-11-22"
    assert env["remeasured"] == [{"file": "auto-tuned.csv", "date": "2026-11-23", "problems": 1}]
    write_remeasured(tmp_path / "auto.csv", tmp_path / "auto-tuned.csv")  # again: listed once
    assert len(json.loads((tmp_path / "auto.json").read_text())["environment"]["remeasured"]) == 1


def test_eager_timing_refuses_the_gpu_timer():
    """gpu_timer sees the GPU's work alone; an eager row timed by it would hide the host (tune's
    eager check once did this)."""
    from tritongemm.bench.measure import gpu_timer

    with pytest.raises(ValueError, match="eager_timer"):
        measure_problem(Problem(8, 8, 8, "float32"), [], device=torch.device("cpu"), device_name="cpu",
                        timer=gpu_timer, l2_bytes=0, timing="eager")  # fmt: skip
