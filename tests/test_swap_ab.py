"""Rung 8, swap-AB (ladder/swap_ab.py): its host logic (CPU), split and unsplit runs against the
fp64 reference with the fused epilogue (interpreter, GPU), and its split runs bit for bit equal
run to run. The generic suites (test_matmul, test_linear, the fuzzer) run it as a ladder kernel."""

import pytest
import torch
from cases import DTYPES, ON_GPU, Case, check_matmul, fused_linear_error, make_operands

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.ladder import swap_ab
from tritongemm.primitives.tl import host as _host
from tritongemm.primitives.tl import split as _split

# CPU: tiles small enough for the interpreter; split_k 0 lets the plan split for its 4 "SMs".
CPU_TILE = MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=1)
TILES = (CPU_TILE, CPU_TILE.with_(split_k=3)) if not ON_GPU else (
    None, MatmulConfig(16, 64, 128, 1, 4, 4), MatmulConfig(32, 128, 64, 1, 4, 3, split_k=4),
)  # fmt: skip
SKINNY = [(1, 100, 300), (5, 64, 64), (17, 33, 129), (3, 130, 1000), (40, 7, 50), (16, 96, 8)]


def test_the_transposed_hints_swap_the_operands_and_keep_k_s_own():
    align = _host.alignment_hints(torch.empty(6, 12)[:, :10], torch.empty(10, 24), torch.empty(6, 24))
    M, N, K, am, ak, bk, bn, cm, cn = align
    assert swap_ab.transposed_alignment(align, 10) == (N, M, 2, bn, bk, ak, am, cn, cm)
    assert swap_ab.transposed_alignment(align, 4096)[2] == 8  # a split's K is no launch argument Triton sees


def test_a_long_k_against_few_tiles_is_split_to_fill_the_sms():
    cuda = torch.device("cuda")
    config = swap_ab.default_config(torch.bfloat16, 1, 4096, 14336, cuda)  # Llama-3-8B's down projection
    S, k_per_split = _split.split_plan(1, 4096, 14336, config, num_sms=132)
    assert config.BLOCK_M == 16 and config.num_tiles(1, 4096) * S >= 100
    assert k_per_split % config.BLOCK_K == 0 and (S - 1) * k_per_split < 14336 <= S * k_per_split
    square = swap_ab.default_config(torch.bfloat16, 1, 4096, 4096, cuda)  # measured faster whole (the probe)
    assert _split.split_plan(1, 4096, 4096, square, num_sms=132)[0] == 1


@pytest.mark.parametrize("config", TILES, ids=str)
@pytest.mark.parametrize("M, N, K", SKINNY)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swap_ab_matches_the_reference(M, N, K, dtype, config):
    check_matmul(Case(M, N, K, "nt", config), "swap_ab", dtype)


@pytest.mark.parametrize("config", TILES, ids=str)
@pytest.mark.parametrize("layout", ("nn", "tt", "offset"))
def test_swap_ab_reads_any_layout(layout, config):
    check_matmul(Case(9, 70, 130, layout, config), "swap_ab", torch.float32)


@pytest.mark.parametrize("config", TILES, ids=str)
def test_split_or_not_the_fused_epilogue_is_applied_once(config):
    err, bound = fused_linear_error("swap_ab", config, (2, 7), N=90, K=200, activation="silu", alpha=0.5, seed=3)
    assert err <= bound


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_runs_are_the_same_bits_every_time(dtype):
    config = CPU_TILE.with_(split_k=3) if not ON_GPU else MatmulConfig(16, 64, 128, 1, 4, 4, split_k=8)
    a, b = make_operands(Case(3, 96, 1200, "nt"), dtype)
    first = tritongemm.matmul(a, b, kernel="swap_ab", config=config)
    for _ in range(3):
        assert torch.equal(tritongemm.matmul(a, b, kernel="swap_ab", config=config), first)
