"""Measured answers for kernel="auto": a table of the fastest kernel and config per shape bucket.

`tritongemm tune` times every kernel and config that runs a problem on this GPU and writes the
winner of each bucket into a table; dispatch/__init__.py asks the table first when a call leaves kernel and
config to the library, and falls back to its rules for a bucket the table lacks, or when no table
fits this GPU. Only plan builds read it: a hit in the plan cache never does.

A bucket is what a winner depends on: the dtype, the layout of a and b (a transposed view or not),
whether TMA can read them in place, and M, N and K each rounded up to a power of two. Tables:
the user's own, written by `tritongemm tune` into the cache directory for this GPU and these
torch and Triton versions, else the one shipped in the package for this GPU (tritongemm/tables/).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.core.registry import dtype_name
from tritongemm.core.tma import tma_unsupported_reason

FORMAT = 1  # the JSON layout below; a table of another format is ignored
TABLE = "table "  # how a Choice's `why` begins
SHIPPED = Path(__file__).parent / "tables"


@dataclass(frozen=True)
class Bucket:
    dtype: str  # "float16", "bfloat16", "float32", or "float32+tf32" under torch's TF32 switch
    layout: str  # "nn", "nt", "tn", "tt": t = that operand is a transposed view
    aligned: bool  # TMA reads both operands in place
    m: int  # M, N and K rounded up to a power of two
    n: int
    k: int

    def describe(self) -> str:
        where = "TMA-aligned" if self.aligned else "not TMA-aligned"
        return f"{self.dtype} {self.layout} {where}, M <= {self.m}, N <= {self.n}, K <= {self.k}"


def bucket_of(a: torch.Tensor, b: torch.Tensor) -> Bucket:
    M, K = a.shape
    N = b.shape[1]
    layout = ("t" if a.stride(1) != 1 else "n") + ("t" if b.stride(1) != 1 else "n")
    aligned = tma_unsupported_reason(a, b) is None
    dtype = dtype_name(a.dtype)
    if a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        dtype += "+tf32"  # another precision, other winners
    return Bucket(dtype, layout, aligned, _ceil_pow2(M), _ceil_pow2(N), _ceil_pow2(K))


def _ceil_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


@dataclass(frozen=True)
class Choice:
    kernel: str
    config: MatmulConfig | None  # None: the kernel's default config
    why: str  # for `tritongemm explain-choice`


@dataclass
class Table:
    device: str
    torch: str
    triton: str
    entries: dict[Bucket, dict] = field(default_factory=dict)  # bucket -> winner and its timings
    path: Path | None = None  # where it was read from or goes

    def choose(self, bucket: Bucket) -> Choice | None:
        entry = self.entries.get(bucket)
        if entry is None:
            return None
        config = MatmulConfig.parse(entry["config"]) if entry.get("config") else None
        M, N, K = entry["problem"]
        why = (
            f"{TABLE}{self.path or '(in memory)'}: bucket {bucket.describe()} -> measured fastest at "
            f"{M} x {N} x {K}: {entry['ms'] * 1e3:.1f} us, {entry['cublas_ms'] / entry['ms']:.2f}x cuBLAS"
        )
        if entry.get("rules_ms"):  # tables from before the tuner timed the rules' choice lack it
            why += f" (the rules' choice: {entry['rules_ms'] * 1e3:.1f} us)"
        return Choice(entry["kernel"], config, why)

    def to_json(self) -> str:
        rows = [asdict(bucket) | entry for bucket, entry in sorted(self.entries.items(), key=_order)]
        head = dict(format=FORMAT, device=self.device, torch=self.torch, triton=self.triton)
        return json.dumps(head | {"entries": rows}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, path: Path | None = None) -> Table | None:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            return None
        fields = Bucket.__dataclass_fields__
        entries = {}
        for row in data["entries"]:
            bucket = Bucket(**{name: row[name] for name in fields})
            entries[bucket] = {name: value for name, value in row.items() if name not in fields}
        return cls(data["device"], data["torch"], data["triton"], entries, path)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(self.to_json())
        temporary.replace(path)  # a reader never sees half a table; an interrupted tune keeps the last
        self.path = path


def _order(item) -> tuple:
    bucket = item[0]
    return bucket.dtype, bucket.layout, not bucket.aligned, bucket.m, bucket.n, bucket.k


def versions() -> tuple[str, str]:
    import triton

    return torch.__version__, triton.__version__


def user_table_path(device_name: str) -> Path:
    """Where `tritongemm tune` writes this GPU's table for these torch and Triton versions."""
    root = os.environ.get("TRITONGEMM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tritongemm"
    )
    torch_version, triton_version = versions()
    return Path(root) / f"dispatch-{_slug(device_name)}-torch{torch_version}-triton{triton_version}.json"


def shipped_table_path(device_name: str) -> Path:
    return SHIPPED / f"{_slug(device_name)}.json"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@functools.lru_cache(maxsize=8)  # one per GPU model in the process; reload() after a tune
def table_for(device_name: str) -> Table | None:
    """The user's table for this GPU and these versions, else the shipped one for this GPU."""
    for path in (user_table_path(device_name), shipped_table_path(device_name)):
        if path.is_file():
            table = Table.from_json(path.read_text(), path)
            if table is not None and table.device == device_name:
                return table
    return None


def reload() -> None:
    table_for.cache_clear()


def lookup(a: torch.Tensor, b: torch.Tensor) -> Choice | None:
    """The table's choice for this problem on a's device (None: no table, or no such bucket)."""
    if a.device.type != "cuda":
        return None
    table = table_for(device_info.name(a.device))
    return None if table is None else table.choose(bucket_of(a, b))
