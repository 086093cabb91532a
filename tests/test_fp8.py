"""fp8: `quantize_fp8` value for value against its torch reference, `scaled_mm` against the fp64
product of the dequantized operands, per recipe, fp8 format, odd shapes and epilogue; and the
errors a bad call gets before anything launches.

On the CPU the `triton.language` kernels run under the interpreter, on a GPU compiled.
"""

from __future__ import annotations

import re
import zlib

import pytest
import torch
from cases import DEVICE, ON_GPU, ON_HOPPER

from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import fp8_tolerance, rel_error
from tritongemm.fp8 import quantize_fp8, reference_quantize, reference_scaled_mm, scaled_mm
from tritongemm.primitives.gluon.compat import CLUSTER_MULTICAST

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# The interpreter has no bf16 arithmetic, but quantization only widens x to fp32: bf16 runs everywhere.
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def rand(*shape, dtype=torch.float32, seed="", scale=1.0):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}{dtype}{seed}".encode()))
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=DEVICE)


def same_values(q: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal fp8 values, element for element (a zero's sign aside: the interpreter drops it)."""
    return q.dtype == expected.dtype and torch.equal(q.float(), expected.float())


# ----------------------------------------------------------------------------------------------
# quantize_fp8
# ----------------------------------------------------------------------------------------------

# (recipe, block, x's shape): odd sizes on every axis, N-D activations, a K shorter than a block.
QUANTIZE_CASES = [
    ("tensor", None, (37, 260)),
    ("tensor", None, (1, 1)),
    ("row", None, (5, 300)),
    ("row", None, (2, 3, 129)),
    ("row", None, (7, 1)),
    ("row", None, (1, 4500)),  # one row: a program of one row, 4096 columns a step
    ("row", None, (3, 2500)),
    ("block", None, (3, 7, 256)),
    ("block", (1, 128), (9, 200)),
    ("block", (128, 128), (200, 384)),
    ("block", (128, 128), (129, 100)),
]
if ON_GPU:  # prefill sizes: rows a program halved until the SMs have programs enough (2, 4 and 8 rows)
    QUANTIZE_CASES += [("row", None, (2048, 4096)), ("row", None, (1000, 14336)), ("tensor", None, (4099, 1000))]


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("recipe, block, shape", QUANTIZE_CASES, ids=str)
def test_quantize_matches_its_reference_exactly(recipe, block, shape, dtype):
    """Magnitudes from 1e-6 to 1e3 in one tensor, so rows and blocks get very different scales,
    and some elements land in fp8's subnormals, or round up into the next power of two."""
    x = rand(*shape, seed=recipe) * torch.logspace(-6, 3, shape[-1], device=DEVICE)
    q, scale = quantize_fp8(x, recipe, block=block, dtype=dtype)
    expected_q, expected_scale = reference_quantize(x, recipe, block, dtype)
    assert scale.shape == expected_scale.shape and scale.dtype == torch.float32
    assert torch.equal(scale, expected_scale)
    assert q.shape == x.shape and same_values(q, expected_q)


@pytest.mark.parametrize("x_dtype", X_DTYPES, ids=str)
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_quantize_takes_any_input_dtype_and_strides(recipe, x_dtype):
    """A transposed view, and all-zero groups (scale at the floor, elements 0, no NaN)."""
    x = rand(256, 48, dtype=x_dtype, seed=recipe).T  # (48, 256), column-major
    x[5] = 0
    q, scale = quantize_fp8(x, recipe)
    expected_q, expected_scale = reference_quantize(x, recipe)
    assert torch.equal(scale, expected_scale) and same_values(q, expected_q)
    assert not torch.isnan(q.float()).any()


def test_quantize_of_an_empty_tensor():
    q, scale = quantize_fp8(torch.empty(0, 256, device=DEVICE), "block")
    assert q.shape == (0, 256) and scale.shape == (0, 2)
    q, scale = quantize_fp8(torch.empty(4, 0, device=DEVICE), "row")
    assert q.shape == (4, 0) and scale.shape == (4, 1) and (scale > 0).all()


# ----------------------------------------------------------------------------------------------
# scaled_mm
# ----------------------------------------------------------------------------------------------


def operands(M, N, K, recipe, a_dtype=E4M3, b_dtype=E4M3, seed=""):
    """a (M, K) and b = weight.T (K, N) quantized with `recipe`, and their scales as scaled_mm takes them."""
    x, w = rand(M, K, seed=f"x{seed}"), rand(N, K, seed=f"w{seed}", scale=K**-0.5)
    if recipe == "block":
        (a, sa), (wq, sw) = (
            quantize_fp8(x, "block", dtype=a_dtype),
            quantize_fp8(w, "block", block=(128, 128), dtype=b_dtype),
        )
        return a, wq.T, sa, sw
    (a, sa), (wq, sw) = quantize_fp8(x, recipe, dtype=a_dtype), quantize_fp8(w, recipe, dtype=b_dtype)
    return a, wq.T, sa, sw.T if recipe == "row" else sw


def check(M, N, K, recipe, out_dtype=torch.bfloat16, a_dtype=E4M3, b_dtype=E4M3, kernel="auto", **epilogue):
    a, b, sa, sb = operands(M, N, K, recipe, a_dtype, b_dtype, f"{M}{N}{K}")
    y = scaled_mm(a, b, sa, sb, out_dtype=out_dtype, kernel=kernel, **epilogue)
    expected = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64, **epilogue)
    assert y.shape == (M, N) and y.dtype == out_dtype and y.device == a.device
    # The products of fp8 values are exact; the sum is as exact as the fp8 MMA's accumulator (core/reference.py).
    bound = fp8_tolerance(out_dtype, K)
    err = rel_error(y, expected)
    assert err <= bound, f"{recipe} {M}x{N}x{K} {out_dtype}: relative error {err:.3e} > {bound:.3e}"
    return y


SHAPES = [(1, 1, 128), (33, 70, 256), (5, 129, 384), (64, 64, 128), (17, 200, 512)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_every_recipe_on_odd_shapes(recipe, shape):
    check(*shape, recipe, out_dtype=torch.float32)


@pytest.mark.parametrize("shape", SHAPES + [(16, 4096, 256)], ids=str)
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_the_swapped_tile_on_odd_shapes(recipe, shape):
    """fp8_swap_ab: C.T's tiles, transposed back before the scales and the epilogue (bias and
    SiLU on the last shape); block scales per 128 of K, a weight row's on each tile row and a
    token's on each column; its GPU tile (16 tokens x 64 weight rows) on the GPU."""
    fused = dict(bias=rand(shape[1], seed="bias"), activation="silu") if shape[0] == 16 else {}
    check(*shape, recipe, out_dtype=torch.bfloat16 if fused else torch.float32, kernel="fp8_swap_ab", **fused)


@pytest.mark.parametrize("a_dtype, b_dtype", [(E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)], ids=str)
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_fp8_formats_in_any_pairing(recipe, a_dtype, b_dtype):
    check(9, 40, 256, recipe, torch.float32, a_dtype, b_dtype)


@pytest.mark.skipif(not ON_GPU, reason="auto's choice past M = 64 is the GPU's (the interpreter's is one tile)")
@pytest.mark.parametrize("shape", [(65, 72, 128), (128, 4096, 256), (129, 136, 256), (300, 264, 384), (200, 100, 128)],
                         ids=str)  # fmt: skip
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_auto_past_the_small_m_tiles(recipe, shape):
    """M > 64 takes the warp-specialized Gluon rungs on Hopper where they can (bf16 out,
    TMA-aligned), on the tile that fills the SMs (64 x 64 for the first two shapes), else the
    `tl` rung; N = 100 leaves C's rows misaligned for TMA: the `tl` rung."""
    check(*shape, recipe, out_dtype=torch.bfloat16)
    check(*shape, recipe, out_dtype=torch.float32)


@pytest.mark.skipif(not ON_HOPPER, reason="auto's choice at decode sizes is Hopper's")
@pytest.mark.parametrize("M, N, K, gluon", [(1, 4096, 8192, True), (32, 28672, 4096, True), (64, 4096, 8192, True),
                                            (16, 28672, 4096, False), (32, 4096, 4096, False)])  # fmt: skip
def test_auto_streams_large_block_scaled_weights_through_the_gluon_rung(M, N, K, gluon, monkeypatch):
    """Block scales at M <= 64: fp8_block's 64-row tiles on weights of 2^25 elements or more,
    the `tl` rung below, and fp8_swap_ab's tile at M <= 16 on a K up to 4096; right either way."""
    from tritongemm.fp8 import block as fp8_block

    planned = []
    real_plan = fp8_block.plan
    monkeypatch.setattr(
        fp8_block, "plan", lambda *args, **kwargs: planned.append(args[5]) or real_plan(*args, **kwargs)
    )
    check(M, N, K, "block")
    assert bool(planned) == gluon
    assert all(config in fp8_block.ONE_WARPGROUP_TILES for config in planned)


@pytest.mark.skipif(not ON_HOPPER, reason="auto's choice at decode sizes is Hopper's")
@pytest.mark.parametrize("M, N, K, swapped", [(1, 4096, 4096, True), (16, 6144, 4096, True), (16, 28672, 4096, True),
                                              (5, 200, 384, True), (17, 4096, 4096, False),
                                              (16, 4096, 14336, False)])  # fmt: skip
def test_block_scales_at_decode_sizes_take_the_swapped_tile(M, N, K, swapped):
    """M <= 16 and K <= 4096: fp8_swap_ab's tile, one 128-wide K block a step; right either way."""
    from tritongemm.dispatch.fp8 import _SWAP_BLOCK_TILE
    from tritongemm.dispatch.fp8 import choose as _auto

    a, b, _, _ = operands(M, N, K, "block")
    kernel, config = _auto(a, b, torch.empty(M, N, device=DEVICE), "block")
    assert (kernel == "fp8_swap_ab") == swapped and (config == _SWAP_BLOCK_TILE) == swapped
    check(M, N, K, "block")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_the_fused_epilogue_after_the_scales(recipe, out_dtype):
    M, N = 13, 72
    bias, residual = rand(N, seed="bias"), rand(M, N, dtype=torch.bfloat16, seed="residual")
    check(M, N, 256, recipe, out_dtype, bias=bias, residual=residual, activation="gelu", alpha=0.5)


@pytest.mark.parametrize("recipe", ["tensor", "row"])
def test_k_not_a_multiple_of_128_outside_the_block_recipe(recipe):
    check(6, 10, 100, recipe, torch.float32)


def test_empty_problems():
    a, b, sa, sb = operands(0, 16, 128, "row")
    assert scaled_mm(a, b, sa, sb).shape == (0, 16)
    a, b = torch.empty(3, 0, device=DEVICE, dtype=E4M3), torch.empty(4, 0, device=DEVICE, dtype=E4M3).T
    one = torch.ones((), device=DEVICE)
    y = scaled_mm(a, b, one, one, bias=torch.ones(4, device=DEVICE), out_dtype=torch.float32)
    assert torch.equal(y, torch.ones(3, 4, device=DEVICE))  # an empty sum, then the bias


def test_a_config_is_taken():
    config = MatmulConfig(BLOCK_M=32, BLOCK_N=16, BLOCK_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=1)
    a, b, sa, sb = operands(40, 50, 256, "block")
    y = scaled_mm(a, b, sa, sb, config=config, out_dtype=torch.float32, kernel="fp8_grouped")
    assert rel_error(y, reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64)) <= fp8_tolerance(torch.float32, 256)


def test_a_second_call_runs_its_plan_without_checks(monkeypatch):
    """The hot path (fp8/api.py): a call like one seen before checks and chooses nothing again,
    quantization included, and computes what the first call did."""
    from tritongemm.fp8 import build as api

    x, w = rand(24, 256, seed="hot"), rand(40, 256, seed="hot-w")
    first = (quantize_fp8(x, "row"), quantize_fp8(w, "row"))
    (a, sa), (wq, sw) = first
    y = scaled_mm(a, wq.T, sa, sw.T, bias=rand(40), out_dtype=torch.float32)

    def refuse(*args):
        raise AssertionError("checked again")

    monkeypatch.setattr(api, "check_scaled_mm", refuse)
    monkeypatch.setattr(api, "check_quantize", refuse)
    (a2, sa2), (wq2, sw2) = quantize_fp8(x, "row"), quantize_fp8(w, "row")
    assert same_values(a2, a) and torch.equal(sa2, sa) and same_values(wq2, wq)
    assert torch.equal(scaled_mm(a2, wq2.T, sa2, sw2.T, bias=rand(40), out_dtype=torch.float32), y)
    with pytest.raises(AssertionError, match="checked again"):  # another problem: planned, so checked
        scaled_mm(a2[:8], wq2.T, sa2[:8], sw2.T, out_dtype=torch.float32)


# ----------------------------------------------------------------------------------------------
# Errors, before any launch
# ----------------------------------------------------------------------------------------------


def _bad_calls():
    a, b, sa, sb = operands(8, 256, 256, "row")
    ab, bb, sab, sbb = operands(8, 256, 256, "block")
    one = torch.ones((), device=DEVICE)
    x = one.expand(4, 4)
    k64 = MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=1)
    return [
        (lambda: scaled_mm(a.float(), b, sa, sb), TypeError, "expected a of dtype float8_e4m3fn or float8_e5m2, "),
        (lambda: scaled_mm(a, b.contiguous(), sa, sb), ValueError, "expected b to be column-major"),
        (lambda: scaled_mm(a.T.contiguous().T, b, sa, sb), ValueError, "expected a to be row-major"),
        (lambda: scaled_mm(a, b[:128], sa, sb), ValueError, r"a \(8x256\) and b \(128x256\) can't be multiplied"),
        (lambda: scaled_mm(a, b, sa.double(), sb), TypeError, "expected scale_a of dtype float32, but got float64"),
        (lambda: scaled_mm(a, b, sa[:4], sb), ValueError, r"scale_a of shape \(4, 1\) and scale_b of shape"),
        (lambda: scaled_mm(ab, bb, sab, sbb[:1]), ValueError, r"\(8, 2\) and \(2, 2\) \(block-wise"),
        (lambda: scaled_mm(a[:, :200], b[:200], sab[:, :1], sbb[:, :1]), ValueError, "needs K % 128 == 0; K is 200"),
        (lambda: scaled_mm(a, b, sa, sb, out_dtype=torch.float8_e4m3fn), TypeError, "expected out_dtype bfloat16"),
        (lambda: scaled_mm(a, b, sa, sb, bias=one.expand(3)), ValueError, r"bias of shape \(256,\), but got \(3,\)"),
        (lambda: scaled_mm(a, b, sa, sb, activation="swish"), ValueError, "expected activation to be one of"),
        (lambda: scaled_mm(a, b, sa, sb, alpha=True), TypeError, "expected alpha to be a finite real number"),
        (lambda: scaled_mm(a, b, sa, sb, kernel="tma_pipelined"), ValueError, "expected kernel to be one of"),
        (lambda: scaled_mm(ab, bb, sab, sbb, config=k64), ValueError, "BLOCK_K must be 128, but got BLOCK_K=64"),
        (lambda: quantize_fp8(x, "column"), ValueError, "expected recipe to be one of"),
        (lambda: quantize_fp8(x.to(torch.int32), "row"), TypeError, "expected x of dtype bfloat16, .* but got int32"),
        (lambda: quantize_fp8(x, "row", dtype=torch.float16), TypeError, "expected dtype float8_e4m3fn or float8_e5m2"),
        (lambda: quantize_fp8(x, "block", block=(2, 128)), ValueError, r"expected block \(1, 128\) \(activations\)"),
        (lambda: quantize_fp8(one.expand(2, 4, 4), "block", block=(128, 128)), ValueError, "blocks quantize a 2D"),
        (lambda: quantize_fp8(x, "row", block=(1, 128)), ValueError, "block applies to recipe 'block' only"),
    ]


