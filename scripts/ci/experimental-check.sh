#!/usr/bin/env bash
# The experimental Hopper rungs on an H100 in one call of the device tool: rung 9
# (tma_warp_specialized), rung 11 (tma_ping_pong) and rung 10 (stream_k). In the order that keeps
# a hang from costing the call: a smoke case of each warp-specialized rung first, then their tests
# (each GPU case in a process of its own with a time limit), then, only if they pass,
# compute-sanitizer and ConSan on them, then the K sweep and the llm suite's M >= 2048 rows
# against rung 6 and cuBLAS. Logs and results in $OUT (or ./exp-logs). racecheck's reports for
# rungs 9 and 11 are expected: scripts/probes/reliability/racecheck_warp_specialize.py shows where they come from.
# Usage: bash scripts/ci/experimental-check.sh   (about 9 minutes; EXP_BENCH=0 skips the benchmarks)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-exp-logs}
mkdir -p "$out"

# Smoke cases first, alone and short: 2 slots, one K-step a tile, many tiles a program. A wrong
# barrier phase hangs them (the test's own limit is 120 s), and then nothing else is worth running.
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_warp_specialized.py \
  -k "many_tiles_per_program and 257 and float16" >"$out/smoke.log" 2>&1
status=$?
echo "smoke: exit $status; $(grep -E 'passed|failed' "$out/smoke.log" | tail -1)"
[ "$status" = 0 ] || exit "$status"
timeout 300 python3 -m pytest -n 8 -q -p no:cacheprovider tests/test_warp_specialized.py tests/test_stream_k.py \
  >"$out/tests.log" 2>&1
status=$?
echo "tests: exit $status; $(grep -E 'passed|failed' "$out/tests.log" | tail -1)"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -20
[ "$status" = 0 ] || exit "$status"

for tool in memcheck racecheck synccheck; do
  (PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 99 \
     --print-limit 50 --log-file "$out/$tool.log" python3 scripts/ci/sanitize_cases.py --kernel tma_warp_specialized \
     --kernel tma_ping_pong --kernel stream_k --quick >"$out/$tool.out" 2>&1; echo "exit $?" >>"$out/$tool.out") &
done
# ConSan takes 125-150 s for each warp-specialized rung's 8 launches (H100, 2026-11-23): one
# process each, side by side, or the second would run past the limit.
for kernel in tma_warp_specialized tma_ping_pong; do
  (TRITON_INSTRUMENTATION_MODE=consan timeout 240 python3 scripts/ci/sanitize_cases.py --consan --quick \
     --kernel "$kernel" >"$out/consan-$kernel.out" 2>&1; echo "exit $?" >>"$out/consan-$kernel.out") &
done
wait
for tool in memcheck racecheck synccheck consan-tma_warp_specialized consan-tma_ping_pong; do
  echo "$tool: $(grep -h launches "$out/$tool.out" | tr '\n' ' '); $(tail -1 "$out/$tool.out")" \
    "$(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$out/$tool.log" 2>/dev/null | tr '\n' ' ')"
done

[ "${EXP_BENCH:-1}" = 0 ] && exit 0
kernels=tma_persistent_pipelined,tma_warp_specialized,tma_ping_pong
llm_big="2048,4096,4096;2048,4096,14336;2048,14336,4096;8192,4096,4096;8192,4096,14336;8192,14336,4096"
python3 -m tritongemm bench ksweep --kernels $kernels --name ksweep-ws --out-dir "$out" --no-plot 2>&1 | tail -40
python3 -m tritongemm bench --shapes "$llm_big" --layout nt --kernels $kernels --name llm-ws \
  --out-dir "$out" --no-plot 2>&1 | tail -40
