"""MoE fp8 training: `fp8_grouped_linear`, the experts' three GEMMs on e4m3 operands with
row-wise scales, each operand quantized along the axis its GEMM reduces over, as Fp8TrainingLinear's
row recipe does for one weight (fp8/training.py):

    forward  Y_g  = X_g W_gᵀ    X per token along K (`quantize_fp8`),   W_g per output row along K
    dX       dX_g = dY_g W_g    dY per token along N,                    W_g per input column along N
    dW       dW_g = dY_gᵀ X_g   dY_g and X_g per column along group g's own tokens

X_g is the tokens routed to expert g (rows offs[g - 1]:offs[g], sorted by expert), W (G, N, K)
the experts' weights as nn.Linear holds one. The weight gradient's operands are scaled per group
(fp8/grouped.py's `quantize_fp8_segments_t`): a column's scale over all the tokens would let one
expert's outlier flatten another's gradient.

`experts_forward` is transformers' experts interface on it (EXPERTS_NAME, selected by
`patch(model, fp8_training=Fp8TrainingConfig("row", experts="fp8"))` on a MoE model): both
projections of every expert in fp8, the
routing, the gated activation and the un-permute as grouped/moe.py runs them for bf16.

Under torch.compile each quantization and each GEMM is one node (fp8/graph_ops.py), as the dense
layer's are. This is the first rung of MoE fp8 training (issue 69): row-wise only; the Gluon
grouped kernels do not take fp8 yet, and on the H200 these `tl` ones made the experts' forward and
backward 0.34-0.49x tritongemm's bf16 experts (Gluon), at 256 and 1024 rows an expert
(scripts/probes/fp8_training/moe_experts_probe.py): `patch` takes them only where
Fp8TrainingConfig(experts="fp8") asks.
"""

from __future__ import annotations

import functools

import torch

from tritongemm.fp8.graph_ops import graph_or_direct_grouped
from tritongemm.fp8.grouped import _check_offsets_tensor
from tritongemm.fp8.training import TRAIN_DTYPES
from tritongemm.grouped import moe


def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """y (T, N): rows offs[g - 1]:offs[g] of x (T, K) times weight[g].T (weight (G, N, K)), the
    forward and both gradients in fp8 (the module docstring's table), in x's dtype; rows past
    offs[-1] are zeros. offs: int32 ends, non-decreasing, at most T (not checked on the device:
    grouped_mm's `_check_offsets` is the caller's where they are not counted, as the MoE layer's are)."""
    _check_linear(x, weight, offs)
    return _Fp8GroupedLinear.apply(x, weight, offs)


class _Fp8GroupedLinear(torch.autograd.Function):
    """Saves the fp8 copies the backward reads, made in the forward: X's per-group transposed
    copy (for dW, 1 byte a value instead of X's 2) and W's per-column one (for dX)."""

    @staticmethod
    def forward(ctx, x, weight, offs):
        quantize, segments_t, grouped_mm = graph_or_direct_grouped()
        G, N, K = weight.shape
        xq, sx = quantize(x, "row", 1)
        wq, sw = quantize(weight.reshape(G * N, K), "row", 1)
        y = grouped_mm(xq, wq.view(G, N, K).transpose(1, 2), sx.view(-1), sw.view(G, N), offs, x.dtype)
        saved = [offs]
        if ctx.needs_input_grad[0]:  # dX reads W along N, per expert: W's rows in groups of N
            saved += segments_t(weight.reshape(G * N, K), _expert_rows(G, N, offs.device))
        if ctx.needs_input_grad[1]:  # dW reads X along each expert's tokens
            saved += segments_t(x, offs)
        ctx.save_for_backward(*saved)
        ctx.weight_shape, ctx.weight_dtype = (G, N, K), weight.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        quantize, segments_t, grouped_mm = graph_or_direct_grouped()
        offs, *saved = ctx.saved_tensors
        G, N, K = ctx.weight_shape
        dy = dy.contiguous()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            wt, swt = saved[:2]
            saved = saved[2:]
            dyq, sdy = quantize(dy, "row", 1)
            # wt (K, G * N): expert g's W_g is its columns g * N ... as (N, K), a K-major view of them
            w_by_n = wt.T.reshape(G, N, K)
            dx = grouped_mm(dyq, w_by_n, sdy.view(-1), swt, offs, dy.dtype)
        if ctx.needs_input_grad[1]:
            xt, sxt = saved
            dyt, sdyt = segments_t(dy, offs)
            dw = grouped_mm(dyt, xt.T, sdyt, sxt, offs, ctx.weight_dtype)
        return dx, dw, None


EXPERTS_NAME = "tritongemm-fp8-row"


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """A transformers experts module's forward (grouped/moe.py's interface) with every expert's
    projections on `fp8_grouped_linear`: the bf16 weights stay the parameters the optimizer
    updates, quantized each step."""
    return moe.experts_grouped(self, hidden_states, top_k_index, top_k_weights, _fp8_projection, None)


def _fp8_projection(self, x, weight, offs, bias_name: str, expert_ids):
    """x (S, in) times each pair's expert's weight, (experts, out, in) as stored or transposed."""
    by_rows = moe._as_b(self, weight).transpose(-2, -1)  # (experts, out, in)
    y = fp8_grouped_linear(x.to(weight.dtype), by_rows, offs)
    if getattr(self, "has_bias", False):
        y = y + getattr(self, bias_name)[expert_ids]
    return y


def register_experts() -> bool:
    """Add EXPERTS_NAME to transformers' experts implementations; False where it has no such
    interface (before 5.x) or is not installed."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register(EXPERTS_NAME, experts_forward)
    return True


@functools.lru_cache(maxsize=64)  # one per layer geometry and device: made once, not every forward
def _expert_rows(groups: int, rows: int, device) -> torch.Tensor:
    """The ends of `groups` stretches of `rows` rows each, as int32 offsets (W (G, N, K) read as
    (G * N, K) rows, an expert a group); read only, never written."""
    return torch.arange(1, groups + 1, dtype=torch.int32, device=device) * rows


def _check_linear(x, weight, offs) -> None:
    who = "fp8_grouped_linear"
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in TRAIN_DTYPES:
        got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{who}: expected x, a 2-D bfloat16, float16 or float32 tensor (T, K), but got {got}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3 or weight.dtype not in TRAIN_DTYPES:
        got = f"{weight.dtype} of shape {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight)
        raise ValueError(f"{who}: expected weight, a 3-D (G, N, K) tensor of a floating dtype, but got {got}")
    _check_offsets_tensor(offs, who)
    if weight.shape[2] != x.shape[1] or weight.shape[0] != offs.shape[0]:
        raise ValueError(f"{who}: expected weight of shape ({offs.shape[0]}, N, {x.shape[1]}) for x "
                         f"{tuple(x.shape)} and {offs.shape[0]} offsets, but got {tuple(weight.shape)}")  # fmt: skip
    if len({x.device, weight.device, offs.device}) != 1:
        raise ValueError(f"{who}: expected x, weight and offs on one device, but got {x.device}, {weight.device} "
                         f"and {offs.device}")  # fmt: skip