@pytest.mark.parametrize("index", range(20))
def test_bad_input_is_refused_naming_it(index):
    call, exc, pattern = _bad_calls()[index]
    with pytest.raises(exc, match=pattern):
        call()


def test_every_bad_call_is_tested():
    assert len(_bad_calls()) == 20


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon fp8 rung needs an sm_90 GPU (CPU: compiled in test_gluon_compile)")
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 8, 128), (33, 72, 256), (200, 136, 384), (1000, 1504, 768)], ids=str)
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_the_gluon_rung_on_every_recipe(recipe, shape, out_dtype):
    """fp8/tma.py against the fp64 reference, bias and GELU in its epilogue on the last shape."""
    fused = dict(bias=rand(shape[1], seed="bias"), activation="gelu") if shape[0] == 1000 else {}
    a, b, sa, sb = operands(*shape, recipe, seed="tma")
    y = scaled_mm(a, b, sa, sb, out_dtype=out_dtype, kernel="fp8_tma", **fused)
    expected = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64, **fused)
    assert rel_error(y, expected) <= fp8_tolerance(out_dtype, shape[2])


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon fp8 rung needs an sm_90 GPU (CPU: compiled in test_gluon_compile)")
@pytest.mark.parametrize("shape", [(1, 8, 128), (33, 72, 256), (128, 4096, 512), (100, 136, 1296)], ids=str)
@pytest.mark.parametrize("recipe", ["tensor", "row"])
def test_the_gluon_rung_on_the_decode_tile(recipe, shape):
    """fp8/tma.py on auto's decode tile (dispatch/fp8.py `_decode_tile`: 64 x 64, 256 deep, 4
    slots): K past the last whole step, rows and columns past the last tile, GELU on the last."""
    from tritongemm.dispatch.fp8 import _ONE_TILE_STAGES

    config = MatmulConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=_ONE_TILE_STAGES)
    fused = dict(activation="gelu") if shape[2] == 1296 else {}
    a, b, sa, sb = operands(*shape, recipe, seed="tma-decode")
    y = scaled_mm(a, b, sa, sb, kernel="fp8_tma", config=config, **fused)
    expected = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64, **fused)
    assert rel_error(y, expected) <= fp8_tolerance(torch.bfloat16, shape[2])


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon fp8 rungs need an sm_90 GPU (CPU: compiled in test_gluon_compile)")
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 8, 128), (33, 72, 256), (200, 136, 384), (1000, 1504, 768), (300, 520, 1280)],
                         ids=str)  # fmt: skip
