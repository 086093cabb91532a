"""`tritongemm bench tp`: tensor-parallel GEMMs on every GPU of this machine, the overlapped
functions against the sequential path and torch's symmetric-memory fused ops, in one run.

A problem is one of Llama-3-70B's projections split over the GPUs, bf16, at M = 2048-16384
tokens: q/k/v and gate/up column-parallel (`all_gather_matmul`: each rank holds M / world tokens
and N / world output features), o and down row-parallel (`matmul_reduce_scatter`: each rank
holds K / world input features, and ends with M / world tokens). `n` and `k` in the results are
one rank's GEMM's; `m` the tokens of the whole batch.

Providers, each checked first on every rank against the float64 product of the whole tensors
(a wrong one is reported and not timed):
- tritongemm: the chunks' GEMMs overlapped with their transfers (distributed/paths.py), through
  symmetric memory (copy-engine copies);
- tritongemm-nccl: the same through NCCL's point-to-point kernels, which take SMs from the GEMMs;
- sequential: the same functions with overlap=False: NCCL's collective, then tritongemm's GEMM
  over all rows, or the reverse;
- torch-symm-mem: torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter
  (cuBLAS's GEMMs, symmetric-memory transfers), where this torch runs them.

Timing: every rank makes the same number of calls (agreed over the group first: a collective
that one rank skips hangs the others), each between two CUDA events, after a write that flushes
L2 (as do_bench does) and a one-element all-reduce that lines the GPUs up. A row keeps the
median call of the slowest rank, since the op ends when its last rank does. "eager" times calls
as a user makes them; "graph" one call captured in a CUDA graph and replayed, where capture
works. Without two GPUs: a smoke run over gloo on the CPU, tiny shapes under the interpreter.

`--profile` records instead one call of each function at M = 8192, overlapped, sequential and
torch's fused op where it runs, with torch's profiler on every rank, and writes their GPU activity
and each host's queueing of the call (tp-timeline.csv, a row per kernel, copy or host range, with
its rank) and rank 0's timeline picture (tp-timeline.png) that docs/tensor-parallel.md shows.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist

from tritongemm.bench.environment import describe_environment
from tritongemm.bench.measure import describe_error
from tritongemm.bench.report import write_dicts, write_results
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.distributed import all_gather_matmul, matmul_reduce_scatter

PROVIDERS = ("tritongemm", "tritongemm-nccl", "sequential", "torch-symm-mem")
COLUMNS = ["device", "gpus", "op", "m", "n", "k", "provider", "ms", "speedup_vs_sequential", "layer", "timing",
           "rel_err", "vs_sequential"]  # fmt: skip
TIMINGS = ("eager", "graph")

# Llama-3-70B: hidden 8192, MLP 28672, 64 query heads and 8 key/value heads of 128.
HIDDEN, MLP, Q, KV = 8192, 28672, 64 * 128, 8 * 128
# (layer, op, whole N, whole K)
LAYERS = (("qkv", "all_gather_matmul", Q + 2 * KV, HIDDEN), ("gate_up", "all_gather_matmul", 2 * MLP, HIDDEN),
          ("o_proj", "matmul_reduce_scatter", HIDDEN, Q), ("down", "matmul_reduce_scatter", HIDDEN, MLP))  # fmt: skip
TOKENS = (2048, 4096, 8192, 16384)
CPU_SMOKE = ((("up", "all_gather_matmul", 32, 24), ("down", "matmul_reduce_scatter", 24, 32)), (16,))
# The environment that keeps NVLink multicast off on the shared machines (the device tool's KINDS.md).
_NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass
class TpRow:
    device: str
    gpus: int
    op: str
    m: int
    n: int
    k: int
    provider: str
    ms: float | None
    speedup_vs_sequential: float | None
    layer: str
    timing: str
    rel_err: float | None
    vs_sequential: str  # "bitwise", or the largest difference from the sequential path's result
    error: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def run_tp(*, timings=TIMINGS, out_dir: str | Path | None = "results", name: str | None = None,
           profile: bool = False, plot: bool = True) -> list[TpRow]:  # fmt: skip
    """The suite on every GPU of this machine (a gloo smoke run on the CPU without two), printed,
    and written to `out_dir`/`name`.csv (COLUMNS) and .json unless out_dir is None."""
    on_gpu = torch.cuda.device_count() >= 2
    world = torch.cuda.device_count() if on_gpu else 2
    # The workers inherit this environment as they are spawned; the caller's own stays as it was
    # (a TRITON_INTERPRET left behind would decorate every later kernel of the process for the CPU).
    worker_env = {k: os.environ.get(k, v) for k, v in _NO_MULTICAST.items()}
    if not on_gpu:
        worker_env["TRITON_INTERPRET"] = "1"
        timings = ("eager",)  # no CUDA graphs on the CPU
        print("Fewer than 2 CUDA GPUs: tiny problems over gloo under the Triton interpreter; times say nothing.")
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, worker_env):
        torch.multiprocessing.spawn(_worker, args=(world, tmp, tuple(timings), profile), nprocs=world)
        result = json.loads(Path(tmp, "rank0.json").read_text())
        if profile:  # every rank's activity, each written by its own process
            events = [e for r in range(world) for e in json.loads(Path(tmp, f"rank{r}.json").read_text())["events"]]
    if profile:
        return _write_timeline(events, out_dir, plot)
    rows = [TpRow(**r) for r in result["rows"]]
    for r in rows:
        ms = f"{r.ms:8.3f} ms" if r.ms is not None else "       - ms"
        speedup = f"{r.speedup_vs_sequential:.3f}" if r.speedup_vs_sequential else "-"
        print(f"{r.layer:7s} {r.op:21s} m {r.m:6d} n {r.n:6d} k {r.k:6d} {r.provider:14s} {r.timing:5s} {ms} "
              f"x{speedup} vs sequential  {r.vs_sequential} {r.error}")  # fmt: skip
    print("\n".join(summary(rows)))
    if out_dir is not None:
        base = name or ("tp" if on_gpu else "tp-cpu")
        timed = [r for r in rows if r.ms is not None]
        paths = write_results(timed, result["environment"], Path(out_dir), base, columns=COLUMNS, json_rows=rows)
        if plot and on_gpu:
            paths += (_plot_speedups(timed, Path(out_dir) / f"{base}.png"),)
        print("Wrote " + ", ".join(map(str, paths)))
    return rows


def summary(rows: list[TpRow]) -> list[str]:
    """The issue's bars: overlapped >= 1.3x sequential at M >= 4096, >= 1.0x torch's fused ops."""
    lines = []
    for timing in TIMINGS:
        ours = [r for r in rows if r.provider == "tritongemm" and r.timing == timing and r.speedup_vs_sequential]
        big = [r.speedup_vs_sequential for r in ours if r.m >= 4096]
        if big:
            lines.append(f"{timing}: tritongemm vs sequential at M >= 4096: {min(big):.3f}-{max(big):.3f} (bar 1.3)")
        theirs = [r for r in rows if r.provider == "torch-symm-mem" and r.timing == timing and r.ms]
        torch_ms = {(r.layer, r.m): r.ms for r in theirs}
        vs_torch = [torch_ms[(r.layer, r.m)] / r.ms for r in ours if (r.layer, r.m) in torch_ms]
        if vs_torch:
            lines.append(f"{timing}: tritongemm vs torch-symm-mem: {min(vs_torch):.3f}-{max(vs_torch):.3f} (bar 1.0)")
    return lines


# --- one process per GPU ---------------------------------------------------------------------


def _worker(rank: int, world: int, tmp: str, timings: tuple, profile: bool) -> None:
    on_gpu = torch.cuda.device_count() >= world
    if on_gpu:
        device = join_gpu_group(rank, world, tmp)
    else:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
        device = torch.device("cpu")
    layers, tokens = (LAYERS, TOKENS) if on_gpu else CPU_SMOKE
    if profile:
        result = {"events": _timeline(rank, world, device, layers)}
    else:
        rows = []
        for layer in layers:
            for m in tokens:
                rows += _measure(layer, m, rank, world, device, timings)
                if rank == 0:
                    print(f"{layer[0]} m {m}: done", flush=True)
        result = {"rows": [r.as_dict() for r in rows], "environment": describe_environment() if rank == 0 else {}}
    if rank == 0 or profile:
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def spawn_on_gpus(worker, *args) -> int:
    """worker(rank, world, tmp, *args) in one process per GPU of this machine (two at least), with
    NVLink multicast kept off and `tmp` a directory they share (`join_gpu_group`'s store): for
    probes of the ops beside this suite (scripts/probes/tp/). Returns the number of GPUs."""
    world = torch.cuda.device_count()
    if world < 2:
        raise SystemExit(f"needs 2 or more CUDA GPUs, this machine has {world}")
    worker_env = {k: os.environ.get(k, v) for k, v in _NO_MULTICAST.items()}
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, worker_env):
        torch.multiprocessing.spawn(worker, args=(world, tmp, *args), nprocs=world)
    return world


def join_gpu_group(rank: int, world: int, tmp: str) -> torch.device:
    """A `spawn_on_gpus` worker's start: its GPU, the NCCL group, torch's symm_mem ops."""
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    _enable_symmetric_memory()
    return torch.device("cuda", rank)


@contextlib.contextmanager
def pulled():
    """Inside: the ops' symmetric transfers pulled (each receiver copies from its senders' buffers)
    rather than pushed (paths.PUSH_GATHER, paths.PUSH_SCATTER): for probes that compare the two."""
    # Lazy: paths loads Triton and the overlapped kernels, for the probes alone; the CLI imports tp for every suite.
    from tritongemm.distributed import paths

    before = paths.PUSH_GATHER, paths.PUSH_SCATTER
    paths.PUSH_GATHER = paths.PUSH_SCATTER = False
    try:
        yield
    finally:
        paths.PUSH_GATHER, paths.PUSH_SCATTER = before  # as found: a caller's own setting survives


def _enable_symmetric_memory() -> None:
    """torch.ops.symm_mem's ops exist once their module is imported; torch releases before the
    group registration was made automatic also want `enable_symm_mem_for_group` (later ones warn)."""
    import warnings

    import torch.distributed._symmetric_memory as symm_mem

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)


def _problem(layer, m: int, rank: int, world: int, device):
    """This rank's operands, its share of the whole-tensor float64 reference, and the calls of
    each provider, for one layer at m tokens."""
    name, op, N, K = layer
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, K, generator=generator, device=device).to(dtype)
    b = torch.randn(K, N, generator=generator, device=device).to(dtype) / math.sqrt(K)
    group = dist.group.WORLD
    if op == "all_gather_matmul":
        per = N // world
        shard = a[rank * (m // world) : (rank + 1) * (m // world)].contiguous()
        b_rank = b[:, rank * per : (rank + 1) * per]
        reference = a.double() @ b_rank.double()
        calls = {
            "tritongemm": lambda: all_gather_matmul(shard, b_rank, group),
            "tritongemm-nccl": lambda: all_gather_matmul(shard, b_rank, group, transport="nccl"),
            "sequential": lambda: all_gather_matmul(shard, b_rank, group, overlap=False),
            "torch-symm-mem": lambda: torch.ops.symm_mem.fused_all_gather_matmul(
                shard, [b_rank], 0, group.group_name, return_A=False)[1][0],
        }  # fmt: skip
        return (per, K), reference, calls
    per = K // world
    a_rank, b_rank = a[:, rank * per : (rank + 1) * per].contiguous(), b[rank * per : (rank + 1) * per]
    rows = slice(rank * (m // world), (rank + 1) * (m // world))
    reference = a[rows].double() @ b.double()
    calls = {
        "tritongemm": lambda: matmul_reduce_scatter(a_rank, b_rank, group),
        "tritongemm-nccl": lambda: matmul_reduce_scatter(a_rank, b_rank, group, transport="nccl"),
        "sequential": lambda: matmul_reduce_scatter(a_rank, b_rank, group, overlap=False),
        "torch-symm-mem": lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(
            a_rank, b_rank, "sum", 0, group.group_name),
    }  # fmt: skip
    return (N, per), reference, calls


def _measure(layer, m: int, rank: int, world: int, device, timings) -> list[TpRow]:
    name, op, _, K = layer
    (n, k), reference, calls = _problem(layer, m, rank, world, device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bound = tolerance(torch.bfloat16 if device.type == "cuda" else torch.float16, K)
    outputs, errors = {}, {}
    for provider, call in calls.items():
        if provider == "torch-symm-mem" and device.type != "cuda":
            errors[provider] = "refused: torch's symm_mem ops need CUDA"
            continue
        try:
            outputs[provider] = call()
        except Exception as exc:  # noqa: BLE001 - recorded in the row, the suite goes on
            errors[provider] = f"raised: {describe_error(exc)}"
    rel_errs = {provider: rel_error(out, reference) for provider, out in outputs.items()}
    for provider, err in rel_errs.items():
        if not err <= bound:
            errors[provider] = f"wrong: rel error {err:.2e} > {bound:.2e}"
    failed = _agreed_failures(errors, reference.device)
    rows = []
    sequential = outputs.get("sequential")
    for provider in calls:
        out = outputs.get(provider)
        err = rel_errs.get(provider)
        same = "-" if out is None or sequential is None else _difference(out, sequential)
        for timing in timings:
            ms, why = None, errors.get(provider, "")
            if provider not in failed:
                ms, why = _time(calls[provider], timing, device)
            rows.append(TpRow(device_name, world, op, m, n, k, provider, ms, None, name, timing, err, same, why))
    for timing in timings:
        base = next((r.ms for r in rows if r.provider == "sequential" and r.timing == timing), None)
        for r in rows:
            if r.timing == timing and r.ms and base:
                r.speedup_vs_sequential = base / r.ms
    return rows


def _agreed_failures(errors: dict, device) -> set[str]:
    """The providers that failed (raised, or missed the bound: `errors`) on any rank: none of them
    is timed, or the ranks' collectives stop matching."""
    flags = torch.tensor([p in errors for p in PROVIDERS], dtype=torch.int32, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    failed = {p for p, flag in zip(PROVIDERS, flags.tolist()) if flag}
    for p in failed:
        errors.setdefault(p, "failed on another rank")
    return failed


def _difference(out: torch.Tensor, sequential: torch.Tensor) -> str:
    if torch.equal(out, sequential):
        return "bitwise"
    return f"max abs diff {(out.double() - sequential.double()).abs().max().item():.2e}"


def _time(call, timing: str, device) -> tuple[float | None, str]:
    """(ms, "") for the median call of the slowest rank, or (None, why) where a graph can't be made."""
    if device.type != "cuda":
        start = time.perf_counter()
        call()
        return _slowest((time.perf_counter() - start) * 1e3, device), ""
    fn = call
    if timing == "graph":
        try:
            fn = _captured(call)
        except Exception as exc:  # noqa: BLE001 - a capture that fails leaves the eager row
            return None, f"graph capture failed: {describe_error(exc)}"
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)  # > L2 (50 MB on H100)
    line_up = torch.zeros(1, device=device)
    fn()
    torch.cuda.synchronize()
    estimate = _events_ms(fn, 3) / 3
    calls = torch.tensor([min(50, max(5, math.ceil(200 / max(estimate, 1e-3))))], device=device)
    dist.all_reduce(calls, op=dist.ReduceOp.MAX)
    pairs = []
    for _ in range(int(calls.item())):
        flush.zero_()
        dist.all_reduce(line_up)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return _slowest(statistics.median(s.elapsed_time(e) for s, e in pairs), device), ""


