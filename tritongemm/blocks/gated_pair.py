"""A gated pair in one GEMM: h = act(x @ gate.T) * (x @ up.T) for a weight [gate; up] of shape
(2I, H), written once as (M, I). `GatedMLP` runs its gate and up projections through here.

The kernels that compute it:
  * rungs 6 and 9 (`tma_persistent_pipelined`, `tma_warp_specialized`; Hopper, 16-bit operands
    TMA can read in place): each tile's B slot holds the gate's rows above the up projection's
    (pipeline.issue_loads), one WGMMA yields both halves side by side, and the epilogue stores
    act(gate) * up (primitives/epilogue.py `gated_gl`);
  * grouped_mm's row-group kernel over one group (grouped/tl.py, `tl`: any GPU, the
    interpreter), two accumulators per tile.
"auto" takes the one measured fastest for M rows (`_auto_kernel`).

A plan per problem (every fact it reads in its key), built once and kept in plan.PLANS with the
other plans; later calls allocate the output and launch.
"""

from __future__ import annotations

import torch

from tritongemm.core.plans import planned
from tritongemm.core.problem import allow_tf32, tensor_facts

GATED_RUNGS = ("tma_persistent_pipelined", "tma_warp_specialized")
KERNELS = ("auto", *GATED_RUNGS)

# "auto" by M, from bench mlp (H100, bf16, Llama-3-8B's and Qwen2-7B's MLPs, the block's forward,
# torch's unfused block's time over ours): the row-group kernel at 1 and 16 rows (0.93-1.04, rung 6
# 0.83-0.94, in the first run, efef208's results/h100/mlp.csv; on its decode tile, grouped/api.py
# DECODE_PAIR_ROWS, 1.06-1.13, rung 6 0.85-0.94 and rung 9 0.67-0.78 in the run of a11ffab), rung 6
# at 128 (1.03-1.09; row-group 0.86-1.03 in the first run), rung 9 at 2048 and 8192 (1.06-1.17;
# rung 6 1.02-1.18, row-group 0.87-0.99 in the first run). The switches sit between the measured sizes.
RUNG6_FROM_ROWS = 64
RUNG9_FROM_ROWS = 1024


def gated_pair(rows: torch.Tensor, weight: torch.Tensor, activation: str, kernel: str = "auto") -> torch.Tensor:
    """act(rows @ weight[:I].T) * (rows @ weight[I:].T): rows (M, H), weight (2I, H) -> (M, I) in
    rows' dtype. `kernel`: "auto" (`_auto_kernel`), or "tma_persistent_pipelined" or
    "tma_warp_specialized" (rung 6's or 9's gated epilogue; raises where it can't run)."""
    return planned_pair(rows, weight, activation, kernel)[0](rows, weight)


def planned_pair(rows: torch.Tensor, weight: torch.Tensor, activation: str, kernel: str = "auto"):
    """(call, writes_into) for operands like these, planned once (plan.PLANS): `call(rows, weight,
    out=None) -> h`, which writes into `out` (a contiguous (M, I) tensor of rows' dtype) where
    `writes_into`, else allocates h itself (a rung whose stores need rows padded to 16 bytes, an
    empty problem) and takes no out."""
    # float32's plan reads torch's TF32 switch (ladder/_host.input_precision): the key holds it.
    tf32 = rows.dtype == torch.float32 and allow_tf32()
    key = ("gated_pair", activation, kernel, tensor_facts(rows), tensor_facts(weight), tf32)
    return planned(key, lambda: _plan(rows, weight, activation, kernel))


def check_pair(rows: torch.Tensor, weight: torch.Tensor, activation: str) -> None:
    """What a gated pair needs of its arguments, each refusal naming them: rows (M, H) and a
    weight [gate; up] (2I, H) of one dtype and device. Checked when a problem's plan is built, and
    by the operator's fake (ops.gated_pair) before a graph is traced."""
    from tritongemm.core.epilogue import GLU_ACTIVATIONS

    if activation not in GLU_ACTIVATIONS:
        raise ValueError(f"gated_pair: expected activation to be one of {GLU_ACTIVATIONS}, but got {activation!r}")
    if rows.dim() != 2 or weight.dim() != 2 or weight.shape[0] % 2 or rows.shape[1] != weight.shape[1]:
        raise ValueError(f"gated_pair: expected rows (M, H) and weight (2I, H), but got shapes {tuple(rows.shape)} "
                         f"and {tuple(weight.shape)}")  # fmt: skip
    if rows.dtype != weight.dtype or rows.device != weight.device:
        raise ValueError(f"gated_pair: expected rows and weight of one dtype and device, but got {rows.dtype} on "
                         f"{rows.device} and {weight.dtype} on {weight.device}")  # fmt: skip


def _plan(rows: torch.Tensor, weight: torch.Tensor, activation: str, kernel: str):
    """`planned_pair`'s (call, writes_into) for operands like these (checked here: the key holds
    every fact check_pair reads)."""
    check_pair(rows, weight, activation)
    if kernel not in KERNELS:
        raise ValueError(f"gated_pair: expected kernel to be one of {KERNELS}, but got {kernel!r}")
    if kernel == "auto":
        kernel = _auto_kernel(rows, weight)
    if kernel in GATED_RUNGS:
        return _rung_plan(kernel, rows, weight, activation)
    from tritongemm.grouped.api import dense_pair_plan

    return dense_pair_plan(rows, weight, activation), True


def _auto_kernel(rows: torch.Tensor, weight: torch.Tensor) -> str:
    """A gated rung for M rows where the H100 measured one faster and it can read the operands in
    place (an sm_90 GPU, 16-bit operands, TMA's alignment); otherwise "auto", the row-group kernel."""
    from tritongemm.core import device_info
    from tritongemm.core.tma import empty_output, tma_unsupported_reason

    M = rows.shape[0]
    if M < RUNG6_FROM_ROWS or rows.device.type != "cuda" or device_info.capability(rows.device) != (9, 0):
        return "auto"
    c = empty_output(M, weight.shape[0] // 2, rows.dtype, rows.device)
    if tma_unsupported_reason(rows, weight.T, c) is not None:
        return "auto"
    return GATED_RUNGS[1] if M >= RUNG9_FROM_ROWS else GATED_RUNGS[0]


def _rung_plan(kernel: str, rows: torch.Tensor, weight: torch.Tensor, activation: str):
    from tritongemm.core import checks, registry
    from tritongemm.core.tma import empty_output
    from tritongemm.dispatch.tiles import gated_config
    from tritongemm.primitives.tl.host import sm_count

    info = registry.get(kernel)
    checks.check_device(info, rows.device)
    checks.check_kernel_dtype(info, rows.dtype, rows.device)
    (M, K), N = rows.shape, weight.shape[0] // 2
    if M == 0 or N == 0 or K == 0:  # nothing to launch: act(0) * 0 is 0
        return (lambda rows, weight: rows.new_zeros((M, N))), False
    # The rung's plan refuses what it can't read in place (pipeline.check_gated_pair, the descriptors).
    config = gated_config(kernel, M, N, K, sm_count(rows.device))
    c = empty_output(M, N, rows.dtype, rows.device)  # this call's, to plan on
    launch = info.plan(rows, weight.T, c, config, glu=activation)

    def call(rows, weight, out=None):
        c = empty_output(M, N, rows.dtype, rows.device) if out is None else out
        launch(rows, weight.T, c)
        return c

    return call, c.is_contiguous()  # a padded c's layout is not a contiguous out's