@pytest.mark.parametrize("tile", range(4))
def test_the_block_scaled_rung(shape, out_dtype, tile):
    """fp8/block.py against the fp64 reference, on auto's four tiles (fp8_block.TILES:
    two widths, on two warpgroups and on one): odd and even numbers of K-steps, rows and columns
    past the last whole tile; bias and GELU in its epilogue on the 1000-row shape."""
    from tritongemm.fp8.block import TILES

    fused = dict(bias=rand(shape[1], seed="bias"), activation="gelu") if shape[0] == 1000 else {}
    a, b, sa, sb = operands(*shape, "block", seed="ws")
    config = TILES[tile]
    y = scaled_mm(a, b, sa, sb, out_dtype=out_dtype, kernel="fp8_block", config=config, **fused)
    expected = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64, **fused)
    assert rel_error(y, expected) <= fp8_tolerance(out_dtype, shape[2])


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon fp8 rungs need an sm_90 GPU")
@pytest.mark.parametrize("num_programs", [1, 3, 7])
@pytest.mark.parametrize("consumers", [None, 1], ids=["warpgroup-partitions", "one-partition"])
def test_the_block_scaled_rung_with_several_tiles_a_program(num_programs, consumers):
    """Few persistent programs, so each walks many tiles: the ring's phases and the scales'
    rows and columns carry from tile to tile (24 tiles of 9 K-steps, the ring of 4 slots), with
    the tile's warpgroups in partitions of their own (each releasing every slot) or in one; and
    scale_a M-major, each K-step's column of it contiguous, in the single-program case."""
    from tritongemm.core.epilogue import PLAIN
    from tritongemm.fp8 import block as fp8_block

    a, b, sa, sb = operands(900, 760, 1152, "block", seed="persistent")
    if num_programs == 1:
        sa = sa.t().contiguous().t()
    c = torch.full((900, 760), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    run = fp8_block.plan(a, b, c, sa, sb, fp8_block.DEFAULT_CONFIG, PLAIN, num_programs=num_programs,
                         consumers=consumers)  # fmt: skip
    run(a, b, c, sa, sb)
    expected = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64)
    assert rel_error(c, expected) <= fp8_tolerance(torch.bfloat16, 1152)


