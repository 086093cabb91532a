"""`tritongemm predict`: a GEMM performance model that shows its terms, calibrated on benchmarks.

    time = launch + max(compute, memory) + tile rounds x tile overhead

- compute: the busiest SM computes `rounds = cdiv(tiles, SMs)` tiles (wave quantization), each
  padded to whole BLOCK_M x BLOCK_N x BLOCK_K blocks (edge tiles do full-size MMAs), at
  `efficiency` x the tensor-core peak / SMs. So compute = flops / (peak x efficiency) /
  (tile efficiency x wave efficiency), where tile efficiency = useful / padded flops and wave
  efficiency = tiles / (SMs x rounds).
- memory: the DRAM bytes of the L2 simulator (l2.py) for A and B plus C written once, at the
  measured copy bandwidth. Loads overlap the MMAs, hence the max.
- tile overhead: per tile, the pipeline fill and the epilogue that the kernel does not overlap
  with MMAs (large for one-tile-per-program kernels, small once tiles are pipelined).
- launch: a fixed cost per GEMM (the benchmarks replay CUDA graphs below ~0.1 ms).

Two constants per kernel and dtype (efficiency, tile overhead) and one launch cost are fitted to
benchmark CSVs by `calibrate` (`tritongemm predict --calibrate results/h100/*.csv`), which writes
predict_constants.json next to this file; without it the defaults below are used. cuBLAS is
modelled as a persistent grouped kernel with the Gluon kernels' tile choice.
The warp-specialized rungs (9, 11) are modelled as rung 6 is (one program per SM over the same
schedulers); what their roles buy shows in their fitted constants. Rung 13 is rung 6 on its odd
widths. Not modelled: clocks dropping under sustained power (8192^3 runs ~7% below 4096^3 on an
H100), operand layout (NT vs NN), L2 partitioning, and a tile's K split across programs: split_k,
stream_k, split_tail and swap_ab (whose default splits K on skinny problems) are refused (REFUSED).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tritongemm.core.config import MatmulConfig
from tritongemm.tools import l2
from tritongemm.tools import launch as launch_mod
from tritongemm.tools.launch import GPU, H100, ITEMSIZE

# The rungs modelled (l2's: the DRAM bytes are its model's), and cuBLAS; those refused, with why.
KERNELS = l2.KERNELS
PROVIDERS = (*KERNELS, "cublas")
REFUSED = {
    kernel: f"{why}, which this model (a tile, one program, all of K) does not cover"
    for kernel, why in (launch_mod.SPLITS_K | {"swap_ab": launch_mod.SWAP_AB_SPLITS}).items()
}
CONSTANTS_PATH = Path(__file__).with_name("predict_constants.json")
TARGET_MEDIAN_ERROR = 0.10


@dataclass(frozen=True)
class KernelConstants:
    efficiency: float  # share of the tensor-core peak the K loop sustains
    tile_overhead_us: float  # per tile on one SM: pipeline fill + epilogue not hidden behind MMAs


@dataclass(frozen=True)
class Constants:
    launch_us: float
    kernels: dict = field(default_factory=dict)  # "kernel/dtype" or "kernel" -> KernelConstants
    source: str = ""

    def of(self, kernel: str, dtype: str) -> KernelConstants:
        for key in (f"{kernel}/{dtype}", kernel):
            if key in self.kernels:
                return self.kernels[key]
        return DEFAULTS.kernels[kernel]

    def to_json(self) -> str:
        data = {"source": self.source, "launch_us": self.launch_us}
        data["kernels"] = {k: asdict(v) for k, v in sorted(self.kernels.items())}
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Constants:
        data = json.loads(text)
        kernels = {k: KernelConstants(**v) for k, v in data["kernels"].items()}
        return cls(launch_us=data["launch_us"], kernels=kernels, source=data.get("source", ""))


# Starting points before calibration, from the H100 numbers we had. cuBLAS bf16: 735 TFLOP/s at
# 4096^3, 680 at 8192^3, 595 at 8192 x 8192 x 512; efficiency 0.77 puts the model within 8% of
# all three (712, 731, 613). The seed tables put the Gluon kernels at 490-670 TFLOP/s at M = N =
# 8192, the lower end at K = 512 where per-tile overheads dominate.
DEFAULTS = Constants(
    launch_us=3.0,
    kernels={
        "naive": KernelConstants(0.55, 3.0),
        "grouped": KernelConstants(0.60, 3.0),
        "persistent": KernelConstants(0.60, 2.0),
        "tma_pipelined": KernelConstants(0.68, 2.5),
        "tma_persistent": KernelConstants(0.69, 2.0),
        "tma_persistent_pipelined": KernelConstants(0.70, 1.0),
        # the epilogue runs beside the next tile's loads (rung 9) or MMAs (rung 11): less per tile
        "tma_warp_specialized": KernelConstants(0.70, 0.5),
        "tma_ping_pong": KernelConstants(0.70, 0.25),
        "odd_width": KernelConstants(0.70, 1.0),  # rung 6's: its loop, on two accumulators
        "cublas": KernelConstants(0.77, 1.0),
    },
    source="built-in defaults (uncalibrated)",
)


def load_constants(path: str | Path | None = None) -> Constants:
    """The calibrated constants (predict_constants.json) if written, else the defaults."""
    if path == "defaults":
        return DEFAULTS
    path = Path(path) if path else CONSTANTS_PATH
    if path.exists():
        return Constants.from_json(path.read_text())
    return DEFAULTS


# ----------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Terms:
    """What a prediction is made of, before the two constants are applied."""

    kernel: str
    dtype: str
    M: int
    N: int
    K: int
    config: MatmulConfig
    tiles: int
    rounds: int  # tiles the busiest SM computes
    tile_efficiency: float  # useful flops / flops of whole padded blocks
    wave_efficiency: float  # tiles / (SMs x rounds)
    ideal_compute_s: float  # the busiest SM's padded flops at 100% of its peak
    memory_s: float
    dram_bytes: float  # A and B from DRAM (l2.py) + C


def terms(kernel: str, M: int, N: int, K: int, dtype: str, config: MatmulConfig | None = None, gpu: GPU = H100):
    """The parts of the model that need no constants (tile counts, padded work, DRAM bytes)."""
    launch_mod.check_kernel(kernel, PROVIDERS, REFUSED, "predict")
    if min(M, N, K) < 1:
        raise ValueError(f"predict: M, N and K must be >= 1, but got {M}x{N}x{K}")
    config = config or launch_mod.default_config(kernel, dtype, M, N, K, gpu)
    geometry_kernel = "tma_persistent" if kernel == "cublas" else kernel
    itemsize = ITEMSIZE[dtype]
    planned = launch_mod.plan(geometry_kernel, M, N, config, num_sms=gpu.num_sms, itemsize=itemsize, gpu=gpu)
    traffic = l2.simulate(planned, K, itemsize, gpu.l2_bytes)

    tiles = planned.num_tiles
    rounds = math.ceil(tiles / gpu.num_sms)
    k_padded = math.ceil(K / config.BLOCK_K) * config.BLOCK_K
    tile_flops = 2 * config.BLOCK_M * config.BLOCK_N * k_padded
    per_sm_flops = gpu.peak_tflops[dtype] * 1e12 / gpu.num_sms
    dram = traffic.dram_bytes + traffic.c_bytes
    return Terms(
        kernel=kernel,
        dtype=dtype,
        M=M,
        N=N,
        K=K,
        config=config,
        tiles=tiles,
        rounds=rounds,
        tile_efficiency=2 * M * N * K / (tiles * tile_flops),
        wave_efficiency=tiles / (gpu.num_sms * rounds),
        ideal_compute_s=rounds * tile_flops / per_sm_flops,
        memory_s=dram / (gpu.dram_tbps * 1e12),
        dram_bytes=dram,
    )


@dataclass(frozen=True)
class Prediction:
    terms: Terms
    constants: KernelConstants
    launch_s: float

    @property
    def compute_s(self) -> float:
        return self.terms.ideal_compute_s / self.constants.efficiency

    @property
    def overhead_s(self) -> float:
        return self.terms.rounds * self.constants.tile_overhead_us * 1e-6

    @property
    def time_s(self) -> float:
        return self.launch_s + max(self.compute_s, self.terms.memory_s) + self.overhead_s

    @property
    def tflops(self) -> float:
        t = self.terms
        return 2 * t.M * t.N * t.K / self.time_s / 1e12

    @property
    def bound(self) -> str:
        """The largest of: compute or memory (whichever the max picks), tile overhead, launch."""
        parts = {"launch": self.launch_s, "tile overhead": self.overhead_s}
        if self.compute_s >= self.terms.memory_s:
            parts["compute"] = self.compute_s
        else:
            parts["memory"] = self.terms.memory_s
        return max(parts, key=parts.get)


def predict(
    kernel: str,
    M: int,
    N: int,
    K: int,
    dtype: str = "bfloat16",
    config: MatmulConfig | None = None,
    constants: Constants | None = None,
    gpu: GPU = H100,
) -> Prediction:
    constants = constants or load_constants()
    t = terms(kernel, M, N, K, dtype, config, gpu)
    return Prediction(t, constants.of(kernel, dtype), constants.launch_us * 1e-6)


def format_predictions(predictions: list[Prediction], constants: Constants, gpu: GPU = H100) -> str:
    p0 = predictions[0].terms
    lines = [
        f"{p0.M}x{p0.N}x{p0.K} {p0.dtype} on {gpu.name}: {gpu.num_sms} SMs, peak {gpu.peak_tflops[p0.dtype]:.0f} "
        f"TFLOP/s, {gpu.dram_tbps} TB/s, L2 {gpu.l2_bytes / 2**20:.0f} MB; constants: {constants.source}",
        "time = launch + max(compute, memory) + rounds x tile overhead;  "
        "compute = flops / (peak x eff) / (tile eff x wave eff)",
        "",
    ]
    header = (
        f"{'kernel':<25} {'tile':<10} {'tiles':>6} {'rounds':>6} {'tile eff':>8} {'wave eff':>8} {'eff':>5} "
        f"{'compute':>8} {'memory':>8} {'overhead':>8} {'launch':>7} {'time ms':>8} {'TFLOP/s':>8}  bound"
    )
    lines += [header, "-" * len(header)]
    for p in predictions:
        t, c = p.terms, p.terms.config
        lines.append(
            f"{t.kernel:<25} {f'{c.BLOCK_M}x{c.BLOCK_N}x{c.BLOCK_K}':<10} {t.tiles:>6} {t.rounds:>6} "
            f"{t.tile_efficiency:>8.1%} {t.wave_efficiency:>8.1%} {p.constants.efficiency:>5.2f} "
            f"{p.compute_s * 1e3:>8.4f} {t.memory_s * 1e3:>8.4f} {p.overhead_s * 1e3:>8.4f} {p.launch_s * 1e3:>7.4f} "
            f"{p.time_s * 1e3:>8.4f} {p.tflops:>8.1f}  {p.bound}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Calibration against benchmark CSVs (tritongemm/bench schema)
# ----------------------------------------------------------------------------------------------

_LABEL = re.compile(r"^(?:default )?(\d+)x(\d+)x(\d+) g(\d+) w(\d+) s(\d+)(?: (\w+))?$")


def parse_config_label(label: str) -> MatmulConfig | None:
    """The MatmulConfig a CSV `config` column names (`MatmulConfig.short()`, "default <short()>" for a
    kernel's default), None for a bare "default" (older CSVs: the kernel's default today)."""
    match = _LABEL.match(label.strip())
    if not match:
        return None
    bm, bn, bk, g, w, s = (int(v) for v in match.groups()[:6])
    return MatmulConfig(bm, bn, bk, g, w, s, scheduler=match.group(7) or "grouped")


@dataclass(frozen=True)
class Measured:
    terms: Terms
    layout: str
    ms: float


def read_measurements(paths, gpu: GPU = H100) -> list[Measured]:
    """The timed rows ("ok", with ms) of benchmark CSVs whose kernel the model knows."""
    rows = []
    for path in paths:
        with Path(path).open() as f:
            for r in csv.DictReader(f):
                # Kernel-only rows: not the eager ones (host time included), nor overhead.csv's.
                if r.get("status") != "ok" or (r.get("timing") or "graph") != "graph" or not r.get("ms"):
                    continue
                if r.get("kernel") not in PROVIDERS or r.get("dtype") not in ITEMSIZE:  # other CSVs, other kernels
                    continue
                M, N, K = int(r["m"]), int(r["n"]), int(r["k"])
                config = parse_config_label(r["config"])
                t = terms(r["kernel"], M, N, K, r["dtype"], config, gpu)
                rows.append(Measured(t, r["layout"], float(r["ms"])))
    return rows


_EFFICIENCIES = np.linspace(0.10, 1.00, 181)
_OVERHEADS_US = np.linspace(0.0, 30.0, 121)
_LAUNCHES_US = np.arange(0.0, 10.01, 0.5)
_MIN_ROWS = 3  # fewer rows than this for a kernel/dtype: share the kernel's constants across dtypes


def _fit_group(rows: list[Measured], launch_us: float) -> tuple[KernelConstants, float]:
    """Grid search of (efficiency, tile overhead) minimizing the mean |log(predicted / measured)|."""
    compute = np.array([r.terms.ideal_compute_s for r in rows])
    memory = np.array([r.terms.memory_s for r in rows])
    rounds = np.array([r.terms.rounds for r in rows])
    measured = np.array([r.ms * 1e-3 for r in rows])
    eff = _EFFICIENCIES[:, None, None]
    ovh = _OVERHEADS_US[None, :, None] * 1e-6
    predicted = launch_us * 1e-6 + np.maximum(compute / eff, memory) + rounds * ovh
    loss = np.abs(np.log(predicted / measured)).mean(axis=2)
    i, j = np.unravel_index(np.argmin(loss), loss.shape)
    return KernelConstants(round(float(_EFFICIENCIES[i]), 4), round(float(_OVERHEADS_US[j]), 3)), float(loss[i, j])


def _groups(rows: list[Measured]) -> dict[str, list[Measured]]:
    by_key: dict[str, list[Measured]] = {}
    for r in rows:
        by_key.setdefault(r.terms.kernel, []).append(r)
        by_key.setdefault(f"{r.terms.kernel}/{r.terms.dtype}", []).append(r)
    return {k: v for k, v in by_key.items() if len(v) >= _MIN_ROWS}


def calibrate(rows: list[Measured], source: str = "") -> Constants:
    """Fit one launch cost for all, and (efficiency, tile overhead) per kernel and per kernel/dtype."""
    if not rows:
        raise ValueError("calibrate: no timed rows (status 'ok' with ms) of a known kernel in the given CSVs")
    groups = _groups(rows)
    best = None
    for launch_us in _LAUNCHES_US:
        fitted = {key: _fit_group(group, launch_us) for key, group in groups.items()}
        loss = sum(fitted[k][1] * len(groups[k]) for k in fitted if "/" in k)
        if best is None or loss < best[0]:
            best = (loss, launch_us, {k: v[0] for k, v in fitted.items()})
    _, launch_us, kernels = best
    return Constants(launch_us=float(launch_us), kernels=kernels, source=source or f"calibrated on {len(rows)} rows")


def compare(rows: list[Measured], constants: Constants) -> list[tuple[Measured, Prediction]]:
    """Each measurement beside the model's prediction for it under `constants`."""
    launch_s = constants.launch_us * 1e-6
    return [(r, Prediction(r.terms, constants.of(r.terms.kernel, r.terms.dtype), launch_s)) for r in rows]


