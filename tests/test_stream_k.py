"""Rung 10, stream-K (ladder/stream_k.py): the partition of K-steps and the fix-up's slots as pure
functions (CPU), then the kernels against the fp64 reference for many program counts, with the
fused epilogue, and their results bit for bit equal run to run (interpreter; GPU dtypes on a GPU)."""

import itertools

import pytest
import torch
from cases import DEVICE, DTYPES, ON_GPU, Case, fused_linear_error, make_operands

from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.ladder import stream_k

TILE = MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_SIZE_M=2, num_warps=4, num_stages=1)
if ON_GPU:
    TILE = MatmulConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_SIZE_M=2, num_warps=4, num_stages=3)
# (tiles, steps, programs), with no more programs than K-steps, as plan() launches them
PARTITIONS = [
    (t, s, p) for t, s, p in itertools.product((1, 2, 5, 7, 12), (1, 3, 4, 10), (1, 2, 3, 7, 13, 50)) if p <= t * s
]


@pytest.mark.parametrize("tiles, steps, programs", PARTITIONS)
def test_every_k_step_of_every_tile_is_computed_once_and_the_work_is_even(tiles, steps, programs):
    pieces = stream_k.segments(tiles, steps, programs)
    covered = [(p.tile, k) for p in pieces for k in range(p.k_first, p.k_last)]
    assert covered == [(t, k) for t in range(tiles) for k in range(steps)]  # in order, once each
    work = [sum(p.k_last - p.k_first for p in pieces if p.program == q) for q in range(programs)]
    assert max(work) - min(work) <= 1


@pytest.mark.parametrize("tiles, steps, programs", PARTITIONS)
def test_split_tiles_and_their_slots_are_what_the_fixup_reads(tiles, steps, programs):
    pieces = stream_k.segments(tiles, steps, programs)
    slots = [p.slot for p in pieces if p.slot is not None]
    assert len(slots) == len(set(slots)) and all(s // 2 < programs for s in slots)  # no slot written twice
    split = stream_k.split_tiles(tiles, steps, programs)
    assert split == sorted({p.tile for p in pieces if p.slot is not None})
    total = tiles * steps
    for tile in split:  # the fix-up kernel's rule: programs in order, slot 0 where their range begins here
        first = tile * steps
        owners = [q for q in range(programs) if q * total // programs <= first + steps - 1 < total]
        p_first = -(-(first + 1) * programs // total) - 1
        p_last = -(-(first + steps) * programs // total) - 1
        expected = [p.slot for p in pieces if p.tile == tile]
        rule = [2 * q + (0 if q * total // programs >= first else 1) for q in range(p_first, p_last + 1)]
        assert rule == expected and p_last in owners


def test_a_half_empty_last_wave_is_balanced():
    # 777 x 4096 x 4096 in 128 x 128 tiles on 132 SMs: 224 tiles of 64 K-steps, 108 or 109 steps each.
    pieces = stream_k.segments(224, 64, 132)
    assert {sum(p.k_last - p.k_first for p in pieces if p.program == q) for q in range(132)} == {108, 109}


@pytest.mark.parametrize("programs", (1, 3, 4, 7, 13))
@pytest.mark.parametrize("M, N, K", [(33, 47, 70), (50, 20, 200), (1, 64, 33), (64, 64, 64)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_stream_k_matches_the_reference(M, N, K, dtype, programs):
    a, b = make_operands(Case(M, N, K, "nt"), dtype, f"stream_k {programs}")
    c = torch.full((M, N), float("nan"), dtype=dtype, device=DEVICE)
    stream_k.plan(a, b, c, TILE, num_sms=programs)(a, b, c)
    assert rel_error(c, reference_matmul(a, b)) <= tolerance(dtype, K)


@pytest.mark.parametrize("programs", (2, 5))
def test_the_epilogue_is_applied_once_to_whole_and_split_tiles(programs, monkeypatch):
    monkeypatch.setattr(stream_k._host, "sm_count", lambda device: programs)
    err, bound = fused_linear_error("stream_k", TILE, (3, 11), N=40, K=90, activation="gelu", alpha=2.0, seed=5)
    assert err <= bound


def test_the_same_bits_every_run():
    a, b = make_operands(Case(40, 50, 300), torch.float32)
    c = torch.empty(40, 50, device=DEVICE)
    launch = stream_k.plan(a, b, c, TILE, num_sms=7)
    launch(a, b, c)
    first = c.clone()
    for _ in range(3):
        launch(a, b, c)
        assert torch.equal(c, first)


def test_it_stays_out_of_auto_until_measured():
    from tritongemm.bench.measure import runnable_kernels
    from tritongemm.core import registry

    assert registry.get("stream_k").experimental
    assert "stream_k" not in runnable_kernels(torch.float32, "cpu")
