"""tritongemm as a Hugging Face experts implementation: `model.set_experts_implementation(
"tritongemm")` on any transformers (5.x) MoE model, once `register()` has run (`tritongemm.patch`
runs it and selects it).

The routing stays the model's own (its router picks top_k_index and top_k_weights). At decode
(few tokens for the experts, moe_decode.serves; without autograd) two launches run the experts straight
from the router's choice (moe_decode.py). Otherwise the experts run as transformers' own grouped
implementation runs them, on `tritongemm.grouped_mm`: the
(token, expert) pairs sorted by expert once, one grouped GEMM for every expert's gate and up
projections with the gated activation in its epilogue (where the module gates as transformers
does by default; its own gate otherwise), one for the down projections, then the routing weights and
the un-permute, summed over each token's experts in fp32 (one kernel, `combine`, where no autograd
records and nothing compiles; torch's ops otherwise). Group ends are counted on the device
(`histc`), so nothing synchronizes and CUDA graphs and torch.compile keep working.
"""

from __future__ import annotations

import torch

from tritongemm.epilogue import GLU_ACTIVATIONS
from tritongemm.grouped import moe_decode
from tritongemm.grouped.api import grouped_mm_of_counts
from tritongemm.plan import PLANS, tensor_facts
from tritongemm.registry import interpreter_active

