"""`tritongemm bench epilogue`: one fused `tritongemm.linear` against the unfused path a PyTorch
model takes (`F.linear`, then the activation or the residual add, each its own kernel) and
against `torch.compile` of that same unfused function, which can fuse the epilogue itself.

The epilogues are a Llama layer's: bias+gelu and bias+silu on the MLP's up/gate projections,
bias+residual on the projections whose output is added back to the residual stream (o, down).
Each provider is checked against `reference_linear` first; a wrong one is reported and never
timed. The correct ones are timed two ways, as the other suites do (measure.py): "graph", the
GPU work alone (`do_bench`, CUDA-graph replays under 0.1 ms), and "eager", a user's back-to-back
calls by the wall clock. `ratio_to_unfused` is the unfused path's time over the provider's, in
the same run and timing: above 1, faster than F.linear + torch.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import tritongemm
from tritongemm.bench import CPU_MAX_VOLUME, DTYPES, Progress
from tritongemm.bench.environment import describe_environment
from tritongemm.bench.measure import ROUNDS, TIMINGS, cpu_timer, describe_error, eager_timer, gpu_timer, wants_graph
from tritongemm.bench.plots import plot_epilogue
from tritongemm.bench.report import format_epilogue_table, write_results
from tritongemm.core.epilogue import reference_linear
from tritongemm.core.reference import rel_error, tolerance

# nn.Linear weights (out_features, in_features) of Llama 3; gate_up is the 8B's gate and up
# projections in one (2 x 14336), the 70B's up projection alone is as wide.
LLAMA_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
LLAMA_70B = {"qkv": (10240, 8192), "o": (8192, 8192), "up": (28672, 8192), "down": (8192, 28672)}
TOKENS = (1, 16, 128, 512, 2048, 4096, 8192)
FEW_TOKENS = (16, 4096)  # decode-sized and prefill-sized: the spot checks beside the full sweeps

PROVIDERS = ("tritongemm", "cublas+torch", "torch.compile")
UNFUSED = "cublas+torch"  # the baseline of ratio_to_unfused
COMPILE_MODE = "max-autotune-no-cudagraphs"

# Without a GPU: the interpreter runs tiny shapes, fp32 only by default (it refuses bf16, and
# fp16 dots are several times slower there), and no torch.compile.
CPU_SMOKE_SHAPES = ((16, 32, 48),)
CPU_DTYPES = ("float32",)
COLUMNS = ["device", "dtype", "m", "n", "k", "epilogue", "provider", "timing", "ms", "tflops", "ratio_to_unfused"]


# ----------------------------------------------------------------------------------------------
# The epilogues: what tritongemm.linear is asked, and the same thing unfused in torch
# ----------------------------------------------------------------------------------------------


def _bias_gelu(x, weight, bias):
    return F.gelu(F.linear(x, weight, bias))


def _bias_silu(x, weight, bias):
    return F.silu(F.linear(x, weight, bias))


def _bias_residual(x, weight, bias, residual):
    return F.linear(x, weight, bias) + residual


@dataclass(frozen=True)
class EpilogueCase:
    name: str
    activation: str | None  # tritongemm.linear's activation=
    residual: bool  # a (M, N) residual is added after the activation
    unfused: object  # the torch function: F.linear, then the epilogue as separate ops


EPILOGUES = {
    e.name: e
    for e in (
        EpilogueCase("bias+gelu", "gelu", False, _bias_gelu),
        EpilogueCase("bias+silu", "silu", False, _bias_silu),
        EpilogueCase("bias+residual", None, True, _bias_residual),
    )
}


@dataclass(frozen=True)
class EpilogueProblem:
    epilogue: str
    M: int
    N: int
    K: int
    dtype: str

    @property
    def flops(self) -> int:
        """The GEMM's: the epilogue's few operations per output element are not counted."""
        return 2 * self.M * self.N * self.K

    @property
    def bytes(self) -> int:
        """x, weight, bias, output (and residual) once each: the least a fused call moves."""
        outputs = 2 if EPILOGUES[self.epilogue].residual else 1
        itemsize = getattr(torch, self.dtype).itemsize
        return (self.M * self.K + self.N * self.K + self.N + outputs * self.M * self.N) * itemsize

    def label(self) -> str:
        return f"{self.epilogue} {self.M}x{self.N}x{self.K} {self.dtype}"


def _sweep(epilogue: str, weight: tuple[int, int], tokens, dtype: str) -> tuple[EpilogueProblem, ...]:
    return tuple(EpilogueProblem(epilogue, m, weight[0], weight[1], dtype) for m in tokens)


# Every token count on one 8B weight per epilogue in bf16; fp16 and the 70B's weights at two
# token counts. Sized for ~8 minutes on an H100, most of it torch.compile's max-autotune (~15 s
# per new GEMM shape; gelu and silu share theirs). --shapes and --dtypes choose others.
SUITE = (
    _sweep("bias+gelu", LLAMA_8B["gate_up"], TOKENS, "bfloat16")
    + _sweep("bias+silu", LLAMA_8B["gate_up"], TOKENS, "bfloat16")
    + _sweep("bias+residual", LLAMA_8B["down"], TOKENS, "bfloat16")
    + _sweep("bias+silu", LLAMA_70B["up"], FEW_TOKENS, "bfloat16")
    + _sweep("bias+residual", LLAMA_8B["o"], FEW_TOKENS, "bfloat16")
    + _sweep("bias+residual", LLAMA_70B["down"], FEW_TOKENS, "bfloat16")
    + _sweep("bias+gelu", LLAMA_8B["gate_up"], FEW_TOKENS, "float16")
    + _sweep("bias+silu", LLAMA_8B["gate_up"], FEW_TOKENS, "float16")
    + _sweep("bias+residual", LLAMA_8B["down"], FEW_TOKENS, "float16")
)


@dataclass
class EpilogueRow:
    device: str
    dtype: str
    m: int
    n: int
    k: int
    epilogue: str
    provider: str  # one of PROVIDERS
    timing: str  # one of measure.TIMINGS
    ms: float | None
    tflops: float | None
    ratio_to_unfused: float | None  # cublas+torch's ms / this ms, same run and timing
    max_rel_err: float | None
    status: str  # "ok", "wrong" (failed the check, not timed) or "error: ..." (raised)

    def as_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# What runs: the problems and the providers
# ----------------------------------------------------------------------------------------------


def plan_problems(
    shapes: list[tuple[int, int, int]] | None,
    dtypes: tuple[str, ...] | None,
    epilogues: tuple[str, ...] | None = None,
    *,
    on_gpu: bool,
) -> tuple[tuple[EpilogueProblem, ...], str]:
    """The problems to run and a note to print first ("" when it is the suite as asked). Given
    `shapes` (M, N, K) run every epilogue; else the SUITE. Raises ValueError on a mistake."""
    unknown = [d for d in dtypes or () if d not in DTYPES]
    if unknown:
        raise ValueError(f"bench epilogue: --dtypes: expected names from {', '.join(DTYPES)}, but got {unknown[0]!r}")
    unknown = [e for e in epilogues or () if e not in EPILOGUES]
    if unknown:
        raise ValueError(f"bench epilogue: expected epilogues from {', '.join(EPILOGUES)}, but got {unknown[0]!r}")
    names = tuple(epilogues or EPILOGUES)
    note = ""
    if not on_gpu:
        if dtypes and "bfloat16" in dtypes:
            raise ValueError(
                "bench epilogue: --dtypes bfloat16 does not run on the CPU: the Triton interpreter computes bf16 "
                "dots on raw bit patterns; give float32 (or float16) here, or run bfloat16 on a CUDA GPU"
            )
        too_large = [s for s in shapes or () if s[0] * s[1] * s[2] > CPU_MAX_VOLUME]
        if too_large:
            M, N, K = too_large[0]
            raise ValueError(
                f"bench epilogue: --shapes {M}x{N}x{K} is too large for the Triton interpreter on the CPU: expected "
                f"M*N*K <= {CPU_MAX_VOLUME} (64**3) per problem, or a CUDA GPU"
            )
        what = "these shapes" if shapes else "a smoke test on tiny shapes instead of the epilogue suite"
        note = (
            f"No CUDA GPU: running {what}, the kernels under the Triton interpreter, without torch.compile. Times "
            "are CPU wall-clock and say nothing about GPU speed."
        )
        shapes, dtypes = shapes or CPU_SMOKE_SHAPES, dtypes or CPU_DTYPES
    if shapes:
        dtypes = dtypes or ("float16", "bfloat16")
        return tuple(EpilogueProblem(e, M, N, K, d) for (M, N, K) in shapes for d in dtypes for e in names), note
    return tuple(p for p in SUITE if p.epilogue in names and (not dtypes or p.dtype in dtypes)), note


def _providers(epilogue: EpilogueCase, on_gpu: bool) -> list[tuple[str, object]]:
    """(name, callable taking (x, weight, bias[, residual=])): each called as a user calls it."""
    providers = [
        ("tritongemm", functools.partial(tritongemm.linear, activation=epilogue.activation)),
        (UNFUSED, epilogue.unfused),
    ]
    if on_gpu:
        # A fresh compilation per problem: dynamic=False so it is specialized to this shape, as
        # max-autotune tunes for one; torch._dynamo.reset() before it (in measure_epilogue) so
        # earlier shapes do not fill dynamo's cache of recompilations for this function.
        providers.append(("torch.compile", torch.compile(epilogue.unfused, mode=COMPILE_MODE, dynamic=False)))
    return providers


def _input_sets(problem: EpilogueProblem, device, l2_bytes: int) -> list[tuple[tuple, dict]]:
    """(args, kwargs) for each call: enough sets that cycling through them spans twice the L2.

    Weights are scaled by 1/sqrt(K), as nn.Linear's initialization does, so that outputs are of
    the order of 1: the activation's curve and the residual then weigh in the check."""
    epilogue = EPILOGUES[problem.epilogue]
    dtype = getattr(torch, problem.dtype)
    count = min(16, max(1, math.ceil(2 * l2_bytes / max(problem.bytes, 1))))

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, device=device, dtype=torch.float32) * scale).to(dtype)

    sets = []
    for _ in range(count):
        args = (randn(problem.M, problem.K), randn(problem.N, problem.K, scale=problem.K**-0.5), randn(problem.N))
        kwargs = {"residual": randn(problem.M, problem.N)} if epilogue.residual else {}
        sets.append((args, kwargs))
    return sets