CLUSTER_CASES = [((256, 256, 128), None), ((300, 520, 1280), None), ((1000, 1504, 768), None), ((900, 760, 1152), 1),
                 ((900, 760, 1152), 7), ((2100, 2056, 2048), None)]  # fmt: skip


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon fp8 rungs need an sm_90 GPU")
@pytest.mark.skipif(not CLUSTER_MULTICAST, reason="a two-CTA cluster needs TMA multicast (triton >= 3.8)")
@pytest.mark.parametrize("shape, num_programs", CLUSTER_CASES, ids=str)
def test_the_block_scaled_rung_on_a_two_cta_cluster_gives_the_one_cta_bits(shape, num_programs):
    """fp8/block.py's cluster (CLUSTER = 2: the weight's tile multicast into both CTAs) runs each
    row's MMAs and promotions in the one-CTA kernel's order, so its result is the same bits:
    rows past the cluster's last whole tile, one and several tiles a cluster (the ring's phases and
    both CTAs' barriers carried across tiles), a fused bias and GELU on the 1000-row shape; and
    against the fp64 reference."""
    from tritongemm.core.epilogue import PLAIN, Epilogue
    from tritongemm.fp8 import block as fp8_block

    M, N, K = shape
    a, b, sa, sb = operands(*shape, "block", seed="cluster")
    fused = M == 1000
    bias = rand(N, seed="bias") if fused else None
    spec = Epilogue(activation="gelu", bias=True) if fused else PLAIN
    outs = []
    for cluster in (1, 2):
        c = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        run = fp8_block.plan(a, b, c, sa, sb, fp8_block.DEFAULT_CONFIG, spec, bias, num_programs=num_programs,
                             cluster=cluster)  # fmt: skip
        run(a, b, c, sa, sb, bias)
        outs.append(c)
    expected = reference_scaled_mm(a, b, sa, sb, bias=bias, activation="gelu" if fused else None,
                                   out_dtype=torch.float64)  # fmt: skip
    assert rel_error(outs[1], expected) <= fp8_tolerance(torch.bfloat16, K)
    assert torch.equal(outs[0], outs[1])


