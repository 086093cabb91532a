"""`tritongemm bench overhead`: what one eager call costs where the GPU work is too small to hide
the host's (argument checks, dispatch, output allocation, launch), tritongemm against torch, op
by op: `tritongemm.matmul` against `torch.matmul`, `tritongemm.linear` (without and with a bias)
against `F.linear`, and a `tritongemm.nn.Linear` module against a `torch.nn.Linear` holding the
same parameters (inference, and "nn.Linear+grad": a training step's forward, autograd recording).

Each provider is called as a user calls it, `torch.matmul(a, b)` or `tritongemm.matmul(a, b,
kernel=...)`, `F.linear(x, w, b)`, `module(x)`, back to back on the same operands: re-reading
them from L2 is the point, it leaves the host as the bottleneck. Every kernel is checked first,
then timed with `eager_timer` in interleaved rounds (torch, ours, torch, ours, ...) that each
keep their median.
"""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import tritongemm
from tritongemm.bench.environment import describe_environment
from tritongemm.bench.measure import ROUNDS, describe_error, eager_timer, operand, runnable_kernels
from tritongemm.bench.plots import plot_overhead
from tritongemm.bench.report import format_overhead_table, write_results
from tritongemm.bench.suites import Problem
from tritongemm.core import registry
from tritongemm.core.epilogue import reference_linear
from tritongemm.core.reference import reference_matmul, rel_error, tolerance

# Each op's torch counterpart, the baseline its rows are timed against. Nothing that matmul and
# linear read requires grad, so both sides take their inference path in grad mode; nn.Linear's
# parameters do, as a model's, so "nn.Linear" is called under torch.no_grad() as inference
# (generate) calls a model, and "nn.Linear+grad" in grad mode, where both record autograd.
COUNTERPARTS = {
    "matmul": "torch.matmul",
    "linear": "F.linear",
    "linear+bias": "F.linear",
    "nn.Linear": "torch.nn.Linear",
    "nn.Linear+grad": "torch.nn.Linear",
}
OPS = tuple(COUNTERPARTS)
GRAD_MODE = {op: op != "nn.Linear" for op in OPS}  # torch.set_grad_enabled() around the check and timing


@dataclass(frozen=True)
class Case:
    """One op on one problem. matmul: a (M, K) @ b (K, N) in the problem's layout; the others:
    x (M, K), or (batch, M, K) where `batch` is given, and an (N, K) weight ("nt": read as its
    transposed view, as nn.Linear does)."""

    op: str
    problem: Problem
    batch: int | None = None


# Launch-bound problems: small squares, and decode-sized nn.Linear GEMMs of a Llama-3-8B layer
# ("nt": b is the transposed view of an (N, K) weight) at 1 to 128 tokens.
PROBLEMS = (
    Problem(64, 64, 64, "float16"),
    Problem(1, 4096, 4096, "bfloat16", "nt"),
    Problem(16, 4096, 4096, "bfloat16", "nt"),
    Problem(128, 4096, 4096, "bfloat16", "nt"),
    Problem(256, 256, 256, "float16"),
    Problem(1, 14336, 4096, "bfloat16", "nt"),
    Problem(64, 64, 64, "float32"),
)
EVERY_KERNEL = (PROBLEMS[0], PROBLEMS[-1])  # 64^3 fp16 and fp32

# The linear ops on weights (N, K) of Llama-3-8B and Qwen2-7B layers at 1, 16 and 128 tokens. The
# q projections (Qwen2's has a bias) leave the host as the bottleneck; the MLP's up projections
# read a 117-136 MB weight, GPU-bound at every M: they check that the whole call keeps up.
TOKENS = (1, 16, 128)
Q_PROJ = ((4096, 4096), (3584, 3584))  # Llama-3-8B, Qwen2-7B
UP_PROJ = ((14336, 4096), (18944, 3584))


def _cases(op: str, weights, tokens=TOKENS, dtype: str = "bfloat16", batch: int | None = None) -> list[Case]:
    return [Case(op, Problem(m, n, k, dtype, "nt"), batch) for n, k in weights for m in tokens]


