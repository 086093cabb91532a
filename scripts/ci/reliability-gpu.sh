#!/usr/bin/env bash
# Issue 6's GPU run in one call of the device tool: the reliability tests (non-finite values,
# bad input, > 2**31 indexing, determinism, threads, streams, CUDA graphs), the fuzzer over every
# kernel and dtype (FUZZ_EXAMPLES cases, default 2000), then scripts/ci/sanitize.sh with what time
# is left of BUDGET_S (default 420 s). Everything ends up in $OUT/reliability-logs.tar.gz (or
# ./reliability-logs), with a summary at the end of the output.
# Usage: bash scripts/ci/reliability-gpu.sh [pytest|fuzz|sanitize ...]   (default: all three)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-reliability-logs}
logs=$(mktemp -d)
budget=${BUDGET_S:-420}
stages=("${@:-pytest fuzz sanitize}")
read -r -a stages <<<"${stages[*]}"
has() { [[ " ${stages[*]} " == *" $1 "* ]]; }
left() { echo $((budget - SECONDS)); }
mkdir -p "$out"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  compute-sanitizer --version | tail -1
} >"$logs/env.txt" 2>&1
cat "$logs/env.txt"

if has pytest || has fuzz; then
  targets=()
  has pytest && targets+=(tests/test_nonfinite.py tests/test_errors.py tests/test_index_width.py
    tests/gpu/test_concurrency.py tests/gpu/test_large_index.py)
  has fuzz && targets+=(tests/test_fuzz.py)
  # One xdist pool for all (compiles dominate: 16 CPUs); the large tests take turns (conftest).
  FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-2000} FUZZ_KEEP_GOING=1 FUZZ_LOG="$logs/fuzz" \
    timeout $(($(left) - $(has sanitize && echo 150 || echo 20))) python3 -m pytest -n ${PYTEST_WORKERS:-16} -q -p no:cacheprovider -rfE --durations=15 \
    --junitxml="$logs/junit.xml" "${targets[@]}" >"$logs/pytest.log" 2>&1
  echo "pytest exit $?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$logs/pytest.log" | tail -40
  python3 - "$logs/fuzz" <<'EOF' | tee "$logs/fuzz-summary.txt"
import collections, glob, json, sys
rows = [json.loads(line) for f in glob.glob(f"{sys.argv[1]}/*.jsonl") for line in open(f)]
by = collections.Counter((r["kernel"], r["ok"]) for r in rows)
print(f"fuzz: {len(rows)} cases, {sum(r['ok'] for r in rows)} passed, {sum(not r['ok'] for r in rows)} failed")
dtypes = collections.Counter((r["kernel"], r["dtype"].removeprefix("torch.")) for r in rows)
for kernel in sorted({k for k, _ in by}):
    each = ", ".join(f"{n} {d}" for (k, d), n in sorted(dtypes.items()) if k == kernel)
    print(f"  {kernel}: {by[kernel, True]} passed, {by[kernel, False]} failed ({each})")
for r in [r for r in rows if not r["ok"]][:15]:
    print("  FAIL", r["error"].replace("\n", " | ")[:600])
EOF
fi

if has sanitize && [ "$(left)" -gt 60 ]; then
  # Four tools share what is left.
  OUT="$logs/sanitize" SANITIZE_TIMEOUT=$(($(left) / 4 - 5)) bash scripts/ci/sanitize.sh
  echo "sanitize exit $?"
fi

tar -czf "$out/reliability-logs.tar.gz" -C "$logs" .
echo "logs: $out/reliability-logs.tar.gz ($SECONDS s in all)"
