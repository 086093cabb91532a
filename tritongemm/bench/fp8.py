"""`tritongemm bench fp8`: `tritongemm.scaled_mm` against `torch._scaled_mm` with the same recipe
(tensor-, row- or block-wise scales, e4m3 x e4m3 -> bf16), in the same run.

Each problem's operands are quantized once by `quantize_fp8` (activations per token or in 1 x 128
blocks, the weight per channel or in 128 x 128 blocks), and both providers get the very same
fp8 tensors and scales. Each is checked against the fp64 product of the dequantized operands
(`reference_scaled_mm`) first; a wrong one is reported and not timed, and a recipe torch refuses
on this GPU is recorded with torch's error. Timings as the other suites (measure.py): "graph" the
kernel alone, "eager" a user's back-to-back calls. `ratio_to_torch` is torch's ms over ours.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import tritongemm
from tritongemm.bench.measure import ROUNDS, TIMINGS, check_then_time
from tritongemm.bench.plots import plot_fp8
from tritongemm.bench.report import run_suite
from tritongemm.core import registry
from tritongemm.core.reference import fp8_tolerance, rel_error
from tritongemm.fp8 import quantize_fp8, reference_scaled_mm

RECIPES = ("tensor", "row", "block")
PROVIDERS = ("tritongemm", "torch")  # and the fp8 kernels asked for by name (--kernels)
# Llama-3-8B's nn.Linear weights (N, K): q/k/v together, o, gate/up together, down.
WEIGHTS = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
TOKENS = (16, 128, 2048, 8192)
CPU_SMOKE_SHAPES = ((16, 32, 128),)  # the interpreter: one tiny problem per recipe
COLUMNS = ["device", "recipe", "m", "n", "k", "provider", "timing", "ms", "tflops", "ratio_to_torch"]


@dataclass(frozen=True)
class Fp8Problem:
    recipe: str
    M: int
    N: int
    K: int

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    @property
    def bytes(self) -> int:
        """fp8 operands once, the bf16 output once: what measure.wants_graph weighs."""
        return self.M * self.K + self.N * self.K + 2 * self.M * self.N

    def label(self) -> str:
        return f"{self.recipe} {self.M}x{self.N}x{self.K}"


SUITE = tuple(
    Fp8Problem(recipe, M, N, K)
    for recipe in RECIPES
    for (N, K) in WEIGHTS
    for M in TOKENS
) + tuple(Fp8Problem(recipe, 8192, 8192, 8192) for recipe in RECIPES)  # fmt: skip


@dataclass
class Fp8Row:
    device: str
    recipe: str
    m: int
    n: int
    k: int
    provider: str  # one of PROVIDERS, or an fp8 kernel's name
    timing: str  # one of measure.TIMINGS
    ms: float | None
    tflops: float | None
    ratio_to_torch: float | None  # torch's ms / this ms, same run and timing
    max_rel_err: float | None
    status: str  # "ok", "wrong" (failed the check, not timed) or "error: ..." (raised: torch's refusal too)

    def as_dict(self) -> dict:
        return asdict(self)


def plan_problems(shapes: list[tuple[int, int, int]] | None, *, on_gpu: bool) -> tuple[tuple[Fp8Problem, ...], str]:
    """The problems (every recipe for given shapes, else the SUITE) and a note to print first."""
    if not on_gpu:
        note = "No CUDA GPU: the kernels under the Triton interpreter; times say nothing about GPU speed."
        return tuple(Fp8Problem(r, *s) for s in shapes or CPU_SMOKE_SHAPES for r in RECIPES), note
    if shapes:
        return tuple(Fp8Problem(r, *s) for s in shapes for r in RECIPES), ""
    return SUITE, ""


def operands(problem: Fp8Problem, device) -> tuple[torch.Tensor, ...]:
    """(a, b, scale_a, scale_b) as scaled_mm and torch._scaled_mm take them: a (M, K) row-major,
    b = weight.T, the scales of `problem.recipe`."""
    x = torch.randn(problem.M, problem.K, device=device)
    weight = torch.randn(problem.N, problem.K, device=device) * problem.K**-0.5
    if problem.recipe == "block":
        (a, sa), (w, sw) = quantize_fp8(x, "block"), quantize_fp8(weight, "block", block=(128, 128))
        return a, w.T, sa, sw
    (a, sa), (w, sw) = quantize_fp8(x, problem.recipe), quantize_fp8(weight, problem.recipe)
    return a, w.T, sa, sw.T if problem.recipe == "row" else sw


def _torch_scaled_mm(a, b, scale_a, scale_b):
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


def _outer_major(scale: torch.Tensor) -> torch.Tensor:
    return scale.t().contiguous().t()


def torch_block_scales(a, b, scale_a, scale_b, reference: torch.Tensor, bound: float) -> tuple:
    """The block scales laid out as this torch takes them. cuBLAS reads 1 x 128 and 128 x 128
    scales outer-dimension-major, some releases want b's as (K/128, N/128), and torch's checks
    differ between releases; a square grid of b's blocks is taken in either orientation and one
    of them is wrong. So each layout is tried and the first whose product passes the check is
    timed; failing that, the first torch took (to be reported wrong); failing that, torch's first
    refusal is raised."""
    accepted, first = None, None
    for sa in (scale_a, _outer_major(scale_a)):
        for sb in (scale_b, _outer_major(scale_b), scale_b.t(), scale_b.t().contiguous()):
            try:
                out = _torch_scaled_mm(a, b, sa, sb)
            except Exception as exc:  # a refusal, kept to report
                first = first or exc
                continue
            if rel_error(out, reference) <= bound:
                return a, b, sa, sb
            accepted = accepted or (a, b, sa, sb)
    if accepted:
        return accepted
    raise first


# `--kernels auto:batch_invariant`: scaled_mm(..., batch_invariant=True) beside the default, on the
# recipes whose scales belong to their rows (a tensor-wise scale is the whole batch's absmax).
INVARIANT_RECIPES = ("row", "block")


def _providers(recipe: str, kernels: tuple[str, ...]) -> dict:
    """scaled_mm's own choice ("tritongemm"), its batch-invariant mode where `kernels` names
    registry.BATCH_INVARIANT, each other of `kernels` that takes `recipe` (by its name), and torch."""

    def ours(kernel: str):
        return lambda a, b, sa, sb: tritongemm.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, kernel=kernel)

    def invariant(a, b, sa, sb):
        return tritongemm.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, batch_invariant=True, recipe=recipe)

    wants_invariant = registry.BATCH_INVARIANT in kernels and recipe in INVARIANT_RECIPES
    named = {k: ours(k) for k in kernels
             if k != registry.BATCH_INVARIANT and recipe in registry.get(k, family="scaled_mm").recipes}  # fmt: skip
    invariant_provider = {registry.BATCH_INVARIANT: invariant} if wants_invariant else {}
    return {"tritongemm": ours("auto"), **invariant_provider, **named, "torch": _torch_scaled_mm}


def runnable_kernels(kernels: tuple[str, ...], device) -> tuple[tuple[str, ...], list[str]]:
    """Those of `kernels` (scaled_mm's names) that run on `device`, and a line for each that doesn't."""
    infos = [registry.get(k, family="scaled_mm") for k in kernels if k != registry.BATCH_INVARIANT]
    reasons = {info.name: info.unavailable_reason(device) for info in infos}
    runnable = tuple(k for k in kernels if k == registry.BATCH_INVARIANT or not reasons[k])
    return runnable, [f"{k}: not timed: {r}" for k, r in reasons.items() if r]


def measure_fp8(problem: Fp8Problem, *, device, device_name: str, timings=TIMINGS, rounds: int = ROUNDS,
                providers: dict | None = None, kernels: tuple[str, ...] = ()) -> list[Fp8Row]:  # fmt: skip
    """One row per (timing, provider): each checked first, the correct ones timed in `rounds`
    interleaved rounds. `kernels`: fp8 kernels to time by name beside scaled_mm's own choice, each
    on the recipes it takes. `providers` (name -> fn(a, b, scale_a, scale_b)) replaces the
    default, for tests."""
    args = operands(problem, device)
    reference = reference_scaled_mm(*args, out_dtype=torch.float64)
    bound = fp8_tolerance(torch.bfloat16, problem.K)
    calls = {}
    for name, fn in (providers or _providers(problem.recipe, kernels)).items():
        try:  # the scales' layout this torch takes: a refusal of every one is torch's result
            block = name == "torch" and problem.recipe == "block"
            given = torch_block_scales(*args, reference, bound) if block else args
            calls[name] = functools.partial(fn, *given)
        except Exception as exc:
            calls[name] = functools.partial(_raise, exc)
    errors, results = check_then_time(calls, reference, bound, problem, timings=timings, rounds=rounds)
    rows = []
    for timing, result in results.items():
        torch_ms = result.get("torch", (None,))[0]
        for name, (ms, status) in result.items():
            tflops = problem.flops / (ms * 1e-3) / 1e12 if ms else None
            ratio = torch_ms / ms if torch_ms and ms else None
            rows.append(Fp8Row(device_name, problem.recipe, problem.M, problem.N, problem.K, name, timing, ms,
                               tflops, ratio, errors[name], status))  # fmt: skip
    return rows


def _raise(exc: Exception):
    raise exc


def format_table(rows: list[Fp8Row]) -> str:
    lines = [f"{'recipe':7s} {'M x N x K':>20s} {'provider':13s} {'timing':6s} {'ms':>9s} {'TFLOP/s':>8s} "
             f"{'vs torch':>8s}  status"]  # fmt: skip
    for r in rows:
        ms = f"{r.ms:9.4f}" if r.ms else f"{'-':>9s}"
        tflops = f"{r.tflops:8.1f}" if r.tflops else f"{'-':>8s}"
        ratio = f"{r.ratio_to_torch:8.3f}" if r.ratio_to_torch else f"{'-':>8s}"
        lines.append(f"{r.recipe:7s} {f'{r.m}x{r.n}x{r.k}':>20s} {r.provider:13s} {r.timing:6s} {ms} {tflops} "
                     f"{ratio}  {r.status}")  # fmt: skip
    return "\n".join(lines)


def summary(rows: list[Fp8Row]) -> list[str]:
    """Per recipe, timing and provider (scaled_mm's default, and its batch-invariant mode where it
    ran): the geomean of ratio_to_torch at M >= 2048, at M <= 128 and over all, and the lowest, as
    the issues' targets read them."""
    lines = []
    ranges = (("M >= 2048", lambda m: m >= 2048), ("M <= 128", lambda m: m <= 128), ("all M", lambda m: True))
    for provider in ("tritongemm", registry.BATCH_INVARIANT):
        for recipe in RECIPES:
            for timing in TIMINGS:
                for label, keep in ranges:
                    ratios = [r.ratio_to_torch for r in rows if r.recipe == recipe and r.timing == timing
                              and r.provider == provider and r.ratio_to_torch and keep(r.m)]  # fmt: skip
                    if ratios:
                        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
                        who = "" if provider == "tritongemm" else f" {provider}"
                        lines.append(f"{recipe:6s} {timing:5s}{who} {label}: geomean {geomean:.3f}, lowest "
                                     f"{min(ratios):.3f} ({len(ratios)} rows)")  # fmt: skip
    return lines


def run_fp8(*, shapes=None, timings=TIMINGS, out_dir: str | Path | None = "results", name: str | None = None,
            plot: bool = True, rounds: int = ROUNDS, kernels: tuple[str, ...] = ()) -> list[Fp8Row]:  # fmt: skip
    """Run the SUITE (or the given shapes, every recipe) for scaled_mm's own choice, each of
    `kernels` (fp8 kernel names, on the recipes each takes) and torch; print the table and the
    targets' summary; write `out_dir`/`name`.csv (COLUMNS, timed rows), .json (the environment and
    every row) and .png unless out_dir is None. `name` defaults to "fp8" ("fp8-cpu" without a GPU)."""
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    problems, note = plan_problems(shapes, on_gpu=on_gpu)
    if note:
        print(note)
    kernels, refused = runnable_kernels(tuple(k for k in kernels if k != "auto"), "cuda" if on_gpu else "cpu")
    for line in refused:
        print(line)
    base = name or ("fp8" if on_gpu else "fp8-cpu")
    measure = functools.partial(measure_fp8, kernels=kernels)
    rows, env, paths = run_suite(problems, measure, name=base, out_dir=out_dir, columns=COLUMNS, timings=timings,
                                 rounds=rounds)  # fmt: skip
    print(format_table(rows))
    print("\n".join(summary(rows)))
    if out_dir is not None and plot and any(r.ratio_to_torch for r in rows):
        paths += (plot_fp8(rows, Path(out_dir) / f"{base}.png", f"fp8 scaled_mm / torch._scaled_mm, {env['device']}"),)
    if paths:
        print("wrote " + ", ".join(str(p) for p in paths))
    return rows