LINEAR_CASES = (
    *_cases("linear", Q_PROJ + UP_PROJ),
    *_cases("linear+bias", Q_PROJ),
    *_cases("linear+bias", Q_PROJ[:1], (16,), "float16"),
    *_cases("nn.Linear", Q_PROJ + UP_PROJ),
    *_cases("nn.Linear", Q_PROJ[:1], (16,), "float16"),
    # x (batch, seq, hidden), as a model calls its layers: folded into M without a copy
    *_cases("nn.Linear", Q_PROJ[:1], (16,), batch=1),
    *_cases("nn.Linear", Q_PROJ[1:], (128,), batch=1),
    *_cases("nn.Linear+grad", Q_PROJ[:1], (16, 128)),
)
CASES = (*(Case("matmul", p) for p in PROBLEMS), *LINEAR_CASES)
# Without a GPU, each op once on 16x16x16 under the interpreter (fp32 for the linear ops: the
# interpreter's fp16 dots are several times slower), the 3-D x too.
CPU_SMOKE_CASES = (
    Case("matmul", Problem(16, 16, 16, "float16")),
    Case("matmul", Problem(16, 16, 16, "float32")),
    *(Case(op, Problem(16, 16, 16, "float32", "nt")) for op in OPS[1:]),
    Case("nn.Linear", Problem(16, 16, 16, "float32", "nt"), batch=1),
)
# More rounds than the suites' 3: a few microseconds of host time move by 30% from one batch to
# the next on the shared H100 machine, the median of 7 holds still. The smoke run's interpreted
# calls (~7 ms each) time nothing worth a median of 7.
OVERHEAD_ROUNDS = 7
CPU_SMOKE_ROUNDS = 2
COLUMNS = ["device", "op", "dtype", "m", "n", "k", "batch", "kernel", "us_per_call", "torch_us_per_call"]
# Rungs that launch two kernels and allocate a workspace by design (split_k: for few tiles and a
# long K, where the GPU's time is the point); their host cost shows in the eager llm suite.
MULTI_LAUNCH = ("split_k",)


@dataclass
class OverheadRow:
    device: str
    op: str  # one of OPS
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    batch: int | None  # x is (batch, m, k) where given, else (m, k)
    kernel: str  # the kernel= given to tritongemm.matmul / linear / nn.Linear ("auto" included)
    us_per_call: float | None
    torch_us_per_call: float | None  # the op's torch counterpart on the same operands, in the same rounds
    baseline: str  # that counterpart: torch.matmul, F.linear or torch.nn.Linear
    max_rel_err: float | None
    status: str  # "ok", "wrong" (failed the check, not timed) or "error: ..." (raised)

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        """M x N x K, x's leading dimensions in brackets where it is 3-D: "(1,16)x4096x4096"."""
        rows = f"({self.batch},{self.m})" if self.batch is not None else str(self.m)
        return f"{rows}x{self.n}x{self.k}"


def run_overhead(
    *,
    kernels: tuple[str, ...] | None = None,
    out_dir: str | Path | None = "results",
    plot: bool = True,
    rounds: int | None = None,
) -> list[OverheadRow]:
    """Every case with "auto", the EVERY_KERNEL matmuls with every kernel that runs them too (or
    each case with the given `kernels`), in `rounds` rounds (default OVERHEAD_ROUNDS, without a
    GPU CPU_SMOKE_ROUNDS). Prints the table and returns the rows; writes `out_dir`/overhead.csv
    (COLUMNS, timed rows only), overhead.json (the environment and every row) and overhead.png,
    unless out_dir is None."""
    on_gpu = torch.cuda.is_available()
    rounds = rounds or (OVERHEAD_ROUNDS if on_gpu else CPU_SMOKE_ROUNDS)
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    env = describe_environment()
    device = torch.device("cuda" if on_gpu else "cpu")
    if not on_gpu:
        print("No CUDA GPU: running an interpreter smoke test of each op on 16x16x16 instead of the overhead problems. "
              "Times are CPU wall-clock of interpreted kernels and say nothing about GPU launch cost.")  # fmt: skip
    rows: list[OverheadRow] = []
    for case in CASES if on_gpu else CPU_SMOKE_CASES:
        # Every rung where the GPU's work is a few microseconds, so their host costs compare; "auto"
        # (what a user calls) on the rest, where a slow rung's GPU time would hide its host time.
        every = case.op == "matmul" and case.problem in EVERY_KERNEL
        names = kernels or (None if every else ("auto",))
        rows += measure_overhead(case, names, device=device, device_name=env["device"], rounds=rounds)

    print(format_overhead_table(rows))
    if out_dir is None:
        return rows
    out_dir = Path(out_dir)
    timed = [r for r in rows if r.us_per_call is not None]
    paths = write_results(timed, env, out_dir, "overhead", columns=COLUMNS, json_rows=rows)
    if plot and timed:
        title = f"eager call, tritongemm vs its torch counterpart, on {env['device']}"
        paths += (plot_overhead(timed, out_dir / "overhead.png", title),)
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows


def measure_overhead(
    case: Case, kernels: tuple[str, ...] | None, *, device, device_name: str, rounds: int = ROUNDS
) -> list[OverheadRow]:
    """One row per tritongemm kernel that runs `case` on `device` (None: every one, and "auto"),
    the op's torch counterpart timed beside it."""
    p = case.problem
    dtype = getattr(torch, p.dtype)
    every = (k.name for k in registry.all_kernels("matmul") if k.name not in MULTI_LAUNCH and not k.experimental)
    asked = kernels or ("auto", *every)
    rungs = [k for k in asked if k != "auto"]
    names = [k for k in asked if k == "auto"] + (runnable_kernels(dtype, device, rungs) if rungs else [])
    rows = [
        OverheadRow(device_name, case.op, p.dtype, p.layout, p.M, p.N, p.K, case.batch, name, None, None,
                    COUNTERPARTS[case.op], None, "ok")
        for name in names
    ]  # fmt: skip
    with torch.set_grad_enabled(GRAD_MODE[case.op]):
        operands = make_operands(case, device)
        calls = _checked_calls(case, operands, rows)
        _time(torch_call(case, operands), calls, rows, rounds)
    return rows


