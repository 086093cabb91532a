"""fp8 grouped GEMMs for training a mixture of experts: the experts' three GEMMs on e4m3
operands with row-wise scales, each operand quantized along the axis its GEMM reduces over, as
Fp8TrainingLinear's row recipe does for one weight (fp8/training.py):

    forward  Y_g  = X_g W_gᵀ    X per token along K (`quantize_fp8`),   W_g per output row along K
    dX       dX_g = dY_g W_g    dY per token along N,                    W_g per input column along N
    dW       dW_g = dY_gᵀ X_g   dY_g and X_g per column along group g's own tokens

X_g is the tokens routed to expert g (rows offs[g - 1]:offs[g], sorted by expert), W (G, N, K)
the experts' weights as nn.Linear holds one. The weight gradient's operands are scaled per group:
a column's scale over all the tokens would let one expert's outlier flatten another's gradient.
`quantize_fp8_segments_t` makes those copies: each group's stretch of each column quantized by
its own absmax and written transposed, so every fp8 operand is K-major, as Hopper's fp8 MMA
reads it. The GEMMs are grouped_mm's `tl` kernels (grouped/tl.py) with the scales applied to the
finished tile before its store (`SCALED`). Offsets stay on the device: nothing synchronizes.

`experts_forward` is transformers' experts interface on it (EXPERTS_NAME, selected by
`patch(model, fp8_training="row")` on a MoE model): both projections of every expert in fp8, the
routing, the gated activation and the un-permute as grouped/moe.py runs them for bf16.

This is the first rung of MoE fp8 training (issue 69): eager, row-wise only; the Gluon grouped
kernels do not take fp8 yet, nothing here has been timed on a GPU, and torch.compile traces it as
an opaque autograd.Function (no operators with fakes yet).
"""

from __future__ import annotations

import torch

from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts
from tritongemm.fp8.api import quantize_fp8
from tritongemm.grouped import moe

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
TRAIN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _build():
    """fp8/grouped_build.py, imported on the first plan (its kernel imports Triton, which reads
    TRITON_INTERPRET when a kernel is decorated)."""
    from tritongemm.fp8 import grouped_build

    return grouped_build


def _grouped_build():
    from tritongemm.grouped import build

    return build


def quantize_fp8_segments_t(x: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn):
    """(qt, scale_t): x (R, C) transposed into qt (C, R) fp8, each group's rows offs[g - 1]:offs[g]
    of each column scaled by their own absmax, scale_t (G, C) fp32: qt[c, r] * scale_t[g, c] ≈ x[r, c]
    for r in group g. Rows past offs[-1] belong to no group: their columns of qt are not written.
    Each group of each column equals `quantize_fp8` of that stretch of x.T along its row, bit for bit."""
    _check_segments(x, offs, dtype)
    key = ("quantize_fp8_segments_t", dtype, tensor_facts(x), tensor_facts(offs))
    return planned(key, lambda: _build().plan_segments_transposed(x, offs, dtype))(x, offs)


def scaled_grouped_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                      offs: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:  # fmt: skip
    """grouped_mm on fp8 operands with row-wise scales, accumulated in fp32, dequantized, rounded once.

    - rows (a 2-D (M, K), b (G, K, N)): c (M, N), rows offs[g - 1]:offs[g] of a times b[g], each
      product times scale_a[m] (M,) and scale_b[g, n] (G, N); rows past offs[-1] are zeros.
    - K groups (a (M, K), b (K, N), both 2-D): c (G, M, N), columns offs[g - 1]:offs[g] of a times
      those rows of b, times scale_a[g, m] (G, M) and scale_b[g, n] (G, N).
    """
    form = _check_scaled(a, b, scale_a, scale_b, offs, out_dtype)
    key = ("scaled_grouped_mm", form, out_dtype, *(tensor_facts(t) for t in (a, b, scale_a, scale_b, offs)))

    def build():
        return _grouped_build().grouped_call(a, b, offs, out_dtype, form, None, None, scales=(scale_a, scale_b))

    return planned(key, build)(a, b, offs, scale_a, scale_b)


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
        G, N, K = weight.shape
        xq, sx = quantize_fp8(x, "row")
        wq, sw = quantize_fp8(weight.reshape(G * N, K), "row")
        y = scaled_grouped_mm(xq, wq.view(G, N, K).transpose(1, 2), sx.view(-1), sw.view(G, N), offs, x.dtype)
        saved = [offs]
        if ctx.needs_input_grad[0]:  # dX reads W along N, per expert: W's rows in groups of N
            saved += quantize_fp8_segments_t(weight.reshape(G * N, K), _expert_rows(G, N, offs.device))
        if ctx.needs_input_grad[1]:  # dW reads X along each expert's tokens
            saved += quantize_fp8_segments_t(x, offs)
        ctx.save_for_backward(*saved)
        ctx.weight_shape, ctx.weight_dtype = (G, N, K), weight.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        offs, *saved = ctx.saved_tensors
        G, N, K = ctx.weight_shape
        dy = dy.contiguous()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            wt, swt = saved[:2]
            saved = saved[2:]
            dyq, sdy = quantize_fp8(dy, "row")
            # wt (K, G * N): expert g's W_g is its columns g * N ... as (N, K), a K-major view of them
            w_by_n = wt.T.reshape(G, N, K)
            dx = scaled_grouped_mm(dyq, w_by_n, sdy.view(-1), swt, offs, dy.dtype)
        if ctx.needs_input_grad[1]:
            xt, sxt = saved
            dyt, sdyt = quantize_fp8_segments_t(dy, offs)
            dw = scaled_grouped_mm(dyt, xt.T, sdyt, sxt, offs, ctx.weight_dtype)
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


