"""Rung 13, odd widths (ladder/odd_width.py): which widths it takes and which tile it picks (CPU),
and the two-part tile against the fp64 reference in every layout, with the fused epilogue and run
to run bit for bit (GPU, sm_90). Its compile for sm_90 is in test_gluon_compile.py."""

import pytest
import torch
from cases import DEVICE, ON_HOPPER

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import reference_linear
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.ladder import odd_width
from tritongemm.primitives.gluon.pipeline import _SMEM_SLACK_BYTES, H100_SHARED_MEMORY_BYTES


def test_an_odd_width_is_a_power_of_two_and_a_smaller_one_beside_it():
    assert [MatmulConfig(BLOCK_N=n).odd_width for n in (96, 160, 192, 320, 144)] == [True] * 5
    assert [MatmulConfig(BLOCK_N=n).odd_width for n in (64, 128, 256)] == [False] * 3
    assert odd_width.split_width(160) == (128, 32) and odd_width.split_width(192) == (128, 64)
    assert odd_width.split_width(96) == (64, 32)


@pytest.mark.parametrize("n", (100, 176, 40))
def test_other_widths_are_refused_by_the_config(n):
    with pytest.raises(ValueError, match=f"BLOCK_N={n}"):
        MatmulConfig(BLOCK_N=n)


@pytest.mark.parametrize("n", (48, 640, 768))
def test_odd_widths_the_kernel_cannot_split_are_refused_naming_the_width(n):
    with pytest.raises(ValueError, match=f"odd_width: BLOCK_N must be .* but got BLOCK_N={n}"):
        odd_width.split_width(n)


def test_other_kernels_refuse_an_odd_width_before_any_launch():
    a = torch.randn(40, 32, device=DEVICE, dtype=torch.float16)
    b = torch.randn(32, 48, device=DEVICE, dtype=torch.float16)
    kernel = "tma_persistent_pipelined" if ON_HOPPER else "grouped"
    with pytest.raises(ValueError, match=f"kernel '{kernel}' takes tiles whose BLOCK_N is a power of two.*BLOCK_N=160"):
        tritongemm.matmul(a, b, kernel=kernel, config=MatmulConfig(BLOCK_N=160))


def test_its_tiles_fit_the_shared_memory_with_their_rings():
    for config in odd_width.TILES:
        odd_width.check_config(config, 2)
        assert odd_width.smem_bytes(config, 2) <= H100_SHARED_MEMORY_BYTES - _SMEM_SLACK_BYTES
        with pytest.raises(ValueError, match="shared memory"):
            odd_width.check_config(config.with_(num_stages=config.num_stages + 1), 2)


def test_the_tile_is_the_one_that_fills_the_waves():
    # One GPU's q,k,v chunk of a four-GPU step at 2048 tokens: 512 x 2560 in 64 x 160 tiles is 128
    # of them, one wave of 132 SMs 97% full (rung 6's 64 x 128: 160 tiles, 1.2 waves in two).
    config = odd_width.default_config(512, 2560, 8192, 132, b_k_major=True)
    assert (config.BLOCK_M, config.BLOCK_N) == (64, 160)
    assert odd_width.wave_fill(config, 512, 2560, 132) == pytest.approx(128 / 132)
    assert odd_width.default_config(2048, 1536, 4096, 132, b_k_major=True).BLOCK_N == 192  # 256 tiles: two waves


def test_with_b_row_major_the_tail_is_64_columns_at_least():
    for M, N in [(512, 2560), (2048, 1536), (1000, 1000)]:
        assert odd_width.default_config(M, N, 4096, 132, b_k_major=False).BLOCK_N == 192


def _pays(M, N, K, b_k_major=True):
    from tritongemm.dispatch.tiles import persistent_pipelined_config

    return odd_width.pays(M, N, K, 132, persistent_pipelined_config(M, N, K, 132), b_k_major)


def test_auto_takes_it_where_it_was_measured_ahead_and_not_where_it_was_behind():
    for b_k_major in (True, False):
        assert _pays(512, 2560, 8192, b_k_major) and _pays(1024, 2560, 8192, b_k_major)
        assert _pays(2048, 1536, 4096, b_k_major)
        for M, N, K in [(2048, 2560, 8192), (4096, 2560, 8192), (1000, 1000, 1000), (777, 4096, 4096),
                        (8192, 8192, 8192), (512, 2560, 1024), (1024, 7168, 8192), (512, 14336, 8192)]:  # fmt: skip
            assert not _pays(M, N, K, b_k_major), (M, N, K, b_k_major)
    assert _pays(512, 1536, 4096, b_k_major=False)  # 64 tiles of 64 x 192: 0.96x cuBLAS where rung 6 had 0.78x


