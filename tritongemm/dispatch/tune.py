"""`tritongemm tune`: find the fastest kernel and config for each problem's bucket on this GPU and
write kernel="auto"'s dispatch table (dispatch/table.py).

For every problem every kernel that runs it here is tried with its default config and the
configs that make sense for it (the Hopper tiles for the TMA kernels, the lesson's configs for the
`triton.language` ones), each checked against the fp64 reference, then timed kernel-only as the
benchmarks time them (CUDA graphs, interleaved rounds, medians; bench/measure.py) beside
torch.matmul. A winner other than the rules' choice is then timed eagerly beside it and kept only
if it is not slower there (RULES_MARGIN). The winner goes into the table, which is written after
every problem: an interrupted run keeps what it measured, and a second run skips the buckets the
table has.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

import tritongemm
from tritongemm import dispatch
from tritongemm.bench import Progress, provider, use_interpreter_without_gpu
from tritongemm.bench.environment import describe_environment
from tritongemm.bench.measure import cpu_timer, eager_timer, gpu_timer, measure_problem, operand, runnable_kernels
from tritongemm.bench.report import COLUMNS
from tritongemm.bench.suites import LLM_WEIGHTS, LLM_WEIGHTS_70B, Problem
from tritongemm.core import device_info, registry
from tritongemm.core.config import MatmulConfig
from tritongemm.dispatch import table as dispatch_table
from tritongemm.dispatch.tiles import (
    BIG_CONFIG,
    DEEP_RING_TILES,
    FP32_CONFIG,
    MID_CONFIG,
    MID_TILE,
    SMALL_CONFIG,
    TILES,
)
from tritongemm.ladder import swap_ab
from tritongemm.ladder.grouped import LESSON_CONFIGS

# What a user's GEMMs look like: the LLM suite's token counts on Llama-3-8B's and -70B's weights,
# squares, and odd shapes (a non-multiple of 8, a prime), in both half-precision dtypes.
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SQUARES = (256, 512, 1024, 2048, 4096, 8192)
ODD = ((1000, 1000, 1000), (3000, 5000, 1000), (5000, 3000, 7000), (997, 1009, 1013))
DTYPES = ("float16", "bfloat16")
CPU_SMOKE = (Problem(16, 16, 16, "float32"), Problem(48, 32, 24, "float32", "nt"))


def default_problems(dtypes=DTYPES) -> tuple[Problem, ...]:
    """Every shape in every dtype, the dtypes side by side: a run cut short has both for what it did."""
    shapes = [(m, n, k, "nt") for m in TOKENS for n, k in LLM_WEIGHTS + LLM_WEIGHTS_70B]
    shapes += [(s, s, s, "nn") for s in SQUARES] + [(*shape, "nn") for shape in ODD]
    return tuple(Problem(m, n, k, dtype, layout) for m, n, k, layout in shapes for dtype in dtypes)


# What is tried besides swap_ab and grouped on a skinny problem (candidates): split_k's default,
# and from SKINNY_TMA_MIN_M tokens up, rung 6 on the small tiles with deep rings, the kind of
# kernel cuBLAS runs there (hopper.DEEP_RING_TILES).
SKINNY_ALSO = ("split_k",)
SKINNY_TMA = "tma_persistent_pipelined"
SKINNY_TMA_MIN_M = 32
# A table entry decides a whole bucket on one problem's timing, so a candidate displaces the
# rules' choice only when it is faster by more than the noise between runs (on the H100 the same
# kernel measured 1-3% apart from run to run: results/h100/auto.csv's re-measured rows).
RULES_MARGIN = 0.03
# A winner is found on kernel-only timing, but users mostly call eagerly, and where a kernel is as
# short as a call's host time the two can disagree: at 64 and 128 x 4096 x 4096 (bf16, H100) rung
# 6's deep ring ran 0.94x cuBLAS kernel-only against swap_ab's 0.90x, and 25-26 us a call eagerly
# against swap_ab's 22-23 (results/h100/probes/dense/deep-ring-eager-check.txt; it then encoded TMA descriptors
# for each call's new operands, which primitives/launch.py now keeps by address). So a winner that is not the
# rules' choice is timed eagerly beside it, and kept only if it is not slower there by more than
# RULES_MARGIN.


def candidates(kernel: str, problem: Problem, device: torch.device) -> tuple[MatmulConfig, ...]:
    """The configs tried for a kernel on a problem: its default for the problem first, then the
    others it is built for (the Hopper tiles; the ladder's size classes and the lesson's five;
    swap_ab's tiles; naive, the teaching rung, only its default), each once. Skinny problems
    (dispatch.SKINNY_M) are swap_ab's: besides its tiles only split_k's default and the grouped
    kernel's default and skinny tile are tried there (the other rungs ran 0.30-0.96x cuBLAS and
    never won a bucket at M = 1, results/h100/probes/dense/tune-skinny.csv), and rung 6's deep-ring tiles from
    SKINNY_TMA_MIN_M tokens; swap_ab tries nothing above. The Gluon kernels try the Hopper tiles
    and, on problems too small for two waves of 128 x 128 tiles, the deep-ring ones."""

    info = registry.get(kernel)
    dtype = getattr(torch, problem.dtype)
    M, N, K = problem.M, problem.N, problem.K
    skinny = M <= dispatch.SKINNY_M
    if kernel == "swap_ab" and not skinny:
        return ()
    default = dispatch.default_config(info, dtype, M, N, K, device)
    if device.type != "cuda":
        return (default,)
    if kernel == "swap_ab":
        return tuple(dict.fromkeys((default, *swap_ab.tuning_configs(dtype, M, N, K))))
    if skinny:
        if kernel == "grouped":  # swap_ab's tile, unswapped: the tokens on the rows
            return tuple(dict.fromkeys((default, swap_ab.default_config(dtype, M, N, K, device).with_(split_k=0))))
        if kernel == SKINNY_TMA and M >= SKINNY_TMA_MIN_M:
            return tuple(dict.fromkeys((default, *DEEP_RING_TILES)))
        return (default,) if kernel in SKINNY_ALSO else ()
    if kernel == "naive":
        return (default,)
    if not info.interpretable:  # a Gluon kernel: the Hopper tile table
        few_tiles = MID_TILE.num_tiles(M, N) < 2 * device_info.sm_count(device)
        return tuple(dict.fromkeys((default, *TILES, *(DEEP_RING_TILES if few_tiles else ()))))

    if dtype == torch.float32:
        return tuple(dict.fromkeys((default, FP32_CONFIG)))
    return tuple(dict.fromkeys((default, SMALL_CONFIG, MID_CONFIG, BIG_CONFIG, *LESSON_CONFIGS)))


def tune(
    problems=None, *, path: str | Path | None = None, resume: bool = True, progress: bool = True,
    minutes: float | None = None, rows_path: str | Path | None = None,
):  # fmt: skip
    """Measure `problems` (default: `default_problems()`, or a CPU smoke set without a GPU) and
    write the table to `path` (default: this GPU's user table, which kernel="auto" then reads).
    `minutes`: start no problem after this long (a run resumes where the last one stopped).
    `rows_path`: a CSV that every timed candidate is appended to (bench's columns), to see what
    lost and by how much. Returns the table."""
    import time

    deadline = None if minutes is None else time.monotonic() + 60 * minutes

    on_gpu = use_interpreter_without_gpu()

    env = describe_environment()
    device = torch.device("cuda" if on_gpu else "cpu")
    problems = problems or (default_problems() if on_gpu else CPU_SMOKE)
    path = Path(path) if path else dispatch_table.user_table_path(env["device"])
    table = _existing(path, env["device"]) if resume else None
    table = table or dispatch_table.Table(env["device"], *dispatch_table.versions(), path=path)
    measured = skipped = 0
    with Progress(len(problems), enabled=progress) as advance:
        for done, problem in enumerate(problems):
            dtype = getattr(torch, problem.dtype)
            a = operand(problem.M, problem.K, problem.layout[0] == "t", dtype, device)
            b = operand(problem.K, problem.N, problem.layout[1] == "t", dtype, device)
            bucket = dispatch_table.bucket_of(a, b)
            if bucket in table.entries:
                skipped += 1
                advance(f"{problem.label()} {problem.dtype}: in the table")
                continue
            if deadline is not None and time.monotonic() > deadline:
                left = len(problems) - done
                print(f"stopped at the {minutes}-minute budget with {left} problems left: run again to go on")
                break
            providers = [("cublas", "torch.matmul", provider(torch.matmul, False))]
            configs = {}  # (kernel, config label) -> config, for the eager check
            for kernel in runnable_kernels(dtype, device):
                for config in candidates(kernel, problem, device):
                    call = provider(tritongemm.matmul, False, kernel=kernel, config=config)
                    providers.append((kernel, config.short(), call))
                    configs[kernel, config.short()] = config
            measure = functools.partial(
                measure_problem, problem, device=device, device_name=env["device"], l2_bytes=env["l2_bytes"]
            )
            rows = measure(providers, timer=gpu_timer if on_gpu else cpu_timer)
            cublas = next(r for r in rows if r.kernel == "cublas")
            timed = [r for r in rows if r.kernel != "cublas" and r.ms]
            if timed and cublas.ms:
                best, rules = winner(timed, rules_choice(a, b, problem))
                checked = {}  # the eager check's times (ms a call), when there was one
                if rules is not None and best is not rules:
                    eager = eager_times(functools.partial(measure, timer=eager_timer if on_gpu else cpu_timer),
                                        configs, best, rules)  # fmt: skip
                    rows += eager.values()
                    if not eager_confirms(eager, best, rules):  # the rules' choice stays
                        checked = dict(rejected=f"{best.kernel} {best.config}", rejected_ms=best.ms,
                                       rejected_eager_ms=eager_ms(eager, best))  # fmt: skip
                        best = rules
                    checked |= dict(eager_ms=eager_ms(eager, best), rules_eager_ms=eager_ms(eager, rules))
                table.entries[bucket] = dict(
                    kernel=best.kernel, config=best.config, problem=[problem.M, problem.N, problem.K],
                    ms=best.ms, cublas_ms=cublas.ms, rules_ms=rules.ms if rules else None,
                    tried=len(providers) - 1, correct=len(timed), **checked,
                )  # fmt: skip
                table.save(path)
                measured += 1
            if rows_path is not None:
                _append_rows(Path(rows_path), rows)
            advance(f"{problem.label()} {problem.dtype}")
    print(f"{measured} buckets measured, {skipped} already in the table; wrote {path}")
    dispatch_table.reload()  # kernel="auto" reads the new table for every plan built from now on,
    tritongemm.plans.clear()  # and the plans it chose before are rebuilt
    return table


def rules_choice(a: torch.Tensor, b: torch.Tensor, problem: Problem) -> tuple[str, str]:
    """(kernel, config label) that kernel="auto" takes for the problem without a table."""

    dtype = getattr(torch, problem.dtype)
    info, config, _ = dispatch.choose("auto", None, a, b, dtype, use_table=False)
    config = config or dispatch.default_config(info, dtype, problem.M, problem.N, problem.K, a.device)
    return info.name, config.short()


def winner(timed: list, rules: tuple[str, str]):
    """(the row the table keeps, the rules' row or None) among a problem's timed rows: the fastest,
    unless the rules' choice is within RULES_MARGIN of it."""
    best = min(timed, key=lambda r: r.ms)
    ruled = next((r for r in timed if (r.kernel, r.config) == rules), None)
    if ruled is not None and ruled.ms * (1 - RULES_MARGIN) <= best.ms:
        return ruled, ruled
    return best, ruled


def key(row) -> tuple[str, str]:
    return row.kernel, row.config


def eager_times(measure, configs: dict, best, rules) -> dict:
    """{(kernel, config label): eager row} for the kernel-only winner, the rules' choice and cuBLAS,
    timed in the same interleaved rounds, eager calls as a user makes them (bench.measure's "eager";
    `measure` brings the wall-clock timer)."""

    pair = [(r.kernel, r.config, provider(tritongemm.matmul, True, kernel=r.kernel, config=configs[key(r)]))
            for r in (best, rules)]  # fmt: skip
    rows = measure([("cublas", "torch.matmul", provider(torch.matmul, True)), *pair], timing="eager")
    return {key(row): row for row in rows}


def eager_ms(eager: dict, row) -> float | None:
    found = eager.get(key(row))
    return found.ms if found is not None else None


def eager_confirms(eager: dict, best, rules) -> bool:
    """Whether the kernel-only winner is no slower eagerly than the rules' choice, within the margin
    (an eager time that failed counts against the winner)."""
    ours, theirs = eager_ms(eager, best), eager_ms(eager, rules)
    if not ours:
        return False
    return not theirs or ours <= theirs * (1 + RULES_MARGIN)


def _append_rows(path: Path, rows) -> None:
    import csv

    new = not path.is_file()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(r.as_dict() for r in rows)


def _existing(path: Path, device: str):

    if not path.is_file():
        return None
    table = dispatch_table.Table.from_json(path.read_text(), path)
    return table if table is not None and table.device == device else None
