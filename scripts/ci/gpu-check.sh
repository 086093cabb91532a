#!/usr/bin/env bash
# One GPU check in one call of the device tool (its machine has torch, triton 3.6.0 and pytest,
# and no network): versions, the GPU test command, the demo. Logs go to $OUT (or ./gpu-logs).
# Usage: bash scripts/ci/gpu-check.sh [pytest args...]   (default: the whole suite)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-gpu-logs}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/env.txt"
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)" | tee -a "$out/env.txt"
# -v: every test's outcome goes to the log as it finishes, so a run the call's time limit cuts
# still names its failures (on screen as they come); -q's dots named none (2026-11-27).
python3 -m pytest -n 12 --dist worksteal --durations=30 -v -p no:cacheprovider "${@:-tests}" 2>&1 \
    | tee "$out/pytest.log" | grep --line-buffered -E "FAILED|ERROR|[0-9]+ (passed|failed)|slowest|^[0-9.]+s "
status=${PIPESTATUS[0]}
python3 -m tritongemm demo 2>&1 | tee "$out/demo.log"
exit "$status"
