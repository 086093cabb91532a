"""How one benchmark row is measured: check first, then time, against cuBLAS in the same run.

Method (see the device tool's METHOD.md):
- random inputs, never zeros; every provider's result is compared with the fp64 reference
  before it is timed, and a wrong result is reported as such and never timed;
- warm-up (compilation, autotuning) happens in the correctness run, outside the timing;
- the median of `triton.testing.do_bench`, or of CUDA-graph replays where a launch would take
  a visible share of the time (problems under ~100 us), in interleaved rounds across providers;
- when one input set fits in L2 (50 MB on H100), the timed function walks through several
  sets so that no provider is timed on a cache-warm repeat of the same operands.

That is timing "graph": the kernel alone. Timing "eager" is what a PyTorch user's loop gets:
providers are called without out= (they allocate their output), back to back, and timed by the
wall clock around a synchronized batch, so host overhead, allocation and launch count too.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from tritongemm.bench.suites import Problem
from tritongemm.core import registry
from tritongemm.core.reference import reference_matmul, rel_error, tolerance

Provider = Callable[..., object]  # graph: (a, b, out) writes a @ b into out; eager: (a, b) -> a new a @ b
Timer = Callable[[Callable[[], None], bool], float]  # (fn, use_graph) -> ms per call of fn

TIMINGS = ("graph", "eager")  # kernel only; or a user's back-to-back calls, host time included
GRAPH_BELOW_MS = 0.1  # use CUDA-graph replay below this estimated time per GEMM
ROUNDS = 3  # interleaved timing rounds per provider; the row keeps their median
EAGER_BATCH_MS = 20.0  # an eager batch lasts at least this long: the two synchronizations vanish in it
_EST_TFLOPS, _EST_TBPS = 600.0, 3.0  # rough H100 rates, only for the graph decision above
_MAX_SETS = 16


@dataclass
class Row:
    device: str
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    kernel: str
    config: str
    ms: float | None
    tflops: float | None
    ratio_to_cublas: float | None
    max_rel_err: float | None
    status: str  # "ok", "wrong" (failed the check, not timed) or "error: ..." (raised)
    timing: str = "graph"  # one of TIMINGS; results written before it existed are "graph"

    def as_dict(self) -> dict:
        return asdict(self)


def operand(rows: int, cols: int, transposed: bool, dtype: torch.dtype, device) -> torch.Tensor:
    """Random (rows, cols) operand; a transposed view of a (cols, rows) tensor when `transposed`."""
    shape = (cols, rows) if transposed else (rows, cols)
    t = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
    return t.T if transposed else t


def unfilled_operand(rows: int, cols: int, transposed: bool, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialized operand laid out as `operand` lays it out: for what reads no data (which
    kernel kernel="auto" would take)."""
    t = torch.empty((cols, rows) if transposed else (rows, cols), dtype=dtype, device=device)
    return t.T if transposed else t