def test_auto_passes_the_tile_of_b_s_layout():
    from tritongemm import dispatch

    def operands(layout):  # meta tensors: the rule reads shapes and strides only
        a = torch.empty(512, 8192, dtype=torch.bfloat16, device="meta")
        b = torch.empty(2560, 8192, dtype=torch.bfloat16, device="meta").T
        if layout[0] == "t":
            a = torch.empty(8192, 512, dtype=torch.bfloat16, device="meta").T
        if layout[1] == "n":
            b = torch.empty(8192, 2560, dtype=torch.bfloat16, device="meta")
        return a, b

    assert dispatch._odd_width_tile(*operands("nt"), 132).BLOCK_N == 160
    assert dispatch._odd_width_tile(*operands("nn"), 132).BLOCK_N == 192  # a 32-column tail lost there
    for layout in ("tn", "tt"):  # A M-major: not measured
        assert dispatch._odd_width_tile(*operands(layout), 132) is None, layout
    assert dispatch._odd_width_tile(*operands("nt"), None) is None  # no GPU
    from tritongemm.core import device_info

    with device_info.sparing_sms(1):  # the tensor-parallel ops' chunk GEMMs share the GPU
        assert dispatch._odd_width_tile(*operands("nt"), 131) is None


def test_a_config_given_with_auto_keeps_rung_6_s_rules(monkeypatch):
    from tritongemm import dispatch
    from tritongemm.core.config import MatmulConfig

    monkeypatch.setattr(dispatch, "_sm_count", lambda device: 132)  # as on an H100, for meta tensors
    a = torch.empty(512, 8192, dtype=torch.bfloat16, device="meta")
    b = torch.empty(2560, 8192, dtype=torch.bfloat16, device="meta").T
    assert dispatch._rules_order(a, b)[0] == dispatch.AUTO_ORDER_ODD_WIDTH
    assert dispatch._rules_order(a, b, MatmulConfig())[0] == dispatch.AUTO_ORDER  # its tile is rung 6's


gpu = pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA and WGMMA")
# (M, N, K, programs): whole waves; a last tile whose tail is cut by N (2552 = 15 x 160 + 152, or
# 13 x 192 + 56 where the tail lies wholly past N); C narrower than the main part (N = 104); K not
# a multiple of 64; one row; several tiles a program. C's rows are whole 16-byte units, as TMA
# needs (matmul copies others: the layout test).
SHAPES = [(2048, 2560, 1024, None), (300, 2552, 712, 5), (777, 104, 256, None), (1, 352, 64, None),
          (129, 200, 1000, 3)]  # fmt: skip


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("M, N, K, programs", SHAPES)
@pytest.mark.parametrize("config", odd_width.TILES, ids=lambda c: c.short())
def test_odd_width_matches_the_reference_bit_for_bit_every_run(M, N, K, programs, config, dtype):
    a = torch.randn(M, K, device=DEVICE, dtype=dtype)
    b = torch.randn(N, K, device=DEVICE, dtype=dtype).T  # an nn.Linear weight's view
    c = torch.full((M, N), float("nan"), device=DEVICE, dtype=dtype)
    launch = odd_width.plan(a, b, c, config, num_programs=programs)
    launch(a, b, c)
    assert rel_error(c, reference_matmul(a, b)) <= tolerance(dtype, K)
    first = c.clone()
    c.fill_(float("nan"))
    launch(a, b, c)
    assert torch.equal(c, first)


@gpu
@pytest.mark.parametrize("layout", ("nn", "tn", "tt"))
def test_odd_width_reads_either_operand_transposed(layout):
    M, N, K = 1000, 2550, 712
    a = torch.randn(K, M, device=DEVICE, dtype=torch.bfloat16).T if layout[0] == "t" else None
    a = a if a is not None else torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(N, K, device=DEVICE, dtype=torch.bfloat16).T if layout[1] == "t" else None
    b = b if b is not None else torch.randn(K, N, device=DEVICE, dtype=torch.bfloat16)
    for config in odd_width.TILES:
        c = tritongemm.matmul(a, b, kernel="odd_width", config=config)
        assert rel_error(c, reference_matmul(a, b)) <= tolerance(torch.bfloat16, K), config.short()


@gpu
def test_odd_width_takes_the_fused_epilogue_in_both_parts():
    x = torch.randn(2, 1000, 1024, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(2550, 1024, device=DEVICE, dtype=torch.bfloat16) * 1024**-0.5
    bias = torch.randn(2550, device=DEVICE, dtype=torch.bfloat16)
    residual = torch.randn(2, 1000, 2550, device=DEVICE).to(torch.bfloat16)
    y = tritongemm.linear(x, w, bias, activation="gelu", residual=residual, alpha=0.5, kernel="odd_width")
    assert rel_error(y, reference_linear(x, w, bias, "gelu", residual, 0.5)) <= tolerance(torch.bfloat16, 1024)
    y = tritongemm.linear(x, w, bias, activation="silu", kernel="odd_width")
    assert rel_error(y, reference_linear(x, w, bias, "silu")) <= tolerance(torch.bfloat16, 1024)
