"""PNG pictures of benchmark rows: TFLOP/s against K per kernel (with cuBLAS), per-shape bars of
the ratio to cuBLAS, per-shape bars of the time of one eager call (`bench overhead`), of the fused
epilogue's speed against the unfused path's (`bench epilogue`), of a model's forward against
eager torch's (`bench model`), of the gated MLP block's against torch's (`bench mlp`), and of
the grouped GEMMs' against torch._grouped_mm's (`bench grouped`)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tritongemm.bench.measure import Row
from tritongemm.tools import figures


def plot_k_sweep(rows: list[Row], path: Path, title: str) -> Path:
    """One panel per dtype: TFLOP/s vs K, a line per kernel, cuBLAS dashed."""
    plt = figures.pyplot()
    dtypes = sorted({r.dtype for r in rows})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        lines = defaultdict(list)
        for r in rows:
            if r.dtype == dtype and r.tflops:
                lines[r.kernel].append((r.k, r.tflops))
        for kernel, points in lines.items():
            ks, tflops = zip(*sorted(points))
            style = dict(color="black", linestyle="--", linewidth=2) if kernel == "cublas" else {}
            ax.plot(ks, tflops, marker="o", label=kernel, **style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{dtype}, M = N = {rows[0].m}" if rows else dtype)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return figures.save(fig, path, dpi=110)


def plot_ratios(rows: list[Row], path: Path, title: str, series=lambda r: r.kernel) -> Path:
    """Grouped bars: for every problem, each series' (by default each kernel's) speed as a
    fraction of cuBLAS's."""
    plt = figures.pyplot()
    problems = list(dict.fromkeys((r.dtype, r.layout, r.m, r.n, r.k) for r in rows))
    kernels = list(dict.fromkeys(series(r) for r in rows if r.kernel != "cublas"))
    ratio = {((r.dtype, r.layout, r.m, r.n, r.k), series(r)): r.ratio_to_cublas for r in rows}
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(problems) * max(1, len(kernels)) / 2), 5))
    _ratio_bars(ax, problems, kernels, lambda p, k: ratio.get((p, k)), "cuBLAS", "speed / cuBLAS speed",
                lambda p: f"{p[2]}x{p[3]}x{p[4]}\n{p[0]} {p[1]}", rotation=60)  # fmt: skip
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=2)
    return figures.save(fig, path, dpi=110)


def _ratio_bars(ax, groups: list, series: list, ratio, baseline: str, ylabel: str, tick, rotation=0, fontsize=7):
    """Grouped bars on `ax`: for every group, each series' `ratio(group, series)` (0 where there
    is none), beside a dashed line at 1 for `baseline`, the series' common reference."""
    width = 0.8 / max(1, len(series))
    for i, name in enumerate(series):
        xs = [p + i * width for p in range(len(groups))]
        ax.bar(xs, [ratio(group, name) or 0.0 for group in groups], width=width, label=name)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label=baseline)
    ax.set_xticks([p + 0.4 - width / 2 for p in range(len(groups))])
    ax.set_xticklabels([tick(group) for group in groups], rotation=rotation, fontsize=fontsize)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def plot_overhead(rows: list, path: Path, title: str) -> Path:
    """A panel per op (matmul, linear, ...): for every problem, microseconds per eager call of the
    op's torch counterpart (black) and of tritongemm with each kernel. `rows` are
    bench.overhead.OverheadRow."""
    plt = figures.pyplot()
    ops = list(dict.fromkeys(r.op for r in rows))
    panels = [[r for r in rows if r.op == op] for op in ops]
    # Wide enough for every panel's bars (0.22 in each) and its shape labels (~1.1 in each, at fontsize 7).
    problems = [len({(r.dtype, r.layout, r.label()) for r in p}) for p in panels]
    bars = max(n * (1 + len({r.kernel for r in p})) for n, p in zip(problems, panels))
    width = max(8, 0.22 * bars, 1.2 * max(problems))
    fig, axes = plt.subplots(len(ops), 1, figsize=(width, 4.2 * len(ops)), squeeze=False)
    times = [t for r in rows for t in (r.us_per_call, r.torch_us_per_call) if t]
    log = bool(times) and max(times) > 30 * min(times)  # the interpreter smoke run: ms against us
    for i, (ax, op, panel) in enumerate(zip(axes[:, 0], ops, panels)):
        _overhead_panel(ax, panel, log)
        ax.set_title(f"{title}\n{op}" if i == 0 else op, fontsize=10)  # not suptitle: tight_layout overlaps it
    return figures.save(fig, path, dpi=110)


