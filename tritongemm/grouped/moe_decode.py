"""MoE experts at decode: a few tokens, each routed to top_k experts, as two kernel launches.

The grouped path (moe.py) sorts the (token, expert) pairs by expert, gathers the tokens in that
order, counts each expert's rows, runs two grouped GEMMs, then weights and un-permutes the rows:
about fifteen launches a layer. At one token they cost more host time than the GEMMs cost GPU
time: in a Qwen3-MoE-shaped decode the experts took 0.52 ms of host time a call against 0.24 ms
for transformers' own path (cProfile, `scripts/probes/model/decode_probe.py qwen3-30b-moe`, on an H200).

Here the router's choice is read as it is. `_expert_rows_kernel` (tl.py) runs each pair as
one row times its expert's weights:
    h[p]   = act(x[p // top_k] @ gate[e_p]) * (x[p // top_k] @ up[e_p])     one launch, all pairs
    out[t] = sum_j w[t, j] * (h[t * top_k + j] @ down[e_tj])                 one launch, all tokens
the routing weights and the sum over each token's experts in the second kernel's fp32
accumulator. A pair routed to no expert (an index outside [0, experts)) adds nothing, as on the
grouped path, whose histc drops it. Nothing is sorted and nothing synchronizes. Each pair reads its expert's weights on
its own, so two tokens that share an expert read it twice: the path serves calls of at most
PAIRS_PER_EXPERT pairs an expert, where the grouped path, which reads each expert once, takes over.

Measured kernel-only on an H200 (`scripts/probes/grouped/moe_decode_probe.py`, results/h200/probes/moe-decode-*):
against the grouped path, Qwen3-MoE's layer (128 small experts, top 8) 2.3x at 1 token, 1.4x at
4, about even at 16 (128 pairs); Mixtral's (8 large experts, top 2) 1.27x at 1 token, 1.16x at
2, 0.78x at 4 (8 pairs: every expert read about twice). Half a pair an expert is the line between.
"""

from __future__ import annotations

import torch

from tritongemm.core import operators
from tritongemm.core.epilogue import GLU_ACTIVATIONS
from tritongemm.core.operators import LIB, no_context, register_autograd
from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts

PAIRS_PER_EXPERT = 0.5


def serves(tokens: int, top_k: int, experts: int) -> bool:
    """Whether this path serves `tokens` tokens routed to `top_k` of `experts` experts."""
    return 0 < tokens * top_k <= PAIRS_PER_EXPERT * experts


def experts_decode(x, gate_up, down, top_k_index, top_k_weights, glu: str) -> torch.Tensor:
    """x (tokens, hidden); gate_up (experts, hidden, 2 x width) with [gate; up] columns and down
    (experts, width, hidden), as grouped_mm's b (any strides); top_k_index and top_k_weights
    (tokens, top_k). Returns (tokens, hidden) in x's dtype. Planned once per problem (core.plans.PLANS):
    the shapes are checked as the plan is built, the kernels compiled, the grids fixed."""
    call = planned_decode(x, gate_up, down, top_k_index, top_k_weights, glu)
    return call(x, gate_up, down, top_k_index.reshape(-1), top_k_weights.reshape(-1))


def planned_decode(x, gate_up, down, top_k_index, top_k_weights, glu: str):
    """`call(x, gate_up, down, ids, weights, out=None) -> out` for arguments like these, planned
    once (core.plans.PLANS): ids and weights flat (tokens x top_k,), out (tokens, hidden) contiguous in
    x's dtype, allocated where not given."""
    key = ("moe decode", glu, *map(tensor_facts, (x, gate_up, down, top_k_index, top_k_weights)))

    def build():
        check(x, gate_up, down, top_k_index, top_k_weights, glu)
        return _planner().decode_call(x, gate_up, down, top_k_index, top_k_weights, glu)

    call = planned(key, build)
    return call


def _planner():
    """grouped/moe_build.py, imported on the first decode plan: its kernels import Triton, whose
    decoration of a kernel reads TRITON_INTERPRET (a program may set it after import tritongemm)."""
    from tritongemm.grouped import moe_build

    return moe_build


def check(x, gate_up, down, top_k_index, top_k_weights, glu: str) -> None:
    """What the kernels index by, each refusal naming the argument: x (tokens, hidden), gate_up
    (experts, hidden, 2 x width), down (experts, width, hidden), top_k_index of an integer dtype
    and top_k_weights (tokens, top_k); glu one of the gated activations. Checked once per problem,
    as the plan is built, and by the operator's fake (moe_decode_op's) before a graph is traced."""
    if glu not in GLU_ACTIVATIONS:
        raise ValueError(f"moe decode: expected glu to be one of {GLU_ACTIVATIONS}, but got {glu!r}")
    if x.dim() != 2 or gate_up.dim() != 3 or top_k_index.dim() != 2:
        raise ValueError(
            f"moe decode: expected x (tokens, hidden), gate_up (experts, hidden, 2 x width) and top_k_index "
            f"(tokens, top_k), but got shapes {tuple(x.shape)}, {tuple(gate_up.shape)} and {tuple(top_k_index.shape)}"
        )
    (tokens, hidden), experts = x.shape, gate_up.shape[0]
    if gate_up.shape[2] % 2:
        raise ValueError(
            f"moe decode: expected gate_up's columns [gate; up], an even number, but got {gate_up.shape[2]}"
        )
    top_k = top_k_index.shape[1]
    expected = {
        "gate_up": (gate_up.shape, (experts, hidden, gate_up.shape[2])),
        "down": (down.shape, (experts, gate_up.shape[2] // 2, hidden)),
        "top_k_index": (top_k_index.shape, (tokens, top_k)),
        "top_k_weights": (top_k_weights.shape, (tokens, top_k)),
    }
    for name, (got, want) in expected.items():
        if tuple(got) != tuple(want):
            raise ValueError(f"moe decode: expected {name} of shape {want}, but got {tuple(got)}")
    if not (x.dtype == gate_up.dtype == down.dtype):
        raise TypeError(f"moe decode: expected x, gate_up and down of one dtype, got {x.dtype}, {gate_up.dtype}, "
                        f"{down.dtype}")  # fmt: skip
    if top_k_index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"moe decode: expected top_k_index of an integer dtype, but got {top_k_index.dtype}")


# ----------------------------------------------------------------------------------------------
# The operator, for graphs
# ----------------------------------------------------------------------------------------------


LIB.define("moe_decode(Tensor x, Tensor gate_up, Tensor down, Tensor top_k_index, Tensor top_k_weights, str glu) "
            "-> Tensor")  # fmt: skip


def moe_decode_impl(x, gate_up, down, top_k_index, top_k_weights, glu):
    return experts_decode(x, gate_up, down, top_k_index, top_k_weights, glu)


LIB.impl("moe_decode", moe_decode_impl, "CompositeExplicitAutograd")
moe_decode_op = torch.ops.tritongemm.moe_decode.default


@torch.library.register_fake("tritongemm::moe_decode", lib=LIB)
def _moe_decode_fake(x, gate_up, down, top_k_index, top_k_weights, glu):
    operators.traced()
    check(x, gate_up, down, top_k_index, top_k_weights, glu)
    return x.new_empty(x.shape)


def _decode_backward(ctx, grad):
    # moe.py takes this path only where no gradient is recorded (moe._decode_serves): each pair's
    # gated row is never kept for a backward to read.
    raise RuntimeError("tritongemm::moe_decode has no backward: call it where no gradient is recorded")


register_autograd(moe_decode_op, moe_decode_impl, no_context, _decode_backward)
