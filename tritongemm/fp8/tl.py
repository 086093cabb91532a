"""The fp8 kernels in `triton.language`: quantization (one pass per scale group: its absmax, its
scale, the cast) and the scaled GEMM, with the scales applied where each recipe needs them.

These are the fp8 family's first rung, the reference the Gluon WGMMA rungs will be checked and
timed against, and what the CPU runs under the interpreter. Quotients are IEEE round-to-nearest
like torch's, so a quantized tensor equals `recipes.reference_quantize`'s bit for bit (Triton's `/`
on fp32 is an approximate division on the GPU): `_fp8_ready` says how they are made cheaply.
"""

import triton
import triton.language as tl

from tritongemm.primitives.epilogue import apply_tl, scale_tl
from tritongemm.primitives.tiling.tl import grouped_tile
from tritongemm.primitives.tl.tiles import dot_tile, store_tile, tile_offsets

# --- quantization ---------------------------------------------------------------------------


@triton.jit
def max_magnitude_into(ptr, magnitude, mask=None):
    """*ptr = max(*ptr, magnitude) for fp32 magnitudes (>= 0, so the float order is the integer
    order of their bits), as one relaxed integer atomic: nothing reads the maxima before the kernel
    ends. Triton's float atomic_max is two acq_rel atomics (one for each sign, a shuffle through
    shared memory between them); the row recipe's maxima pass read x at 1.6-2.1 TB/s with them and
    at 3.3-3.9 with this on the H200 (scripts/probes/fp8_training/absmax_probe.py)."""
    bits = ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    tl.atomic_max(bits, magnitude.to(tl.int32, bitcast=True), mask=mask, sem="relaxed")


# fmt: off
@triton.jit
def _absmax_kernel(
    x_ptr, amax_ptr,  # x (R, C); amax: one fp32, zeroed by the host, max-reduced into
    R, C, stride_xr, stride_xc,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # fmt: on
    """The tensor recipe's first pass: max |x| over the whole tensor, one tile a program."""
    offs_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # x may pass 2**31 elements
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r[:, None] < R) & (offs_c[None, :] < C)
    x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask, other=0.0)
    max_magnitude_into(amax_ptr, tl.max(tl.max(tl.abs(x.to(tl.float32)), 1), 0))


# fmt: off
@triton.jit
def _quantize_kernel(
    # pointers
    x_ptr, q_ptr, scale_ptr,  # x (R, C), its fp8 copy q (R, C), the scales (a grid over the groups)
    amax_ptr,  # the tensor recipe: the whole tensor's absmax (_absmax_kernel); else unused
    # sizes and strides (elements)
    R, C,
    stride_xr, stride_xc, stride_qr, stride_qc, stride_sr, stride_sc,
    # meta-parameters
    GROUP_R: tl.constexpr,  # rows that share one scale: 1 (a row, or 1 x 128 blocks) or 128 (weight blocks)
    GROUP_C: tl.constexpr,  # columns that share one scale: 128, or the row's padded length
    BLOCK_R: tl.constexpr,  # rows a program takes (GROUP_R when rows share a scale)
    BLOCK_C: tl.constexpr,  # columns a step takes, over the GROUP_C of the program's group
    WHOLE_TENSOR: tl.constexpr,  # the tensor recipe: one scale, from amax_ptr
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr,  # the fp8 format's
    INTERPRETED: tl.constexpr,  # under Triton's interpreter (recipes.fp8_cast_meta)
):
    # fmt: on
    """Program (i, j): rows [i * BLOCK_R, ...) over the j-th GROUP_C columns. Pass 1 finds each
    group's absmax, pass 2 writes x / scale, clamped to the fp8 range, rounded to nearest even."""
    # 64-bit rows: a prefill's MLP activation (131072 tokens x 18944) passes 2**31 elements, and
    # `offs_r * stride_xr` in int32 wrapped there (an illegal address on the H200). One multiply a
    # row in a kernel bound by memory, so not worth a second compiled variant.
    offs_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col0 = tl.program_id(1) * GROUP_C
    rows_in = offs_r < R
    # 1. The scale: max(|x|) over the group, floored (an all-zero group quantizes to 0, not NaN).
    if WHOLE_TENSOR:
        amax = tl.zeros((BLOCK_R,), dtype=tl.float32) + tl.load(amax_ptr)
    else:
        amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for c in range(0, GROUP_C, BLOCK_C):
            offs_c = col0 + c + tl.arange(0, BLOCK_C)
            mask = rows_in[:, None] & (offs_c[None, :] < C)
            x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask, other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), 1))
        if GROUP_R > 1:  # a weight block: one scale for its rows
            amax = tl.zeros((BLOCK_R,), dtype=tl.float32) + tl.max(amax, 0)
    scale = tl.math.div_rn(tl.maximum(amax, 1e-12), FP8_MAX)
    inv_scale = _reciprocal(scale)
    s_ptrs = scale_ptr + (offs_r // GROUP_R) * stride_sr + tl.program_id(1) * stride_sc
    tl.store(s_ptrs, scale, mask=rows_in)  # the rows of a shared group store the same value
    # 2. The cast.
    for c in range(0, GROUP_C, BLOCK_C):
        offs_c = col0 + c + tl.arange(0, BLOCK_C)
        mask = rows_in[:, None] & (offs_c[None, :] < C)
        x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask, other=0.0)
        y = _fp8_ready(x.to(tl.float32), scale[:, None], inv_scale[:, None], FP8_MAX, MANTISSA, MIN_EXP, INTERPRETED)
        tl.store(q_ptr + offs_r[:, None] * stride_qr + offs_c[None, :] * stride_qc, y.to(q_ptr.dtype.element_ty),
                 mask=mask)  # fmt: skip


