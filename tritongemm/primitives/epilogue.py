"""The fused epilogue in the kernels' languages (core/epilogue.py says what it computes): one
jitted function for the `triton.language` rungs, its Gluon twin for the Hopper rungs."""

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# --- triton.language ------------------------------------------------------------------------
# tanh and sigmoid from exp(-|y|), which is in (0, 1]: nothing overflows for any finite input
# (exp(-y) would, to inf, in half of the range) and every Triton release and the interpreter
# have exp.


@triton.jit
def _activate_tl(y, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        y = tl.maximum(y, 0.0)
    elif ACTIVATION == "gelu":
        y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        e = tl.exp(-2.0 * tl.abs(inner))
        tanh = (1.0 - e) / (1.0 + e)
        y = 0.5 * y * (1.0 + tl.where(inner >= 0, tanh, -tanh))
    elif ACTIVATION == "silu":
        e = tl.exp(-tl.abs(y))
        y = y * tl.where(y >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return y


@triton.jit
def apply_tl(
    acc, offs_m, offs_n, M, N,
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):  # fmt: skip
    """The epilogue on a (BLOCK_M, BLOCK_N) fp32 tile whose rows are offs_m, columns offs_n.
    STORE_PREACT also writes alpha * acc + bias, the activation's input, to preact (M, N) with
    rows stride_pm apart: what the backward's activation derivative reads."""
    if HAS_ALPHA:
        acc = acc * alpha
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    rows = offs_m.to(tl.int64)[:, None]  # a residual may span 2**31 elements on its own, and its
    cols = offs_n.to(tl.int64)[None, :]  # columns may be its long axis (a transposed view)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if STORE_PREACT:
        p_ptrs = preact_ptr + rows * stride_pm + cols
        tl.store(p_ptrs, acc.to(preact_ptr.dtype.element_ty), mask=mask)
    acc = _activate_tl(acc, ACTIVATION)
    if HAS_RESIDUAL:
        r_ptrs = residual_ptr + rows * stride_rm + cols * stride_rn
        acc = acc + tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def scale_tl(acc, offs_m, offs_n, M, N, sa_ptr, sb_ptr, stride_sa, stride_sb, ROW_SCALES: tl.constexpr):
    """fp8's dequantization of a finished (BLOCK_M, BLOCK_N) tile, before the epilogue:
    acc * scale_a[m] * scale_b[n] (row-wise scales, stride_sa / stride_sb apart) or acc * scale_a
    * scale_b (tensor-wise: one element each)."""
    if ROW_SCALES:
        sa = tl.load(sa_ptr + offs_m * stride_sa, mask=offs_m < M, other=0.0)
        sb = tl.load(sb_ptr + offs_n * stride_sb, mask=offs_n < N, other=0.0)
        return acc * sa[:, None] * sb[None, :]
    return acc * (tl.load(sa_ptr) * tl.load(sb_ptr))


# --- Gluon ----------------------------------------------------------------------------------
# The same steps on the WGMMA accumulator: the bias and residual are loaded straight into the
# accumulator's register layout, so no layout conversion sits between the MMA and the store.


@gluon.jit
def _activate_gl(y, ACTIVATION: gl.constexpr):
    if ACTIVATION == "relu":
        y = gl.maximum(y, 0.0)
    elif ACTIVATION == "gelu":
        y = 0.5 * y * (1.0 + gl.erf(y * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        e = gl.exp(-2.0 * gl.abs(inner))
        tanh = (1.0 - e) / (1.0 + e)
        y = 0.5 * y * (1.0 + gl.where(inner >= 0, tanh, -tanh))
    elif ACTIVATION == "silu":
        e = gl.exp(-gl.abs(y))
        y = y * gl.where(y >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return y


@gluon.jit
def apply_gl(
    acc, off_m, off_n, M, N,
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    ACTIVATION: gl.constexpr, HAS_ALPHA: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
):  # fmt: skip
    """The epilogue on the fp32 accumulator of the tile at (off_m, off_n) (see apply_tl).

    A residual's tile whose columns all lie below N is loaded under a mask by row alone
    (`_apply_gl`'s WHOLE_COLUMNS). Masked by column against N, a runtime value whose
    divisibility the compiler doesn't know, each load was 2 bytes wide, 128 a thread on a 128 x
    256 tile, and spilled registers; by row alone each thread's two adjacent values come in one
    4-byte load, and rung 6's tiles spill nothing on triton 3.6.0 and 3.7.1 (ptxas, sm_90a;
    test_gluon_compile). The last tile along N keeps the column mask. With a pre-activation to
    store, two copies of the epilogue spilled more than one: one copy then."""
    # Three calls, not a flag set under the constexpr test and branched on once: triton 3.6.0
    # failed to compile that for the fp8 and Gluon rungs (ConvertTritonGPUToLLVM; CI, 3702eeb).
    if HAS_RESIDUAL and not STORE_PREACT:
        if off_n + acc.shape[1] <= N:
            acc = _apply_gl(
                acc, off_m, off_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
                ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT, True,
            )  # fmt: skip
        else:
            acc = _apply_gl(
                acc, off_m, off_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
                ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT, False,
            )  # fmt: skip
    else:
        acc = _apply_gl(
            acc, off_m, off_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
            ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT, False,
        )  # fmt: skip
    return acc


@gluon.jit
def _apply_gl(
    acc, off_m, off_n, M, N,
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    ACTIVATION: gl.constexpr, HAS_ALPHA: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr, WHOLE_COLUMNS: gl.constexpr,
):  # fmt: skip
    """apply_gl's steps; WHOLE_COLUMNS: every column of the tile is below N (masks by row)."""
    layout: gl.constexpr = acc.type.layout
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    if HAS_ALPHA:
        acc = acc * alpha
    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    if HAS_BIAS:
        bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + gl.expand_dims(bias.to(gl.float32), 0)
    offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    rows = gl.expand_dims(offs_m.to(gl.int64), 1)  # 64-bit, as in apply_tl
    cols = gl.expand_dims(offs_n.to(gl.int64), 0)
    if WHOLE_COLUMNS:
        mask = rows < M  # (BLOCK_M, 1), broadcast along the row
    else:
        mask = (rows < M) & (cols < N)
    if STORE_PREACT:
        gl.store(preact_ptr + rows * stride_pm + cols, acc.to(preact_ptr.dtype.element_ty), mask=mask)
    acc = _activate_gl(acc, ACTIVATION)
    if HAS_RESIDUAL:
        r_ptrs = residual_ptr + rows * stride_rm + cols * stride_rn
        acc = acc + gl.load(r_ptrs, mask=mask, other=0.0).to(gl.float32)
    return acc


@gluon.jit
def gated_gl(acc, ACTIVATION: gl.constexpr):
    """A gated pair's epilogue, act(gate) * up, on an fp32 accumulator whose left half holds the
    gate projection's columns and its right half the up projection's, for the same outputs
    (pipeline.issue_loads loads B so): [BLOCK_M, BLOCK_N] in, [BLOCK_M, BLOCK_N / 2] out. The
    halves are a register renaming of the WGMMA accumulator, as in pipeline.store_tile_in_pieces."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    HALF_N: gl.constexpr = acc.shape[1] // 2
    gate, up = gl.split(gl.permute(gl.reshape(acc, [BLOCK_M, 2, HALF_N]), (0, 2, 1)))
    return _activate_gl(gate, ACTIVATION) * up


@gluon.jit
def scale_gl(acc, off_m, off_n, M, N, sa_ptr, sb_ptr, ROW_SCALES: gl.constexpr):
    """scale_tl on the accumulator of the tile at (off_m, off_n), its scales loaded straight into
    the accumulator's row and column layouts; row-wise scales contiguous."""
    layout: gl.constexpr = acc.type.layout
    if ROW_SCALES:
        offs_m = off_m + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, layout))
        offs_n = off_n + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
        sa = gl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)
        sb = gl.load(sb_ptr + offs_n, mask=offs_n < N, other=0.0)
        return acc * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)
    return acc * (gl.load(sa_ptr) * gl.load(sb_ptr))
