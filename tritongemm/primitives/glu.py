"""A gated pair's activation as elementwise kernels, for autograd: h = act(g) * u from a stored
pair [g | u] (M, 2I), and its backward d[g | u] = [dh * u * act'(g) | dh * act(g)].

Training keeps the pair instead of recomputing it. The fused forward (gated epilogue) never
writes it, so its backward had to run the pair's GEMM again, in fp32, then seven torch kernels
over fp32 (M, 2I) tensors: at 2048 x 4096 x 14336 bf16 on the H100 a GatedMLP forward + backward
took 4.92 ms where torch's unfused block took 3.35. A training forward now runs the pair's GEMM
and one kernel of this file, the backward one more of them and its two GEMMs: 3.29 ms
(bench mlp, results/h100/mlp.csv at efef208; 3.35 against torch's 3.32 in the run of a11ffab).
What a training step stores is what torch's block stores: the pair, in the operands' dtype
(torch keeps g, u and act(g)).

Each program takes one row's BLOCK columns of g and the same of u: the two halves sit I apart
in a row, so both loads are contiguous. The arithmetic is fp32, as the fused epilogue's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongemm.core.epilogue import GLU_ACTIVATIONS
from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts
from tritongemm.primitives.epilogue import _activate_tl
from tritongemm.primitives.launch import compile_launch

BLOCK = 1024  # columns per program: 2 KB of each half in 16-bit types, 16-byte loads at 4 warps


@triton.jit
def _activation_grad_tl(y, ACTIVATION: tl.constexpr):
    """act'(y), as torch's silu_backward and gelu_backward compute it (fp32)."""
    if ACTIVATION == "silu":
        e = tl.exp(-tl.abs(y))
        s = tl.where(y >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        d = s * (1.0 + y * (1.0 - s))
    elif ACTIVATION == "gelu":
        cdf = 0.5 * (1.0 + tl.erf(y * 0.7071067811865476))
        d = cdf + y * 0.3989422804014327 * tl.exp(-0.5 * y * y)
    else:  # gelu_tanh
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        e = tl.exp(-2.0 * tl.abs(inner))
        tanh = tl.where(inner >= 0, (1.0 - e) / (1.0 + e), (e - 1.0) / (1.0 + e))
        d = 0.5 * (1.0 + tanh) + 0.5 * y * (1.0 - tanh * tanh) * 0.7978845608028654 * (1.0 + 0.134145 * y * y)
    return d


@triton.jit
def _load_pair(pair_ptr, width, stride_pm, BLOCK: tl.constexpr):
    """This program's row and columns, their mask, and g and u there in fp32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    g = tl.load(pair_ptr + row * stride_pm + cols, mask=mask).to(tl.float32)
    u = tl.load(pair_ptr + row * stride_pm + width + cols, mask=mask).to(tl.float32)
    return row, cols, mask, g, u


@triton.jit
def _glu_forward_kernel(
    pair_ptr, h_ptr,  # (M, 2I), (M, I)
    width, stride_pm, stride_hm,
    ACTIVATION: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row, cols, mask, g, u = _load_pair(pair_ptr, width, stride_pm, BLOCK)
    h = _activate_tl(g, ACTIVATION) * u
    tl.store(h_ptr + row * stride_hm + cols, h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _glu_backward_kernel(
    grad_ptr, pair_ptr, d_ptr,  # (M, I), (M, 2I), (M, 2I)
    width, stride_gm, stride_pm, stride_dm,
    ACTIVATION: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row, cols, mask, g, u = _load_pair(pair_ptr, width, stride_pm, BLOCK)
    dh = tl.load(grad_ptr + row * stride_gm + cols, mask=mask).to(tl.float32)
    d_g = dh * u * _activation_grad_tl(g, ACTIVATION)
    d_u = dh * _activate_tl(g, ACTIVATION)
    tl.store(d_ptr + row * stride_dm + cols, d_g.to(d_ptr.dtype.element_ty), mask=mask)
    tl.store(d_ptr + row * stride_dm + width + cols, d_u.to(d_ptr.dtype.element_ty), mask=mask)


def glu_forward(pair: torch.Tensor, activation: str) -> torch.Tensor:
    """act(g) * u for a pair [g | u] (M, 2I) with unit column stride -> (M, I) in its dtype."""
    key = ("glu_forward", activation, tensor_facts(pair))

    def build():  # checked once per problem: the key holds every fact _check reads
        _check(pair, activation, "glu_forward")
        M, width = pair.shape[0], pair.shape[1] // 2
        return _plan(_glu_forward_kernel, (pair,), pair.new_empty((M, width)), activation)

    return planned(key, build)(pair)


def glu_backward(grad: torch.Tensor, pair: torch.Tensor, activation: str, out_dtype: torch.dtype) -> torch.Tensor:
    """d[g | u] (M, 2I) in `out_dtype` of h = act(g) * u, from dh (M, I) and the pair (M, 2I)."""
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    key = ("glu_backward", activation, out_dtype, tensor_facts(grad), tensor_facts(pair))

    def build():
        _check(pair, activation, "glu_backward")
        M, width = pair.shape[0], pair.shape[1] // 2
        if grad.shape != (M, width):
            raise ValueError(f"glu_backward: expected grad of shape {(M, width)}, but got {tuple(grad.shape)}")
        out = torch.empty((M, 2 * width), dtype=out_dtype, device=pair.device)
        return _plan(_glu_backward_kernel, (grad, pair), out, activation)

    return planned(key, build)(grad, pair)


def _check(pair: torch.Tensor, activation: str, name: str) -> None:
    if activation not in GLU_ACTIVATIONS:
        raise ValueError(f"{name}: expected activation to be one of {GLU_ACTIVATIONS}, but got {activation!r}")
    if pair.dim() != 2 or pair.shape[1] % 2 or pair.stride(1) != 1:
        raise ValueError(f"{name}: expected a pair of shape (M, 2I) with unit column stride, but got shape "
                         f"{tuple(pair.shape)} and strides {pair.stride()}")  # fmt: skip


def _plan(kernel, inputs: tuple, out: torch.Tensor, activation: str):
    """`call(*inputs) -> a new output like out`: the kernel compiled once for operands like these
    (the plan key holds their facts); later calls allocate and launch."""
    M, width = inputs[-1].shape[0], inputs[-1].shape[1] // 2  # the pair is the last input
    if M == 0 or width == 0:
        return lambda *given: torch.empty_like(out)
    strides = tuple(t.stride(0) for t in (*inputs, out))
    grid = (M, triton.cdiv(width, BLOCK))
    meta = dict(ACTIVATION=activation, BLOCK=BLOCK, num_warps=4)
    launch = compile_launch(kernel, grid, (*inputs, out, width, *strides), meta, out.device)

    def call(*given):
        result = torch.empty_like(out)
        launch(*given, result, width, *strides)
        return result

    return call
