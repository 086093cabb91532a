"""`bench overhead` on the CPU: its cases (the issue's ops, tokens and weights), each op against
its own torch counterpart in the same grad mode, a wrong result reported and never timed, and the
smoke run's files with a row per op."""

import csv
import json

import pytest
import torch
import torch.nn.functional as F

from tritongemm.bench import overhead as O
from tritongemm.bench.report import csv_fields
from tritongemm.core.epilogue import reference_linear
from tritongemm.core.reference import rel_error, tolerance

ON_CPU = not torch.cuda.is_available()
cpu_only = pytest.mark.skipif(not ON_CPU, reason="the CPU's smoke run: a GPU runs the real cases")
LINEAR_OPS = ("linear", "linear+bias", "nn.Linear")  # the target: within 3 us of torch's counterpart


def test_the_cases_cover_each_op_at_1_16_and_128_tokens_on_llama_and_qwen_weights():
    assert [c.problem for c in O.CASES if c.op == "matmul"] == list(O.PROBLEMS)  # today's rows, as they were
    assert {c.op for c in O.CASES} == set(O.OPS) == set(O.COUNTERPARTS)
    for op in LINEAR_OPS:
        bf16 = [c.problem for c in O.CASES if c.op == op and c.batch is None and c.problem.dtype == "bfloat16"]
        for weight in ((4096, 4096), (3584, 3584)):  # Llama-3-8B's and Qwen2-7B's q_proj
            assert sorted(p.M for p in bf16 if (p.N, p.K) == weight) == [1, 16, 128], (op, weight)
    weights = {(c.problem.N, c.problem.K) for c in O.CASES if c.op != "matmul"}
    assert weights == {(4096, 4096), (14336, 4096), (3584, 3584), (18944, 3584)}
    assert all(c.problem.layout == "nt" for c in O.LINEAR_CASES)
    assert any(c.op == "nn.Linear" and c.batch == 1 for c in O.CASES)  # x (batch, seq, hidden)
    assert {c.problem.dtype for c in O.LINEAR_CASES} == {"bfloat16", "float16"}
    assert {c.op for c in O.CPU_SMOKE_CASES} == set(O.OPS) and any(c.batch for c in O.CPU_SMOKE_CASES)


@pytest.mark.skipif(not ON_CPU, reason="CPU operands, run by the interpreter: a GPU runs `bench overhead` itself")
@pytest.mark.parametrize("case", O.CPU_SMOKE_CASES[1:], ids=lambda c: f"{c.op}-{c.batch}")
def test_each_op_is_timed_against_its_own_torch_counterpart(case):
    """The counterpart is the function the issue names, on the same operands, computing the same
    thing as ours, and both take the same autograd path in the op's grad mode."""
    with torch.set_grad_enabled(O.GRAD_MODE[case.op]):
        operands = O.make_operands(case, "cpu")
        theirs, ours = O.torch_call(case, operands), O.our_call(case, operands, "auto")
        y_torch, y_ours = theirs(), ours()
    o = operands
    if case.op == "matmul":
        assert theirs.func is torch.matmul and theirs.args == (o.x, o.weight)
    elif case.op in ("linear", "linear+bias"):
        expected = (o.x, o.weight) if case.op == "linear" else (o.x, o.weight, o.bias)
        assert theirs.func is F.linear and theirs.args == expected and (o.bias is None) == (case.op == "linear")
    else:  # nn.Linear: a torch.nn.Linear with a bias, whose very parameters our module holds
        assert type(theirs.func) is torch.nn.Linear and theirs.func.bias is not None and theirs.args == (o.x,)
        assert ours.func.weight is theirs.func.weight and ours.func.bias is theirs.func.bias
        assert o.weight.requires_grad  # a model's parameters: what no_grad, or autograd, is for
    autograd = case.op == "nn.Linear+grad"
    assert y_torch.requires_grad == y_ours.requires_grad == autograd
    assert y_ours.shape == y_torch.shape == (*o.x.shape[:-1], case.problem.N)
    ref = O.reference(case, operands)
    if case.op != "matmul":
        assert torch.equal(ref, reference_linear(o.x, o.weight.detach(), None if o.bias is None else o.bias.detach(),
                                                 out_dtype=torch.float64))  # fmt: skip
    bound = tolerance(getattr(torch, case.problem.dtype), case.problem.K)
    assert rel_error(y_torch.detach(), ref) <= bound and rel_error(y_ours.detach(), ref) <= bound


def test_a_wrong_result_is_reported_and_never_timed(monkeypatch):
    case = O.Case("linear+bias", O.CPU_SMOKE_CASES[-1].problem)
    monkeypatch.setattr(O, "our_call", lambda case, operands, kernel: lambda: torch.zeros(16, 16))
    (row,) = O.measure_overhead(case, ("auto",), device=torch.device("cpu"), device_name="cpu", rounds=1)
    assert row.status == "wrong" and row.us_per_call is None and row.torch_us_per_call is None
    assert row.max_rel_err == pytest.approx(1.0) and row.baseline == "F.linear"


@cpu_only
def test_overhead_suite_writes_a_row_per_op_and_kernel(tmp_path, capsys):
    from tritongemm.cli import main

    assert main(["bench", "overhead", "--out-dir", str(tmp_path), "--kernels", "auto,naive"]) == 0
    out = capsys.readouterr().out
    assert "us/call" in out and "linear+bias: F.linear" in out and "nn.Linear: torch.nn.Linear" in out
    with (tmp_path / "overhead.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == csv_fields(O.COLUMNS)
    assert reader.fieldnames == ["device", "triton", "op", "dtype", "m", "n", "k", "batch", "kernel", "us_per_call",
                                 "torch_us_per_call"]  # fmt: skip
    cases = {(r["op"], r["dtype"], r["m"], r["n"], r["k"], r["batch"]) for r in rows}
    assert len(cases) == len(O.CPU_SMOKE_CASES) and {r["op"] for r in rows} == set(O.OPS)
    assert {r["kernel"] for r in rows} == {"auto", "naive"} and len(rows) == 2 * len(cases)
    assert all(float(r["us_per_call"]) > 0 and float(r["torch_us_per_call"]) > 0 for r in rows)
    assert {r["batch"] for r in rows} == {"", "1"}  # x 2-D, and (1, 16, 16)
    saved = json.loads((tmp_path / "overhead.json").read_text())
    assert "environment" in saved
    assert {(r["op"], r["baseline"]) for r in saved["rows"]} == set(O.COUNTERPARTS.items())
    assert (tmp_path / "overhead.png").stat().st_size > 10_000
