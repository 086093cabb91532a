"""A gated pair in one GEMM: h = act(x @ gate.T) * (x @ up.T) for a weight [gate; up] of shape
(2I, H), written once as (M, I). `GatedMLP` runs its gate and up projections through here.

The kernels that compute it:
  * rungs 6 and 9 (`tma_persistent_pipelined`, `tma_warp_specialized`; Hopper, 16-bit operands
    TMA can read in place): each tile's B slot holds the gate's rows above the up projection's
    (pipeline.issue_loads), one WGMMA yields both halves side by side, and the epilogue stores
    act(gate) * up (primitives/epilogue.py `gated_gl`);
  * grouped_mm's row-group kernel over one group (grouped/tl.py, `tl`: any GPU, the
    interpreter), two accumulators per tile.
"auto" takes the one measured fastest for M rows (dispatch/gated_pair.py).

A plan per problem (every fact it reads in its key), built once and kept in core.plans.PLANS with the
other plans; later calls allocate the output and launch.
"""

from __future__ import annotations

import torch

from tritongemm.core import checks, operators, registry
from tritongemm.core.epilogue import GLU_ACTIVATIONS
from tritongemm.core.operators import LIB, no_context, register_autograd
from tritongemm.core.plans import planned
from tritongemm.core.problem import allow_tf32, tensor_facts
from tritongemm.core.registry import GATED_RUNGS

KERNELS = ("auto", *GATED_RUNGS)


def gated_pair(rows: torch.Tensor, weight: torch.Tensor, activation: str, kernel: str = "auto") -> torch.Tensor:
    """act(rows @ weight[:I].T) * (rows @ weight[I:].T): rows (M, H), weight (2I, H) -> (M, I) in
    rows' dtype. `kernel`: "auto" (dispatch/gated_pair.py), or "tma_persistent_pipelined" or
    "tma_warp_specialized" (rung 6's or 9's gated epilogue; raises where it can't run)."""
    return planned_pair(rows, weight, activation, kernel)[0](rows, weight)


def planned_pair(rows: torch.Tensor, weight: torch.Tensor, activation: str, kernel: str = "auto"):
    """(call, writes_into) for operands like these, planned once (core.plans.PLANS): `call(rows, weight,
    out=None) -> h`, which writes into `out` (a contiguous (M, I) tensor of rows' dtype) where
    `writes_into`, else allocates h itself (a rung whose stores need rows padded to 16 bytes, an
    empty problem) and takes no out."""
    # float32's plan reads torch's TF32 switch (primitives/tl/host.input_precision): the key holds it.
    tf32 = rows.dtype == torch.float32 and allow_tf32()
    key = ("gated_pair", activation, kernel, tensor_facts(rows), tensor_facts(weight), tf32)
    return planned(key, lambda: _build(rows, weight, activation, kernel))


def check_pair(rows: torch.Tensor, weight: torch.Tensor, activation: str) -> None:
    """What a gated pair needs of its arguments, each refusal naming them: rows (M, H) and a
    weight [gate; up] (2I, H) of one dtype and device. Checked when a problem's plan is built, and
    by the operator's fake (gated_pair_op's) before a graph is traced."""
    if activation not in GLU_ACTIVATIONS:
        raise ValueError(f"gated_pair: expected activation to be one of {GLU_ACTIVATIONS}, but got {activation!r}")
    if rows.dim() != 2 or weight.dim() != 2 or weight.shape[0] % 2 or rows.shape[1] != weight.shape[1]:
        raise ValueError(f"gated_pair: expected rows (M, H) and weight (2I, H), but got shapes {tuple(rows.shape)} "
                         f"and {tuple(weight.shape)}")  # fmt: skip
    if rows.dtype != weight.dtype or rows.device != weight.device:
        raise ValueError(f"gated_pair: expected rows and weight of one dtype and device, but got {rows.dtype} on "
                         f"{rows.device} and {weight.dtype} on {weight.device}")  # fmt: skip


def _checked(rows: torch.Tensor, weight: torch.Tensor, activation: str, kernel: str) -> None:
    """`check_pair`, and the kernel: "auto" or a gated rung that runs on these operands."""
    check_pair(rows, weight, activation)
    if kernel not in KERNELS:
        raise ValueError(f"gated_pair: expected kernel to be one of {KERNELS}, but got {kernel!r}")
    if kernel != "auto":
        info = registry.get(kernel, "gated_pair")
        checks.check_device(info, rows.device)
        checks.check_kernel_dtype(info, rows.dtype, rows.device)


def _build(rows: torch.Tensor, weight: torch.Tensor, activation: str, kernel: str):
    """`planned_pair`'s (call, writes_into) for operands like these, checked here (the key holds
    every fact the checks read) and built by blocks/gated_pair_build.py, imported on the first plan:
    it imports the kernels, and with them Triton, whose decoration reads TRITON_INTERPRET."""
    _checked(rows, weight, activation, kernel)
    from tritongemm.blocks import gated_pair_build

    return gated_pair_build.pair_call(rows, weight, activation, kernel)


# ----------------------------------------------------------------------------------------------
# The operator, for inference
# ----------------------------------------------------------------------------------------------


LIB.define("gated_pair(Tensor rows, Tensor weight, str activation, str kernel_name='auto') -> Tensor")


def gated_pair_impl(rows, weight, activation, kernel_name="auto"):
    h = gated_pair(rows, weight, activation, kernel_name)  # checked once per problem, as its plan is built
    return h if h.is_contiguous() else h.contiguous()  # as the fake says: a rung may pad C's rows


LIB.impl("gated_pair", gated_pair_impl, "CompositeExplicitAutograd")
gated_pair_op = torch.ops.tritongemm.gated_pair.default


@torch.library.register_fake("tritongemm::gated_pair", lib=LIB)
def _gated_pair_fake(rows, weight, activation, kernel_name="auto"):
    operators.traced()
    check_pair(rows, weight, activation)
    if kernel_name not in KERNELS:
        raise ValueError(f"gated_pair: expected kernel_name to be one of {KERNELS}, but got {kernel_name!r}")
    return rows.new_empty((rows.shape[0], weight.shape[0] // 2))


def _gated_backward(ctx, grad):
    # GatedMLP traces the pair's GEMM (`mm`) and the gating in torch when autograd records: the
    # gated kernel never keeps the pair a backward needs.
    raise RuntimeError("tritongemm::gated_pair has no backward: call it where no gradient is recorded")


register_autograd(gated_pair_op, gated_pair_impl, no_context, _gated_backward)
