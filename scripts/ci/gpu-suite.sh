#!/usr/bin/env bash
# The whole GPU test suite in time-boxed parts, under the GPU machine's Triton or under a carried
# one (../shared/device/TRITON.md), one log per part. A call of the device tool runs at most 10
# minutes and the suite needs more than that under one Triton, so each part is its own call (or a
# few short ones share a call), and no part's hang eats another's time.
#
# Usage: bash scripts/ci/gpu-suite.sh [--triton TARBALL] PART[@SECONDS] ...
#   main   every test but the two fuzzers (about 8.5 minutes on the H200 with 16 workers)
#   fuzz   tests/test_fuzz.py and test_fp8.py::test_fuzz (FUZZ_EXAMPLES sets their cases)
#   other  any other word is a pytest selection of its own (split at spaces):
#          "tests/test_fp8.py --deselect tests/test_fp8.py::test_fuzz@240"
#   --triton TARBALL  run under the slim Triton in TARBALL, through with-triton.sh beside it
# Exits 1 where any part's pytest did not pass (failed, cut by its limit), else 0.
# Logs go to $OUT (or ./gpu-logs): suite-triton<version>-<part>.txt, each ending in pytest's summary,
# then the failures and errors of every part in suite-triton<version>-summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-gpu-logs}
mkdir -p "$out"

wrap=()
if [ "${1:-}" = "--triton" ]; then
  wrap=(bash "$(dirname "$2")/with-triton.sh" "$2")
  shift 2
fi
[ $# -gt 0 ] || { echo "usage: gpu-suite.sh [--triton TARBALL] PART[@SECONDS] ..." >&2; exit 2; }

version=$("${wrap[@]}" python3 -c "import triton; print(triton.__version__)" | tail -1)
[[ $version =~ ^[0-9] ]] || { echo "gpu-suite: triton does not import here (${wrap[*]:-the machine Triton})" >&2; exit 3; }
summary="$out/suite-triton$version-summary.txt"
{
  # The tree's commit, "+changes" where the tree that travelled differs from it. The device tool's
  # copy has the landed commit as its HEAD and a session's own commits as changes: GPU_SUITE_TREE
  # (the developer's `git rev-parse --short HEAD`) names the tree instead.
  tree=${GPU_SUITE_TREE:-"$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo '+changes')"}
  echo "GPU suite at $tree under triton $version, $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "${wrap[@]}" python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)" | tail -1
} >"$summary" 2>&1

status=0  # the script's exit: 1 where any part's pytest did not pass
for part in "$@"; do
  name=${part%@*}
  secs=540
  [[ $part == *@* ]] && secs=${part##*@}
  case $name in
    main) selection=(tests --deselect tests/test_fp8.py::test_fuzz --ignore tests/test_fuzz.py) ;;
    fuzz) selection=(tests/test_fuzz.py tests/test_fp8.py::test_fuzz) ;;
    *) read -r -a selection <<<"$name"; name=$(printf %s "$name" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-40) ;;
  esac
  log="$out/suite-triton$version-$name.txt"
  echo "part $name: pytest ${selection[*]} (limit $secs s)" | tee "$log"
  start=$SECONDS
  # -v: each test's outcome is written as it finishes, so a part cut by its limit still names what ran.
  timeout -s INT "$secs" "${wrap[@]}" python3 -m pytest -n 16 --dist worksteal -v -p no:cacheprovider -rfE \
    "${selection[@]}" >>"$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  counted=$(grep -cE " (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) " "$log")
  line="part $name: exit $rc after $((SECONDS - start)) s, $counted tests reported; $(grep -E '^=+ .*(passed|failed|error).* =+$' "$log" | tail -1)"
  [ $rc -eq 124 ] || [ $rc -eq 130 ] && line="$line (cut by the $secs s limit)"
  echo "$line" | tee -a "$summary"
  grep -E "^(FAILED|ERROR) " "$log" | sort -u | tee -a "$summary" || true  # none found: grep's 1
done
exit $status
