"""`tritongemm bench overhead`: what one eager call costs where the GPU work is too small to hide
the host's (argument checks, dispatch, output allocation, launch), tritongemm against torch.matmul.

Each provider is called as a user calls it, `torch.matmul(a, b)` or `tritongemm.matmul(a, b,
kernel=...)`, back to back on the same operands: re-reading them from L2 is the point, it leaves
the host as the bottleneck. Every kernel is checked first, then timed with `eager_timer` in
interleaved rounds (torch, ours, torch, ours, ...) that each keep their median.
"""

from __future__ import annotations

import functools
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tritongemm.bench.measure import ROUNDS, describe_error, eager_timer, operand, runnable_kernels
from tritongemm.bench.suites import Problem
from tritongemm.reference import reference_matmul, rel_error, tolerance

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
CPU_SMOKE_PROBLEMS = (Problem(16, 16, 16, "float16"), Problem(16, 16, 16, "float32"))
# More rounds than the suites' 3: a few microseconds of host time move by 30% from one batch to
# the next on the shared H100 machine, the median of 7 holds still.
OVERHEAD_ROUNDS = 7
COLUMNS = ["device", "dtype", "m", "n", "k", "kernel", "us_per_call", "torch_us_per_call"]
# Rungs that launch two kernels and allocate a workspace by design (split_k: for few tiles and a
# long K, where the GPU's time is the point); their host cost shows in the eager llm suite.
MULTI_LAUNCH = ("split_k",)


@dataclass
class OverheadRow:
    device: str
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    kernel: str  # the kernel= given to tritongemm.matmul ("auto" included)
    us_per_call: float | None
    torch_us_per_call: float | None  # torch.matmul on the same operands, in the same rounds
    max_rel_err: float | None
    status: str  # "ok", "wrong" (failed the check, not timed) or "error: ..." (raised)

    def as_dict(self) -> dict:
        return asdict(self)


def run_overhead(
    *,
    kernels: tuple[str, ...] | None = None,
    out_dir: str | Path | None = "results",
    plot: bool = True,
    rounds: int = OVERHEAD_ROUNDS,
) -> list[OverheadRow]:
    """Every problem with "auto", the EVERY_KERNEL ones with every kernel that runs them too (or
    each problem with the given `kernels`). Prints
    the table and returns the rows; writes `out_dir`/overhead.csv (COLUMNS, timed rows only),
    overhead.json (the environment and every row) and overhead.png, unless out_dir is None."""
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from tritongemm.bench.environment import describe_environment
    from tritongemm.bench.report import format_overhead_table, write_results

    env = describe_environment()
    device = torch.device("cuda" if on_gpu else "cpu")
    if not on_gpu:
        print("No CUDA GPU: running an interpreter smoke test on 16x16x16 instead of the overhead problems. "
              "Times are CPU wall-clock of interpreted kernels and say nothing about GPU launch cost.")  # fmt: skip
    rows: list[OverheadRow] = []
    for problem in PROBLEMS if on_gpu else CPU_SMOKE_PROBLEMS:
        # Every rung where the GPU's work is a few microseconds, so their host costs compare; "auto"
        # (what a user calls) on the rest, where a slow rung's GPU time would hide its host time.
        names = kernels or (None if problem in EVERY_KERNEL else ("auto",))
        rows += measure_overhead(problem, names, device=device, device_name=env["device"], rounds=rounds)

    print(format_overhead_table(rows))
    if out_dir is None:
        return rows
    out_dir = Path(out_dir)
    timed = [r for r in rows if r.us_per_call is not None]
    paths = write_results(timed, env, out_dir, "overhead", columns=COLUMNS)
    if plot and timed:
        from tritongemm.bench.plots import plot_overhead

        title = f"eager call, tritongemm vs torch.matmul, on {env['device']}"
        paths += (plot_overhead(timed, out_dir / "overhead.png", title),)
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows


def measure_overhead(
    problem: Problem, kernels: tuple[str, ...] | None, *, device, device_name: str, rounds: int = ROUNDS
) -> list[OverheadRow]:
    """One row per tritongemm kernel that runs `problem` on `device`, torch.matmul timed beside it."""
    import tritongemm
    from tritongemm import registry

    dtype = getattr(torch, problem.dtype)
    every = (k.name for k in registry.all_kernels() if k.name not in MULTI_LAUNCH and not k.experimental)
    asked = kernels or ("auto", *every)
    rungs = [k for k in asked if k != "auto"]
    names = [k for k in asked if k == "auto"] + (runnable_kernels(dtype, device, rungs) if rungs else [])
    a = operand(problem.M, problem.K, problem.layout[0] == "t", dtype, device)
    b = operand(problem.K, problem.N, problem.layout[1] == "t", dtype, device)
    ref, bound = reference_matmul(a, b), tolerance(dtype, problem.K)
    rows = [
        OverheadRow(device_name, problem.dtype, problem.layout, problem.M, problem.N, problem.K, name,
                    None, None, None, "ok")
        for name in names
    ]  # fmt: skip
    for row in rows:
        try:
            row.max_rel_err = rel_error(tritongemm.matmul(a, b, kernel=row.kernel), ref)
            if not row.max_rel_err <= bound:
                row.status = "wrong"
        except Exception as exc:  # a kernel that fails to compile or launch is a result too
            row.status = describe_error(exc)

    # partials, so that the timed loop calls torch and tritongemm with no Python frame of ours between
    calls = {id(r): functools.partial(tritongemm.matmul, a, b, kernel=r.kernel) for r in rows if r.status == "ok"}
    torch_call = functools.partial(torch.matmul, a, b)
    samples: dict[int, list[float]] = {key: [] for key in calls}
    torch_samples: list[float] = []
    for _ in range(rounds):
        torch_samples.append(eager_timer(torch_call) * 1e3)
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
    return rows