def test_the_cluster_is_taken_where_it_was_measured_to_help(monkeypatch):
    """fp8_block.cluster_for: two CTAs on the wide two-consumer tile from CLUSTER_MIN_M rows, where
    this Triton multicasts; one otherwise (narrow tiles, one consumer, small M, older Tritons)."""
    from tritongemm.fp8 import block as fp8_block

    wide, narrow = fp8_block.DEFAULT_CONFIG, fp8_block.NARROW_CONFIG
    monkeypatch.setattr(fp8_block, "CLUSTER_MULTICAST", True)
    assert fp8_block.cluster_for(wide, fp8_block.CLUSTER_MIN_M, 2) == 2
    assert fp8_block.cluster_for(wide, fp8_block.CLUSTER_MIN_M - 1, 2) == 1
    assert fp8_block.cluster_for(wide, 8192, 1) == 1
    assert fp8_block.cluster_for(narrow, 8192, 2) == 1
    monkeypatch.setattr(fp8_block, "CLUSTER_MULTICAST", False)
    assert fp8_block.cluster_for(wide, 8192, 2) == 1


# fp8 on rung 9 (fp8/ws.py): auto's four tiles (fp8_ws.TILES; the first stores C in halves), and ping-pong's.
FP8_WS_TILES = [0, 1, 2, 3, "ping-pong"]
PING_PONG = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=6)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon fp8 rungs need an sm_90 GPU (CPU: compiled in test_gluon_compile)")
@pytest.mark.parametrize("tile", FP8_WS_TILES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 8, 128), (33, 72, 256), (200, 136, 384), (1000, 1504, 768), (300, 520, 1296)],
                         ids=str)  # fmt: skip
@pytest.mark.parametrize("recipe", ["tensor", "row"])
def test_the_warp_specialized_rung(recipe, shape, out_dtype, tile):
    """fp8/ws.py against the fp64 reference: rows, columns and K past the last whole tile,
    into a poisoned output; bias, GELU and a residual in its epilogue on the 1000-row shape; one
    program walking every tile of the last shape, so the ring's phases carry over tiles."""
    from tritongemm.core.epilogue import Epilogue
    from tritongemm.fp8 import ws as fp8_ws

    M, N, K = shape
    config, consumers = (PING_PONG, 2) if tile == "ping-pong" else (fp8_ws.TILES[tile], 1)
    fused = dict(bias=rand(N, seed="bias"), activation="gelu", residual=rand(M, N, seed="res")) if M == 1000 else {}
    a, b, sa, sb = operands(*shape, recipe, seed="fp8-ws")
    c = torch.full((M, N), float("nan"), dtype=out_dtype, device=DEVICE)
    spec = Epilogue(fused.get("activation"), 1.0, "bias" in fused, "residual" in fused)
    run = fp8_ws.plan(a, b, c, sa, sb.contiguous(), recipe, config, spec, fused.get("bias"), fused.get("residual"),
                      consumers=consumers, num_programs=1 if K == 1296 else None)  # fmt: skip
    run(a, b, c, sa, sb.contiguous(), fused.get("bias"), fused.get("residual"))
    expected = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64, **fused)
    assert rel_error(c, expected) <= fp8_tolerance(out_dtype, K)


# fp8 on odd widths (fp8/odd_width.py): its default 64 x 96 (a 32-column tail) and two
# wider ones, 64 + 96 and 128 + 64 columns.
FP8_ODD_TILES = [(96, 256, 5), (160, 128, 6), (192, 128, 5)]  # (BLOCK_N, BLOCK_K, num_stages)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon fp8 rungs need an sm_90 GPU (CPU: compiled in test_gluon_compile)")
@pytest.mark.parametrize("tile", FP8_ODD_TILES, ids=str)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 8, 128), (33, 72, 256), (128, 6144, 512), (200, 136, 384), (1000, 1504, 768),
                                   (300, 520, 1296)], ids=str)  # fmt: skip
@pytest.mark.parametrize("recipe", ["tensor", "row"])
def test_the_odd_width_rung(recipe, shape, out_dtype, tile):
    """fp8/odd_width.py against the fp64 reference: rows, columns and K past the last whole
    tile (a last tile's tail wholly past N at N = 8 and 72), into a poisoned output; bias, GELU and
    a residual in both parts' epilogues on the 1000-row shape; one program walking every tile of
    the last shape, so the ring's phases carry over tiles."""
    from tritongemm.core.epilogue import Epilogue
    from tritongemm.fp8 import odd_width as fp8_odd_width

    M, N, K = shape
    width, depth, stages = tile
    config = fp8_odd_width.DEFAULT_CONFIG.with_(BLOCK_N=width, BLOCK_K=depth, num_stages=stages)
    fused = dict(bias=rand(N, seed="bias"), activation="gelu", residual=rand(M, N, seed="res")) if M == 1000 else {}
    a, b, sa, sb = operands(*shape, recipe, seed="fp8-odd")
    c = torch.full((M, N), float("nan"), dtype=out_dtype, device=DEVICE)
    spec = Epilogue(fused.get("activation"), 1.0, "bias" in fused, "residual" in fused)
    run = fp8_odd_width.plan(a, b, c, sa, sb.contiguous(), recipe, config, spec, fused.get("bias"),
                             fused.get("residual"), num_programs=1 if K == 1296 else None)  # fmt: skip
    run(a, b, c, sa, sb.contiguous(), fused.get("bias"), fused.get("residual"))
    expected = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64, **fused)
    assert rel_error(c, expected) <= fp8_tolerance(out_dtype, K)