def _overhead_panel(ax, rows: list, log: bool) -> None:
    """Grouped bars on `ax` for rows of one op: per problem, the torch counterpart, then each kernel."""
    key = lambda r: (r.dtype, r.layout, r.label())  # noqa: E731
    problems = list(dict.fromkeys(key(r) for r in rows))
    kernels = list(dict.fromkeys(r.kernel for r in rows))
    us = {(key(r), r.kernel): r.us_per_call for r in rows} | {(key(r), None): r.torch_us_per_call for r in rows}
    series = [(None, rows[0].baseline)] + [(k, f"tritongemm {k}") for k in kernels]
    width = 0.8 / len(series)
    for i, (kernel, label) in enumerate(series):
        xs = [p + i * width for p in range(len(problems))]
        ys = [us.get((problem, kernel)) or float("nan") for problem in problems]
        ax.bar(xs, ys, width=width, label=label, **(dict(color="black") if kernel is None else {}))
    ax.set_xticks([p + 0.4 - width / 2 for p in range(len(problems))])
    ax.set_xticklabels([f"{shape}\n{d} {lay}" for d, lay, shape in problems], fontsize=7)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("us per call (eager, lower is better)", fontsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)


def plot_epilogue(rows: list, path: Path, title: str) -> Path:
    """A panel per (timing, epilogue): for every shape, each provider's speed as a fraction of the
    unfused path's (F.linear + torch, the dashed line). `rows` are bench.epilogue.EpilogueRow."""
    plt = figures.pyplot()
    timings = list(dict.fromkeys(r.timing for r in rows))
    epilogues = list(dict.fromkeys(r.epilogue for r in rows))
    providers = list(dict.fromkeys(r.provider for r in rows if r.provider != "cublas+torch"))
    key = lambda r: (r.m, r.n, r.k, r.dtype)  # noqa: E731
    ratio = {(r.timing, r.epilogue, key(r), r.provider): r.ratio_to_unfused for r in rows}
    most = max((len({key(r) for r in rows if r.epilogue == e}) for e in epilogues), default=1)
    fig, axes = plt.subplots(
        len(timings), len(epilogues), figsize=(max(5, 0.3 * most * max(1, len(providers))) * len(epilogues),
                                               4.5 * len(timings)), squeeze=False,
    )  # fmt: skip
    for row_axes, timing in zip(axes, timings):
        for ax, epilogue in zip(row_axes, epilogues):
            shapes = list(dict.fromkeys(key(r) for r in rows if r.epilogue == epilogue and r.timing == timing))
            _ratio_bars(ax, shapes, providers, lambda shape, p, t=timing, e=epilogue: ratio.get((t, e, shape, p)),
                        "F.linear + torch (unfused)", "speed / unfused speed",
                        lambda shape: "{}x{}x{}\n{}".format(*shape), rotation=60)  # fmt: skip
            ax.set_title(f"{epilogue}, {timing} timing", fontsize=10)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    return figures.save(fig, path, dpi=110)


CLIP = 1.6  # plot_ratio_vs_m's top


