"""tritongemm as a Hugging Face experts implementation: `model.set_experts_implementation(
"tritongemm")` on any transformers (5.x) MoE model, once `register()` has run (`tritongemm.patch`
runs it and selects it).

The routing stays the model's own (its router picks top_k_index and top_k_weights). At decode
(few tokens for the experts, moe_decode.serves; without autograd) two launches run the experts
straight from the router's choice (moe_decode.py; the operator `torch.ops.tritongemm.moe_decode`
under torch.compile). Otherwise the experts run as transformers' own grouped
implementation runs them, on `tritongemm.grouped_mm`: the
(token, expert) pairs sorted by expert once, one grouped GEMM for every expert's gate and up
projections with the gated activation in its epilogue (where the module gates as transformers
does by default; its own gate otherwise), one for the down projections, then the routing weights and
the un-permute, summed over each token's experts in fp32, in one kernel (`combine`; the operator
`torch.ops.tritongemm.moe_combine` where autograd records or torch.compile traces). Group ends
are counted on the device (`histc`), so nothing synchronizes and CUDA graphs and torch.compile
keep working.
"""

from __future__ import annotations

import torch

from tritongemm.core import device_info, operators
from tritongemm.core.epilogue import GLU_ACTIVATIONS, activation_of
from tritongemm.core.operators import LIB, register_autograd
from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts
from tritongemm.grouped import moe_decode
from tritongemm.grouped.api import grouped_mm_of_counts

NAME = "tritongemm"


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """An experts module's forward (transformers' `use_experts_implementation` interface): `self`
    holds gate_up_proj or up_proj and down_proj, (experts, out, in) or transposed (`is_transposed`),
    optional biases, `act_fn` and `_apply_gate`."""
    top_k = top_k_index.shape[-1]
    # What transformers' decorator sets on the module, read with the defaults of releases that set less.
    gated = getattr(self, "has_gate", hasattr(self, "gate_up_proj"))
    glu = _fusable_glu(self) if gated else None
    if glu is not None and _decode_serves(self, hidden_states, top_k):
        b, down = _as_b(self, self.gate_up_proj), _as_b(self, self.down_proj)
        args = (hidden_states.to(b.dtype), b, down, top_k_index, top_k_weights, glu)
        if torch.compiler.is_compiling():  # the graph's node (moe_decode_op), which Inductor calls directly
            return moe_decode.moe_decode_op(*args).to(hidden_states.dtype)
        return moe_decode.experts_decode(*args).to(hidden_states.dtype)
    return experts_grouped(self, hidden_states, top_k_index, top_k_weights, _grouped_linear, glu)


def experts_grouped(self, hidden_states, top_k_index, top_k_weights, linear, glu: str | None):
    """The experts on grouped GEMMs, as transformers' grouped implementation runs them: the pairs
    sorted by expert, `linear(self, x, weight, offs, bias_name, expert_ids)` for each projection
    (bf16's `_grouped_linear`, or fp8 training's, fp8/grouped_training.py), the gated activation in the up
    GEMM's epilogue where `glu` names it, then the weighted un-permute (`combine`)."""
    top_k = top_k_index.shape[-1]
    gated = getattr(self, "has_gate", hasattr(self, "gate_up_proj"))
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
        h = linear(self, x, up_weight, offs, up_bias, expert_ids)
        if gated:
            h = self._apply_gate(h) if hasattr(self, "_apply_gate") else _gate(self, h)
        else:
            h = self.act_fn(h)
    out = linear(self, h, self.down_proj, offs, "down_proj_bias", expert_ids)
    if getattr(self, "has_post_expert_norm", False):
        out = self.post_expert_norm(out)
    return _combined(out, order, top_k_weights).to(hidden_states.dtype)


def _decode_serves(self, hidden_states: torch.Tensor, top_k: int) -> bool:
    """Whether moe_decode's two launches serve this call: few (token, expert) pairs an expert,
    inference (no autograd to record), no norm after the experts, on a GPU or under the
    interpreter. Under torch.compile too: the decision is the trace's, on its shapes (a graph
    traced for other token counts holds the grouped path)."""
    if not moe_decode.serves(hidden_states.shape[0], top_k, self.num_experts):
        return False
    if getattr(self, "has_post_expert_norm", False):
        return False
    if torch.is_grad_enabled() and (hidden_states.requires_grad or self.gate_up_proj.requires_grad):
        return False
    return hidden_states.is_cuda or device_info.interpreter_active()


def _combined(rows: torch.Tensor, order: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """`combine`, called directly where no autograd records and nothing compiles, else through its
    operator (moe_combine_op: its backward, a graph's node), at the dispatcher's cost."""
    recording = torch.is_grad_enabled() and (rows.requires_grad or top_k_weights.requires_grad)
    if recording or torch.compiler.is_compiling():
        return moe_combine_op(rows, order, top_k_weights)
    return combine(rows, order, top_k_weights)


def combine(rows: torch.Tensor, order: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """out[t] = sum over j of top_k_weights[t, j] * rows[i], i the place of pair t * top_k + j in
    `order` (rows are the pairs sorted by expert: rows[i] is pair order[i]'s), accumulated in fp32
    and returned (tokens, hidden) in rows' dtype: one kernel (grouped/tl.py `_combine_kernel`)
    after the sort's inverse."""
    key = ("moe combine", tensor_facts(rows), tensor_facts(order), tensor_facts(top_k_weights))

    def build():
        check_combine(rows, order, top_k_weights)
        return _planner().combine_call(rows, order, top_k_weights)

    call = planned(key, build)
    return call(rows, order, top_k_weights)


def _planner():
    """grouped/moe_build.py, imported on a MoE layer's first plan: its kernels import Triton, whose
    decoration of a kernel reads TRITON_INTERPRET (a program may set it after import tritongemm)."""
    from tritongemm.grouped import moe_build

    return moe_build


def check_combine(rows: torch.Tensor, order: torch.Tensor, top_k_weights: torch.Tensor) -> None:
    """What `combine` indexes by: rows (tokens x top_k, hidden) and order (tokens x top_k,) of an
    integer dtype for (tokens, top_k) weights."""
    if rows.dim() != 2 or top_k_weights.dim() != 2 or order.dim() != 1:
        raise ValueError(
            f"moe combine: expected 2-D rows and weights and a 1-D sort order, but got shapes {tuple(rows.shape)}, "
            f"{tuple(top_k_weights.shape)} and {tuple(order.shape)}"
        )
    tokens, top_k = top_k_weights.shape
    if rows.shape[0] != tokens * top_k or order.shape[0] != tokens * top_k:
        raise ValueError(
            f"moe combine: expected {tokens} x {top_k} rows and sort order, but got rows {tuple(rows.shape)} "
            f"and order {tuple(order.shape)}"
        )
    if order.dtype not in (torch.int32, torch.int64) or not top_k_weights.is_floating_point():
        raise TypeError(
            f"moe combine: expected an integer sort order and floating weights, but got {order.dtype} and "
            f"{top_k_weights.dtype}"
        )


def combine_grads(grad, rows, order, top_k_weights, needs) -> tuple:
    """(d rows, None, d weights) of `combine` for grad (tokens, hidden), fp32 products: row i, pair
    order[i] of token order[i] // top_k, gets that token's grad times the pair's weight; the pair's
    weight gets the dot product of the two. Eager: one kernel (tl.py `_combine_backward_kernel`),
    planned once per geometry. Traced (torch.compile, opcheck: fake or functional tensors), on a
    tensor subclass, or on a CPU without the interpreter: torch's ops (`combine_grads_torch`),
    which Inductor fuses."""
    plain = all(type(t) is torch.Tensor and not torch._is_functional_tensor(t) for t in (grad, rows))
    if not plain or torch.compiler.is_compiling() or not (grad.is_cuda or device_info.interpreter_active()):
        return combine_grads_torch(grad, rows, order, top_k_weights, needs)
    key = ("moe combine backward", tensor_facts(grad), tensor_facts(rows), tensor_facts(order),
           tensor_facts(top_k_weights))  # fmt: skip
    call = planned(key, lambda: _planner().combine_backward_call(grad, rows, order, top_k_weights))
    d_rows, d_weights = call(grad, rows, order, top_k_weights)
    return (d_rows if needs[0] else None), None, (d_weights if needs[2] else None)


def combine_grads_torch(grad, rows, order, top_k_weights, needs) -> tuple:
    """`combine_grads` in torch's ops: what torch.compile traces, and the kernel's reference."""
    top_k = top_k_weights.shape[1]
    token_grad = grad[order // top_k].float()
    d_rows = d_weights = None
    if needs[0]:
        d_rows = (token_grad * top_k_weights.reshape(-1)[order].float().unsqueeze(-1)).to(rows.dtype)
    if needs[2]:
        per_row = (rows.float() * token_grad).sum(-1).to(top_k_weights.dtype)
        d_weights = torch.empty_like(per_row).scatter_(0, order, per_row).view(top_k_weights.shape)
    return d_rows, None, d_weights


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


# ----------------------------------------------------------------------------------------------
# The operator of `combine`, for graphs and autograd
# ----------------------------------------------------------------------------------------------


LIB.define("moe_combine(Tensor rows, Tensor order, Tensor weights) -> Tensor")


def moe_combine_impl(rows, order, weights):
    return combine(rows, order, weights)


LIB.impl("moe_combine", moe_combine_impl, "CompositeExplicitAutograd")
moe_combine_op = torch.ops.tritongemm.moe_combine.default


@torch.library.register_fake("tritongemm::moe_combine", lib=LIB)
def _moe_combine_fake(rows, order, weights):
    operators.traced()
    check_combine(rows, order, weights)
    return rows.new_empty((weights.shape[0], rows.shape[1]))


def _setup_combine_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _combine_backward(ctx, grad):
    return combine_grads(grad, *ctx.saved_tensors, ctx.needs_input_grad)


register_autograd(moe_combine_op, moe_combine_impl, _setup_combine_context, _combine_backward)