def _captured(call):
    """One call in a CUDA graph (made after a warm-up on a side stream, as torch's docs ask)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def _events_ms(fn, n: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _slowest(ms: float, device) -> float:
    value = torch.tensor([ms], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


# --- the timeline: what each stream runs during one call -------------------------------------


# The spins around the GPUs' line-up: about 0.5 ms each at the H100's clocks. The first keeps the
# GPU busy while its host queues the line-up and the second spin: a host that queued them after its
# GPU had left the line-up started its spin, and so the call, that much later (four H200s, one
# 0.13 ms spin after the line-up: the ranks' spins ended up to 130 us apart, and the ranks that
# started first waited that long in the call's first barrier). The second is room for every host
# to queue the call: under the profiler a graph replay's launch took up to 0.2 ms of host time.
LINE_UP_SPIN_CYCLES = 1_000_000


def _timeline(rank: int, world: int, device, layers) -> list[dict]:
    """This rank's GPU activity during one call per function, path and timing, from torch's
    profiler: kernels and copies with their stream, start and duration (us from the end of the
    line-up's spin), and the host's queueing of the call (stream "host"). "graph" replays the call
    captured in a CUDA graph, as the kernel-only rows time it: no host work between the launches.
    Every rank records its own; the processes share the host's clock, so `t0_us` (the spin's end
    on that clock) lines the ranks' timelines up."""
    events = []
    line_up = torch.zeros(1, device=device)
    picked = [next(x for x in layers if x[1] == op) for op in ("all_gather_matmul", "matmul_reduce_scatter")]
    m = 8192 if device.type == "cuda" else 16
    timings = TIMINGS if device.type == "cuda" else ("eager",)
    for layer in picked:
        _, _, calls = _problem(layer, m, rank, world, device)
        for path in (p for p in _PATH_NAMES if device.type == "cuda" or p != "torch-symm-mem"):  # it needs CUDA
            for timing in timings:
                fn = _captured(calls[path]) if timing == "graph" else calls[path]
                for _ in range(3):  # warm: compiled, communicators made
                    fn()
                # Every rank profiles, but the profiler's costs are not the same on every host: after
                # the barrier the hosts queued the call up to ~120 us apart, and a graph replay's
                # first barrier waited that long for the late peer (results/h100x4/tp-timeline.csv).
                # So the GPUs line up in a one-element all-reduce, which they leave together, queued
                # behind a spin, and spin again while every host queues the call; the second spin's
                # end marks the call's start.
                with torch.profiler.profile() as prof:
                    dist.barrier()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                        torch.cuda._sleep(LINE_UP_SPIN_CYCLES)
                        dist.all_reduce(line_up)
                        torch.cuda._sleep(LINE_UP_SPIN_CYCLES)
                    with torch.profiler.record_function(_HOST_MARK):
                        fn()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                events += _gpu_activity(prof, rank, layer[0], layer[1], path, timing)
    return events