def input_sets(problem: Problem, device, l2_bytes: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(a, b, out) triples: enough of them that cycling through all spans twice the L2."""
    dtype = getattr(torch, problem.dtype)
    count = min(_MAX_SETS, max(1, math.ceil(2 * l2_bytes / max(problem.bytes, 1))))
    ta, tb = problem.layout[0] == "t", problem.layout[1] == "t"
    return [
        (
            operand(problem.M, problem.K, ta, dtype, device),
            operand(problem.K, problem.N, tb, dtype, device),
            torch.empty(problem.M, problem.N, device=device, dtype=dtype),
        )
        for _ in range(count)
    ]


def gpu_timer(fn: Callable[[], None], use_graph: bool) -> float:
    import triton.testing

    if use_graph:
        return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def cpu_timer(fn: Callable[[], None], use_graph: bool) -> float:
    """Wall-clock median of a few calls: for the interpreter smoke run, where times only show
    that the harness works."""
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def eager_timer(fn: Callable[[], None], use_graph: bool = False, *, rounds: int = ROUNDS) -> float:
    """Wall-clock ms per call of `fn` called back to back, as a user's loop calls it: batches of n
    calls (n grown until a batch lasts EAGER_BATCH_MS) between two synchronizations, median of
    `rounds` batches. do_bench would time GPU events and hide the host; graphs are never used."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    n, seconds = 1, _batch(fn, 1, sync)  # also the warm-up
    while seconds < EAGER_BATCH_MS * 1e-3:
        n = min(100 * n, max(2 * n, math.ceil(1.2 * n * EAGER_BATCH_MS * 1e-3 / max(seconds, 1e-7))))
        seconds = _batch(fn, n, sync)
    return statistics.median(_batch(fn, n, sync) / n * 1e3 for _ in range(rounds))


def _batch(fn: Callable[[], None], n: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return time.perf_counter() - start


def runnable_kernels(dtype: torch.dtype, device, names=None) -> list[str]:
    """The kernels among `names` (default: all, in ladder order) that run `dtype` on `device`;
    "auto" (or batch_invariant's policy) where any of them does."""
    names = names or [k.name for k in registry.all_kernels("matmul") if not k.experimental]
    device = torch.device(device)
    runs = {k.name for k in registry.all_kernels("matmul") if k.available_on(device) and dtype in k.dtypes_on(device)}
    return [n for n in names if n in runs or (n in registry.POLICIES and runs)]


def wants_graph(problem: Problem) -> bool:
    estimate_ms = max(problem.flops / (_EST_TFLOPS * 1e12), problem.bytes / (_EST_TBPS * 1e12)) * 1e3
    return estimate_ms < GRAPH_BELOW_MS


def measure_problem(
    problem: Problem,
    providers: list[tuple[str, str, Provider]],
    *,
    device,
    device_name: str,
    timer: Timer,
    l2_bytes: int,
    profile: bool = False,
    rounds: int = ROUNDS,
    timing: str = "graph",
) -> list[Row]:
    """One row per provider for `problem`. A provider is (kernel name, config label, callable);
    the kernel named "cublas" is the baseline the ratios are taken against. With timing "eager"
    the callables take (a, b) and return a new tensor: what is checked is what is timed.

    Every provider is checked first; the correct ones are then timed in `rounds` interleaved
    rounds (cuBLAS, ours, cuBLAS, ours, ...) and keep the median, so a clock or neighbour that
    drifts during the run shifts everyone alike instead of whoever happened to run then."""
    if timing == "eager" and timer is gpu_timer:  # it times GPU work alone: no host time in it
        raise ValueError("measure_problem: timing 'eager' needs a wall-clock timer (eager_timer), not gpu_timer")
    sets = input_sets(problem, device, l2_bytes)
    references = [reference_matmul(a, b) for a, b, _ in sets]
    bound = tolerance(getattr(torch, problem.dtype), problem.K)
    eager = timing == "eager"
    rows = [
        Row(device_name, problem.dtype, problem.layout, problem.M, problem.N, problem.K, kernel, config,
            None, None, None, None, "ok", timing)
        for kernel, config, _ in providers
    ]  # fmt: skip
    for row, (_, _, provider) in zip(rows, providers):
        try:
            errors = []
            for (a, b, out), ref in zip(sets, references):
                if eager:
                    result = provider(a, b)
                else:
                    result = out.fill_(float("nan"))
                    provider(a, b, out)
                errors.append(rel_error(result, ref))
            row.max_rel_err = max(errors)
            if not row.max_rel_err <= bound:
                row.status = "wrong"
        except Exception as exc:  # a kernel that fails to compile or launch is a result too
            row.status = describe_error(exc)

    timed = [(row, provider) for row, (_, _, provider) in zip(rows, providers) if row.status == "ok"]
    samples: dict[int, list[float]] = {id(row): [] for row, _ in timed}
    use_graph = wants_graph(problem)
    for _ in range(0 if profile else rounds):
        for row, provider in timed:
            if row.status != "ok":
                continue
            try:
                run_all = _user_loop(provider, sets) if eager else _kernel_loop(provider, sets)
                samples[id(row)].append(timer(run_all, use_graph) / len(sets))
            except Exception as exc:
                row.status = describe_error(exc)
    for row, _ in timed:
        if row.status == "ok" and samples[id(row)]:
            row.ms = statistics.median(samples[id(row)])
            row.tflops = problem.flops / (row.ms * 1e-3) / 1e12

    baseline = next((r.ms for r in rows if r.kernel == "cublas"), None)
    for row in rows:
        if row.ms and baseline:
            row.ratio_to_cublas = baseline / row.ms
    return rows


def _kernel_loop(provider: Provider, sets) -> Callable[[], None]:
    return lambda: [provider(a, b, out) for a, b, out in sets]


def _user_loop(provider: Provider, sets) -> Callable[[], None]:
    """Each result is dropped before the next call, as in a user's loop, so the caching
    allocator hands the same block back instead of holding one output per input set."""

    def run() -> None:
        for a, b, _ in sets:
            provider(a, b)

    return run


def check_then_time(calls: dict, reference: torch.Tensor, bound: float, problem, *, timings=TIMINGS,
                    rounds: int = ROUNDS) -> tuple[dict, dict]:  # fmt: skip
    """The method above for providers whose calls take no arguments (`calls`: name -> fn() ->
    result): each checked against the fp64 `reference` under `bound` (a call that raises is a
    result: its error is its status), then the correct ones timed in `rounds` interleaved rounds
    per timing. Returns (name -> relative error or None, timing -> name -> (median ms or None,
    status))."""
    on_gpu = reference.is_cuda
    errors, checked = {}, {}
    for name, fn in calls.items():
        try:
            errors[name] = rel_error(fn(), reference)
            checked[name] = "ok" if errors[name] <= bound else "wrong"
        except Exception as exc:
            errors[name], checked[name] = None, describe_error(exc)
    results = {}
    for timing in timings:
        timer = eager_timer if timing == "eager" else gpu_timer if on_gpu else cpu_timer
        use_graph = timing == "graph" and wants_graph(problem)
        status, samples = dict(checked), {name: [] for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                if status[name] == "ok":
                    try:
                        samples[name].append(timer(fn, use_graph))
                    except Exception as exc:
                        status[name] = describe_error(exc)
        results[timing] = {
            n: (statistics.median(samples[n]) if status[n] == "ok" and samples[n] else None, status[n]) for n in calls
        }
    return errors, results


def describe_error(exc: Exception) -> str:
    return "error: " + (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