def plot_ratio_vs_m(rows: list[Row], path: Path, title: str) -> Path:
    """One panel per timing (graph, eager): each non-cuBLAS row's speed / cuBLAS's against M, a
    line per weight (N x K, NT layout) and dtype, the other shapes as points; lines at 1 and 0.9."""
    plt = figures.pyplot()
    timings = [t for t in ("graph", "eager") if any(r.timing == t for r in rows)]
    fig, axes = plt.subplots(1, len(timings), figsize=(7 * len(timings), 5), squeeze=False, sharey=True)
    for ax, timing in zip(axes[0], timings):
        lines, points = defaultdict(list), defaultdict(list)
        for r in rows:
            if r.timing != timing or r.kernel == "cublas" or not r.ratio_to_cublas:
                continue
            if r.layout == "nt":
                lines[(r.n, r.k, r.dtype)].append((r.m, r.ratio_to_cublas))
            else:
                points[r.dtype].append((r.m, r.ratio_to_cublas))
        for (n, k, dtype), pts in sorted(lines.items()):
            ms, ratios = zip(*sorted(pts))
            ax.plot(ms, ratios, marker="o", linestyle="-" if dtype == "bfloat16" else ":", label=f"{n}x{k} {dtype}")
        for dtype, pts in sorted(points.items()):
            ms, ratios = zip(*pts)
            ax.scatter(ms, ratios, marker="x", s=30, label=f"other shapes, {dtype}")
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.axhline(0.9, color="grey", linestyle=":", linewidth=1)
        # A far outlier (cuBLAS slow on rows TMA can't read) would flatten the rest: clip, and say so.
        high = [r for pts in (*lines.values(), *points.values()) for _, r in pts if r > CLIP]
        if high:
            ax.set_ylim(top=CLIP)
            ax.text(0.99, 0.98, f"{len(high)} point(s) above {CLIP}x, up to {max(high):.2f}x", transform=ax.transAxes,
                    ha="right", va="top", fontsize=7)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("speed / cuBLAS speed")
        ax.set_title("kernel only (CUDA graphs)" if timing == "graph" else "eager calls (host time included)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(title)
    return figures.save(fig, path, dpi=110)


def plot_fp8(rows: list, path: Path, title: str) -> Path:
    """A panel per (timing, recipe): tritongemm.scaled_mm's speed / torch._scaled_mm's (the
    dashed line) per shape, and each fp8 kernel's timed by name beside it. `rows` are
    bench.fp8.Fp8Row; a recipe torch refused has no bars."""
    plt = figures.pyplot()
    timings = list(dict.fromkeys(r.timing for r in rows))
    recipes = list(dict.fromkeys(r.recipe for r in rows))
    key = lambda r: (r.m, r.n, r.k)  # noqa: E731
    ratio = {(r.timing, r.recipe, key(r), r.provider): r.ratio_to_torch for r in rows}
    ours = list(dict.fromkeys(r.provider for r in rows if r.provider != "torch"))
    most = max((len({key(r) for r in rows if r.recipe == e}) for e in recipes), default=1)
    fig, axes = plt.subplots(len(timings), len(recipes), figsize=(max(5, 0.35 * most) * len(recipes),
                                                                  4.5 * len(timings)), squeeze=False)  # fmt: skip
    for row_axes, timing in zip(axes, timings):
        for ax, recipe in zip(row_axes, recipes):
            shapes = list(dict.fromkeys(key(r) for r in rows if r.recipe == recipe and r.timing == timing))
            _ratio_bars(ax, shapes, ours, lambda shape, p, t=timing, e=recipe: ratio.get((t, e, shape, p)),
                        "torch._scaled_mm", "speed / torch's", lambda shape: "{}x{}x{}".format(*shape),
                        rotation=60)  # fmt: skip
            ax.set_title(f"{recipe}-wise scales, {timing} timing", fontsize=10)
            if len(ours) > 1:  # "tritongemm" is scaled_mm's own choice; the others, kernels by name
                ax.legend(fontsize=7)
    fig.suptitle(title)
    return figures.save(fig, path, dpi=110)


def plot_mlp(rows: list, path: Path, title: str) -> Path:
    """A panel per (direction, timing): each provider's speed / the unfused torch block's (the
    dashed line), per MLP and token count. `rows` are bench.mlp.MlpRow."""
    plt = figures.pyplot()
    panels = list(dict.fromkeys((r.direction, r.timing) for r in rows))
    providers = list(dict.fromkeys(r.provider for r in rows if r.provider != "torch"))
    ratio = {(r.direction, r.timing, r.model, r.tokens, r.provider): r.ratio_to_torch for r in rows}
    groups = list(dict.fromkeys((r.model, r.tokens) for r in rows))
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 0.5 * len(groups) * len(providers)), 4 * len(panels)),
                             squeeze=False)  # fmt: skip
    for ax, (direction, timing) in zip(axes[:, 0], panels):
        _ratio_bars(ax, groups, providers, lambda g, p, d=direction, t=timing: ratio.get((d, t, *g, p)),
                    "torch (unfused)", "speed / torch's", lambda g: f"{g[0]}\n{g[1]} tokens")  # fmt: skip
        ax.set_title(f"{direction}, {timing} timing", fontsize=10)
        ax.legend(fontsize=7, ncol=len(providers) + 1)
    fig.suptitle(title)
    return figures.save(fig, path, dpi=110)


