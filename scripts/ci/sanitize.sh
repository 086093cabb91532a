#!/usr/bin/env bash
# Memory and race checks on a GPU: compute-sanitizer's memcheck, racecheck and synccheck over
# every kernel on boundary shapes (scripts/ci/sanitize_cases.py, results checked too), and Triton's
# concurrency sanitizer (ConSan, TRITON_INSTRUMENTATION_MODE=consan) over each kernel in its own
# process (a race it finds is a device-side assert, which ends the process). All run at once,
# each under SANITIZE_TIMEOUT seconds (default 240).
# PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives every tensor its own cudaMalloc, so that an access past
# one lands outside any allocation, where memcheck sees it.
# Logs go to $OUT (or ./sanitize-logs).
# Usage: bash scripts/ci/sanitize.sh [memcheck|racecheck|synccheck|consan ...]   (default: all four)
# SANITIZE_FULL=1 runs racecheck, synccheck and ConSan over every case, as memcheck does.
# SANITIZE_KERNELS="a b" limits ConSan to those kernels (default: every kernel this GPU runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1
out=${OUT:-sanitize-logs}
mkdir -p "$out"
limit=${SANITIZE_TIMEOUT:-240}
tools=("${@:-memcheck racecheck synccheck consan}")
read -r -a tools <<<"${tools[*]}"
kernels=${SANITIZE_KERNELS:-$(python3 -c "import tritongemm; print(' '.join(k['name'] for k in tritongemm.kernels(family='matmul') if k['available'] and not k['experimental']))")}
start=$SECONDS

for tool in "${tools[@]}"; do
  if [ "$tool" = consan ]; then
    for kernel in $kernels; do
      quick=$([ -n "${SANITIZE_FULL:-}" ] || echo --quick)
      (TRITON_INSTRUMENTATION_MODE=consan timeout "$limit" python3 scripts/ci/sanitize_cases.py --consan $quick \
        --kernel "$kernel" >"$out/consan-$kernel.log" 2>&1
       echo "exit $?" >>"$out/consan-$kernel.log") &
    done
  else
    # --quick for the slow tools: racecheck and synccheck instrument every shared-memory access.
    quick=$([ "$tool" = memcheck ] || [ -n "${SANITIZE_FULL:-}" ] || echo --quick)
    (timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 100 \
      --log-file "$out/$tool.log" python3 scripts/ci/sanitize_cases.py $quick >"$out/$tool.out" 2>&1
     echo "exit $?" >>"$out/$tool.out") &
  fi
done
wait

status=0
summary="$out/sanitize-summary.txt"
: >"$summary"
for tool in "${tools[@]}"; do
  if [ "$tool" = consan ]; then
    for kernel in $kernels; do
      log="$out/consan-$kernel.log"
      line="consan $kernel: $(tail -1 "$log"); $(grep -h 'launches' "$log" | head -1)"
      grep -qi 'assert' "$log" && line="$line; DEVICE ASSERT (see $log)"
      [ "$(tail -1 "$log")" = "exit 0" ] || status=1
      echo "$line" >>"$summary"
    done
  else
    echo "$tool: $(tail -1 "$out/$tool.out"); $(grep -h 'launches' "$out/$tool.out" | tr '\n' ' ')" \
      "$(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$out/$tool.log" 2>/dev/null | tr '\n' ' ')" >>"$summary"
    [ "$(tail -1 "$out/$tool.out")" = "exit 0" ] || status=1
  fi
done
echo "($((SECONDS - start)) s)" >>"$summary"
cat "$summary"
exit "$status"