@triton.jit
def _reciprocal(scale):
    """1 / scale rounded to nearest: computed once a row, column or tile, for `_fp8_ready`."""
    return tl.math.div_rn(tl.zeros_like(scale) + 1.0, scale)


@triton.jit
def _fp8_ready(x, scale, inv_scale, FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr,
               INTERPRETED: tl.constexpr):  # fmt: skip
    """x / scale (fp32, broadcast), clamped to the fp8 range: ready for the cast to fp8, which
    rounds it to nearest even, as torch's `(x / scale).clamp(...).to(fp8)` does.

    On the GPU the quotient is x * inv_scale (inv_scale = RN(1 / scale)) corrected by one residual
    (Markstein's: with a correctly rounded reciprocal it is the correctly rounded quotient, the same
    bits as div_rn), three instructions where div_rn takes about a dozen: the row-wise
    quantize-and-transpose kernel was bound by its arithmetic, two quotients a value (1.2-1.4 TB/s
    on the H200, where a copy runs at 3.7). A non-finite scale gives NaN here, where div_rn gives 0
    for the group's finite values: its group was garbage either way. The interpreter's fma rounds
    twice and its cast does not round to nearest, so under it div_rn and `_round_to_fp8`."""
    s = tl.zeros_like(x) + scale
    if INTERPRETED:
        y = tl.math.div_rn(x, s)
    else:
        inv = tl.zeros_like(x) + inv_scale
        y = x * inv
        y = tl.fma(tl.fma(-y, s, x), inv, y)
    # NaN stays NaN, as in torch's clamp: the default min/max would return the bound, and the group's
    # absmax (a max that skips NaN) is finite, so a NaN in x would have become a finite +-FP8_MAX.
    keep_nan: tl.constexpr = tl.PropagateNan.ALL
    y = tl.minimum(tl.maximum(y, -FP8_MAX, propagate_nan=keep_nan), FP8_MAX, propagate_nan=keep_nan)
    if INTERPRETED:
        y = _round_to_fp8(y, MANTISSA, MIN_EXP)
    return y