@pytest.mark.parametrize(("N", "kernel", "width"), [(6144, "fp8_odd_width", 96), (4096, "fp8_ws", 64),
                                                   (28672, "fp8_ws", 64), (8192, "fp8_ws", 128)])  # fmt: skip
def test_decode_sized_tiles_fill_their_waves(N, kernel, width):
    """auto's tile at M = 128 on 132 SMs (dispatch/fp8.py `_wave_filling_tile`): 6144 weight rows in 64 x
    96 tiles (128 of them, where 64 x 128 gives 96), 28672 in 64 x 64 (seven waves 97% full,
    where 64 x 128 fills 85%), the wider of two that fill as well at 8192."""
    from tritongemm.dispatch.fp8 import _wave_filling_tile

    chosen, config = _wave_filling_tile(128, N, 132)
    assert (chosen, config.BLOCK_M, config.BLOCK_N) == (kernel, 64, width)


ONE_WAVE_CASES = [(4096, 4096, "fp8_tma"), (4096, 14336, "fp8_ws"), (1024, 1024, "fp8_tma"), (28672, 4096, "fp8_ws"),
                  (6144, 4096, "fp8_odd_width")]  # fmt: skip


@pytest.mark.parametrize(("N", "K", "kernel"), ONE_WAVE_CASES)
def test_a_one_wave_decode_tile_on_a_short_k_runs_on_rung_4(N, K, kernel):
    """dispatch/fp8.py `_decode_tile` at M = 128 on 132 SMs: the 64 x 64 tile in one wave on a K of at
    most 4096 runs on fp8_tma; more waves, a longer K or another tile stay where they were."""
    from tritongemm.dispatch.fp8 import _decode_tile

    assert _decode_tile(128, N, K, 132)[0] == kernel


def test_the_odd_width_rung_takes_tensor_and_row_scales_only():
    a, b, sa, sb = operands(8, 128, 128, "block")
    with pytest.raises(ValueError, match="'fp8_odd_width' takes tensor- or row-wise scales"):
        scaled_mm(a, b, sa, sb, kernel="fp8_odd_width")


def test_the_warp_specialized_rung_takes_tensor_and_row_scales_only():
    a, b, sa, sb = operands(8, 128, 128, "block")
    match = "fp8_ws: takes tensor- or row-wise scales" if ON_HOPPER else "'fp8_ws' runs on a CUDA GPU"
    with pytest.raises(ValueError, match=match):
        scaled_mm(a, b, sa, sb, kernel="fp8_ws")


def test_the_block_scaled_rung_takes_block_scales_only():
    a, b, sa, sb = operands(8, 16, 128, "row")
    with pytest.raises(ValueError, match="'fp8_block' takes block-wise .* but got row-wise scales and K = 128"):
        scaled_mm(a, b, sa, sb, kernel="fp8_block")


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon fp8 rungs need an sm_90 GPU")
@pytest.mark.parametrize("shape", [(1, 96, 128), (77, 304, 512)], ids=str)
def test_the_block_scaled_rung_reads_one_element_scales_broadcast(shape):
    """A block grid of one element each (M = 1, N <= 128, K = 128) reads as tensor-wise scales:
    the rung takes those too, the one scale for every block."""
    a, b, sa, sb = operands(*shape, "tensor", seed="one")
    y = scaled_mm(a, b, sa, sb, kernel="fp8_block")
    expected = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64)
    assert rel_error(y, expected) <= fp8_tolerance(torch.bfloat16, shape[2])


@pytest.mark.skipif(ON_GPU and not ON_HOPPER, reason="another GPU refuses the rung as a whole (require_sm90)")
def test_the_gluon_rung_says_what_it_does_not_take():
    a, b, sa, sb = operands(8, 16, 128, "row")
    with pytest.raises(
        ValueError, match="fp8_tma" + (": C in bfloat16 or float16" if ON_HOPPER else "' runs on a CUDA GPU")
    ):
        scaled_mm(a, b, sa, sb, kernel="fp8_tma", out_dtype=torch.float32)


@pytest.mark.skipif(not ON_GPU, reason="scales on another device need a GPU")
def test_scales_on_another_device_are_refused():
    a, b, sa, sb = operands(8, 16, 128, "row")
    with pytest.raises(ValueError, match="expected scale_a on cuda"):
        scaled_mm(a, b, sa.cpu(), sb)


@pytest.mark.parametrize("recipe, swap", [("tensor", False), ("row", False), ("block", False), ("row", True),
                                          ("block", True)])  # fmt: skip
