#!/usr/bin/env bash
# The pictures of docs/see-inside.md, on any machine (no GPU): bash scripts/ci/docs-pictures.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
img=docs/img
mkdir -p "$img"
# A toy GPU with 16 SMs on a 12 x 12 grid of 128 x 128 tiles: 9 waves, small enough to read.
toy="1536 1536 --block-m 128 --block-n 128 --group-size-m 4 --sms 16"
python3 -m tritongemm schedule $toy --kernel naive --out "$img/schedule-naive.png"
python3 -m tritongemm schedule $toy --kernel grouped --out "$img/schedule-grouped.png"
python3 -m tritongemm schedule $toy --kernel persistent --out "$img/schedule-persistent.png"
python3 -m tritongemm schedule $toy --kernel tma_persistent --scheduler chunked --out "$img/schedule-chunked.png"
# The real thing: 8192 x 8192 in 128 x 256 tiles on an H100's 132 SMs.
h100="8192 8192 --block-m 128 --block-n 256 --group-size-m 8"
python3 -m tritongemm schedule $h100 --kernel tma_pipelined --out "$img/schedule-h100-column-major.png"
python3 -m tritongemm schedule $h100 --kernel grouped --out "$img/schedule-h100-grouped.png"
python3 -m tritongemm l2 8192 8192 8192 --plot "$img/l2-8192.png"
python3 -m tritongemm.tools.grouped_schedule --out "$img/grouped-schedule.png"
# Odd widths (docs/stream-k.md): one GPU's q,k,v chunk in rung 6's 64 x 128 tiles, 1.2 waves run in
# two, and in rung 13's 64 x 160, one (rung 13 walks its tiles in rung 6's order).
python3 -m tritongemm schedule 512 2560 --kernel tma_persistent_pipelined --block-m 64 --block-n 128 --out "$img/waves-512x2560-64x128.png"
python3 -m tritongemm schedule 512 2560 --kernel tma_persistent_pipelined --block-m 64 --block-n 160 --out "$img/waves-512x2560-64x160.png"
