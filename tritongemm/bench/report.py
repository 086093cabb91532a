"""Results as data (CSV, JSON) and as a table for the terminal. Measuring lives in measure.py,
pictures in plots.py."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

from tritongemm.bench.environment import describe_environment
from tritongemm.bench.measure import Row
from tritongemm.bench.plots import plot_ratio_vs_m

COLUMNS = list(Row.__dataclass_fields__)


def csv_fields(columns: list[str]) -> list[str]:
    """A results CSV's header: `columns`, with "triton" after "device". One GPU's suites differ
    between Triton releases (issue 66), so each row says which one compiled its kernels."""
    at = columns.index("device") + 1 if "device" in columns else 0
    return [*columns[:at], "triton", *columns[at:]]


def write_results(
    rows: list, env: dict, out_dir: Path, name: str, columns: list[str] = COLUMNS, json_rows: list | None = None
) -> tuple[Path, Path]:
    """`name`.csv (one row per measurement, `columns` of each row's as_dict(), and after `device`
    the Triton that compiled the kernels, from `env`) and `name`.json (the environment and the
    whole rows; `json_rows` instead where given, e.g. the untimed too)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / f"{name}.csv", out_dir / f"{name}.json"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=csv_fields(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**r.as_dict(), "triton": env.get("triton")} for r in rows)
    json_path.write_text(
        json.dumps({"environment": env, "rows": [r.as_dict() for r in json_rows or rows]}, indent=1) + "\n"
    )
    return csv_path, json_path