@triton.jit
def _round_to_fp8(y, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr):
    """y (fp32, within the fp8 range) rounded to the nearest fp8 value, ties to even, in fp32: then
    the cast to fp8 only re-encodes. The GPU's cast rounds the same way; Triton's interpreter
    (3.6 to 3.9), which the CPU runs this in, rounds half up and drops the carry into the exponent
    (124.3 cast to e4m3 gives 64, not 128). Adding c = 2**(e + 23 - MANTISSA), e the exponent of
    |y| (at least the smallest normal one, for subnormals), leaves fp8's precision in the sum's
    23 mantissa bits, and fp32's own round-to-nearest-even does the rest."""
    mag = tl.abs(y)
    e = tl.maximum(((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, MIN_EXP)
    c = ((e + (23 - MANTISSA + 127)) << 23).to(tl.float32, bitcast=True)
    r = (mag + c) - c
    return tl.where(y < 0, -r, r)


# --- the scaled GEMM ------------------------------------------------------------------------


# fmt: off
@triton.jit
def _scaled_mm_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,  # A (M, K) fp8, B (K, N) fp8, C (M, N)
    sa_ptr, sb_ptr,  # the scales: one each; (M, 1) and (1, N); (M, K/128) and (ceil(N/128), K/128)
    # sizes
    M, N, K,
    # strides (elements)
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    stride_sam, stride_sak,  # scale_a's row and column strides (row: its column stride unused)
    stride_sbn, stride_sbk,  # scale_b's strides along N (its blocks, for block) and K
    # the fused epilogue (primitives/epilogue.py), after the scales
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    RECIPE: tl.constexpr,  # "tensor", "row" or "block" (recipes.py)
    SCALE_BLOCK: tl.constexpr,  # the block recipe's 128 (BLOCK_K is 128 then)
    ALIGN: tl.constexpr,  # _host.alignment_hints
    SWAP_AB: tl.constexpr,  # the tile as C.T's, the weight's rows on the dot's tall side
    ALIGN_T: tl.constexpr,  # SWAP_AB: the transposed product's hints (swap_ab.transposed_alignment); else None
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
    INT64: tl.constexpr,  # an operand spans 2**31 elements: 64-bit index math (primitives/tl/tiles.py)
):
    # fmt: on
    # 1. Which output tile am I? The grouped order (ladder/grouped.py).
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_SIZE_M)
    offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INT64)
    m_in, n_in = offs_m < M, offs_n < N

    # 2. Accumulate over K. Tensor- and row-wise scales are constant along K: the sum runs unscaled
    #    and the scales apply once, below. A block scale changes every 128 of K: each K block's
    #    partial sum is a dot of its own, scaled and added in fp32 ("promotion"), so no more than
    #    one block's products ever share the MMA's accumulator.
    if RECIPE == "block":
        sa_ptrs = sa_ptr + offs_m * stride_sam  # a token's 1 x 128 scales
        sb_ptrs = sb_ptr + (offs_n // SCALE_BLOCK) * stride_sbn  # a weight row's 128 x 128 block's
        if SWAP_AB:  # the transposed tile (below): a tile row is a weight row, a column a token
            acc = tl.trans(_block_scaled_dot(b_ptr, a_ptr, offs_n, offs_m, n_in, m_in, K, stride_bn, stride_bk,
                                             stride_ak, stride_am, sb_ptrs, sa_ptrs, stride_sbk, stride_sak,
                                             BLOCK_N, BLOCK_M, BLOCK_K))  # fmt: skip
        else:
            acc = _block_scaled_dot(a_ptr, b_ptr, offs_m, offs_n, m_in, n_in, K, stride_am, stride_ak, stride_bk,
                                    stride_bn, sa_ptrs, sb_ptrs, stride_sak, stride_sbk, BLOCK_M, BLOCK_N,
                                    BLOCK_K)  # fmt: skip
    elif SWAP_AB:
        # Rung 8's transposed tile (ladder/swap_ab.py): C.T's = W[offs_n] @ x[offs_m].T, so a few
        # tokens are the MMA's narrow side, not padding rows of a 64-row tile; both operands stay
        # K-major, as fp8's MMA reads them.
        acc_t = dot_tile(b_ptr, a_ptr, offs_n, offs_m, N, M, K, stride_bn, stride_bk, stride_ak, stride_am,
                         BLOCK_N, BLOCK_M, BLOCK_K, True, "tf32", ALIGN_T)  # fmt: skip
        acc = scale_tl(tl.trans(acc_t), offs_m, offs_n, M, N, sa_ptr, sb_ptr, stride_sam, stride_sbn, RECIPE == "row")
    else:
        acc = dot_tile(a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       BLOCK_M, BLOCK_N, BLOCK_K, True, "tf32", ALIGN)  # fmt: skip
        acc = scale_tl(acc, offs_m, offs_n, M, N, sa_ptr, sb_ptr, stride_sam, stride_sbn, RECIPE == "row")

    # 3. linear's epilogue on the dequantized tile, then one rounding to C's dtype.
    acc = apply_tl(
        acc, offs_m, offs_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
        ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
    )  # fmt: skip
    store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)


@triton.jit
def _block_scaled_dot(r_ptr, c_ptr, offs_r, offs_c, r_in, c_in, K, stride_rr, stride_rk, stride_ck, stride_cc,
                      sr_ptrs, sc_ptrs, stride_srk, stride_sck,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """sum over the K blocks kb of (R_kb @ C_kb) * sr_kb[:, None] * sc_kb[None, :], in fp32: R's
    rows (offs_r) times C's columns (offs_c), both K-major as fp8's MMA reads them, each block's
    product promoted with its rows' and columns' scales (sr_ptrs, sc_ptrs: column kb at kb * stride).
    K is a multiple of BLOCK_K = 128: no K mask."""
    offs_k = tl.arange(0, BLOCK_K)
    r_ptrs = r_ptr + offs_r[:, None] * stride_rr + offs_k[None, :] * stride_rk
    c_ptrs = c_ptr + offs_k[:, None] * stride_ck + offs_c[None, :] * stride_cc
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        r = tl.load(r_ptrs, mask=r_in[:, None], other=0.0)
        c = tl.load(c_ptrs, mask=c_in[None, :], other=0.0)
        partial = tl.dot(r, c)
        sr = tl.load(sr_ptrs + kb * stride_srk, mask=r_in, other=0.0)
        sc = tl.load(sc_ptrs + kb * stride_sck, mask=c_in, other=0.0)
        acc += partial * sr[:, None] * sc[None, :]
        r_ptrs += BLOCK_K * stride_rk
        c_ptrs += BLOCK_K * stride_ck
    return acc