def test_the_scaled_gemm_compiles_to_fp8_wgmma_for_sm90(recipe, swap):
    """Checked on the CPU, since Triton compiles for sm_90 without a GPU: each recipe's kernel is
    Hopper's fp8 tensor-core MMA (e4m3 x e4m3 into fp32), its block scales included; the swapped
    tile (fp8_swap_ab) is 64 weight rows by 16 tokens, WGMMA's narrow n16."""
    from test_codegen import compile_call_ptx

    from tritongemm.core.epilogue import PLAIN

    M, N, K = (16 if swap else 4096), 4096, 4096
    scales = {"tensor": ((0, 0), (0, 0)), "row": ((1, 0), (1, 0)), "block": ((K // 128, 1), (K // 128, 1))}[recipe]
    tensor = lambda dtype: ["tensor", dtype]  # noqa: E731
    args = [tensor("float8_e4m3fn"), tensor("float8_e4m3fn"), tensor("bfloat16"), tensor("float32"), tensor("float32"),
            M, N, K, K, 1, 1, K, N, 1, *scales[0], *scales[1], 0, 0, 0, 0, 0, 0, 1.0]  # fmt: skip
    tile = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_warps=8)
    if swap:  # block scales step 128 of K at a time, with fp8_swap_ab's default ring for them
        tile = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128 if recipe == "block" else 256, num_warps=4)
    stages = 8 if swap and recipe == "block" else 3
    meta = dict(**tile, GROUP_SIZE_M=8, RECIPE=recipe, SCALE_BLOCK=128, ALIGN=[1] * 9, SWAP_AB=swap, INT64=False,
                ALIGN_T=[1] * 9 if swap else None, num_stages=stages, **PLAIN.constexprs())  # fmt: skip
    ptx = compile_call_ptx("tritongemm.fp8.tl", "_scaled_mm_kernel", args, meta)
    shape = "m64n16" if swap else r"m64n\d+"
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.{shape}k32\.f32\.e4m3\.e4m3", ptx), "expected fp8 WGMMA"


# ----------------------------------------------------------------------------------------------
# Fp8Linear and patch(model, fp8=...)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_fp8_linear_computes_the_quantized_layer(recipe):
    """Against the same quantization in torch and the fp64 scaled product (tight), and against the
    float layer (fp8's own error: e4m3 keeps 3 bits of mantissa)."""
    import tritongemm

    layer = torch.nn.Linear(256, 72, device=DEVICE)
    fp8_layer = tritongemm.nn.Fp8Linear.from_linear(layer, recipe, activation="silu")
    x = rand(2, 5, 256, seed=recipe)
    with torch.no_grad():
        y = fp8_layer(x)
        expected_float = torch.nn.functional.silu(layer(x))
    assert y.shape == (2, 5, 72) and y.dtype == x.dtype
    x_fp8, sx = reference_quantize(x.reshape(10, 256), recipe)
    w = fp8_layer
    expected = reference_scaled_mm(x_fp8, w.weight_fp8.T, sx, w.weight_scale, bias=layer.bias.detach(),
                                   out_dtype=torch.float64, activation="silu")  # fmt: skip
    assert rel_error(y.reshape(10, 72), expected) <= fp8_tolerance(torch.float32, 256)
    assert rel_error(y, expected_float.double()) <= 0.1


def test_fp8_linear_plans_once_per_input_geometry_and_reads_each_calls_tensors():
    """The hot path: a plan per input geometry, shared by layers of one shape, each call with its
    own input, weights and bias; a new layout, or a bad dtype, gets a plan (or a refusal) of its own."""
    import tritongemm
    from tritongemm.core.plans import PLANS

    layers = [torch.nn.Linear(128, 40, device=DEVICE) for _ in range(2)]
    fp8_layers = [tritongemm.nn.Fp8Linear.from_linear(layer, "row") for layer in layers]

    def expected(fp8_layer, x):
        x_fp8, sx = reference_quantize(x.reshape(-1, 128), "row")
        return reference_scaled_mm(x_fp8, fp8_layer.weight_fp8.T, sx, fp8_layer.weight_scale,
                                   bias=fp8_layer.bias, out_dtype=torch.float64)  # fmt: skip

    inputs = [
        rand(6, 128, seed=1),
        rand(6, 128, seed=2),
        rand(2, 3, 128, seed=3),
        rand(3, 2, 128, seed=4).transpose(0, 1),
    ]
    with torch.no_grad():
        before = PLANS.misses
        for x in inputs:
            for fp8_layer in fp8_layers:
                y = fp8_layer(x)
                assert y.shape == (*x.shape[:-1], 40)
                assert rel_error(y.reshape(-1, 40), expected(fp8_layer, x)) <= fp8_tolerance(torch.float32, 128)
        assert PLANS.misses - before <= 3  # a plan per input geometry (2-D, 3-D, a 3-D transposed view)
        with pytest.raises(TypeError, match="expected x of dtype bfloat16, float16 or float32, but got torch.int32"):
            fp8_layers[0](torch.ones(6, 128, dtype=torch.int32, device=DEVICE))


def test_fp8_linear_is_inference_only():
    import tritongemm

    fp8_layer = tritongemm.nn.Fp8Linear.from_linear(torch.nn.Linear(128, 16, device=DEVICE))
    with pytest.raises(RuntimeError, match="inference only .* under torch.no_grad"):
        fp8_layer(rand(3, 128).requires_grad_())
    assert not fp8_layer(rand(3, 128)).requires_grad  # an input without grad: fine as it is


def test_patch_with_fp8_replaces_what_the_recipe_takes_and_says_why_not_the_rest():
    import tritongemm

    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.GELU(), torch.nn.Linear(128, 100),
                                torch.nn.Linear(100, 8)).to(DEVICE)  # fmt: skip
    x = rand(4, 256)
    with torch.no_grad():
        expected = model(x)
        tritongemm.patch(model, fp8="block")
        got = model(x)
    report = model.tritongemm_patch_report
    assert report.replaced == ["0", "2"] and "multiple of 128" in report.skipped["3"]
    assert isinstance(model[0], tritongemm.nn.Fp8Linear) and type(model[3]) is torch.nn.Linear
    assert rel_error(got, expected.double()) <= 0.1
    with pytest.raises(ValueError, match="expected fp8 to be None or one of"):
        tritongemm.patch(model, fp8="int4")