# ----------------------------------------------------------------------------------------------
# Check, then time
# ----------------------------------------------------------------------------------------------


def measure_epilogue(
    problem: EpilogueProblem,
    *,
    device,
    device_name: str,
    l2_bytes: int,
    timings: tuple[str, ...] = TIMINGS,
    rounds: int = ROUNDS,
    providers: list[tuple[str, object]] | None = None,
    timers: dict | None = None,
) -> list[EpilogueRow]:
    """One row per (timing, provider). Every provider is checked first on every input set (which
    also compiles and autotunes, untimed); the correct ones are timed in `rounds` interleaved
    rounds per timing (ours, unfused, compiled, ours, ...), each keeping its median. `providers`
    and `timers` (timing -> measure.Timer) replace the defaults, for tests."""
    epilogue = EPILOGUES[problem.epilogue]
    on_gpu = torch.device(device).type == "cuda"
    if on_gpu:
        torch._dynamo.reset()  # see _providers
    sets = _input_sets(problem, device, l2_bytes)
    if providers is None:
        providers = _providers(epilogue, on_gpu)
    references = [
        reference_linear(*args, activation=epilogue.activation, out_dtype=torch.float64, **kwargs)
        for args, kwargs in sets
    ]
    bound = tolerance(getattr(torch, problem.dtype), problem.K)

    checked: dict[str, tuple[float | None, str]] = {}
    for name, fn in providers:
        try:
            err = max(rel_error(fn(*args, **kwargs), ref) for (args, kwargs), ref in zip(sets, references))
            checked[name] = (err, "ok" if err <= bound else "wrong")
        except Exception as exc:  # a compilation or launch that fails is a result too
            checked[name] = (None, describe_error(exc))
    del references

    rows = []
    for timing in timings:
        timer = (timers or {}).get(timing) or (eager_timer if timing == "eager" else gpu_timer if on_gpu else cpu_timer)
        use_graph = timing == "graph" and wants_graph(problem)
        timed = [(name, fn) for name, fn in providers if checked[name][1] == "ok"]
        samples: dict[str, list[float]] = {name: [] for name, _ in timed}
        status = {name: checked[name][1] for name, _ in providers}
        for _ in range(rounds):
            for name, fn in timed:
                if status[name] != "ok":
                    continue
                try:
                    samples[name].append(timer(_loop(fn, sets), use_graph) / len(sets))
                except Exception as exc:
                    status[name] = describe_error(exc)
        for name, _ in providers:
            ms = statistics.median(samples[name]) if status[name] == "ok" and samples.get(name) else None
            tflops = problem.flops / (ms * 1e-3) / 1e12 if ms else None
            rows.append(
                EpilogueRow(device_name, problem.dtype, problem.M, problem.N, problem.K, problem.epilogue, name,
                            timing, ms, tflops, None, checked[name][0], status[name])
            )  # fmt: skip
        baseline = next((r.ms for r in rows[-len(providers) :] if r.provider == UNFUSED), None)
        for row in rows[-len(providers) :]:
            if row.ms and baseline:
                row.ratio_to_unfused = baseline / row.ms
    return rows


