#!/usr/bin/env bash
# Rung 9 (tma_warp_specialized, experimental) on an H100 in one call of the device tool, in the
# order that keeps a hang from costing the call: its own tests first (each GPU case in a process
# of its own with a time limit), then, only if they pass, compute-sanitizer and ConSan on it, then
# the K sweep and the llm suite against rung 6 and cuBLAS (the one-warpgroup default tiles, then
# the two-warpgroup 128 x 256 tile). Logs and result files in $OUT (or ./ws-logs).
# Usage: bash scripts/ws-check.sh   (about 9 minutes; WS_BENCH=0 skips the benchmarks)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-ws-logs}
mkdir -p "$out"
kernel=tma_warp_specialized
two_warpgroups="128x256x64 g8 w8 s3"

timeout 300 python3 -m pytest -n 8 -q -p no:cacheprovider tests/test_warp_specialized.py >"$out/tests.log" 2>&1
status=$?
echo "tests: exit $status; $(grep -E 'passed|failed' "$out/tests.log" | tail -1)"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -20
[ "$status" = 0 ] || exit "$status"

for tool in memcheck racecheck synccheck; do
  (PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 99 \
     --print-limit 50 --log-file "$out/$tool.log" python3 scripts/sanitize_cases.py --kernel $kernel --quick \
     >"$out/$tool.out" 2>&1; echo "exit $?" >>"$out/$tool.out") &
done
(TRITON_INSTRUMENTATION_MODE=consan timeout 150 python3 scripts/sanitize_cases.py --consan --quick --kernel $kernel \
   >"$out/consan.out" 2>&1; echo "exit $?" >>"$out/consan.out") &
wait
for tool in memcheck racecheck synccheck consan; do
  echo "$tool: $(grep -h launches "$out/$tool.out" | head -1); $(tail -1 "$out/$tool.out")" \
    "$(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$out/$tool.log" 2>/dev/null | tr '\n' ' ')"
done

[ "${WS_BENCH:-1}" = 0 ] && exit 0
kernels=tma_persistent_pipelined,$kernel
llm_big="2048,4096,4096;2048,4096,14336;2048,14336,4096;8192,4096,4096;8192,4096,14336;8192,14336,4096"
python3 -m tritongemm bench ksweep --kernels $kernels --out-dir "$out" --no-plot 2>&1 | tail -30
python3 -m tritongemm bench --shapes "$llm_big" --layout nt --kernels $kernels --name llm-ws \
  --out-dir "$out" --no-plot 2>&1 | tail -16
python3 -m tritongemm bench --shapes "8192,8192,8192;8192,8192,4096;4096,4096,4096" --kernels $kernel \
  --configs "$two_warpgroups" --name ws-two-warpgroups --out-dir "$out" --no-plot 2>&1 | tail -14