def _checked_calls(case: Case, operands: Operands, rows: list[OverheadRow]) -> dict[int, Callable[[], object]]:
    """id(row) -> tritongemm's call for each row whose kernel computes `case` within the
    reference's tolerance; the others get their status ("wrong", "error: ...") and no call."""
    ref, bound = reference(case, operands), tolerance(getattr(torch, case.problem.dtype), case.problem.K)
    calls = {}
    for row in rows:
        try:
            call = our_call(case, operands, row.kernel)
            row.max_rel_err = rel_error(call().detach(), ref)  # detached: nn.Linear+grad's output records autograd
            if row.max_rel_err <= bound:
                calls[id(row)] = call
            else:
                row.status = "wrong"
        except Exception as exc:  # a kernel that fails to compile or launch is a result too
            row.status = describe_error(exc)
    return calls


def _time(torch_fn: Callable[[], object], calls: dict[int, Callable[[], object]], rows: list[OverheadRow],
          rounds: int) -> None:  # fmt: skip
    """Fill in the rows' times: `rounds` interleaved rounds (torch, each row, torch, ...), medians."""
    samples: dict[int, list[float]] = {key: [] for key in calls}
    torch_samples: list[float] = []
    for _ in range(rounds):
        torch_samples.append(eager_timer(torch_fn) * 1e3)
        for row in rows:
            if row.status != "ok":
                continue
            try:
                samples[id(row)].append(eager_timer(calls[id(row)]) * 1e3)
            except Exception as exc:
                row.status = describe_error(exc)
    torch_us = statistics.median(torch_samples)
    for row in rows:
        if row.status == "ok":
            row.us_per_call, row.torch_us_per_call = statistics.median(samples[id(row)]), torch_us


# ----------------------------------------------------------------------------------------------
# The calls: tritongemm's and torch's, as partials, so that the timed loop calls them with no
# Python frame of ours between
# ----------------------------------------------------------------------------------------------


@dataclass
class Operands:
    """What a case's calls read: x and the weight (matmul: a and b), the bias of linear+bias and
    the nn.Linear ops, and for these the torch.nn.Linear module holding weight and bias."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    module: torch.nn.Linear | None = None


def make_operands(case: Case, device) -> Operands:
    """Random operands for `case` on `device`; nn.Linear's parameters require grad, as a model's."""
    p = case.problem
    dtype = getattr(torch, p.dtype)
    if case.op == "matmul":
        a = operand(p.M, p.K, p.layout[0] == "t", dtype, device)
        return Operands(a, operand(p.K, p.N, p.layout[1] == "t", dtype, device))
    x = operand((case.batch or 1) * p.M, p.K, False, dtype, device)
    x = x if case.batch is None else x.view(case.batch, p.M, p.K)
    if case.op.startswith("nn.Linear"):
        module = torch.nn.Linear(p.K, p.N, bias=True, device=device, dtype=dtype)
        return Operands(x, module.weight, module.bias, module)
    bias = torch.randn(p.N, device=device).to(dtype) if case.op == "linear+bias" else None
    return Operands(x, operand(p.N, p.K, False, dtype, device), bias)


def torch_call(case: Case, operands: Operands) -> Callable[[], torch.Tensor]:
    """The op's torch counterpart (COUNTERPARTS) on `operands`."""
    o = operands
    if case.op == "matmul":
        return functools.partial(torch.matmul, o.x, o.weight)
    if o.module is not None:
        return functools.partial(o.module, o.x)  # __call__, hooks' machinery included, as a model calls it
    return functools.partial(F.linear, *_linear_args(o))


def our_call(case: Case, operands: Operands, kernel: str) -> Callable[[], torch.Tensor]:
    """tritongemm's `case.op` with `kernel` on `operands`; nn.Linear: a tritongemm.nn.Linear
    sharing the torch module's parameters."""
    o = operands
    if case.op == "matmul":
        return functools.partial(tritongemm.matmul, o.x, o.weight, kernel=kernel)
    if o.module is not None:
        return functools.partial(tritongemm.nn.Linear.from_linear(o.module, kernel=kernel), o.x)
    return functools.partial(tritongemm.linear, *_linear_args(o), kernel=kernel)


def _linear_args(o: Operands) -> tuple[torch.Tensor, ...]:
    """(x, weight) or (x, weight, bias): "linear" is called without a bias, not with None."""
    return (o.x, o.weight) if o.bias is None else (o.x, o.weight, o.bias)


def reference(case: Case, operands: Operands) -> torch.Tensor:
    """The op's result in float64."""
    o = operands
    if case.op == "matmul":
        return reference_matmul(o.x, o.weight)
    return reference_linear(o.x.detach(), o.weight.detach(), None if o.bias is None else o.bias.detach(),
                            out_dtype=torch.float64)  # fmt: skip
