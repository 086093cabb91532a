"""Nsight Compute logs of scripts/ci/ncu-l2.sh, set beside the L2 model: `tritongemm l2 --ncu DIR`.

The script writes one `ncu --csv` log per run, named ncu-LABEL-MxNxK-DTYPE.csv, where LABEL is a
kernel name, with "-chunked" for the persistent Gluon kernels under the chunked scheduler. Each
log holds the metrics of that kernel's one profiled launch:

  lts__t_sector_hit_rate.pct          L2 hit rate, loads and stores (l2.L2Estimate.hit_rate)
  lts__t_sector_op_read_hit_rate.pct  L2 hit rate of loads only     (l2.L2Estimate.read_hit_rate)
  dram__bytes_read.sum                bytes read from DRAM          (l2.L2Estimate.dram_bytes)

ncu flushes the caches before each profiled kernel (its default --cache-control all), so the
launch starts from a cold L2, as the model does.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

from tritongemm.core import registry
from tritongemm.tools import l2
from tritongemm.tools import launch as launch_mod

HIT_RATE = "lts__t_sector_hit_rate.pct"
READ_HIT_RATE = "lts__t_sector_op_read_hit_rate.pct"
DRAM_READ = "dram__bytes_read.sum"

_FILE = re.compile(
    r"^ncu-(?P<kernel>[a-z_]+?)(?P<chunked>-chunked)?-(?P<M>\d+)x(?P<N>\d+)x(?P<K>\d+)-(?P<dtype>\w+)\.csv$"
)
_UNIT_SCALE = {
    "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
    "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30,
}  # fmt: skip


def _number(value: str, unit: str = "") -> float:
    """ncu prints thousands separators ("268,435,456") and, without --print-units base, scaled units."""
    return float(value.replace(",", "")) * _UNIT_SCALE.get(unit.strip(), 1)


def read_ncu_csv(text: str) -> list[dict]:
    """One dict per profiled launch: {"kernel": name, metric: value, ...}. Accepts both layouts ncu
    writes: one row per metric (--csv on the details page) and one column per metric (--page raw),
    and skips the ==PROF== lines and program output before the header."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    launches: dict[str, dict] = {}
    if "Metric Name" in (reader.fieldnames or []):
        for row in reader:
            if not row.get("Metric Value"):
                continue
            entry = launches.setdefault(row["ID"], {"kernel": row["Kernel Name"]})
            entry[row["Metric Name"]] = _number(row["Metric Value"], row.get("Metric Unit", ""))
        return list(launches.values())
    metrics = [f for f in reader.fieldnames if "__" in f]
    units = None
    for row in reader:
        if not row["ID"]:  # the units row under the header
            units = row
            continue
        launches[row["ID"]] = {"kernel": row["Kernel Name"]} | {
            m: _number(row[m], (units or {}).get(m, "")) for m in metrics if row.get(m)
        }
    return list(launches.values())


@dataclass(frozen=True)
class L2Comparison:
    label: str
    estimate: l2.L2Estimate
    measured: dict  # metric -> value of the first profiled launch in the log


def compare(log_dir: str | Path, l2_bytes: int = launch_mod.H100.l2_bytes) -> list[L2Comparison]:
    """Model vs measurement for every ncu-*.csv in `log_dir`, each with the config the benchmark
    harness picks on an H100 (the same one the profiled run used)."""
    rows = []
    for path in sorted(Path(log_dir).glob("ncu-*.csv")):
        match = _FILE.match(path.name)
        launches = read_ncu_csv(path.read_text(errors="replace"))
        if not match or not launches:
            continue
        kernel, dtype = match["kernel"], match["dtype"]
        M, N, K = int(match["M"]), int(match["N"]), int(match["K"])
        scheduler = "chunked" if match["chunked"] else "grouped"
        config = launch_mod.default_config(kernel, dtype, M, N, K).with_(scheduler=scheduler)
        estimate = l2.estimate(kernel, M, N, K, dtype=dtype, config=config, l2_bytes=l2_bytes)
        label = kernel + (" (chunked)" if match["chunked"] else "")
        rows.append(L2Comparison(label, estimate, launches[0]))
    return sorted(rows, key=_by_shape_then_rung)


def _by_shape_then_rung(row: L2Comparison):
    e = row.estimate
    return e.launch.M, e.launch.N, e.K, registry.get(e.launch.kernel).rung, row.label


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1f}%"


def format_l2_table(rows: list[L2Comparison]) -> str:
    """Markdown: predicted vs measured L2 hit rates and DRAM reads, one row per log."""
    if not rows:
        return "(no ncu-*.csv logs with metrics found)"
    lines = [
        "| kernel | shape | tile | predicted hit | measured hit | predicted read hit | measured read hit "
        "| predicted DRAM read GB | measured DRAM read GB |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        e, c = r.estimate, r.estimate.launch.config
        dram = r.measured.get(DRAM_READ)
        lines.append(
            f"| {r.label} | {e.launch.M}x{e.launch.N}x{e.K} | {c.BLOCK_M}x{c.BLOCK_N} g{c.GROUP_SIZE_M} "
            f"| {_pct(100 * e.hit_rate)} | {_pct(r.measured.get(HIT_RATE))} "
            f"| {_pct(100 * e.read_hit_rate)} | {_pct(r.measured.get(READ_HIT_RATE))} "
            f"| {e.dram_bytes / 1e9:.3f} | {'-' if dram is None else f'{dram / 1e9:.3f}'} |"
        )
    return "\n".join(lines)
