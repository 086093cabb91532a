"""`tritongemm bench`: every kernel against cuBLAS, checked, timed, tabled, saved and plotted.

from tritongemm.bench import run_bench
rows = run_bench(suite="ksweep", out_dir="results/h100")
rows = run_bench(suite="llm", timing="eager")  # a user's back-to-back calls -> results/llm-eager.csv
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

import tritongemm
from tritongemm.bench import plots
from tritongemm.bench.environment import describe_environment
from tritongemm.bench.measure import (
    TIMINGS,
    Row,
    cpu_timer,
    eager_timer,
    gpu_timer,
    measure_problem,
    runnable_kernels,
    unfilled_operand,
)
from tritongemm.bench.report import format_table, write_results
from tritongemm.bench.suites import LAYOUTS, SUITES, Problem, Suite, parse_shapes, problems
from tritongemm.core import registry

DTYPES = ("float16", "bfloat16", "float32")
# Without a GPU the harness still runs end to end, on the interpreter: the given shapes up to
# CPU_MAX_VOLUME, else these tiny ones.
CPU_SMOKE_SHAPES = [(48, 40, 80), (33, 17, 65)]
CPU_SMOKE_DTYPES = ("float16", "float32")  # the interpreter computes bf16 dots on raw bit patterns
# M*N*K per problem: one interpreted call of 64^3 takes ~45 ms, so a problem (3 kernels x 10
# calls each) ~2 s per dtype; 128^3 takes 5x as long.
CPU_MAX_VOLUME = 64**3


def run_bench(
    suite: str | None = None,
    *,
    shapes: str | list | None = None,
    dtypes: tuple[str, ...] | None = None,
    kernels: tuple[str, ...] | None = None,
    layout: str = "nn",
    timing: str = "graph",
    configs: tuple | None = None,
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
    `configs`: every kernel runs each of these MatmulConfigs instead of its default (a sweep).
    """
    on_gpu = use_interpreter_without_gpu()
    plan = _checked_plan(suite, shapes, dtypes, kernels, layout, timing, on_gpu)
    if configs:
        plan = dataclasses.replace(plan, configs=tuple(configs))

    env = describe_environment()
    device = torch.device("cuda" if on_gpu else "cpu")
    if plan.note:
        print(plan.note)
    if timing == "eager":
        print("Timing eager: wall clock per back-to-back call without out=, host overhead and allocation included.")
    timer = eager_timer if timing == "eager" else gpu_timer if on_gpu else cpu_timer

    keep = not profile and out_dir is not None
    if keep:
        out_dir = Path(out_dir)
        base = name or plan.name + ("-eager" if timing == "eager" else "")
    rows: list[Row] = []
    with Progress(len(plan.problems), enabled=progress) as advance:
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
            if keep:  # after every problem: a run cut short keeps what it measured
                paths = write_results(rows, env, out_dir, base)

    print(format_table(rows, on_gpu))
    if not keep or not rows:
        return rows
    if plot and rows:
        paths += (_plot(rows, plan, out_dir / f"{base}.png", env["device"], timing),)
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows


def check_arguments(
    suite: str | None = None,
    *,
    shapes: str | list | None = None,
    dtypes: tuple[str, ...] | None = None,
    kernels: tuple[str, ...] | None = None,
    layout: str = "nn",
    timing: str = "graph",
) -> None:
    """Raise the ValueError that `run_bench` would raise for these arguments, running nothing (so
    that the CLI can tell a mistake in them from a failure of the run)."""
    _checked_plan(suite, shapes, dtypes, kernels, layout, timing, use_interpreter_without_gpu())


def use_interpreter_without_gpu() -> bool:
    """True on a GPU; else the kernels, if imported after this, run under the Triton interpreter."""
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return on_gpu


@dataclass(frozen=True)
class _Plan:
    name: str  # base name of the result files
    problems: tuple[Problem, ...]
    kernels: tuple[str, ...] | None  # None: every available kernel
    configs: tuple  # non-empty: a sweep, each kernel runs each config
    note: str = ""  # printed before the run: what runs instead of what was asked, and why


def _checked_plan(suite, shapes, dtypes, kernels, layout, timing, on_gpu) -> _Plan:
    if timing not in TIMINGS:
        raise ValueError(f"bench: expected timing to be one of {TIMINGS}, but got {timing!r}")
    return _plan(suite, shapes, dtypes, kernels, layout, on_gpu)


def _plan(suite, shapes, dtypes, kernels, layout, on_gpu) -> _Plan:
    if suite is not None and suite not in SUITES:
        raise ValueError(f"bench: unknown suite {suite!r}; expected one of {sorted(SUITES)}")
    if layout not in LAYOUTS:
        raise ValueError(f"bench: expected layout to be one of {LAYOUTS}, but got {layout!r}")
    unknown = [d for d in dtypes or () if d not in DTYPES]
    if unknown:
        raise ValueError(f"bench: --dtypes: expected names from {', '.join(DTYPES)}, but got {unknown[0]!r}")
    names = [*registry.POLICIES, *(k.name for k in registry.all_kernels("matmul"))] if kernels else []
    unknown = [k for k in kernels or () if k not in names]
    if unknown:
        raise ValueError(f"bench: --kernels: expected names from {', '.join(names)}, but got {unknown[0]!r}")
    chosen: Suite | None = SUITES.get(suite)
    kernels = tuple(kernels) if kernels else (chosen.kernels if chosen else None)
    configs = chosen.configs if chosen else ()
    shape_list = None if shapes is None else parse_shapes(shapes) if isinstance(shapes, str) else list(shapes)
    if not on_gpu:
        return _cpu_plan(suite, shape_list, dtypes, kernels if not configs else None, layout)
    if shape_list is not None:
        probs = problems(shape_list, dtypes or ("float16", "bfloat16"), layout)
    elif chosen is not None and dtypes and configs:  # a sweep runs its one problem in each asked dtype
        probs = tuple(Problem(p.M, p.N, p.K, d, p.layout) for p in chosen.problems for d in dtypes)
    elif chosen is not None:
        probs = tuple(p for p in chosen.problems if dtypes is None or p.dtype in dtypes)
    else:
        raise ValueError("bench: give a suite or shapes")
    return _Plan(suite or "custom", probs, kernels, configs)