def _expert_rows(groups: int, rows: int, device) -> torch.Tensor:
    """The ends of `groups` stretches of `rows` rows each, as int32 offsets (W (G, N, K) read as
    (G * N, K) rows, an expert a group)."""
    return torch.arange(1, groups + 1, dtype=torch.int32, device=device) * rows


def _check_offsets_tensor(offs, who: str) -> None:
    if not isinstance(offs, torch.Tensor) or offs.dim() != 1 or offs.dtype != torch.int32:
        got = f"{offs.dtype} of shape {tuple(offs.shape)}" if isinstance(offs, torch.Tensor) else type(offs).__name__
        raise ValueError(f"{who}: expected offs, a 1-D int32 tensor of group ends, but got {got}")


def _check_segments(x, offs, dtype) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in TRAIN_DTYPES:
        got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"quantize_fp8_segments_t: expected x, a 2-D bfloat16, float16 or float32 tensor, but got "
                         f"{got}")  # fmt: skip
    _check_offsets_tensor(offs, "quantize_fp8_segments_t")
    if dtype not in FP8_DTYPES:
        raise TypeError(f"quantize_fp8_segments_t: expected dtype float8_e4m3fn or float8_e5m2, but got {dtype}")
    if offs.device != x.device:
        raise ValueError(f"quantize_fp8_segments_t: expected offs on x's device {x.device}, but got {offs.device}")


def _check_scaled(a, b, scale_a, scale_b, offs, out_dtype) -> str:
    who = "scaled_grouped_mm"
    tensors = dict(a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: expected {name} to be a tensor, but got {type(t).__name__}")
    _check_offsets_tensor(offs, who)
    for name in ("a", "b"):
        if tensors[name].dtype not in FP8_DTYPES:
            raise TypeError(f"{who}: expected {name} of an fp8 dtype, but got {tensors[name].dtype}")
    for name in ("scale_a", "scale_b"):
        if tensors[name].dtype != torch.float32:
            raise TypeError(f"{who}: expected {name} of dtype float32, but got {tensors[name].dtype}")
    if out_dtype not in TRAIN_DTYPES:
        raise TypeError(f"{who}: expected out_dtype bfloat16, float16 or float32, but got {out_dtype}")
    devices = {t.device for t in (a, b, scale_a, scale_b, offs)}
    if len(devices) != 1:
        raise ValueError(f"{who}: expected every tensor on one device, but got {sorted(map(str, devices))}")
    G = offs.shape[0]
    if a.dim() == 2 and b.dim() == 3:
        form, (M, K), (Gb, Kb, N) = "m", a.shape, b.shape
        want_a, want_b = (M,), (G, N)
        if Gb != G or Kb != K:
            raise ValueError(f"{who}: expected b of shape ({G}, {K}, N) for a {tuple(a.shape)} and {G} offsets, "
                             f"but got {tuple(b.shape)}")  # fmt: skip
    elif a.dim() == 2 and b.dim() == 2:
        form, (M, K), (Kb, N) = "k", a.shape, b.shape
        want_a, want_b = (G, M), (G, N)
        if Kb != K:
            raise ValueError(f"{who}: expected b of shape ({K}, N) for a {tuple(a.shape)}, but got {tuple(b.shape)}")
    else:
        raise ValueError(f"{who}: expected a 2-D and b 3-D (row groups) or both 2-D (K groups), but got "
                         f"{a.dim()}-D and {b.dim()}-D")  # fmt: skip
    for name, want in (("scale_a", want_a), ("scale_b", want_b)):
        t = tensors[name]
        if tuple(t.shape) != want or not t.is_contiguous():
            raise ValueError(f"{who}: expected {name} contiguous of shape {want}, but got {tuple(t.shape)} with "
                             f"strides {t.stride()}")  # fmt: skip
    return form


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
