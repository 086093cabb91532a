#!/usr/bin/env bash
# Reproduce the committed H100 results: bash scripts/ci/bench-h100.sh [suite ...]
# (default: every suite). A suite named NAME-eager runs `bench NAME --timing eager` (NAME-eager.csv);
# `overhead` is the eager host-cost benchmark (overhead.csv); `epilogue` the fused linear against
# cuBLAS + torch and torch.compile (epilogue.csv); `model` a patched Llama (model.csv, needs
# transformers); `auto` kernel="auto" on the issue-14 shapes, whose graph and eager runs are merged
# into one auto.csv. Results land in results/h100/ (CSV, JSON, PNG); logs in $OUT if set.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
log=${OUT:-results/h100}
mkdir -p results/h100 "$log"
for suite in "${@:-ladder ksweep group configs llm llm-eager auto auto-eager overhead epilogue model}"; do
  for s in $suite; do
    case $s in
      *-eager) args=("${s%-eager}" --timing eager) ;;
      *) args=("$s") ;;
    esac
    python3 -m tritongemm bench "${args[@]}" --out-dir results/h100 2>&1 | tee "$log/bench-$s.log" | grep -v '^\s*$' | tail -80
    if [ "$s" = auto-eager ] && [ -f results/h100/auto.csv ]; then  # one file, both timings (issue 14)
      python3 scripts/ci/combine_timings.py results/h100 auto
    fi
  done
done