def relative_error(measured: Measured, predicted: Prediction) -> float:
    return predicted.time_s / (measured.ms * 1e-3) - 1.0


def format_comparison(pairs: list[tuple[Measured, Prediction]], markdown: bool = False) -> str:
    """Every measurement beside its prediction, then the median |error| per kernel and overall."""
    head = [
        "kernel",
        "dtype",
        "layout",
        "shape",
        "tile",
        "measured TFLOP/s",
        "predicted TFLOP/s",
        "time error",
        "bound",
    ]
    table = []
    for m, p in pairs:
        t, c = m.terms, m.terms.config
        measured_tflops = 2 * t.M * t.N * t.K / (m.ms * 1e-3) / 1e12
        shape, tile = f"{t.M}x{t.N}x{t.K}", f"{c.BLOCK_M}x{c.BLOCK_N}x{c.BLOCK_K}"
        error = f"{relative_error(m, p):+.1%}"
        table.append(
            [t.kernel, t.dtype, m.layout, shape, tile, f"{measured_tflops:.1f}", f"{p.tflops:.1f}", error, p.bound]
        )
    errors: dict[str, list[float]] = {}
    for m, p in pairs:
        errors.setdefault(m.terms.kernel, []).append(abs(relative_error(m, p)))
    errors["all"] = [abs(relative_error(m, p)) for m, p in pairs]
    summary = [[k, str(len(v)), f"{np.median(v):.1%}", f"{max(v):.1%}"] for k, v in errors.items()]
    overall = float(np.median(errors["all"]))
    verdict = f"median abs error of the predicted time {overall:.1%} over {len(pairs)} rows: "
    verdict += f"{'meets' if overall <= TARGET_MEDIAN_ERROR else 'MISSES'} the {TARGET_MEDIAN_ERROR:.0%} target"
    render = _markdown if markdown else _fixed_width
    return "\n\n".join(
        [render(head, table), render(["kernel", "rows", "median abs error", "worst abs error"], summary), verdict]
    )


def _markdown(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _fixed_width(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in column) for column in zip(head, *rows)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def median_abs_error(pairs: list[tuple[Measured, Prediction]]) -> float:
    return float(np.median([abs(relative_error(m, p)) for m, p in pairs]))
