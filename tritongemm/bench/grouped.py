"""`tritongemm bench grouped`: the expert GEMMs of MoE layers, `tritongemm.grouped_mm` against
`torch._grouped_mm` and a loop of `torch.mm` over the experts, in the same run.

A problem is one MoE layer's up projection (gate and up together, N = 2 x the MLP width) over
`tokens` tokens routed to `topk` of `experts` experts each, uniformly at random (seeded): the
grouped GEMM of tokens x topk rows in ragged groups. Each provider is checked against the fp64
reference first; a wrong one is reported and not timed, one that raises is recorded with its
error. Timings as the other suites (measure.py). `ratio_to_torch` is torch._grouped_mm's ms over
the provider's.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import tritongemm
from tritongemm.bench.measure import ROUNDS, TIMINGS, check_then_time
from tritongemm.bench.plots import plot_grouped
from tritongemm.bench.report import problems_here, run_suite
from tritongemm.core.reference import tolerance
from tritongemm.grouped import reference_grouped_mm
from tritongemm.grouped.api import grouped_mm_ws

# tritongemm-ws: the Hopper Gluon kernel by name (grouped/ws.py, grouped.api.grouped_mm_ws), on
# one CTA, at every group size (grouped_mm takes it from 128 rows a group); an sm_90 GPU's rows only.
PROVIDERS = ("tritongemm", "tritongemm-ws", "torch._grouped_mm", "torch.mm loop")
BASELINE = "torch._grouped_mm"
COLUMNS = ["device", "dtype", "experts", "tokens", "topk", "n", "k", "provider", "timing", "ms", "tflops",
           "ratio_to_torch"]  # fmt: skip


@dataclass(frozen=True)
class GroupedProblem:
    experts: int
    tokens: int
    topk: int
    n: int  # each expert's output width (the MLP width, x2 for gate and up)
    k: int  # the hidden size
    dtype: str = "bfloat16"

    @property
    def rows(self) -> int:
        return self.tokens * self.topk

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.n * self.k

    @property
    def bytes(self) -> int:
        """What the GEMM must move at least: the rows in and out, and the weights of the experts
        the rows can reach (a decode step's few rows touch a few of 128 experts)."""
        itemsize = getattr(torch, self.dtype).itemsize
        touched = min(self.experts, self.rows)
        return (self.rows * self.k + touched * self.k * self.n + self.rows * self.n) * itemsize

    def label(self) -> str:
        return f"{self.experts} experts top-{self.topk}, {self.tokens} tokens, {self.n}x{self.k} {self.dtype}"


# The three layers (Mixtral, a 64-expert and Qwen3-MoE's 128-expert one) at prefill sizes,
# and decode-sized batches of each.
LAYERS = ((8, 2, 2 * 14336, 4096), (64, 6, 2 * 1408, 2048), (128, 8, 2 * 768, 2048))
SUITE = tuple(GroupedProblem(e, t, k, n, h) for (e, k, n, h) in LAYERS for t in (1, 16, 64, 2048, 8192))
CPU_SMOKE = (GroupedProblem(4, 8, 2, 24, 16, "float32"), GroupedProblem(8, 3, 2, 16, 32, "float32"))


@dataclass
class GroupedRow:
    device: str
    dtype: str
    experts: int
    tokens: int
    topk: int
    n: int
    k: int
    provider: str
    timing: str
    ms: float | None
    tflops: float | None
    ratio_to_torch: float | None  # torch._grouped_mm's ms / this ms, same run and timing
    max_rel_err: float | None
    status: str

    def as_dict(self) -> dict:
        return asdict(self)


def operands(problem: GroupedProblem, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """a (tokens x topk, k) in expert order, b (experts, k, n) as the transpose of (n, k) weights
    (nn.Linear's layout, as transformers stores experts), offs: the experts' group ends."""
    gen = torch.Generator().manual_seed(0)
    choice = torch.randint(0, problem.experts, (problem.rows,), generator=gen)
    counts = torch.bincount(choice, minlength=problem.experts)
    dtype = getattr(torch, problem.dtype)
    a = torch.randn(problem.rows, problem.k, generator=gen).to(dtype=dtype, device=device)
    weights = torch.randn(problem.experts, problem.n, problem.k, generator=gen) * problem.k**-0.5
    b = weights.to(dtype=dtype, device=device).transpose(1, 2)
    return a, b, counts.cumsum(0).to(torch.int32).to(device)


def _providers(offs: torch.Tensor) -> dict:
    bounds = [0, *offs.tolist()]  # the loop's host offsets, taken once here: a loop needs them

    def loop(a, b, offs):
        out = a.new_empty(a.shape[0], b.shape[2])
        for g, (s, e) in enumerate(zip(bounds, bounds[1:])):
            torch.mm(a[s:e], b[g], out=out[s:e])
        return out

    providers = {"tritongemm": tritongemm.grouped_mm, BASELINE: torch._grouped_mm, "torch.mm loop": loop}
    if offs.device.type == "cuda" and torch.cuda.get_device_capability(offs.device) == (9, 0):
        providers["tritongemm-ws"] = grouped_mm_ws
    return providers


def measure_grouped(problem: GroupedProblem, *, device, device_name: str, timings=TIMINGS, rounds: int = ROUNDS):
    args = operands(problem, device)
    calls = {name: functools.partial(fn, *args) for name, fn in _providers(args[2]).items()}
    reference = reference_grouped_mm(*args).double()
    errors, results = check_then_time(calls, reference, tolerance(getattr(torch, problem.dtype), problem.k), problem,
                                      timings=timings, rounds=rounds)  # fmt: skip
    rows, p = [], problem
    for timing, result in results.items():
        torch_ms = result[BASELINE][0]
        for name, (ms, status) in result.items():
            tflops = p.flops / (ms * 1e-3) / 1e12 if ms else None
            ratio = torch_ms / ms if torch_ms and ms else None
            rows.append(GroupedRow(device_name, p.dtype, p.experts, p.tokens, p.topk, p.n, p.k, name, timing, ms,
                                   tflops, ratio, errors[name], status))  # fmt: skip
    return rows


def run_grouped(*, timings=TIMINGS, out_dir: str | Path | None = "results", name: str | None = None,
                rounds: int = ROUNDS) -> list[GroupedRow]:  # fmt: skip
    """The SUITE on a GPU (a smoke run on tiny problems under the interpreter without one): prints
    the rows, writes `out_dir`/`name`.csv (COLUMNS, timed rows) and .json unless out_dir is None."""
    problems, base = problems_here(SUITE, CPU_SMOKE, name, "grouped")
    rows, env, _ = run_suite(problems, measure_grouped, name=base, out_dir=out_dir, columns=COLUMNS, timings=timings,
                             rounds=rounds)  # fmt: skip
    for r in rows:
        ratio = f"{r.ratio_to_torch:.3f}" if r.ratio_to_torch else "-"
        ms = f"{r.ms:.4f}" if r.ms else "-"
        print(f"{r.experts:4d} x top-{r.topk} {r.tokens:6d} tokens {r.n}x{r.k} {r.provider:18s} {r.timing:5s} "
              f"{ms:>9s} ms  vs torch {ratio:>6s}  {r.status}")  # fmt: skip
    if out_dir is not None and any(r.ratio_to_torch for r in rows):
        title = f"grouped_mm / torch._grouped_mm, {env['device']}, triton {env.get('triton', '?')}"
        print(f"wrote {plot_grouped([r for r in rows if r.ms], Path(out_dir) / f'{base}.png', title)}")
    return rows