_HOST_MARK = "tp call queued"  # the host's range around the profiled call


def _gpu_activity(prof, rank: int, layer: str, op: str, path: str, timing: str) -> list[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    every = trace.get("traceEvents", [])
    gpu = [e for e in every if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    host = [dict(e, args={"stream": "host"}) for e in every  # (not its copies on the GPU's streams)
            if e.get("name") == _HOST_MARK and e.get("cat") == "user_annotation"]  # fmt: skip
    marks = [e for e in gpu if "spin_kernel" in e["name"]]
    t0 = marks[-1]["ts"] + marks[-1]["dur"] if marks else min((e["ts"] for e in gpu + host), default=0)
    base = trace.get("baseTimeNanoseconds", 0) / 1e3  # (kineto's times count from it, where it is given)
    return [dict(rank=rank, layer=layer, op=op, path=path, timing=timing,
                 stream=e.get("args", {}).get("stream", e.get("tid")), name=e["name"][:80],
                 start_us=e["ts"] - t0, dur_us=e["dur"], t0_us=base + t0)
            for e in gpu + host if e["ts"] + e["dur"] >= t0]  # fmt: skip


def _write_timeline(events: list[dict], out_dir, plot: bool) -> list:
    if out_dir is None or not events:
        print(f"{len(events)} GPU events; no files written")
        return events
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tp-timeline.csv"
    write_dicts(path, events)
    print(f"Wrote {path}")
    if plot:
        print(f"Wrote {plot_timeline(path, out / 'tp-timeline.png')}")
    return events


def plot_timeline(csv_path: Path, png_path: Path) -> Path:
    """Rank 0's timeline: one panel per function and path, a row per stream, a bar per kernel or
    copy, GEMMs blue, communication orange (NCCL's kernels, copies), the rest grey; a row for the
    host's queueing of the call."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with Path(csv_path).open() as f:
        events = [e for e in csv.DictReader(f) if e.get("rank", "0") == "0"]
    panel_of = lambda e: (e["layer"], e["op"], e["path"], e.get("timing", "eager"))  # noqa: E731
    panels = list(dict.fromkeys(map(panel_of, events)))
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 1.6 * len(panels) + 0.6), squeeze=False)
    span = {}  # one time axis for each function's panels, so their lengths compare
    for e in events:
        span[e["op"]] = max(span.get(e["op"], 0.0), float(e["start_us"]) + float(e["dur_us"]))
    for ax, (layer, op, path, timing) in zip(axes[:, 0], panels):
        mine = [e for e in events if panel_of(e) == (layer, op, path, timing)]
        streams = sorted({e["stream"] for e in mine}, key=str)
        for e in mine:
            kind = _kind(e["name"])
            color = {"gemm": "tab:blue", "comm": "tab:orange"}.get(kind, "0.6")
            ax.broken_barh([(float(e["start_us"]), float(e["dur_us"]))], (streams.index(e["stream"]) - 0.4, 0.8),
                           color=color)  # fmt: skip
        ends = max(float(e["start_us"]) + float(e["dur_us"]) for e in mine)
        ax.set_yticks(range(len(streams)), [f"stream {s}" for s in streams], fontsize=7)
        ax.set_xlim(0, span[op])
        ax.set_title(f"{op} ({layer}), {_PATH_NAMES[path]}, {timing}: {ends:.0f} us", fontsize=8, loc="left")
    axes[-1, 0].set_xlabel("us since the line-up spin ended (rank 0; blue GEMM, orange communication)")
    fig.tight_layout()
    fig.savefig(png_path, dpi=130)
    plt.close(fig)
    return png_path


_PATH_NAMES = {
    "tritongemm": "overlapped, symmetric memory (copy engines)",
    "tritongemm-nccl": "overlapped, NCCL send/recv",
    "sequential": "sequential (NCCL collective + one GEMM)",
    "torch-symm-mem": "torch's fused symm_mem op (cuBLAS, copy engines)",
}


def _kind(kernel_name: str) -> str:
    name = kernel_name.lower()
    if "nccl" in name or "memcpy" in name:
        return "comm"
    if "barrier" in name or "reduce_partials" in name:
        return "other"
    if any(word in name for word in ("matmul", "gemm", "persistent", "pipelined", "sm90")):
        return "gemm"
    return "other"


def _plot_speedups(rows: list[TpRow], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timings = [t for t in TIMINGS if any(r.timing == t for r in rows)]
    fig, axes = plt.subplots(1, len(timings), figsize=(6 * len(timings), 4), squeeze=False)
    for ax, timing in zip(axes[0], timings):
        mine = [r for r in rows if r.timing == timing]
        groups = list(dict.fromkeys((r.layer, r.m) for r in mine))
        width = 0.8 / len(PROVIDERS)
        for i, provider in enumerate(PROVIDERS):
            values = {(r.layer, r.m): r.speedup_vs_sequential for r in mine if r.provider == provider}
            xs = [j + (i - (len(PROVIDERS) - 1) / 2) * width for j in range(len(groups))]
            ax.bar(xs, [values.get(g) or 0 for g in groups], width=width, label=provider)
        ax.axhline(1.0, color="k", lw=0.6)
        ax.axhline(1.3, color="tab:red", lw=0.6, ls="--")
        ax.set_xticks(range(len(groups)), [f"{layer}\n{m}" for layer, m in groups], fontsize=6)
        ax.set_ylabel("speedup over sequential")
        ax.set_title(f"{rows[0].gpus} x {rows[0].device}, {timing}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
