"""`tritongemm bench`: every kernel against cuBLAS, checked, timed, tabled, saved and plotted.

from tritongemm.bench import run_bench
rows = run_bench(suite="ksweep", out_dir="results/h100")
rows = run_bench(suite="llm", timing="eager")  # a user's back-to-back calls -> results/llm-eager.csv
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from tritongemm.bench.measure import TIMINGS, Row, cpu_timer, eager_timer, gpu_timer, measure_problem, runnable_kernels
from tritongemm.bench.suites import LAYOUTS, SUITES, Problem, Suite, parse_shapes, problems

# Without a GPU the harness still runs end to end, on the interpreter and tiny shapes.
CPU_SMOKE_SHAPES = [(48, 40, 80), (33, 17, 65)]
CPU_SMOKE_DTYPES = ("float16", "float32")  # the interpreter gets bf16 dots wrong


def run_bench(
    suite: str | None = None,
    *,
    shapes: str | list | None = None,
    dtypes: tuple[str, ...] | None = None,
    kernels: tuple[str, ...] | None = None,
    layout: str = "nn",
    timing: str = "graph",
    out_dir: str | Path | None = "results",
    name: str | None = None,
    profile: bool = False,
    plot: bool = True,
    progress: bool = True,
) -> list[Row]:
    """Run a named suite, or the given shapes, for every (or the given) kernels plus cuBLAS.

    `timing` "graph" times the kernels alone; "eager" times back-to-back user calls without out=
    (see measure.py). Prints the table and returns the rows. Writes `out_dir/name.csv`, `.json`
    and a `.png` plot (name: the suite's, plus "-eager" for eager timing), unless out_dir is None
    or `profile` is set (then each kernel runs once, checked but not timed, for Nsight Compute).
    """
    if timing not in TIMINGS:
        raise ValueError(f"bench: expected timing to be one of {TIMINGS}, but got {timing!r}")
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import tritongemm
    from tritongemm.bench.environment import describe_environment
    from tritongemm.bench.report import format_table, write_results

    plan = _plan(suite, shapes, dtypes, kernels, layout, on_gpu)
    env = describe_environment()
    device = torch.device("cuda" if on_gpu else "cpu")
    if not on_gpu:
        print("No CUDA GPU: running an interpreter smoke test on tiny shapes instead of the suite. "
              "Times are CPU wall-clock and say nothing about GPU speed.")  # fmt: skip
    if timing == "eager":
        print("Timing eager: wall clock per back-to-back call without out=, host overhead and allocation included.")
    timer = eager_timer if timing == "eager" else gpu_timer if on_gpu else cpu_timer

    rows: list[Row] = []
    with _Progress(len(plan.problems), enabled=progress) as advance:
        for problem in plan.problems:
            providers = _providers(plan, problem, tritongemm.matmul, eager=timing == "eager")
            rows += measure_problem(
                problem,
                providers,
                device=device,
                device_name=env["device"],
                timer=timer,
                l2_bytes=env["l2_bytes"],
                profile=profile,
                timing=timing,
            )
            advance(problem.label() + " " + problem.dtype)

    print(format_table(rows))
    if profile or out_dir is None:
        return rows
    out_dir = Path(out_dir)
    base = name or plan.name + ("-eager" if timing == "eager" else "")
    paths = write_results(rows, env, out_dir, base)
    if plot and rows:
        paths += (_plot(rows, plan, out_dir / f"{base}.png", env["device"], timing),)
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows


@dataclass(frozen=True)
class _Plan:
    name: str  # base name of the result files
    problems: tuple[Problem, ...]
    kernels: tuple[str, ...] | None  # None: every available kernel
    configs: tuple  # non-empty: a sweep, each kernel runs each config


def _plan(suite, shapes, dtypes, kernels, layout, on_gpu) -> _Plan:
    if suite is not None and suite not in SUITES:
        raise ValueError(f"bench: unknown suite {suite!r}; expected one of {sorted(SUITES)}")
    if layout not in LAYOUTS:
        raise ValueError(f"bench: expected layout to be one of {LAYOUTS}, but got {layout!r}")
    chosen: Suite | None = SUITES.get(suite)
    kernels = tuple(kernels) if kernels else (chosen.kernels if chosen else None)
    configs = chosen.configs if chosen else ()
    if not on_gpu:
        smoke = problems(CPU_SMOKE_SHAPES, CPU_SMOKE_DTYPES, layout)
        return _Plan(f"{suite or 'custom'}-cpu-smoke", smoke, kernels if not configs else None, ())
    if shapes is not None:
        shape_list = parse_shapes(shapes) if isinstance(shapes, str) else list(shapes)
        probs = problems(shape_list, dtypes or ("float16", "bfloat16"), layout)
    elif chosen is not None and dtypes and configs:  # a sweep runs its one problem in each asked dtype
        probs = tuple(Problem(p.M, p.N, p.K, d, p.layout) for p in chosen.problems for d in dtypes)
    elif chosen is not None:
        probs = tuple(p for p in chosen.problems if dtypes is None or p.dtype in dtypes)
    else:
        raise ValueError("bench: give a suite or shapes")
    return _Plan(suite or "custom", probs, kernels, configs)


def _providers(plan: _Plan, problem: Problem, matmul, eager: bool) -> list:
    """cuBLAS first, then each kernel (x each config of a sweep) that runs this problem here."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runnable = runnable_kernels(getattr(torch, problem.dtype), device, plan.kernels)
    providers = [("cublas", "torch.matmul", _provider(torch.matmul, eager))]
    for kernel, config in itertools.product(runnable, plan.configs or (None,)):
        label = config.short() if config else "default"
        providers.append((kernel, label, _provider(matmul, eager, kernel=kernel, config=config)))
    return providers


def _provider(fn, eager: bool, **kwargs):
    """Eager: `fn(a, b, **kwargs)` exactly as a user calls it, a new output each time (a partial,
    so the harness adds no Python frame). Otherwise (a, b, out) -> `fn(a, b, out=out, **kwargs)`."""
    if eager:
        return functools.partial(fn, **kwargs)
    return lambda a, b, out: fn(a, b, out=out, **kwargs)


def _plot(rows: list[Row], plan: _Plan, path: Path, device: str, timing: str) -> Path:
    from tritongemm.bench import plots

    title = f"tritongemm {plan.name} on {device}" + (", eager calls (host time included)" if timing == "eager" else "")
    if plan.name == "ksweep":
        return plots.plot_k_sweep(rows, path, title)
    if plan.configs:
        return plots.plot_ratios(rows, path, title, series=lambda r: f"{r.kernel} {r.config}")
    return plots.plot_ratios(rows, path, title)


class _Progress:
    """A rich progress bar when rich is installed and output is a terminal; otherwise a line per step."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done, self.bar = total, enabled, 0, None

    def __enter__(self):
        if self.enabled:
            try:
                from rich.progress import Progress

                self.bar = Progress(transient=True)
                self.bar.start()
                self.task = self.bar.add_task("benchmarking", total=self.total)
            except ImportError:
                self.bar = None
        return self.advance

    def advance(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=label)
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {label}", flush=True)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