class _Attention(torch.nn.Module):
    """The projections that transformers' attention and gated MLP call on one input."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(256, n, bias=False) for n in (128, 64, 64))
        self.gate_proj, self.up_proj = torch.nn.Linear(256, 96), torch.nn.Linear(256, 96)

    def forward(self, x):  # the MLP pair's only: the projections' group is dropped by the hook alone
        return self.gate_proj(x)


def test_layers_of_one_input_share_its_quantization(monkeypatch):
    """q, k and v (and gate and up) called on one input quantize it once, and compute what each
    would alone; an input modified in place since, another input, a second call of one layer, a
    call after the parent module's forward, or an inference tensor is quantized afresh."""
    import tritongemm
    from tritongemm.fp8 import linear

    module = _Attention().to(DEVICE)
    tritongemm.patch(module, fp8="row")
    assert module.tritongemm_patch_report.shared_quantization == ["q_proj, k_proj, v_proj", "gate_proj, up_proj"]
    alone = {name: tritongemm.nn.Fp8Linear(layer.weight_fp8, layer.weight_scale, layer.bias, "row")
             for name, layer in module.named_children()}  # fmt: skip
    x = rand(3, 5, 256, seed="shared")
    with torch.no_grad():
        expected = {name: layer(x) for name, layer in alone.items()}
        expected_k = alone["k_proj"](x + 1.0)
    calls, quantize = [], linear.quantize_fp8
    monkeypatch.setattr(linear, "quantize_fp8", lambda *args, **kw: calls.append(args) or quantize(*args, **kw))
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            assert torch.equal(getattr(module, name)(x), expected[name]), name
        assert len(calls) == 2  # one per group
        module.q_proj(x)
        x.add_(1.0)  # in place: a new version
        assert torch.equal(module.k_proj(x), expected_k)
        module.v_proj(x)  # the kept quantization is k's input's: v takes it
        module.v_proj(x)  # taken already: afresh
        module.gate_proj(rand(3, 5, 256, seed="other"))
        module.up_proj(x)
        assert len(calls) == 2 + 5
        z = rand(3, 5, 256, seed="z")
        module.k_proj(z)  # kept for q and v ...
        module(rand(3, 5, 256, seed="forward"))  # ... until the parent's forward ends
        module.v_proj(z)
        assert len(calls) == 7 + 3
    with torch.inference_mode():  # no version counter to see an in-place change by: nothing kept
        y = rand(3, 5, 256, seed="inference")
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(module, name)(y)
    assert len(calls) == 10 + 3
    assert module.q_proj.shared._kept.input is z  # v's, from before: the inference tensor's was not kept


# ----------------------------------------------------------------------------------------------
# Fuzzing: random problems, each kernel, against the reference
# ----------------------------------------------------------------------------------------------

FUZZ_KERNELS = ("fp8_grouped", "fp8_swap_ab") + (("fp8_tma", "fp8_ws", "fp8_block", "fp8_odd_width") if ON_HOPPER
                                                  else ())  # fmt: skip
FUZZ_MAX_DIM = 700 if ON_GPU else 96  # the interpreter runs ~200 tile steps a second


@pytest.mark.parametrize("kernel", FUZZ_KERNELS)
def test_fuzz(kernel):
    """Random M, N, K (a multiple of 128 under block scales; of 16 for the Gluon rung, whose
    operands TMA reads), recipe, fp8 formats, output dtype and epilogue: the result matches the
    fp64 reference, and the operands and scales are left as they were. FUZZ_EXAMPLES (the
    tritongemm fuzz suite's knob) sets the number of cases."""
    import os

    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    examples = int(os.environ.get("FUZZ_EXAMPLES", 30 if not ON_GPU else 300))
    tma = kernel in ("fp8_tma", "fp8_ws", "fp8_block", "fp8_odd_width")

    @st.composite
    def problems(draw):
        recipes = {"fp8_block": ["tensor", "block"], "fp8_ws": ["tensor", "row"], "fp8_odd_width": ["tensor", "row"]}
        recipe = draw(st.sampled_from(recipes.get(kernel, ["tensor", "row", "block"])))
        dim = st.integers(1, FUZZ_MAX_DIM)
        M, N = draw(dim), draw(dim) if not tma else 8 * draw(st.integers(1, FUZZ_MAX_DIM // 8))
        step = 128 if recipe == "block" or kernel == "fp8_block" else 16 if tma else 1
        K = step * draw(st.integers(1, max(1, FUZZ_MAX_DIM // step)))
        formats = [E4M3, E5M2]
        a_dtype = draw(st.sampled_from(formats))
        b_dtype = a_dtype if tma else draw(st.sampled_from(formats))
        outs = [torch.bfloat16, torch.float16] if tma else [torch.bfloat16, torch.float16, torch.float32]
        epilogue = dict(
            activation=draw(st.sampled_from([None, "gelu", "silu"])), alpha=draw(st.sampled_from([1.0, -0.5]))
        )
        return recipe, M, N, K, a_dtype, b_dtype, draw(st.sampled_from(outs)), draw(st.booleans()), epilogue

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(problem=problems())
    def run(problem):
        recipe, M, N, K, a_dtype, b_dtype, out_dtype, with_bias, epilogue = problem
        a, b, sa, sb = operands(M, N, K, recipe, a_dtype, b_dtype, seed=repr(problem))
        bias = rand(N, seed="fuzz-bias") if with_bias else None
        before = [t.clone() for t in (a, b, sa, sb)]
        y = scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype, kernel=kernel, **epilogue)
        expected = reference_scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float64, **epilogue)
        err, bound = rel_error(y, expected), fp8_tolerance(out_dtype, K)
        assert err <= bound, f"{kernel} {problem}: relative error {err:.3e} > {bound:.3e}"
        assert all(same_values(t, u) if t.dtype in (E4M3, E5M2) else torch.equal(t, u)
                   for t, u in zip((a, b, sa, sb), before))  # fmt: skip

    hypothesis_seed(zlib.crc32(kernel.encode()))(run)()
