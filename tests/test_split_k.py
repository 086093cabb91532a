"""Split-K: how K is partitioned (primitives/tl/split.py and rung 7's ring, CPU), the fixed-order
reduction with the fused epilogue (CPU, interpreter), and rung 7 (ladder/split_k.py) against the
fp64 reference, run to run bit for bit (GPU, sm_90). Rung 8's use of them: test_swap_ab.py."""

import itertools

import pytest
import torch
from cases import DEVICE, ON_GPU, ON_HOPPER

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Epilogue, reference_linear
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.dispatch.tiles import SMALL_TILE, TILES
from tritongemm.ladder import split_k
from tritongemm.primitives.tl import split as _split


@pytest.mark.parametrize("config", TILES, ids=MatmulConfig.short)
def test_every_k_step_belongs_to_one_split(config):
    for M, N, K in itertools.product((1, 16, 200, 4096), (64, 4096, 14336), (16, 64, 700, 4096, 14336)):
        S, k_per_split = split_k.ring_split_plan(M, N, K, config, num_sms=132)
        steps = -(-K // config.BLOCK_K)
        assert k_per_split % config.BLOCK_K == 0 and S >= 1
        assert (S - 1) * k_per_split < K <= S * k_per_split, (M, N, K)  # no split is empty, none is missing
        if S > 1:  # the ring's prologue stays inside a split (split_k's kernel comment)
            assert k_per_split // config.BLOCK_K >= max(_split.MIN_STEPS_PER_SPLIT, config.num_stages - 2)
        assert S <= max(1, 132 // config.num_tiles(M, N)) and S <= steps


def test_few_tiles_and_a_long_k_fill_the_sms():
    S, _ = split_k.ring_split_plan(16, 4096, 4096, SMALL_TILE, num_sms=132)  # 32 tiles of 64 x 128
    assert S * SMALL_TILE.num_tiles(16, 4096) >= 100
    assert split_k.ring_split_plan(8192, 8192, 4096, SMALL_TILE, num_sms=132)[0] == 1  # enough tiles already


@pytest.mark.parametrize("split_k", (1, 2, 3, 7, 1000))
def test_a_config_s_split_count_is_kept_where_k_has_the_steps(split_k):
    config = SMALL_TILE.with_(split_k=split_k)
    for K in (64, 700, 4096):
        S, k_per_split = _split.split_plan(8192, 8192, K, config, num_sms=132)  # many tiles: 0 would be 1 split
        steps = -(-K // config.BLOCK_K)
        assert S <= split_k and (S - 1) * k_per_split < K <= S * k_per_split
        if split_k * _split.MIN_STEPS_PER_SPLIT <= steps:
            assert S == split_k or (S < split_k and -(-steps // S) == -(-steps // split_k))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the reduction; the GPU runs the whole rung below")
def test_the_reduction_adds_the_partials_in_order_then_applies_the_epilogue():
    S, M, N = 3, 37, 50
    partials = torch.randn(S, M, N, generator=torch.Generator().manual_seed(1))
    bias, residual = torch.randn(N), torch.randn(M, N)
    c, preact = torch.full((M, N), float("nan")), torch.full((M, N), float("nan"))
    spec = Epilogue("gelu", 0.5, bias=True, residual=True, preact=True)
    meta = dict(BLOCK_M=16, BLOCK_N=32, ALIGN=(1,) * 9, **spec.constexprs())
    epilogue_args = (*spec.pointers(bias, residual, preact), *spec.fixed_args(residual, preact))
    grid = (-(-M // 16) * -(-N // 32),)
    _split._reduce_kernel[grid](partials, c, M, N, *c.stride(), S, *epilogue_args, **meta)
    total = partials[0] + partials[1] + partials[2]  # fp32, in the kernel's order
    z = 0.5 * total + bias
    assert torch.allclose(preact, z, rtol=1e-6, atol=1e-6)
    assert torch.allclose(c, torch.nn.functional.gelu(z) + residual, rtol=1e-5, atol=1e-5)


gpu = pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA and WGMMA")
SHAPES = [(1, 4096, 4096), (16, 4096, 14336), (37, 520, 700), (128, 136, 48), (200, 64, 1000)]


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("M, N, K", SHAPES)
def test_split_k_matches_the_reference_bit_for_bit_every_run(M, N, K, dtype):
    a = torch.randn(M, K, device=DEVICE, dtype=dtype)
    b = torch.randn(N, K, device=DEVICE, dtype=dtype).T  # an nn.Linear weight's view
    first = tritongemm.matmul(a, b, kernel="split_k")
    assert rel_error(first, reference_matmul(a, b)) <= tolerance(dtype, K)
    for _ in range(3):
        assert torch.equal(tritongemm.matmul(a, b, kernel="split_k"), first)  # a fixed order, no atomics


@gpu
def test_split_k_takes_the_fused_epilogue():
    x = torch.randn(4, 16, 2048, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(1024, 2048, device=DEVICE, dtype=torch.bfloat16) * 2048**-0.5
    bias, residual = torch.randn(1024, device=DEVICE, dtype=torch.bfloat16), torch.randn_like(x[..., :1024])
    y = tritongemm.linear(x, w, bias, activation="silu", residual=residual, alpha=0.5, kernel="split_k")
    assert rel_error(y, reference_linear(x, w, bias, "silu", residual, 0.5)) <= tolerance(torch.bfloat16, 2048)
