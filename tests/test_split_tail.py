"""Rung 12, the split tail (ladder/split_tail.py): where C's rows are cut (CPU), and the two parts
against the fp64 reference, with the fused epilogue and run to run bit for bit (GPU, sm_90)."""

import itertools

import pytest
import torch
from cases import DEVICE, ON_HOPPER

import tritongemm
from tritongemm.core.epilogue import reference_linear
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.dispatch.tiles import MID_TILE, SMALL_TILE, TILES
from tritongemm.ladder import split_k, split_tail


def test_the_rows_past_whole_waves_are_split_in_two_where_they_are_less_than_half_a_wave():
    # One GPU's share of Llama-3-70B's q,k,v over four GPUs at 8192 tokens: 320 tiles of 128 x 128,
    # 2.4 waves; 13 tile rows (260 tiles) make two, the 3 left (60 tiles) split in two.
    assert split_tail.split_rows(2048, 2560, 8192, MID_TILE.with_(num_stages=6), 132) == (1664, 2)
    # 512 rows in 64 x 128 tiles: 160 tiles, one wave of 6 tile rows, 40 tiles left, split in three.
    assert split_tail.split_rows(512, 2560, 8192, SMALL_TILE.with_(num_stages=8), 132) == (384, 3)


def test_where_splitting_does_not_pay_the_whole_problem_is_the_head():
    assert split_tail.split_rows(4096, 2560, 8192, MID_TILE, 132) == (4096, 1)  # 120 tiles left: most of a wave
    assert split_tail.split_rows(128 * 132, 128, 4096, MID_TILE, 132) == (128 * 132, 1)  # whole waves
    assert split_tail.split_rows(300, 256, 128, MID_TILE, 4) == (300, 1)  # 2 K-steps: no two splits of 4


def test_fewer_tiles_than_half_the_sms_are_split_along_k_alone():
    head_rows, S = split_tail.split_rows(256, 256, 4096, MID_TILE, 132)  # 4 tiles, 64 K-steps
    assert head_rows == 0 and S == 16  # each split at least 4 steps (rung 7's ring)