def plot_grouped(rows: list, path: Path, title: str) -> Path:
    """A panel per timing: each provider's speed / torch._grouped_mm's (the dashed line), per MoE
    layer and token count. `rows` are bench.grouped.GroupedRow."""
    plt = figures.pyplot()
    timings = list(dict.fromkeys(r.timing for r in rows))
    providers = list(dict.fromkeys(r.provider for r in rows if r.provider != "torch._grouped_mm"))
    ratio = {(r.timing, r.experts, r.topk, r.n, r.k, r.tokens, r.provider): r.ratio_to_torch for r in rows}
    groups = list(dict.fromkeys((r.experts, r.topk, r.n, r.k, r.tokens) for r in rows))
    fig, axes = plt.subplots(len(timings), 1, figsize=(max(8, 0.45 * len(groups) * len(providers)), 4 * len(timings)),
                             squeeze=False)  # fmt: skip
    for ax, timing in zip(axes[:, 0], timings):
        _ratio_bars(ax, groups, providers, lambda g, p, t=timing: ratio.get((t, *g, p)), "torch._grouped_mm",
                    "speed / torch's", lambda g: f"{g[0]} x top-{g[1]}\n{g[2]}x{g[3]}\n{g[4]} tokens")  # fmt: skip
        ax.set_title("kernel only (CUDA graphs)" if timing == "graph" else "eager calls (host time included)")
        ax.legend(fontsize=7, ncol=len(providers) + 1)
    fig.suptitle(title)
    return figures.save(fig, path, dpi=110)


def plot_decode(rows: list, path: Path, title: str) -> Path:
    """A panel per model: each provider's decode step speed / eager torch's captured step (the
    dashed line), per batch, and beside it the GEMM weights' read speed in TB/s. `rows` are
    bench.decode.DecodeRow."""
    plt = figures.pyplot()
    models = list(dict.fromkeys(r.model for r in rows))
    providers = list(dict.fromkeys(r.provider for r in rows if r.provider != "torch"))
    everyone = list(dict.fromkeys(r.provider for r in rows))
    ratio = {(r.model, r.batch, r.provider): r.ratio_to_torch for r in rows}
    tbps = {(r.model, r.batch, r.provider): r.weight_GBps / 1e3 if r.weight_GBps else None for r in rows}
    fig, axes = plt.subplots(len(models), 2, figsize=(16, 4 * len(models)), squeeze=False)
    for (speed, bandwidth), model in zip(axes, models):
        batches = list(dict.fromkeys(r.batch for r in rows if r.model == model))
        _ratio_bars(speed, batches, providers, lambda b, p, m=model: ratio.get((m, b, p)), "torch (captured)",
                    "step speed / torch's", lambda b: f"batch {b}")  # fmt: skip
        speed.set_title(f"{model}: decode step, CUDA graph", fontsize=10)
        speed.legend(fontsize=7)
        for p in everyone:
            bandwidth.plot(batches, [tbps.get((model, b, p)) or float("nan") for b in batches], marker="o", label=p)
        bandwidth.set_xscale("log", base=2)
        bandwidth.set_xlabel("batch (sequences in flight)")
        bandwidth.set_ylabel("GEMM weights read, TB/s")
        bandwidth.set_title(f"{model}: weight bytes / GEMM kernel time", fontsize=10)
        bandwidth.grid(alpha=0.3)
        bandwidth.legend(fontsize=7)
    fig.suptitle(title)
    return figures.save(fig, path, dpi=110)
