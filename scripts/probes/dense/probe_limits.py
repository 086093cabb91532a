"""What bounds the rows where tritongemm still trails cuBLAS: which kernel cuBLAS runs there (its
name carries its tile, stages and thread-block cluster: nvjet_sm90_tst_320x128_64x3_1x2_... is
320 x 128 tiles, BLOCK_K 64, 3 stages, clusters of 1 x 2 CTAs), and the SM clock and board power
under a sustained load, with the TFLOP/s each clock cycle buys. Nsight Compute's view of the same
launches is scripts/probes/dense/ncu-limits.sh.

Run on a GPU: PYTHONPATH=. python3 scripts/probes/dense/probe_limits.py OUT_DIR
writes OUT_DIR/cublas-kernels.csv and OUT_DIR/clocks.csv, and prints both.
"""

import csv
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import tritongemm

# The rows issues 14 and 15 name: (M, N, K, layout); "nt" is x @ W.T with W an (N, K) weight.
SHAPES = [
    (8192, 8192, 8192, "nn"), (8192, 8192, 1024, "nn"), (1024, 1024, 1024, "nn"), (1000, 1000, 1000, "nn"),
    (5000, 3000, 7000, "nn"), (3000, 5000, 1000, "nn"), (777, 4096, 4096, "nn"), (64, 4096, 4096, "nt"),
    (128, 4096, 4096, "nt"), (128, 14336, 4096, "nt"), (512, 4096, 14336, "nt"),
]  # fmt: skip
# Sustained load for the clock probe: the 8192^3 bf16 GEMM of issue 15's target.
SUSTAINED = (8192, 8192, 8192)
SUSTAINED_KERNELS = ("cublas", "tma_persistent_pipelined", "tma_warp_specialized")
SUSTAINED_SECONDS = 3.0
SMI_FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def operands(M, N, K, layout, dtype=torch.bfloat16):
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    if layout == "nt":  # x @ W.T, W an (N, K) weight
        return a, torch.randn(N, K, device="cuda", dtype=dtype).T
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    return a, b


def cublas_kernels(M, N, K, layout) -> list[str]:
    """The names of the CUDA kernels one torch.matmul launches for this problem."""
    a, b = operands(M, N, K, layout)
    torch.matmul(a, b)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.matmul(a, b)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def sustained(kernel: str) -> dict:
    """Run the GEMM back to back for SUSTAINED_SECONDS while nvidia-smi samples every 50 ms; the
    medians of the samples taken after the first second (the clock settles under the power cap)."""
    M, N, K = SUSTAINED
    a, b = operands(M, N, K, "nn")
    run = (lambda: torch.matmul(a, b)) if kernel == "cublas" else (lambda: tritongemm.matmul(a, b, kernel=kernel))
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    calls, start = 0, time.perf_counter()
    events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    while time.perf_counter() - start < SUSTAINED_SECONDS:
        if calls == 20:
            events[0].record()
        run()
        calls += 1
        if calls % 10 == 0:
            torch.cuda.synchronize()
    events[1].record()
    torch.cuda.synchronize()
    smi.terminate()
    samples = [line.split(", ") for line in smi.stdout.read().splitlines() if line.strip()]
    settled = samples[len(samples) // 3 :] or samples
    ms = events[0].elapsed_time(events[1]) / (calls - 20)
    sm_mhz = statistics.median(float(s[0]) for s in settled)
    tflops = 2 * M * N * K / ms / 1e9
    return {
        "kernel": kernel, "ms": round(ms, 4), "tflops": round(tflops, 1), "sm_mhz": sm_mhz,
        "mem_mhz": statistics.median(float(s[1]) for s in settled),
        "power_w": round(statistics.median(float(s[2]) for s in settled), 1),
        "temp_c": statistics.median(float(s[3]) for s in settled),
        "throttle": sorted({s[4] for s in settled}), "tflops_per_ghz": round(tflops / (sm_mhz / 1000), 1),
        "samples": len(settled),
    }  # fmt: skip


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_name(), torch.__version__, torch.version.cuda)
    with open(out_dir / "cublas-kernels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["m", "n", "k", "layout", "dtype", "kernels"])
        for M, N, K, layout in SHAPES:
            names = cublas_kernels(M, N, K, layout)
            writer.writerow([M, N, K, layout, "bfloat16", " | ".join(names)])
            print(f"{M}x{N}x{K} {layout}: {' | '.join(names)}")
    rows = [sustained(kernel) for kernel in SUSTAINED_KERNELS]
    with open(out_dir / "clocks.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow(row | {"throttle": " ".join(row["throttle"])})
            print(row)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "probe-limits"))
