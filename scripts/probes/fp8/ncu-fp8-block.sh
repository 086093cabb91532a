#!/usr/bin/env bash
# Nsight Compute on the block-scaled fp8 rung beside cuBLAS's block-wise kernel and the tensor-wise
# rung of the same tile (which has no promotion): every section (--set full) of one warm launch
# each, clocks floating as in the benchmarks, so that tensor-pipe use, shared-memory traffic and
# the warps' stall reasons can be set side by side. Prints cuBLAS's kernel name and a summary.
# Usage: bash scripts/probes/fp8/ncu-fp8-block.sh [M,N,K]  ->  $OUT/ncu-fp8-block/LABEL.csv
#        bash scripts/probes/fp8/ncu-fp8-block.sh [M,N,K] --stalls: instead, where the block rung's and cuBLAS's
#        warps wait (stall reasons, hottest SASS lines: scripts/probes/fp8/ncu_stalls.py)
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-ncu-logs}/ncu-fp8-block
shape=${1:-2048,6144,4096}
mode=${2:-}
mkdir -p "$out"

cat > "$out/one.py" << 'PY'
import sys
import torch
from tritongemm.bench.fp8 import Fp8Problem, _torch_scaled_mm, operands, torch_block_scales
from tritongemm.core.epilogue import PLAIN
from tritongemm.fp8 import reference_scaled_mm
from tritongemm.fp8 import block as fp8_block, ws as fp8_ws
from tritongemm.core.reference import fp8_tolerance
M, N, K = (int(v) for v in sys.argv[1].split(","))
which = sys.argv[2]
recipe = "tensor" if which == "ws-tensor" else "block"
a, b, sa, sb = operands(Fp8Problem(recipe, M, N, K), "cuda")
c = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
if which == "cublas":
    ref = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64)
    given = torch_block_scales(a, b, sa, sb, ref, fp8_tolerance(torch.bfloat16, K))
    call = lambda: _torch_scaled_mm(*given)  # noqa: E731
elif which == "ws-tensor":
    run = fp8_ws.plan(a, b, c, sa, sb, "tensor", fp8_ws.TILES[0], PLAIN)
    call = lambda: run(a, b, c, sa, sb)  # noqa: E731
else:  # block-c1, block-c2
    run = fp8_block.plan(a, b, c, sa, sb, fp8_block.DEFAULT_CONFIG, PLAIN, consumers=int(which[-1]))
    call = lambda: run(a, b, c, sa, sb)  # noqa: E731
for _ in range(2):  # ncu profiles the second launch: compiled, plan cached
    call()
torch.cuda.synchronize()
PY

profile() {  # profile LABEL WHICH KERNEL_REGEX
  ncu --csv --page details --clock-control none --set full --kernel-name "regex:$3" --launch-skip 1 --launch-count 1 \
    --log-file "$out/$1.csv" python3 "$out/one.py" "$shape" "$2" > "$out/$1.log" 2>&1
  echo "== $1 (exit $?): $(grep -m1 -oE '"[^"]*(nvjet|cutlass|gemm|_kernel)[^"]*"' "$out/$1.csv" | head -1)"
  grep -E '"(Duration|SM Frequency|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|Shared Memory|L1/TEX Cache Throughput|L2 Cache Throughput|Registers Per Thread|Block Size|Grid Size|Warp Cycles Per Issued Instruction|Achieved Occupancy)"' "$out/$1.csv" \
    | awk -F'","' '{printf "   %-45s %s %s\n", $(NF-2), $NF, $(NF-1)}' | tr -d '"' | sort -u
}

stalls() {  # stalls LABEL WHICH KERNEL_REGEX: warp-state sampling by SASS line
  ncu --clock-control none --section SourceCounters --section WarpStateStats --import-source no \
    --kernel-name "regex:$3" --launch-skip 1 --launch-count 1 -f -o "$out/$1" \
    python3 "$out/one.py" "$shape" "$2" > "$out/$1.log" 2>&1
  ncu -i "$out/$1.ncu-rep" --page raw --csv > "$out/$1-raw.csv"
  ncu -i "$out/$1.ncu-rep" --page source --csv --print-source sass > "$out/$1-sass.csv"
  echo "== $1 ($shape)"
  python3 scripts/probes/fp8/ncu_stalls.py "$out/$1-raw.csv" "$out/$1-sass.csv" 30
}

if [ "$mode" = --stalls ]; then
  stalls block-c2 block-c2 '^_fp8_block_kernel'
  stalls cublas-block cublas 'nvjet|cutlass|gemm|sm90'
  exit 0
fi

profile cublas-block cublas 'nvjet|cutlass|gemm|sm90'
profile block-c1 block-c1 '^_fp8_block_kernel'
profile block-c2 block-c2 '^_fp8_block_kernel'
profile ws-tensor ws-tensor '^_tma_warp_specialized_kernel'