def _cpu_plan(suite, shapes, dtypes, kernels, layout) -> _Plan:
    """The interpreter's plan: the given shapes if small enough, else the smoke test; no bf16."""
    wall_clock = "Times are CPU wall-clock and say nothing about GPU speed."
    if dtypes and "bfloat16" in dtypes:
        raise ValueError(
            "bench: --dtypes bfloat16 does not run on the CPU: the Triton interpreter computes bf16 dots on raw "
            "bit patterns (relative error ~1e10); give float16 or float32 here, or run bfloat16 on a CUDA GPU"
        )
    for name in kernels or ():
        if name in registry.POLICIES:
            continue
        reason = registry.get(name).unavailable_reason(torch.device("cpu"))
        if reason:
            raise ValueError(f"bench: --kernels {name} does not run here: {reason}")
    dtypes = dtypes or CPU_SMOKE_DTYPES
    if shapes is None:
        instead = (
            f" instead of the {suite} suite (--shapes runs yours, up to M*N*K = {CPU_MAX_VOLUME})" if suite else ""
        )
        note = f"No CUDA GPU: running an interpreter smoke test on tiny shapes{instead}. {wall_clock}"
        return _Plan(f"{suite or 'custom'}-cpu-smoke", problems(CPU_SMOKE_SHAPES, dtypes, layout), kernels, (), note)
    for M, N, K in shapes:
        if M * N * K > CPU_MAX_VOLUME:
            raise ValueError(
                f"bench: --shapes {M}x{N}x{K} is too large for the Triton interpreter on the CPU: expected "
                f"M*N*K <= {CPU_MAX_VOLUME} (64**3) per problem, or a CUDA GPU"
            )
    note = f"No CUDA GPU: running these shapes under the Triton interpreter. {wall_clock}"
    return _Plan(f"{suite or 'custom'}-cpu", problems(shapes, dtypes, layout), kernels, (), note)


def _providers(plan: _Plan, problem: Problem, matmul, eager: bool) -> list:
    """cuBLAS first, then each kernel (x each config of a sweep) that runs this problem here."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runnable = runnable_kernels(getattr(torch, problem.dtype), device, plan.kernels)
    providers = [("cublas", "torch.matmul", provider(torch.matmul, eager))]
    for kernel, config in itertools.product(runnable, plan.configs or (None,)):
        label = (
            config.short() if config else _auto_choice(problem, device, kernel) if kernel in registry.POLICIES else None
        )
        label = label or f"default {_config_label(registry.get(kernel), problem, device)}"
        providers.append((kernel, label, provider(matmul, eager, kernel=kernel, config=config)))
    return providers


def _auto_choice(problem: Problem, device, policy: str = "auto") -> str:
    """What kernel="auto" (or another policy) runs for the problem, as '<kernel> <config>', for the row's config column
    (from unfilled operands laid out as measure.operand lays them out)."""
    # Lazy: dispatch loads the ladder (Triton), and the CLI imports this module before it sets TRITON_INTERPRET.
    from tritongemm import dispatch

    dtype = getattr(torch, problem.dtype)

    a = unfilled_operand(problem.M, problem.K, problem.layout[0] == "t", dtype, device)
    b = unfilled_operand(problem.K, problem.N, problem.layout[1] == "t", dtype, device)
    info, config, _ = dispatch.choose(policy, None, a, b, dtype)
    if config is None:
        return f"{info.name} {_config_label(info, problem, device)}"
    return f"{info.name} {config.short() if hasattr(config, 'short') else config}"


def _config_label(info, problem: Problem, device) -> str:
    """The config a kernel's default resolves to for the problem, as a row's config column names it
    (a bare "default" would name different configs as the defaults change)."""
    # Lazy: dispatch loads the ladder (Triton), and the CLI imports this module before it sets TRITON_INTERPRET.
    from tritongemm import dispatch

    config = dispatch.default_config(info, getattr(torch, problem.dtype), problem.M, problem.N, problem.K, device)
    return config.short() if hasattr(config, "short") else str(config)


def provider(fn, eager: bool, **kwargs):
    """Eager: `fn(a, b, **kwargs)` exactly as a user calls it, a new output each time (a partial,
    so the harness adds no Python frame). Otherwise (a, b, out) -> `fn(a, b, out=out, **kwargs)`."""
    if eager:
        return functools.partial(fn, **kwargs)
    return lambda a, b, out: fn(a, b, out=out, **kwargs)


def _plot(rows: list[Row], plan: _Plan, path: Path, device: str, timing: str) -> Path:
    title = f"tritongemm {plan.name} on {device}" + (", eager calls (host time included)" if timing == "eager" else "")
    if plan.name == "ksweep":
        return plots.plot_k_sweep(rows, path, title)
    if plan.name == "auto":
        return plots.plot_ratio_vs_m(rows, path, title)
    if plan.configs:
        return plots.plot_ratios(rows, path, title, series=lambda r: f"{r.kernel} {r.config}")
    return plots.plot_ratios(rows, path, title)


class Progress:
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
