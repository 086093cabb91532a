"""`tritongemm l2`: how many bytes of A and B come from DRAM, per wave and for the whole GEMM.

A program computing tile (pid_m, pid_n) streams the A row-panel pid_m (BLOCK_M rows x K) and the
B column-panel pid_n (K x BLOCK_N) through L2. Programs that run at the same time and share a
panel let L2 serve it once; the tile ordering decides how many they share.

The model, in four assumptions:
1. The programs of one wave (`launch.Launch.wave`: num_sms x programs per SM consecutive
   programs, or step s of every persistent program) start together and walk K at the same pace,
   so a panel the wave touches is fetched from DRAM once per wave however many programs read it.
   L2 then needs to hold only the K-slices in flight, (A + B panels of the wave) x BLOCK_K x
   stages, a few MB at most: true on an H100 (50 MB).
2. A panel used again in a later wave is still in L2 only if everything touched since its last
   use fits: the distinct panels of the waves from its last use up to the previous wave, at
   full K, take at most `l2_bytes` (LRU stack distance at panel granularity). On an H100 at
   8192^3 a wave of 128x256 tiles touches 93 MB (GROUP_SIZE_M = 8) to 147 MB (column-major) of
   panels, so waves do not share through L2; at K = 512 all of A and B (17 MB) fit and every
   panel is fetched once.
3. The ideal is each input read once: M x K + K x N elements. C is written once (M x N), in
   every ordering alike.
4. Hit rate as Nsight Compute counts it (lts__t_sector_hit_rate): requests are the A and B bytes
   every program loads (edge tiles load only in-bounds rows) plus the C stores; misses are the
   DRAM fetches. ncu counts every store as a hit (L2 is write-back; NVIDIA's profiler forum:
   "all stores are considered hits, only loads cause misses"). No L2 partitioning, no prefetch,
   no eviction by C.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritongemm.tools import figures
from tritongemm.tools import launch as launch_mod
from tritongemm.tools.launch import H100, ITEMSIZE, Launch

GROUP_SIZES = (1, 2, 4, 8, 16)
# The rungs modelled, and those refused, with why: a tile's panels are one program's, over all of K.
KERNELS = tuple(k for k in launch_mod.KERNELS if k != "swap_ab")
REFUSED = {
    kernel: f"{why}, which this model (a tile's panels read by one program, over all of K) does not cover"
    for kernel, why in (launch_mod.SPLITS_K | {"swap_ab": launch_mod.SWAP_AB_SPLITS}).items()
}


@dataclass(frozen=True)
class L2Estimate:
    launch: Launch
    K: int
    itemsize: int
    l2_bytes: int
    a_panels: np.ndarray  # (waves,) distinct A row-panels each wave touches
    b_panels: np.ndarray  # (waves,) distinct B column-panels
    wave_bytes: np.ndarray  # (waves,) bytes of those panels at full K (the wave's footprint)
    wave_dram_bytes: np.ndarray  # (waves,) of which fetched from DRAM (not left in L2 by earlier waves)
    request_bytes: float  # A and B bytes all programs load through L2
    ideal_bytes: float  # A and B read once
    c_bytes: float  # C written once

    @property
    def dram_bytes(self) -> float:
        return float(self.wave_dram_bytes.sum())

    @property
    def traffic_ratio(self) -> float:
        """DRAM bytes over the ideal: 1.0 means every input element left DRAM once."""
        return self.dram_bytes / self.ideal_bytes

    @property
    def read_hit_rate(self) -> float:
        """Share of A and B load bytes served by L2 (ncu: lts__t_sector_op_read_hit_rate)."""
        return 1.0 - self.dram_bytes / self.request_bytes

    @property
    def hit_rate(self) -> float:
        """Loads and C stores together, every store a hit (ncu: lts__t_sector_hit_rate)."""
        return 1.0 - self.dram_bytes / (self.request_bytes + self.c_bytes)


def panel_sizes(total: int, block: int) -> np.ndarray:
    """Rows (or columns) in each panel: `block`, except a shorter last one."""
    starts = np.arange(0, total, block)
    return np.minimum(block, total - starts)


def simulate(launch: Launch, K: int, itemsize: int = 2, l2_bytes: int = H100.l2_bytes) -> L2Estimate:
    """Walk the waves of `launch` in order and count the DRAM bytes of A and B (see module docstring)."""
    if K < 1:
        raise ValueError(f"simulate: K must be >= 1, but got K={K}")
    config = launch.config
    rows = panel_sizes(launch.M, config.BLOCK_M)  # A panel i holds rows[i] rows of K elements
    cols = panel_sizes(launch.N, config.BLOCK_N)
    # One id space: A panels 0..num_pid_m-1, then B panels.
    panel_bytes = np.concatenate([rows, cols]).astype(np.float64) * K * itemsize

    waves = launch.num_waves
    a_count, b_count = np.zeros(waves, int), np.zeros(waves, int)
    footprint, fetched = np.zeros(waves), np.zeros(waves)
    last_use = np.full(panel_bytes.size, -1)
    # Two-pointer LRU window: waves [lo, w-1] whose distinct panels fit in L2 (monotone in w).
    in_window: dict[int, int] = {}  # panel -> number of waves in the window that touch it
    window_bytes, lo = 0.0, 0
    wave_panels: list[np.ndarray] = []
    for w in range(waves):
        pid_m, pid_n = launch.tiles_of_wave(w)
        a_ids, b_ids = np.unique(pid_m), np.unique(pid_n) + launch.num_pid_m
        panels = np.concatenate([a_ids, b_ids])
        wave_panels.append(panels)
        a_count[w], b_count[w] = a_ids.size, b_ids.size
        footprint[w] = panel_bytes[panels].sum()
        resident = last_use[panels] >= lo
        resident &= last_use[panels] >= 0
        fetched[w] = panel_bytes[panels[~resident]].sum()
        last_use[panels] = w

        # Slide the window to end at wave w, then drop its oldest waves until it fits.
        for p in panels.tolist():
            if in_window.get(p, 0) == 0:
                window_bytes += panel_bytes[p]
            in_window[p] = in_window.get(p, 0) + 1
        while window_bytes > l2_bytes and lo <= w:
            for p in wave_panels[lo].tolist():
                in_window[p] -= 1
                if in_window[p] == 0:
                    window_bytes -= panel_bytes[p]
            lo += 1

    tiles_m, tiles_n = np.nonzero(launch.wave >= 0)
    request = float((rows[tiles_m].sum() + cols[tiles_n].sum()) * K * itemsize)
    return L2Estimate(
        launch=launch,
        K=K,
        itemsize=itemsize,
        l2_bytes=l2_bytes,
        a_panels=a_count,
        b_panels=b_count,
        wave_bytes=footprint,
        wave_dram_bytes=fetched,
        request_bytes=request,
        ideal_bytes=float((launch.M + launch.N) * K * itemsize),
        c_bytes=float(launch.M * launch.N * itemsize),
    )


def estimate(
    kernel: str,
    M: int,
    N: int,
    K: int,
    *,
    dtype: str = "bfloat16",
    config=None,
    num_sms: int = H100.num_sms,
    l2_bytes: int = H100.l2_bytes,
    resident: int | None = None,
) -> L2Estimate:
    """`simulate` for one kernel with its H100 default config unless `config` is given."""
    launch_mod.check_kernel(kernel, KERNELS, REFUSED, "l2")
    itemsize = ITEMSIZE[dtype]
    config = config or launch_mod.default_config(kernel, dtype, M, N, K)
    planned = launch_mod.plan(kernel, M, N, config, num_sms=num_sms, itemsize=itemsize, resident=resident)
    return simulate(planned, K, itemsize, l2_bytes)


# ----------------------------------------------------------------------------------------------
# Sweep, table, plot
# ----------------------------------------------------------------------------------------------


def sweep(kernels, M: int, N: int, K: int, group_sizes=GROUP_SIZES, **kwargs) -> list[L2Estimate]:
    """One estimate per kernel (x scheduler for the persistent Gluon kernels) x GROUP_SIZE_M.
    Orderings that ignore GROUP_SIZE_M (column_major, chunked) get one row."""
    config = kwargs.pop("config", None)
    dtype = kwargs.get("dtype", "bfloat16")
    rows = []
    for kernel in kernels:
        launch_mod.check_kernel(kernel, KERNELS, REFUSED, "l2")
        base = config or launch_mod.default_config(kernel, dtype, M, N, K)
        scheduled = launch_mod.TILE_ORDERS.get(kernel) == launch_mod.SCHEDULED  # the persistent Gluon rungs
        schedulers = ("grouped", "chunked") if scheduled else ("grouped",)
        for scheduler in schedulers:
            ordering = launch_mod.ordering_of(kernel, scheduler)
            groups = group_sizes if ordering in ("grouped", "persistent") else (base.GROUP_SIZE_M,)
            for g in groups:
                rows.append(estimate(kernel, M, N, K, config=base.with_(GROUP_SIZE_M=g, scheduler=scheduler), **kwargs))
    return rows


def _label(e: L2Estimate) -> str:
    launch = e.launch
    g = f"G={launch.config.GROUP_SIZE_M}" if launch.ordering in ("grouped", "persistent") else "-"
    return f"{launch.kernel:<25} {launch.ordering:<13} {g:<5}"


def format_table(estimates: list[L2Estimate]) -> str:
    if not estimates:
        return "(no estimates)"
    e0 = estimates[0]
    head = (
        f"{e0.launch.M}x{e0.launch.N}x{e0.K}, {e0.itemsize}-byte elements, L2 {e0.l2_bytes / 2**20:.0f} MB; "
        f"ideal (A + B once) {e0.ideal_bytes / 1e9:.3f} GB"
    )
    header = (
        f"{'kernel':<25} {'ordering':<13} {'group':<5} {'tile':>9} {'waves':>5} {'A/wave':>6} {'B/wave':>6} "
        f"{'MB/wave':>8} {'DRAM GB':>8} {'x ideal':>7} {'read hit':>8} {'L2 hit':>6}"
    )
    lines = [head, header, "-" * len(header)]
    for e in estimates:
        c = e.launch.config
        lines.append(
            f"{_label(e)} {f'{c.BLOCK_M}x{c.BLOCK_N}':>9} {e.launch.num_waves:>5} {e.a_panels.mean():>6.1f} "
            f"{e.b_panels.mean():>6.1f} {e.wave_bytes.mean() / 1e6:>8.1f} {e.dram_bytes / 1e9:>8.3f} "
            f"{e.traffic_ratio:>7.2f} {100 * e.read_hit_rate:>7.1f}% {100 * e.hit_rate:>5.1f}%"
        )
    return "\n".join(lines)


def plot(estimates: list[L2Estimate], path: str | Path, title: str | None = None) -> Path:
    """DRAM traffic over the ideal against GROUP_SIZE_M, one line per ordering (kernels that share
    an ordering share the line); orderings without a group size as horizontal lines."""
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series: dict[str, dict[int, float]] = {}
    kernels: dict[str, list[str]] = {}
    for e in estimates:
        ordering = e.launch.ordering
        series.setdefault(ordering, {})[e.launch.config.GROUP_SIZE_M] = e.traffic_ratio
        if e.launch.kernel not in kernels.setdefault(ordering, []):
            kernels[ordering].append(e.launch.kernel)
    groups = sorted({e.launch.config.GROUP_SIZE_M for e in estimates if e.launch.ordering in ("grouped", "persistent")})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (ordering, points) in enumerate(series.items()):
        label = f"{ordering}: {', '.join(kernels[ordering])}"
        color = colors[i % len(colors)]
        if ordering in ("column_major", "chunked") and groups:  # no GROUP_SIZE_M: one value across the axis
            ax.axhline(next(iter(points.values())), linestyle="--", linewidth=1.5, label=label, color=color)
        else:
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], marker="o", label=label, color=color)
    if groups:
        ax.set_xscale("log", base=2)
        ax.set_xticks(groups, [str(g) for g in groups])
    e0 = estimates[0]
    ax.set_xlabel("GROUP_SIZE_M")
    ax.set_ylabel("DRAM bytes of A and B / ideal")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title or f"L2 model: {e0.launch.M}x{e0.launch.N}x{e0.K}, {e0.l2_bytes / 2**20:.0f} MB L2", fontsize=10)
    return figures.save(fig, path, dpi=90)
