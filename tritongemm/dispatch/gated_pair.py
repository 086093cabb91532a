"""Which kernel a gated pair's "auto" takes (core/registry.py's `gated_pair` rows), by M, as
bench mlp measured them on the H100 (blocks/gated_pair.py computes the pair)."""

from __future__ import annotations

import torch

from tritongemm.core import device_info
from tritongemm.core.registry import GATED_RUNGS
from tritongemm.core.tma import empty_output, tma_unsupported_reason

# "auto" by M, from bench mlp (H100, bf16, Llama-3-8B's and Qwen2-7B's MLPs, the block's forward,
# torch's unfused block's time over ours): the row-group kernel at 1 and 16 rows (0.93-1.04, rung 6
# 0.83-0.94, in the first run, efef208's results/h100/mlp.csv; on its decode tile, dispatch/grouped.py
# DECODE_PAIR_ROWS, 1.06-1.13, rung 6 0.85-0.94 and rung 9 0.67-0.78 in the run of a11ffab), rung 6
# at 128 (1.03-1.09; row-group 0.86-1.03 in the first run), rung 9 at 2048 and 8192 (1.06-1.17;
# rung 6 1.02-1.18, row-group 0.87-0.99 in the first run). The switches sit between the measured sizes.
RUNG6_FROM_ROWS = 64
RUNG9_FROM_ROWS = 1024


def choose(rows: torch.Tensor, weight: torch.Tensor) -> str:
    """A gated rung for M rows where the H100 measured one faster and it can read the operands in
    place (an sm_90 GPU, 16-bit operands, TMA's alignment); otherwise "auto", the row-group kernel."""
    M = rows.shape[0]
    if M < RUNG6_FROM_ROWS or rows.device.type != "cuda" or device_info.capability(rows.device) != (9, 0):
        return "auto"
    c = empty_output(M, weight.shape[0] // 2, rows.dtype, rows.device)
    if tma_unsupported_reason(rows, weight.T, c) is not None:
        return "auto"
    return GATED_RUNGS[1] if M >= RUNG9_FROM_ROWS else GATED_RUNGS[0]