def write_dicts(path, rows: list[dict]) -> None:
    """rows (dicts with the same keys, in column order) as a CSV at `path`: the probe scripts'
    output."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_rows(csv_path: Path) -> list[dict]:
    """The rows of a results CSV; those written before the timing column existed were "graph"."""
    with Path(csv_path).open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.setdefault("timing", "graph")
    return rows


def rows_from_csv(csv_path: Path) -> list[Row]:
    """The Rows of a results CSV written with COLUMNS, typed again (read_rows gives strings)."""
    kinds = {"m": int, "n": int, "k": int, "ms": float, "tflops": float, "ratio_to_cublas": float, "max_rel_err": float}

    def typed(name, text):
        return None if text in ("", "None") else kinds.get(name, str)(text)

    return [Row(**{name: typed(name, row[name]) for name in COLUMNS}) for row in read_rows(csv_path)]


def combine_timings(out_dir: Path, name: str) -> tuple[Path, ...]:
    """`name`.csv (kernel-only rows) and `name`-eager.csv, as written by `bench NAME` and `bench
    NAME --timing eager`, into one `name`.csv and .json with both timings (the `timing` column
    tells them apart), the graph run's environment with the eager run's date, and a picture of
    the ratio to cuBLAS against M for each timing. The -eager files are left as they are."""
    out_dir = Path(out_dir)
    graph, eager = (rows_from_csv(out_dir / f"{base}.csv") for base in (name, f"{name}-eager"))
    if {r.timing for r in graph} != {"graph"} or {r.timing for r in eager} != {"eager"}:
        raise ValueError(f"combine_timings: expected {name}.csv of graph rows and {name}-eager.csv of eager rows")
    env = json.loads((out_dir / f"{name}.json").read_text())["environment"]
    env["eager_date"] = json.loads((out_dir / f"{name}-eager.json").read_text())["environment"].get("date")
    rows = graph + eager
    paths = write_results(rows, env, out_dir, name)
    title = f"kernel='auto' / cuBLAS on {env.get('device', '?')}, {env.get('date', '')[:10]}"
    return (*paths, plot_ratio_vs_m(rows, out_dir / f"{name}.png", title))


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def kernel_label(kernel: str, on_gpu: bool) -> str:
    """A row's kernel as tables name it. The baseline's rows say "cublas" in the data (the ratios
    and the committed results key on it) but are torch.matmul, which is cuBLAS only on a GPU."""
    if kernel != "cublas":
        return kernel
    return "cuBLAS (torch.matmul)" if on_gpu else "torch.matmul (CPU)"


def format_table(rows: list[Row], on_gpu: bool = True) -> str:
    """Fixed-width table: one line per measurement, grouped by problem."""
    versus = "vs cuBLAS" if on_gpu else "vs torch"
    header = f"{'dtype':<9} {'layout':<6} {'shape':>18} {'kernel':<25} {'config':<26} {'ms':>9} {'TFLOP/s':>8} {versus:>9} {'rel err':>8}  status"  # noqa: E501
    return _grouped_table(
        header,
        rows,
        lambda r: (
            f"{r.dtype:<9} {r.layout:<6} {f'{r.m}x{r.n}x{r.k}':>18} {kernel_label(r.kernel, on_gpu):<25} "
            f"{r.config[:26]:<26} {_fmt(r.ms, '9.4f')} {_fmt(r.tflops, '8.1f')} {_fmt(r.ratio_to_cublas, '9.3f')} "
            f"{_fmt(r.max_rel_err, '8.1e')}  {r.status}"
        ),
    )


def format_overhead_table(rows: list) -> str:
    """`bench overhead`'s table: one line per (op, problem, kernel), the time of the op's torch
    counterpart beside ours and the gap (ours - torch). A blank line after each op, and around
    each problem timed with several kernels. `rows` are bench.overhead.OverheadRow."""
    header = f"{'op':<14} {'dtype':<9} {'layout':<6} {'shape':>18} {'kernel':<25} {'us/call':>9} {'torch us':>9} {'gap us':>7} {'vs torch':>8} {'rel err':>8}  status"  # noqa: E501

    def line(r) -> str:
        timed = r.us_per_call and r.torch_us_per_call
        ratio = r.torch_us_per_call / r.us_per_call if timed else None
        gap = r.us_per_call - r.torch_us_per_call if timed else None
        return (
            f"{r.op:<14} {r.dtype:<9} {r.layout:<6} {r.label():>18} {r.kernel:<25} {_fmt(r.us_per_call, '9.1f')} "
            f"{_fmt(r.torch_us_per_call, '9.1f')} {_fmt(gap, '+7.1f')} {_fmt(ratio, '8.2f')} "
            f"{_fmt(r.max_rel_err, '8.1e')}  {r.status}"
        )

    problem = lambda r: (r.op, r.dtype, r.layout, r.label())  # noqa: E731
    kernels = Counter(problem(r) for r in rows)
    group = lambda r: problem(r) if kernels[problem(r)] > 1 else (r.op,)  # noqa: E731
    baselines = ", ".join(f"{op}: {baseline}" for op, baseline in dict.fromkeys((r.op, r.baseline) for r in rows))
    return f"torch us: each op's torch counterpart ({baselines})\n" + _grouped_table(header, rows, line, key=group)


def format_epilogue_table(rows: list, on_gpu: bool = True) -> str:
    """`bench epilogue`'s table: one line per (problem, timing, provider). `rows` are
    bench.epilogue.EpilogueRow."""
    versus = "vs unfused"
    header = f"{'dtype':<9} {'epilogue':<14} {'shape':>18} {'timing':<6} {'provider':<20} {'ms':>9} {'TFLOP/s':>8} {versus:>10} {'rel err':>8}  status"  # noqa: E501

    def line(r) -> str:
        provider = "torch (CPU)" if r.provider == "cublas+torch" and not on_gpu else r.provider
        return (
            f"{r.dtype:<9} {r.epilogue:<14} {f'{r.m}x{r.n}x{r.k}':>18} {r.timing:<6} {provider:<20} "
            f"{_fmt(r.ms, '9.4f')} {_fmt(r.tflops, '8.1f')} {_fmt(r.ratio_to_unfused, '10.3f')} "
            f"{_fmt(r.max_rel_err, '8.1e')}  {r.status}"
        )

    return _grouped_table(header, rows, line, key=lambda r: (r.epilogue, r.dtype, r.m, r.n, r.k))


def _grouped_table(header: str, rows: list, line, key=lambda r: (r.dtype, r.layout, r.m, r.n, r.k)) -> str:
    """The header, a rule, then `line(row)` for each row, a blank line between problems (`key`)."""
    lines = [header, "-" * len(header)]
    previous = None
    for r in rows:
        problem = key(r)
        if previous is not None and problem != previous:
            lines.append("")
        previous = problem
        lines.append(line(r))
    return "\n".join(lines)


MARKDOWN_COLUMNS = ("dtype", "layout", "m", "n", "k", "kernel", "config", "tflops", "ratio_to_cublas", "status")


def markdown_pivot(rows: list[dict]) -> str:
    """A markdown table from CSV rows: one line per problem (and config, in sweeps), one column
    per kernel, each cell `TFLOP/s (ratio to cuBLAS)`."""
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    # A sweep runs configs that were asked for; each kernel's own default ("default 128x256x64 ...")
    # differs from kernel to kernel and from problem to problem without making one.
    asked = lambda r: "" if r["config"].startswith("default") else r["config"]  # noqa: E731
    sweep = len({asked(r) for r in rows if r["kernel"] != "cublas"}) > 1
    key = lambda r: (r["dtype"], r["layout"], r["m"], r["n"], r["k"]) + ((asked(r),) if sweep else ())  # noqa: E731
    cells: dict[tuple, dict[str, str]] = {}
    baseline: dict[tuple, str] = {}
    for r in rows:
        problem = (r["dtype"], r["layout"], r["m"], r["n"], r["k"])
        if r["kernel"] == "cublas":
            baseline[problem] = f"{float(r['tflops']):.0f}" if r["tflops"] else r["status"]
            continue
        value = f"{float(r['tflops']):.0f} ({float(r['ratio_to_cublas']):.2f})" if r["tflops"] else r["status"]
        cells.setdefault(key(r), {})[r["kernel"]] = value
    ours = [k for k in kernels if k != "cublas"]
    head = ["dtype", "layout", "M x N x K"] + (["config"] if sweep else []) + ["cuBLAS"] + ours
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k, by_kernel in cells.items():
        dtype, layout, m, n, kk = k[:5]
        first = [dtype, layout, f"{m} x {n} x {kk}"] + ([k[5]] if sweep else [])
        lines.append(
            "| " + " | ".join(first + [baseline.get(k[:5], "-")] + [by_kernel.get(x, "") for x in ours]) + " |"
        )
    return "\n".join(lines)


# Issue 14's bars for kernel="auto", as ratios to cuBLAS in the same run: (geomean, worst) per
# timing, and kernel-only at least 1.0 on every row with M <= 128.
AUTO_TARGETS = {"graph": (1.05, 0.90), "eager": (1.00, 0.85)}
AUTO_SKINNY_M, AUTO_SKINNY_BAR = 128, 1.0


def auto_scorecard(rows: list[Row]) -> str:
    """Where `auto`'s rows (the auto suite's CSVs) stand against AUTO_TARGETS: geomean and worst
    per timing, then every row that misses a bar, worst first."""
    lines = []
    for timing, (geomean_bar, worst_bar) in AUTO_TARGETS.items():
        rows_here = [r for r in rows if r.timing == timing and r.kernel == "auto" and r.ratio_to_cublas]
        if not rows_here:
            continue
        ratios = [r.ratio_to_cublas for r in rows_here]
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"{timing}: {len(ratios)} rows, geomean {geomean:.2f} (bar {geomean_bar}), "
                     f"worst {min(ratios):.2f} (bar {worst_bar})")  # fmt: skip

        bars = [(r, _auto_bar(r, timing, worst_bar)) for r in rows_here]
        misses = sorted(((r, b) for r, b in bars if r.ratio_to_cublas < b), key=lambda rb: rb[0].ratio_to_cublas)
        lines.append(f"  {len(misses)} rows under their bar:")
        lines += [f"  {r.ratio_to_cublas:6.3f} < {b:.2f}  {r.dtype:9s} {r.layout} {r.m}x{r.n}x{r.k}  {r.config}"
                  for r, b in misses]  # fmt: skip
    return "\n".join(lines)


def _auto_bar(row: Row, timing: str, worst_bar: float) -> float:
    skinny = timing == "graph" and row.m <= AUTO_SKINNY_M
    return max(worst_bar, AUTO_SKINNY_BAR) if skinny else worst_bar


def newest_rows(*csv_paths: Path) -> list[Row]:
    """The rows of several results CSVs, a later file's row replacing an earlier one's for the same
    problem, kernel and timing (a re-measure of part of a suite)."""
    merged = {}
    for path in csv_paths:
        for r in rows_from_csv(path):
            merged[(r.dtype, r.layout, r.m, r.n, r.k, r.kernel, r.timing)] = r
    return list(merged.values())


def write_remeasured(base: Path, *remeasures: Path) -> tuple[Path, ...]:
    """Rewrite a suite's results `base` (CSV, JSON, plot of the ratio against M) with the rows of
    later partial runs in place of its own (newest_rows: a problem's cuBLAS and kernel rows both
    come from the run that re-measured it), for the kernels base holds. The JSON keeps base's
    environment and names each re-measure and its date under "remeasured"; the partial CSVs
    stay, as the raw record."""
    base = Path(base)
    kernels = {r.kernel for r in rows_from_csv(base)}  # a re-measure's other kernels stay in its own CSV
    rows = [r for r in newest_rows(base, *remeasures) if r.kernel in kernels]
    env = json.loads(base.with_suffix(".json").read_text())["environment"]
    for path in map(Path, remeasures):
        date = json.loads(path.with_suffix(".json").read_text())["environment"].get("date")
        problems = {(r.dtype, r.layout, r.m, r.n, r.k) for r in rows_from_csv(path)}
        entry = {"file": path.name, "date": date, "problems": len(problems)}
        env["remeasured"] = [e for e in env.get("remeasured", []) if e["file"] != path.name] + [entry]
    paths = write_results(rows, env, base.parent, base.stem)
    title = f"kernel='auto' / cuBLAS on {env.get('device', '?')}, {env.get('date', '')[:10]}"
    if env.get("remeasured"):
        title += f" (part re-measured {max(e['date'] or '' for e in env['remeasured'])[:10]})"
    return (*paths, plot_ratio_vs_m(rows, base.with_suffix(".png"), title))


def problems_here(suite, cpu_smoke, name: str | None, default: str) -> tuple[list, str]:
    """(problems, base file name) for an own suite on this machine: the suite as `default` on a
    GPU; without one a smoke run of tiny problems under the Triton interpreter, "<default>-cpu",
    said on stdout. Call before anything imports the kernels (Triton reads TRITON_INTERPRET then)."""
    import os

    import torch

    if torch.cuda.is_available():
        return list(suite), name or default
    os.environ.setdefault("TRITON_INTERPRET", "1")
    print("No CUDA GPU: tiny problems under the Triton interpreter; times say nothing about GPU speed.")
    return list(cpu_smoke), name or f"{default}-cpu"


def run_suite(problems, measure, *, name: str, out_dir: str | Path | None, columns: list[str], timings,
              rounds: int) -> tuple[list, dict, tuple[Path, ...]]:  # fmt: skip
    """The loop the own suites (fp8, grouped, mlp) share: each problem measured on this machine's
    device (`measure(problem, device=, device_name=, timings=, rounds=) -> rows`), its progress
    printed, and after each one `out_dir`/`name`.csv (the timed rows, `columns`) and .json (every
    row) rewritten, so an interrupted run keeps what it measured. Returns (rows, the environment,
    the paths written)."""
    import time

    import torch

    env = describe_environment()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows: list = []
    paths: tuple[Path, ...] = ()
    start = time.perf_counter()
    for problem in problems:
        rows += measure(problem, device=device, device_name=env["device"], timings=timings, rounds=rounds)
        print(f"[{time.perf_counter() - start:.0f} s] {problem.label()}", flush=True)
        if out_dir is not None:
            timed = [r for r in rows if r.ms is not None]
            paths = write_results(timed, env, Path(out_dir), name, columns=columns, json_rows=rows)
    return rows, env, paths