NAME = "tritongemm"


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """An experts module's forward (transformers' `use_experts_implementation` interface): `self`
    holds gate_up_proj or up_proj and down_proj, (experts, out, in) or transposed (`is_transposed`),
    optional biases, `act_fn` and `_apply_gate`."""
    num_tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    # What transformers' decorator sets on the module, read with the defaults of releases that set less.
    gated = getattr(self, "has_gate", hasattr(self, "gate_up_proj"))
    glu = _fusable_glu(self) if gated else None
    if glu is not None and _decode_serves(self, hidden_states, top_k):
        b = _as_b(self, self.gate_up_proj)
        down = _as_b(self, self.down_proj)
        out = moe_decode.experts_decode(hidden_states.to(b.dtype), b, down, top_k_index, top_k_weights, glu)
        return out.to(hidden_states.dtype)
    expert_ids, order = torch.sort(top_k_index.reshape(-1))  # the (token, expert) pairs, by expert
    x = hidden_states[order // top_k]
    # Counted on the device: histc takes floats on the CPU and integers on CUDA (deterministic mode).
    counts = torch.histc(expert_ids.float() if x.device.type == "cpu" else expert_ids.int(), bins=self.num_experts,
                         min=0, max=self.num_experts - 1)  # fmt: skip
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    up_weight, up_bias = (self.gate_up_proj, "gate_up_proj_bias") if gated else (self.up_proj, "up_proj_bias")
    if glu is not None:  # gate and up in one grouped GEMM, the gated activation in its epilogue
        b = _as_b(self, up_weight)
        h = _grouped_mm(x.to(b.dtype), b, offs, glu)
    else:
        h = _grouped_linear(self, x, up_weight, offs, up_bias, expert_ids)
        if gated:
            h = self._apply_gate(h) if hasattr(self, "_apply_gate") else _gate(self, h)
        else:
            h = self.act_fn(h)
    out = _grouped_linear(self, h, self.down_proj, offs, "down_proj_bias", expert_ids)
    if getattr(self, "has_post_expert_norm", False):
        out = self.post_expert_norm(out)
    if _combine_serves(out, top_k_weights):
        return combine(out, order, top_k_weights).to(hidden_states.dtype)
    weighted = out * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    # Back to token order (a scatter by the sort's permutation), each token's experts summed in fp32.
    unsorted = torch.empty_like(weighted)
    unsorted[order] = weighted
    return unsorted.view(num_tokens, top_k, hidden).sum(dim=1, dtype=torch.float32).to(hidden_states.dtype)


def _decode_serves(self, hidden_states: torch.Tensor, top_k: int) -> bool:
    """Whether moe_decode's two launches serve this call: few (token, expert) pairs an expert,
    inference (no autograd to record), eagerly (a compiled graph keeps the grouped operator), no
    norm after the experts, on a GPU or under the interpreter."""
    if not moe_decode.serves(hidden_states.shape[0], top_k, self.num_experts):
        return False
    if getattr(self, "has_post_expert_norm", False):
        return False
    if torch.is_grad_enabled() and (hidden_states.requires_grad or self.gate_up_proj.requires_grad):
        return False
    if torch.compiler.is_compiling():
        return False
    return hidden_states.is_cuda or interpreter_active()


def _combine_serves(rows: torch.Tensor, top_k_weights: torch.Tensor) -> bool:
    """Whether `combine`'s kernel un-permutes: inference (it has no backward), eagerly (Inductor
    fuses torch's ops itself), on a GPU or under the interpreter."""
    if torch.is_grad_enabled() and (rows.requires_grad or top_k_weights.requires_grad):
        return False
    return not torch.compiler.is_compiling() and (rows.is_cuda or interpreter_active())


# combine's tile: a few tokens x 512 columns of their rows (4 warps, 16 bytes a load of bf16).
_COMBINE_TOKENS, _COMBINE_COLUMNS = 4, 512


def combine(rows: torch.Tensor, order: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """out[t] = sum over j of top_k_weights[t, j] * rows[i], i the place of pair t * top_k + j in
    `order` (rows are the pairs sorted by expert: rows[i] is pair order[i]'s), accumulated in fp32
    and returned (tokens, hidden) in rows' dtype: one kernel (grouped/kernels.py `_combine_kernel`)
    after the sort's inverse."""
    pairs, hidden = rows.shape
    tokens, top_k = top_k_weights.shape
    weights = top_k_weights.reshape(-1)
    rows = rows if rows.stride(1) == 1 else rows.contiguous()
    key = ("moe combine", top_k, tensor_facts(rows), tensor_facts(order), tensor_facts(weights))
    launch = PLANS.find_key(key)
    if launch is None:
        if pairs != tokens * top_k or order.shape != (pairs,):
            raise ValueError(
                f"moe combine: expected {tokens} x {top_k} rows and sort order, but got rows {tuple(rows.shape)} "
                f"and order {tuple(order.shape)}"
            )
        import triton

        from tritongemm.fast_launch import compile_launch
        from tritongemm.grouped.kernels import _combine_kernel

        block_h = min(_COMBINE_COLUMNS, triton.next_power_of_2(hidden))
        grid = (-(-tokens // _COMBINE_TOKENS), -(-hidden // block_h))
        out = rows.new_empty((tokens, hidden))  # this call's, to plan on
        args = (rows, order, weights, out, tokens, hidden, rows.stride(0), out.stride(0))
        meta = dict(TOP_K=top_k, BLOCK_T=_COMBINE_TOKENS, BLOCK_H=block_h, num_warps=4)
        launch = compile_launch(_combine_kernel, grid, args, meta, rows.device)
        PLANS.remember(key, launch)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(pairs, device=order.device, dtype=order.dtype))
    out = rows.new_empty((tokens, hidden))
    launch(rows, inverse, weights, out, tokens, hidden, rows.stride(0), out.stride(0))
    return out


def _fusable_glu(self) -> str | None:
    """The activation to fuse where the module gates as transformers does by default (act(gate) *
    up on [gate; up] halves, no bias between): else None, and the module's own gate runs."""
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:
        return None
    if getattr(type(self), "_apply_gate", None) is not _default_apply_gate or getattr(self, "has_bias", False):
        return None
    if not getattr(self, "is_concatenated", True):
        return None
    from tritongemm.epilogue import activation_of

    act = activation_of(getattr(self, "act_fn", None))
    return act if act in GLU_ACTIVATIONS else None


def _gate(self, gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return self.act_fn(gate) * up


def _as_b(self, weight: torch.Tensor) -> torch.Tensor:
    """An experts weight as grouped_mm's b, (experts, in, out): as stored when transposed, else a
    transposed view of (experts, out, in)."""
    return weight if getattr(self, "is_transposed", False) else weight.transpose(-2, -1)


def _grouped_mm(a, b, offs, glu=None):
    """grouped_mm on offsets that are the cumsum of histc's counts: in range by construction, so
    not checked again."""
    return grouped_mm_of_counts(a, b, offs, None, glu, offs_from_counts=True)


def _grouped_linear(self, x, weight, offs, bias_name: str, expert_ids):
    """x (S, in) times each pair's expert's weight (`_as_b`), then that expert's bias."""
    b = _as_b(self, weight)
    y = _grouped_mm(x.to(b.dtype), b, offs)
    if getattr(self, "has_bias", False):
        y = y + getattr(self, bias_name)[expert_ids]
    return y


def register() -> bool:
    """Add "tritongemm" to transformers' experts implementations (once is enough, again is
    harmless); False where this transformers has no such interface (before 5.x) or none is installed."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register(NAME, experts_forward)
    return True


def uses_experts(model: torch.nn.Module) -> bool:
    """Whether `model` is a transformers model whose experts modules dispatch through the interface."""
    config = getattr(model, "config", None)
    return (
        hasattr(model, "set_experts_implementation")
        and hasattr(config, "_experts_implementation")
        and any(
            hasattr(m, "num_experts") and hasattr(m, "down_proj") and getattr(m.down_proj, "dim", lambda: 0)() == 3
            for m in model.modules()
        )
    )
