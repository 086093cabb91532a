#!/usr/bin/env bash
# One device call, several stages, each under its own time limit (seconds), everything under
# $OUT/logs.tar.gz: bash scripts/ci/session-gpu.sh "pytest:240:tests/test_a.py tests/test_b.py" "bench:200:ksweep" ...
# A stage is KIND:SECONDS:ARGS; pytest runs ARGS with 16 workers, bench runs `tritongemm bench ARGS
# --out-dir logs/results`, py runs `python3 ARGS`.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}. PYTHONUNBUFFERED=1  # a caller's extra site (a carried wheel) stays first
out=${OUT:-gpu-logs}
logs=$(mktemp -d)
mkdir -p "$out" "$logs/results"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } >"$logs/env.txt" 2>&1
cat "$logs/env.txt"
i=0
for stage in "$@"; do
  i=$((i + 1))
  kind=${stage%%:*}; rest=${stage#*:}; secs=${rest%%:*}; args=${rest#*:}
  log="$logs/$i-$kind.log"
  start=$SECONDS
  case $kind in
    pytest) timeout -s INT "$secs" python3 -m pytest -n 16 -q -p no:cacheprovider -rfE $args >"$log" 2>&1 ;;
    bench) timeout -s INT "$secs" python3 -m tritongemm bench $args --out-dir "$logs/results" >"$log" 2>&1 ;;
    py) timeout -s INT "$secs" python3 $args >"$log" 2>&1 ;;
  esac
  rc=$?
  echo "== stage $i ($kind $args): exit $rc after $((SECONDS - start)) s"
  grep -E "^(FAILED|ERROR)|passed|failed|Error|error:" "$log" | tail -15
  tail -4 "$log"
  tar czf "$out/logs.tar.gz" -C "$logs" .
done