def _loop(fn, sets):
    """Every input set once, each result dropped before the next call as in a user's loop."""

    def run() -> None:
        for args, kwargs in sets:
            fn(*args, **kwargs)

    return run


# ----------------------------------------------------------------------------------------------
# The suite
# ----------------------------------------------------------------------------------------------


def run_epilogue(
    *,
    shapes: list[tuple[int, int, int]] | None = None,
    dtypes: tuple[str, ...] | None = None,
    epilogues: tuple[str, ...] | None = None,
    timings: tuple[str, ...] = TIMINGS,
    out_dir: str | Path | None = "results",
    name: str | None = None,
    plot: bool = True,
    progress: bool = True,
    rounds: int = ROUNDS,
) -> list[EpilogueRow]:
    """Run the SUITE (or the given shapes x dtypes, every epilogue) for every provider, print the
    table and return the rows. Writes `out_dir`/`name`.csv (COLUMNS, timed rows only), .json (the
    environment and every row, statuses included) and .png, unless out_dir is None. `name`
    defaults to "epilogue", "epilogue-cpu-smoke" or "epilogue-cpu" without a GPU."""
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before tritongemm's kernels are decorated
    unknown = [t for t in timings if t not in TIMINGS]
    if unknown or not timings:
        raise ValueError(f"bench epilogue: expected timings from {TIMINGS}, but got {timings!r}")
    problems, note = plan_problems(shapes, dtypes, epilogues, on_gpu=on_gpu)

    env = describe_environment()
    device = torch.device("cuda" if on_gpu else "cpu")
    if note:
        print(note)
    start = time.perf_counter()
    if out_dir is not None:
        out_dir = Path(out_dir)
        base = name or ("epilogue" if on_gpu else "epilogue-cpu" if shapes else "epilogue-cpu-smoke")
    rows: list[EpilogueRow] = []
    with Progress(len(problems), enabled=progress) as advance:
        for problem in problems:
            rows += measure_epilogue(
                problem, device=device, device_name=env["device"], l2_bytes=env["l2_bytes"], timings=timings,
                rounds=rounds,
            )  # fmt: skip
            advance(problem.label())
            if out_dir is not None:  # after every problem: a run cut short keeps what it measured
                timed = [r for r in rows if r.ms is not None]
                paths = write_results(timed, env, out_dir, base, columns=COLUMNS, json_rows=rows)

    print(format_epilogue_table(rows, on_gpu))
    print(f"{len(problems)} problems in {time.perf_counter() - start:.0f} s")
    if out_dir is None or not rows:
        return rows
    if plot and timed:
        title = f"fused epilogue: speed / F.linear + torch's, on {env['device']}"
        paths += (plot_epilogue(timed, out_dir / f"{base}.png", title),)
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows
