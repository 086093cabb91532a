"""`GatedMLP`: a transformer's gated MLP, `down(act(gate(x)) * up(x))` (SwiGLU, GeGLU), in two
GEMMs instead of three GEMMs and two elementwise kernels.

The gate and up projections read the same x, so their weights side by side make one GEMM whose
N axis holds [gate; up]; its epilogue computes act(g) * u from the two fp32 tiles and writes that
once (gated_pair.py: `grouped_mm`'s row-group kernel over a single group, or rung 6's or 9's
gated epilogue), so the M x 2I product never reaches memory and the elementwise kernels
disappear. The down projection is `tritongemm.linear`, which takes the block's residual add in
its store. When autograd records, the forward keeps the pair instead (`_GatedPair`): one GEMM
writes [g | u] and one elementwise kernel gates it, so the backward needs no GEMM of its own to
get it back; the gradients of x and of the joined weight are two dense GEMMs through
`tritongemm.matmul`. Under torch.compile the same, traced: the pair's GEMM is the `mm` operator,
its gating torch's, which Inductor fuses (forward and backward) into one kernel each; without
autograd the `gated_pair` operator runs the gated kernel.

The module holds one (2I, H) weight, `gate_up_weight`, and shows its halves as views
(`gate_weight`, `up_weight`); its state_dict has transformers' keys (`gate_proj.weight`,
`up_proj.weight`, `down_proj.weight`; the halves as copies), so checkpoints load both ways.
"""

from __future__ import annotations

import math

import torch

from tritongemm.blocks.gated_pair import GATED_RUNGS, gated_pair, gated_pair_op
from tritongemm.core.epilogue import GLU_ACTIVATIONS, activate_torch
from tritongemm.dense import linear as fused
from tritongemm.dense.matmul import matmul
from tritongemm.dense.module import Linear


class GatedMLP(torch.nn.Module):
    """y = down(act(x @ gate.T) * (x @ up.T)) (+ residual), for x of shape (..., hidden_size);
    `activation` "silu" (SwiGLU), "gelu" or "gelu_tanh" (GeGLU). No biases: the gated MLPs of
    Llama, Qwen2, Mistral and Gemma have none. `kernel` is the down projection's (as
    tritongemm.nn.Linear takes it); "tma_persistent_pipelined" or "tma_warp_specialized" also runs
    the gated pair on that rung's gated epilogue (gated_pair.py), any other value on the row-group
    kernel."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "silu", *, device=None,
                 dtype=None, kernel: str = "auto") -> None:  # fmt: skip
        if activation not in GLU_ACTIVATIONS:
            raise ValueError(f"GatedMLP: expected activation to be one of {GLU_ACTIVATIONS}, but got {activation!r}")
        super().__init__()
        self.hidden_size, self.intermediate_size, self.activation = hidden_size, intermediate_size, activation
        self.kernel = kernel  # the training forward's pair GEMM's
        self.pair_kernel = kernel if kernel in GATED_RUNGS else "auto"
        self.gate_up_weight = torch.nn.Parameter(torch.empty(2 * intermediate_size, hidden_size, device=device,
                                                             dtype=dtype))  # fmt: skip
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False, device=device, dtype=dtype, kernel=kernel)
        if self.gate_up_weight.device.type != "meta":
            for half in (self.gate_weight, self.up_weight):  # as nn.Linear initializes each
                torch.nn.init.kaiming_uniform_(half, a=math.sqrt(5))
        self.register_state_dict_post_hook(_split_gate_up)
        self.register_load_state_dict_pre_hook(_join_gate_up)

    @property
    def gate_weight(self) -> torch.Tensor:
        """The gate projection's (I, H) weight: a view of gate_up_weight's first half."""
        return self.gate_up_weight[: self.intermediate_size]

    @property
    def up_weight(self) -> torch.Tensor:
        return self.gate_up_weight[self.intermediate_size :]

    @classmethod
    def from_mlp(cls, mlp: torch.nn.Module, activation: str, kernel: str = "auto") -> GatedMLP:
        """The fused module computing what `mlp` (gate_proj, up_proj and down_proj without bias)
        computes: the gate and up weights copied once into one; down_proj's Parameter shared."""
        gate, up, down = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj
        new = cls(gate.shape[1], gate.shape[0], activation, device="meta", kernel=kernel)
        trainable = gate.requires_grad or up.requires_grad
        new.gate_up_weight = torch.nn.Parameter(torch.cat([gate, up]).detach(), requires_grad=trainable)
        new.down_proj = Linear.from_linear(down, kernel=kernel) if type(down) is torch.nn.Linear else down
        new.train(mlp.training)
        return new

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        lead, hidden = x.shape[:-1], x.shape[-1]
        rows = x.reshape(-1, hidden)
        weight = self.gate_up_weight
        records = torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad)
        if torch.compiler.is_compiling():
            if records:  # the pair's GEMM as the `mm` operator, its gating left to Inductor to fuse
                gate, up = matmul(rows, weight.t(), kernel=self.kernel).chunk(2, dim=-1)
                h = activate_torch(gate, self.activation) * up
            else:
                h = gated_pair_op(rows, weight, self.activation, self.pair_kernel)
        elif records:
            h = _GatedPair.apply(rows, weight, self.activation, self.kernel)
        else:
            h = gated_pair(rows, weight, self.activation, self.pair_kernel)
        if residual is not None:
            residual = residual.reshape(-1, residual.shape[-1])
        y = fused.linear(h, self.down_proj.weight, self.down_proj.bias, residual=residual, kernel=self.down_proj.kernel)
        return y.view(*lead, y.shape[-1])

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"activation={self.activation!r}")  # fmt: skip


