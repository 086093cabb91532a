"""What a result was measured on: recorded with every benchmark run."""

from __future__ import annotations

import datetime
import platform
import subprocess

import torch

from tritongemm.core.registry import sm_name


def _nvidia_smi(fields: str) -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "--id=0"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return [v.strip() for v in out.strip().split(",")]
    except (OSError, subprocess.SubprocessError):
        return []


def describe_environment() -> dict:
    import triton

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }
    if not torch.cuda.is_available():
        return env | {"device": "cpu (Triton interpreter)", "sm_count": 0, "l2_bytes": 0}
    props = torch.cuda.get_device_properties(0)
    smi = _nvidia_smi("driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit")
    keys = ("driver", "sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz", "power_limit_w")
    return env | {
        "device": props.name,
        "capability": sm_name(torch.cuda.get_device_capability(0)),
        "sm_count": props.multi_processor_count,
        "l2_bytes": props.L2_cache_size,
        "memory_gib": round(props.total_memory / 2**30, 1),
        **dict(zip(keys, smi)),
    }
