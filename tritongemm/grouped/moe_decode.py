"""MoE experts at decode: a few tokens, each routed to top_k experts, as two kernel launches.

The grouped path (moe.py) sorts the (token, expert) pairs by expert, gathers the tokens in that
order, counts each expert's rows, runs two grouped GEMMs, then weights and un-permutes the rows:
about fifteen launches a layer. At one token they cost more host time than the GEMMs cost GPU
time: in a Qwen3-MoE-shaped decode the experts took 0.52 ms of host time a call against 0.24 ms
for transformers' own path (cProfile, `scripts/probes/model/decode_probe.py qwen3-30b-moe`, on an H200).

Here the router's choice is read as it is. `_expert_rows_kernel` (kernels.py) runs each pair as
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

from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts

PAIRS_PER_EXPERT = 0.5
# A program's tile: BLOCK_N columns x BLOCK_K of K, TILE_ELEMENTS in all, so each thread has a
# few 16-byte loads in flight whatever the split; BLOCK_N as wide as still gives every SM WAVES
# programs (a down projection of one token has few columns and a long K).
# 8192 elements, 4 waves, 4 warps: the best of 8 settings on 5 of the 6 probed rows.
TILE = dict(TILE_ELEMENTS=8192, WAVES=4, num_warps=4)


def serves(tokens: int, top_k: int, experts: int) -> bool:
    """Whether this path serves `tokens` tokens routed to `top_k` of `experts` experts."""
    return 0 < tokens * top_k <= PAIRS_PER_EXPERT * experts


def experts_decode(x, gate_up, down, top_k_index, top_k_weights, glu: str) -> torch.Tensor:
    """x (tokens, hidden); gate_up (experts, hidden, 2 x width) with [gate; up] columns and down
    (experts, width, hidden), as grouped_mm's b (any strides); top_k_index and top_k_weights
    (tokens, top_k). Returns (tokens, hidden) in x's dtype. Planned once per problem (plan.PLANS):
    the shapes are checked as the plan is built, the kernels compiled, the grids fixed."""
    call = planned_decode(x, gate_up, down, top_k_index, top_k_weights, glu)
    return call(x, gate_up, down, top_k_index.reshape(-1), top_k_weights.reshape(-1))


def planned_decode(x, gate_up, down, top_k_index, top_k_weights, glu: str):
    """`call(x, gate_up, down, ids, weights, out=None) -> out` for arguments like these, planned
    once (plan.PLANS): ids and weights flat (tokens x top_k,), out (tokens, hidden) contiguous in
    x's dtype, allocated where not given."""
    key = ("moe decode", glu, *map(tensor_facts, (x, gate_up, down, top_k_index, top_k_weights)))
    call = planned(key, lambda: _plan(x, gate_up, down, top_k_index, top_k_weights, glu))
    return call


def _plan(x, gate_up, down, top_k_index, top_k_weights, glu: str):
    from tritongemm.grouped.tl import _expert_rows_kernel
    from tritongemm.primitives.launch import compile_launch

    check(x, gate_up, down, top_k_index, top_k_weights, glu)
    (tokens, hidden), top_k = x.shape, top_k_index.shape[1]
    width = gate_up.shape[2] // 2
    ids, weights = top_k_index.reshape(-1), top_k_weights.reshape(-1)
    pairs = tokens * top_k
    h = x.new_empty((pairs, width))  # this call's, to plan on
    out = x.new_empty((tokens, hidden))
    up_n, down_n = _block_n(pairs, width, x.device), _block_n(tokens, hidden, x.device)
    common = dict(num_warps=TILE["num_warps"])
    experts = gate_up.shape[0]
    up_sizes = (width, hidden, experts, *x.stride(), *gate_up.stride(), *h.stride())
    down_sizes = (hidden, width, experts, *h.stride(), *down.stride(), *out.stride())
    launch_up = compile_launch(_expert_rows_kernel, (pairs, -(-width // up_n)),
                               (x, gate_up, h, ids, weights, *up_sizes),
                               dict(common, PAIRS_PER_ROW=1, A_ROW_DIV=top_k, SCALED=False, GLU=glu, BLOCK_N=up_n,
                                    BLOCK_K=_block_k(up_n, hidden)),
                               x.device)  # fmt: skip
    launch_down = compile_launch(_expert_rows_kernel, (tokens, -(-hidden // down_n)),
                                 (h, down, out, ids, weights, *down_sizes),
                                 dict(common, PAIRS_PER_ROW=top_k, A_ROW_DIV=1, SCALED=True, GLU="none",
                                      BLOCK_N=down_n, BLOCK_K=_block_k(down_n, width)), x.device)  # fmt: skip

    def call(x, gate_up, down, ids, weights, out=None):
        h = x.new_empty((pairs, width))
        out = x.new_empty((tokens, hidden)) if out is None else out
        launch_up(x, gate_up, h, ids, weights, *up_sizes)
        launch_down(h, down, out, ids, weights, *down_sizes)
        return out

    return call


def _block_n(rows: int, n: int, device: torch.device) -> int:
    """The widest of 32, 16 and 8 columns a program that still gives every SM TILE["WAVES"]
    programs: the weights stream at the GPU's bandwidth only when every SM has loads in flight."""
    if device.type != "cuda":
        return 16
    from tritongemm.primitives.tl.host import sm_count

    for block_n in (32, 16):
        if rows * -(-n // block_n) >= TILE["WAVES"] * sm_count(device):
            return block_n
    return 8


def _block_k(block_n: int, k: int) -> int:
    """TILE_ELEMENTS / BLOCK_N of K, but no more than K's next power of two (and at least 16)."""
    return max(16, min(TILE["TILE_ELEMENTS"] // block_n, 1 << (k - 1).bit_length()))


def check(x, gate_up, down, top_k_index, top_k_weights, glu: str) -> None:
    """What the kernels index by, each refusal naming the argument: x (tokens, hidden), gate_up
    (experts, hidden, 2 x width), down (experts, width, hidden), top_k_index of an integer dtype
    and top_k_weights (tokens, top_k); glu one of the gated activations. Checked once per problem,
    as the plan is built, and by the operator's fake (ops.moe_decode) before a graph is traced."""
    from tritongemm.core.epilogue import GLU_ACTIVATIONS

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