class _GatedPair(torch.autograd.Function):
    """h = act(x @ gate.T) * (x @ up.T), the weight [gate; up] (2I, H), when autograd records:
    the pair [g | u] (M, 2I) is one GEMM and is kept for the backward, h one elementwise kernel
    (primitives/glu.py); the backward is one more of those for d[g | u], then two dense GEMMs,
    d[g | u] @ W for dx and d[g | u]^T @ x for dW (a transposed A: the weight-gradient layout,
    `tn`). Keeping the pair costs what torch's unfused block keeps (g, u and act(g)); recomputing
    it, as this did before, cost a third GEMM: forward + backward at 2048 tokens of Llama-3-8B
    took 4.92 ms then, 3.29 now (H100, bench mlp)."""

    @staticmethod
    def forward(ctx, rows, weight, activation, kernel):
        from tritongemm.primitives.glu import glu_forward  # imports Triton: not at tritongemm's import

        pair = matmul(rows, weight.t(), kernel=kernel)
        ctx.save_for_backward(rows, weight, pair)
        ctx.activation = activation
        return glu_forward(pair, activation)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        from tritongemm.primitives.glu import glu_backward  # imports Triton: not at tritongemm's import

        rows, weight, pair = ctx.saved_tensors
        d_pair = glu_backward(grad, pair, ctx.activation, rows.dtype)
        grad_rows = matmul(d_pair, weight) if ctx.needs_input_grad[0] else None
        grad_weight = matmul(d_pair.t(), rows).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_rows, grad_weight, None, None


def _split_gate_up(module: GatedMLP, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict post-hook: transformers' keys for the joined weight's halves, as copies. Two
    views of one storage would read as tied weights to savers that look for shared storage
    (safetensors refuses them; transformers' save_pretrained keeps one of a tied pair)."""
    joined = state_dict.pop(prefix + "gate_up_weight").detach()
    state_dict[prefix + "gate_proj.weight"] = joined[: module.intermediate_size].clone()
    state_dict[prefix + "up_proj.weight"] = joined[module.intermediate_size :].clone()


def _join_gate_up(module: GatedMLP, state_dict: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook: transformers' two keys joined into the module's one."""
    gate, up = prefix + "gate_proj.weight", prefix + "up_proj.weight"
    if gate in state_dict and up in state_dict:
        state_dict[prefix + "gate_up_weight"] = torch.cat([state_dict.pop(gate), state_dict.pop(up)])
