#!/usr/bin/env bash
# Measured L2 hit rates and DRAM reads (Nsight Compute) beside the L2 model of tritongemm/tools/l2.py.
# Usage: bash scripts/ci/ncu-l2.sh ["M,N,K M,N,K ..."]   (default: the three shapes below)
# Each kernel runs once under ncu (bench --profile: checked, not timed); ncu profiles its first
# launch from a cold L2 (it flushes the caches before each profiled kernel by default).
# Logs: $OUT/ncu-l2/ncu-KERNEL-MxNxK-DTYPE.csv (ncu) and .log (the program). The table at the end
# is `python3 -m tritongemm l2 --ncu $OUT/ncu-l2`, also saved there as l2-table.md.
# DTYPE (default bfloat16) and METRICS override the defaults.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-ncu-logs}/ncu-l2
mkdir -p "$out"
dtype=${DTYPE:-bfloat16}
metrics=${METRICS:-lts__t_sector_hit_rate.pct,lts__t_sector_op_read_hit_rate.pct,dram__bytes_read.sum}
shapes=${1:-"8192,8192,8192 8192,8192,512 8192,8192,16384"}
kernels="naive grouped persistent tma_pipelined tma_persistent tma_persistent_pipelined"

profile() {  # profile LABEL SHAPE_LABEL KERNEL_REGEX COMMAND...
  local label=$1 shape=$2 regex=$3
  shift 3
  local log="$out/ncu-$label-$shape-$dtype"
  echo "== $label $shape"
  ncu --csv --print-units base --metrics "$metrics" --kernel-name "regex:^${regex}" --launch-count 1 \
    --log-file "$log.csv" "$@" > "$log.log" 2>&1
  echo "   exit $?, $(grep -c '^"' "$log.csv" 2> /dev/null) csv lines"
}

# The chunked scheduler: the bench runs default (grouped) configs only, so this calls matmul itself.
cat > "$out/chunked.py" << 'PY'
import sys

import torch

import tritongemm
from tritongemm.tools.launch import default_config

M, N, K = (int(v) for v in sys.argv[1].split(","))
kernel, dtype = sys.argv[2], sys.argv[3]
a = torch.randn(M, K, device="cuda", dtype=getattr(torch, dtype))
b = torch.randn(K, N, device="cuda", dtype=getattr(torch, dtype))
config = default_config(kernel, dtype, M, N, K).with_(scheduler="chunked")
tritongemm.matmul(a, b, kernel=kernel, config=config)
torch.cuda.synchronize()
print(kernel, config.short())
PY

for shape in $shapes; do
  shape_label=${shape//,/x}
  for kernel in $kernels; do
    # Triton names a compiled kernel after its @jit function: _naive_kernel, _tma_persistent_kernel, ...
    profile "$kernel" "$shape_label" "_${kernel}_kernel" \
      python3 -m tritongemm bench --shapes "$shape" --dtypes "$dtype" --kernels "$kernel" --profile --no-plot
  done
  for kernel in tma_persistent tma_persistent_pipelined; do
    profile "$kernel-chunked" "$shape_label" "_${kernel}_kernel" python3 "$out/chunked.py" "$shape" "$kernel" "$dtype"
  done
done

python3 -m tritongemm l2 --ncu "$out" | tee "$out/l2-table.md"