@pytest.mark.parametrize("config", TILES, ids=lambda c: c.short())
def test_the_head_is_as_many_tile_rows_as_whole_waves_hold_and_the_split_tail_one_wave(config):
    for M, N, K, sms in itertools.product((1, 100, 777, 2048, 5000), (64, 2560, 14336), (256, 4096), (4, 131, 132)):
        head_rows, S = split_tail.split_rows(M, N, K, config, sms)
        if S == 1:
            assert head_rows == M
            continue
        tiles_n = -(-N // config.BLOCK_N)
        whole_waves = config.num_tiles(M, N) // sms * sms
        head_tiles = config.num_tiles(head_rows, N) if head_rows else 0
        assert head_rows % config.BLOCK_M == 0 and head_tiles <= whole_waves < head_tiles + tiles_n
        tail_tiles = config.num_tiles(M - head_rows, N)
        assert 2 * tail_tiles <= sms and tail_tiles * S <= sms  # the tail's splits make one wave
        tail = split_tail.tail_config(config).with_(split_k=S)
        assert S == split_k.ring_split_plan(M - head_rows, N, K, tail, sms)[0]


def test_the_tail_keeps_the_head_s_tile_and_the_ring_slots_that_fit():
    for config in TILES:
        tail = split_tail.tail_config(config)
        assert (tail.BLOCK_M, tail.BLOCK_N, tail.BLOCK_K) == (config.BLOCK_M, config.BLOCK_N, config.BLOCK_K)
        assert 2 <= tail.num_stages <= config.num_stages


def test_a_part_s_rows_come_from_the_data_pointer_of_whatever_tensor_is_given():
    # linear's fast path gives a (batch, seq, K) activation for the plan's (M, K) operand
    x = torch.arange(2 * 6 * 4, dtype=torch.float32).reshape(2, 6, 4)
    rows = split_tail._Rows(x.reshape(12, 4), 5, 12)
    assert torch.equal(rows(x), x.reshape(12, 4)[5:]) and rows(None) is None
    a = torch.arange(4 * 12, dtype=torch.float32).reshape(4, 12).T  # an M-major (12, 4) A
    assert torch.equal(split_tail._Rows(a, 5, 12)(a), a[5:])
    assert split_tail._Rows(None, 0, 3)(x) is None  # no such operand in the plan: none passed on


def test_auto_takes_it_where_it_was_measured_ahead_and_not_where_it_was_behind():
    from tritongemm.dispatch.tiles import persistent_pipelined_config

    def pays(M, N, K):
        return split_tail.pays(M, N, K, 132, persistent_pipelined_config(M, N, K, 132))

    for M, N, K in [(1280, 4096, 8192), (1536, 3072, 4096), (1792, 2560, 8192), (2048, 2560, 4096),
                    (3328, 1536, 8192), (2048, 2560, 8192)]:  # fmt: skip
        assert pays(M, N, K), (M, N, K)
    for M, N, K in [(768, 6144, 4096), (768, 1536, 4096), (256, 2560, 8192), (4096, 2560, 8192), (8192, 8192, 8192),
                    (2048, 2560, 1024), (8192, 14336, 4096)]:  # fmt: skip
        assert not pays(M, N, K), (M, N, K)


def test_auto_leaves_it_out_beside_other_streams_kernels_and_for_an_m_major_a():
    from tritongemm import dispatch
    from tritongemm.core import device_info

    a = torch.empty(2048, 8192, dtype=torch.bfloat16, device="meta")  # meta: shapes and strides only
    b = torch.empty(2560, 8192, dtype=torch.bfloat16, device="meta").T
    assert dispatch._split_tail_pays(a, b, 132)
    assert not dispatch._split_tail_pays(torch.empty(8192, 2048, dtype=torch.bfloat16, device="meta").T, b, 132)
    assert not dispatch._split_tail_pays(a, b, None)  # no GPU
    with device_info.sparing_sms(1):  # the tensor-parallel ops' chunk GEMMs share the GPU
        assert not dispatch._split_tail_pays(a, b, 131)


gpu = pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA and WGMMA")
# (M, N, K, SM count to fill): a head and a split tail (the last with a partial tile row and K
# not a multiple of 64, rows TMA reads in place); the tail alone (head empty); no split.
SHAPES = [
    (300, 256, 1024, 4),
    (2048, 2560, 1024, None),
    (777, 520, 712, 32),
    (100, 256, 4096, None),
    (64, 64, 64, None),
]


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("M, N, K, sms", SHAPES)
def test_split_tail_matches_the_reference_bit_for_bit_every_run(M, N, K, sms, dtype):
    a = torch.randn(M, K, device=DEVICE, dtype=dtype)
    b = torch.randn(N, K, device=DEVICE, dtype=dtype).T  # an nn.Linear weight's view
    c = torch.full((M, N), float("nan"), device=DEVICE, dtype=dtype)
    launch = split_tail.plan(a, b, c, MID_TILE, num_sms=sms)
    launch(a, b, c)
    assert rel_error(c, reference_matmul(a, b)) <= tolerance(dtype, K)
    first = c.clone()
    for _ in range(2):
        c.fill_(float("nan"))
        launch(a, b, c)
        assert torch.equal(c, first)  # a fixed order, no atomics


@gpu
def test_split_tail_through_matmul_with_a_transposed_a():
    a = torch.randn(1024, 2048, device=DEVICE, dtype=torch.bfloat16).T  # (M, K) = (2048, 1024), M-major
    b = torch.randn(1024, 2560, device=DEVICE, dtype=torch.bfloat16)
    c = tritongemm.matmul(a, b, kernel="split_tail")
    assert rel_error(c, reference_matmul(a, b)) <= tolerance(torch.bfloat16, 1024)


@gpu
def test_split_tail_takes_the_fused_epilogue_in_both_parts():
    x = torch.randn(2, 1024, 1024, device=DEVICE, dtype=torch.bfloat16)  # 2048 rows: a head and a split tail
    w = torch.randn(2560, 1024, device=DEVICE, dtype=torch.bfloat16) * 1024**-0.5
    bias, residual = torch.randn(2560, device=DEVICE, dtype=torch.bfloat16), torch.randn(2, 1024, 2560, device=DEVICE)
    residual = residual.to(torch.bfloat16)
    y = tritongemm.linear(x, w, bias, activation="gelu", residual=residual, alpha=0.5, kernel="split_tail")
    assert rel_error(y, reference_linear(x, w, bias, "gelu", residual, 0.5)) <= tolerance(torch.bfloat16, 1024)
