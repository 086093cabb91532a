#!/usr/bin/env bash
# Nsight Compute beside cuBLAS on the rows where tritongemm trails it (scripts/probes/dense/probe_limits.py has the
# kernel names and clocks): L2, DRAM and SM throughput, the SM clock, bytes moved, for
# one warm launch of each (ncu flushes the caches before it). Clocks float (--clock-control none),
# as in the benchmarks.
# Usage: bash scripts/probes/dense/ncu-limits.sh   ->  $OUT/ncu-limits/LABEL.csv, and a summary on stdout
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-ncu-logs}/ncu-limits
mkdir -p "$out"
metrics=lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,sm__cycles_elapsed.avg.per_second

cat > "$out/one.py" << 'PY'
import sys
import torch
import tritongemm
M, N, K = (int(v) for v in sys.argv[1].split(","))
layout, kernel = sys.argv[2], sys.argv[3]
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).T if layout == "nt" else torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
for _ in range(2):  # ncu profiles the second launch: compiled, plan cached
    (torch.matmul(a, b) if kernel == "cublas" else tritongemm.matmul(a, b, kernel=kernel))
torch.cuda.synchronize()
PY

profile() {  # profile LABEL SHAPE LAYOUT KERNEL KERNEL_REGEX
  ncu --csv --page details --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --metrics "$metrics" --kernel-name "regex:$5" --launch-skip 1 --launch-count 1 \
    --log-file "$out/$1.csv" python3 "$out/one.py" "$2" "$3" "$4" > "$out/$1.log" 2>&1
  echo "== $1 (exit $?)"
  grep -E '"(Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|lts__t_bytes.sum|lts__t_sectors_srcunit_tex_op_read.sum|dram__bytes_read.sum|Executed Ipc Active)"' "$out/$1.csv" \
    | awk -F'","' '{printf "   %-45s %s %s\n", $(NF-2), $NF, $(NF-1)}' | tr -d '"'
}

cublas='gemm|nvjet|xmma|cutlass|sm90'
profile cublas-8192x8192x8192 8192,8192,8192 nn cublas "$cublas"
profile ws-8192x8192x8192 8192,8192,8192 nn tma_warp_specialized '^_tma_warp_specialized_kernel'
profile pp6-8192x8192x8192 8192,8192,8192 nn tma_persistent_pipelined '^_tma_persistent_pipelined'
profile cublas-128x4096x4096 128,4096,4096 nt cublas "$cublas"
profile swap-128x4096x4096 128,4096,4096 nt swap_ab '^_swap_ab_kernel'
