"""Rung 9, the warp-specialized kernel (ladder/tma_warp_specialized.py): its host side on the CPU
(config checks, shared-memory budget, grid, meta-parameters, registration), and on an sm_90 GPU
matmul and linear against the fp64 reference.

Each GPU case runs in a fresh process with a time limit: a kernel whose partitions wait on each
other forever (a wrong barrier phase) then fails its case instead of hanging the suite.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import triton
from cases import ON_HOPPER, Case, check_matmul, make_operands

from tritongemm import dispatch
from tritongemm.core import device_info, registry
from tritongemm.core.config import MatmulConfig
from tritongemm.dispatch.tiles import (
    BIG_TILE,
    MID_TILE,
    PING_PONG_TILES,
    SMALL_TILE,
    TILES,
    TINY_TILE,
    WARP_SPECIALIZED_BIG_TILE,
    WARP_SPECIALIZED_TILES,
)
from tritongemm.ladder import tma_warp_specialized as ws
from tritongemm.primitives.gluon.pipeline import H100_SHARED_MEMORY_BYTES

KERNEL = "tma_warp_specialized"
PING_PONG = "tma_ping_pong"  # rung 11: the same kernel, two consumers on alternate tiles
TWO_WARPGROUPS = WARP_SPECIALIZED_BIG_TILE  # 128 x 256: two MMA warpgroups, 64 rows each

# ---------------------------------------------------------------------------------------------
# Host side (CPU)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", WARP_SPECIALIZED_TILES, ids=MatmulConfig.short)
def test_defaults_and_the_two_warpgroup_tile_fit(config):
    ws.check_config(config, 2)
    assert ws.smem_bytes(config, 2) <= H100_SHARED_MEMORY_BYTES


def test_smem_counts_the_ring_and_c():
    # 4 x (128 + 128) x 64 x 2 bytes of ring, 128 x 128 x 2 of C
    assert ws.smem_bytes(MID_TILE, 2) == 4 * 32768 + 32768


def test_c_is_staged_in_halves_only_where_a_whole_tile_does_not_fit():
    assert ws.c_pieces(MID_TILE, 2) == 1
    assert ws.c_pieces(BIG_TILE.with_(num_stages=3), 2) == 1  # 3 x 48 KB + 64 KB
    assert ws.c_pieces(BIG_TILE, 2) == 2  # 4 x 48 KB + 64 KB > 227 KB: a 32 KB half-tile buffer
    assert ws.smem_bytes(BIG_TILE, 2) == 4 * 49152 + 32768
    ws.check_config(BIG_TILE, 2)


def test_too_many_buffers_name_the_most_that_fit():
    with pytest.raises(ValueError, match=r"tma_warp_specialized: 128x256x64 g8 w8 s5 needs 278528 .* num_stages <= 4"):
        ws.check_config(BIG_TILE.with_(num_stages=5), 2)


@pytest.mark.parametrize(
    "config, message",
    [
        (MID_TILE.with_(num_stages=1), "num_stages .* must be >= 2"),
        (MID_TILE.with_(num_warps=2), "num_warps must be 4 or 8"),
        (MatmulConfig(32, 128, 64, num_warps=4, num_stages=4), "BLOCK_M must be >= 64"),
        (MatmulConfig(64, 512, 64, num_warps=4, num_stages=2), "BLOCK_N must be <= 256"),
    ],
)
def test_bad_configs_are_refused(config, message):
    with pytest.raises(ValueError, match=f"tma_warp_specialized: .*{message}"):
        ws.check_config(config, 2)


@pytest.fixture
def planned(monkeypatch):
    """plan(...) on CPU tensors, stopped before compiling: returns what it would launch."""
    monkeypatch.setattr(ws, "require_sm90", lambda kernel, device: None)
    monkeypatch.setattr(ws, "mma_for", lambda kernel, device: ws.WGMMA)  # as on the H100
    monkeypatch.setattr(device_info, "sm_count", lambda device: 132)
    monkeypatch.setattr(ws, "planned_launch", lambda kernel, grid, desc, constexprs, c, **epilogue: (grid, constexprs))

    def plan(M, N, K, config, b_k_major=False, **kwargs):
        a = torch.empty(M, K, dtype=torch.float16)
        b = torch.empty(N, K, dtype=torch.float16).T if b_k_major else torch.empty(K, N, dtype=torch.float16)
        return ws.plan(a, b, torch.empty(M, N, dtype=torch.float16), config, **kwargs)

    return plan


@pytest.mark.parametrize(
    "M, N, num_programs, expected",
    [
        (8192, 8192, None, 132),  # 4096 tiles: one program per SM
        (1000, 1504, None, 96),  # 8 x 12 tiles: one program per tile
        (1, 8, None, 1),
        (1000, 1504, 3, 3),  # tests: many tiles per program
    ],
)
def test_grid_is_min_of_tiles_and_sms(planned, M, N, num_programs, expected):
    (grid,), _ = planned(M, N, 64, MID_TILE, num_programs=num_programs)
    assert grid == expected


def test_meta_parameters(planned, monkeypatch):
    config = SMALL_TILE.with_(num_stages=3, scheduler="chunked", GROUP_SIZE_M=1)
    _, meta = planned(1000, 1504, 704, config, b_k_major=True)
    assert meta["NUM_BUFFERS"] == 3 and meta["num_warps"] == 4 and meta["B_K_MAJOR"]
    assert meta["Scheduler"].__name__ == "ChunkedScheduler" and meta["BARRIERS_PER_SLOT"] == 1
    assert meta["LOAD_REGS"] == ws.LOAD_REGISTERS
    monkeypatch.setattr(triton.knobs.compilation, "instrumentation_mode", "consan")
    assert planned(1000, 1504, 704, config)[1]["BARRIERS_PER_SLOT"] == 2  # ConSan: A and B a barrier each


def test_load_register_budget_is_one_setmaxnreg_takes():
    # setmaxnreg takes multiples of 8 in [24, 256]; two MMA warpgroups must keep room for their
    # 128 x 256 fp32 accumulator (128 registers a thread) plus addresses: 232 with 40 here.
    assert 24 <= ws.LOAD_REGISTERS <= 256 and ws.LOAD_REGISTERS % 8 == 0
    assert (65536 - 128 * ws.LOAD_REGISTERS) // (2 * 128) >= 200


def test_registered_as_an_experimental_rung():
    info = registry.get(KERNEL)
    tma = registry.get("tma_persistent_pipelined")
    assert info.rung == 9 and info.experimental and not info.interpretable
    assert info.dtypes == (torch.float16, torch.bfloat16) and not info.any_out_dtype
    # sm_90 with WGMMA; sm_100 and sm_103 with tcgen05 (compiled for, never run: docs/blackwell.md)
    assert info.capability_range() == "sm_90 to sm_103" and not info.available_on(torch.device("cpu"))
    assert info.tma and tma.tma  # TMA's operand rules and aligned copies (core/tma.py), as rung 6's
    for M, N in ((8192, 8192), (1024, 1024), (256, 1024), (1, 1)):
        config = dispatch.default_config(info, torch.float16, M, N, 4096, torch.device("cpu"))
        assert config in WARP_SPECIALIZED_TILES
    # Two MMA warpgroups where the 128 x 256 tiles fill the SMs, one below that.
    assert dispatch.default_config(info, torch.float16, 8192, 8192, 4096, torch.device("cpu")) == TWO_WARPGROUPS
    assert dispatch.default_config(info, torch.float16, 1024, 2048, 4096, torch.device("cpu")) == MID_TILE
    assert dispatch.default_config(info, torch.float16, 256, 1024, 4096, torch.device("cpu")) == TINY_TILE
    assert set(WARP_SPECIALIZED_TILES[1:]) <= set(TILES)


def test_short_k_defaults_take_a_deeper_ring_with_c_in_halves():
    cpu = torch.device("cpu")
    rung9, rung11 = registry.get(KERNEL), registry.get(PING_PONG)
    assert dispatch.default_config(rung9, torch.bfloat16, 8192, 8192, 512, cpu) == BIG_TILE  # 4 slots
    assert dispatch.default_config(rung9, torch.bfloat16, 8192, 8192, 513, cpu) == TWO_WARPGROUPS  # 3 slots
    assert dispatch.default_config(rung9, torch.bfloat16, 256, 1024, 512, cpu) == TINY_TILE  # small tiles as they were
    assert dispatch.default_config(rung11, torch.bfloat16, 8192, 8192, 2048, cpu) == MID_TILE.with_(num_stages=6)
    assert dispatch.default_config(rung11, torch.bfloat16, 8192, 8192, 4096, cpu) == MID_TILE
    assert ws.c_pieces(BIG_TILE, 2) == 2 and ws.c_pieces(MID_TILE.with_(num_stages=6), 2, consumers=2) == 2
    ws.check_config(MID_TILE.with_(num_stages=6), 2, consumers=2)


# ---------------------------------------------------------------------------------------------
# On the GPU, each case in a process of its own
# ---------------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA, WGMMA and setmaxnreg")
# A case compiles (seconds) and runs (milliseconds); past this its partitions are stuck.
CASE_TIMEOUT_S = 120
DTYPES = (torch.float16, torch.bfloat16)

MATMUL_CASES = [
    Case(1000, 1500, 700),  # partial tiles on M, N and K; default config
    Case(65, 129, 67, "nt"),  # one row and column past a tile; B as an nn.Linear weight's view
    Case(1, 256, 200),  # a single row
    Case(300, 500, 16, config=MID_TILE.with_(num_stages=2)),  # one K-step a tile: only the end-of-tile release
    Case(200, 300, 1000, "nt", MID_TILE.with_(num_stages=2)),  # the smallest ring, 16 laps a tile
    Case(1000, 1500, 700, config=TWO_WARPGROUPS),  # two MMA warpgroups, setmaxnreg 232 / 40
    Case(1000, 1500, 700, "nt", BIG_TILE),  # 4 slots: C staged and stored in two halves
    Case(1000, 1500, 700, config=MID_TILE.with_(num_stages=6)),  # ping-pong: two half-tile C buffers
    Case(1000, 1500, 700, "nt", SMALL_TILE.with_(num_stages=3)),
    Case(640, 100, 300, config=MID_TILE.with_(scheduler="chunked", GROUP_SIZE_M=1)),
    Case(1000, 1500, 700, "tn", TWO_WARPGROUPS),  # A M-major (a weight gradient's dY^T), read in place
    Case(1000, 1500, 700, "tt", MID_TILE.with_(num_stages=6)),
]
# (case, programs): several tiles per program, so the ring's phases run over many laps and tiles;
# chunked over 5 tiles on 4 programs leaves the last program without a tile.
FEW_PROGRAMS = [
    (Case(1000, 1500, 700, config=MID_TILE), 3),
    (Case(257, 300, 16, config=TINY_TILE.with_(num_stages=2)), 2),
    (Case(1000, 1500, 700, "nt", TWO_WARPGROUPS), 5),
    (Case(1000, 1500, 700, config=BIG_TILE), 5),  # the half-tile C buffer, reused tile after tile
    (Case(1000, 1500, 700, config=MID_TILE.with_(num_stages=6)), 3),
    (Case(640, 100, 300, config=MID_TILE.with_(scheduler="chunked", GROUP_SIZE_M=1)), 4),
]


def run_isolated(spec: dict, module: str = "test_warp_specialized") -> None:
    """Run `module._run_case(spec)` in a fresh Python process; fail on its error or after
    CASE_TIMEOUT_S."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, os.path.dirname(tests), env.get("PYTHONPATH")]))
    code = f"import json, {module} as t; t._run_case(json.loads({json.dumps(spec)!r}))"
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=CASE_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{spec}: no result within {CASE_TIMEOUT_S} s: the partitions deadlocked (barrier phases?)")
    assert done.returncode == 0, f"{spec}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"


def _case_spec(case: Case, dtype: torch.dtype, **extra) -> dict:
    config = case.config.short() if case.config else None
    return dict(M=case.M, N=case.N, K=case.K, layout=case.layout, config=config, dtype=str(dtype), **extra)


def _run_case(spec: dict) -> None:
    """One GPU case (in the child process): raises on a wrong result."""
    from tritongemm.core.epilogue import reference_linear
    from tritongemm.core.reference import reference_matmul, rel_error, tolerance

    dtype = getattr(torch, spec["dtype"].removeprefix("torch."))
    config = MatmulConfig.parse(spec["config"]) if spec["config"] else None
    case = Case(spec["M"], spec["N"], spec["K"], spec["layout"], config)
    kernel = spec.get("kernel", KERNEL)
    if spec.get("linear"):
        import tritongemm

        x, b = make_operands(Case(case.M, case.N, case.K, "nt"), dtype, "linear")
        w = b.T * case.K**-0.5  # an (N, K) weight; unit-scale outputs, so that GELU bends
        bias = torch.randn(case.N, device=x.device, dtype=dtype)
        residual = torch.randn(case.M, case.N, device=x.device, dtype=dtype)
        y = tritongemm.linear(x, w, bias, activation="gelu", residual=residual, alpha=0.5, kernel=kernel, config=config)
        err = rel_error(y, reference_linear(x, w, bias, "gelu", residual, 0.5))
    elif spec.get("num_programs"):
        a, b = make_operands(case, dtype, kernel)
        a, b, c = registry.get(kernel).plan_operands(a, b, None, dtype)(a, b, None)
        c.fill_(float("nan"))
        ws.launch(a, b, c, config, num_programs=spec["num_programs"], consumers=2 if kernel == PING_PONG else 1)
        err = rel_error(c, reference_matmul(a, b))
    else:
        check_matmul(case, kernel, dtype)
        return
    torch.cuda.synchronize()
    bound = tolerance(dtype, case.K)
    assert err <= bound, f"{spec}: relative error {err:.3e} > {bound:.3e}"


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", MATMUL_CASES, ids=str)
def test_matmul(case, dtype):
    run_isolated(_case_spec(case, dtype))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case, num_programs", FEW_PROGRAMS, ids=str)
def test_many_tiles_per_program(case, num_programs, dtype):
    run_isolated(_case_spec(case, dtype, num_programs=num_programs))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", (None, TWO_WARPGROUPS, BIG_TILE), ids=lambda c: c.short() if c else "default")
def test_linear_bias_gelu_residual(config, dtype):
    # M = 3 x 37 rows, N and K off the tile sizes
    run_isolated(_case_spec(Case(111, 264, 520, config=config), dtype, linear=True))


# Ping-pong takes one-warpgroup tiles only. Its new ways to go wrong: the turns between the two
# consumers (a program with one tile, an odd number, many), the second consumer's C tile.
PING_PONG_CASES = [case for case in MATMUL_CASES if case.config is None or case.config.num_warps == 4]
PING_PONG_FEW_PROGRAMS = [(case, programs) for case, programs in FEW_PROGRAMS if case.config.num_warps == 4]


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", PING_PONG_CASES, ids=str)
def test_ping_pong_matmul(case, dtype):
    run_isolated(_case_spec(case, dtype, kernel=PING_PONG))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case, num_programs", PING_PONG_FEW_PROGRAMS, ids=str)
def test_ping_pong_many_tiles_per_program(case, num_programs, dtype):
    run_isolated(_case_spec(case, dtype, num_programs=num_programs, kernel=PING_PONG))


@gpu
def test_ping_pong_linear_bias_gelu_residual():
    run_isolated(_case_spec(Case(111, 264, 520), torch.bfloat16, linear=True, kernel=PING_PONG))


def test_ping_pong_is_registered_with_one_warpgroup_tiles(planned):
    info = registry.get(PING_PONG)
    assert info.rung == 11 and info.experimental and not info.any_out_dtype
    for M, N in ((8192, 8192), (1024, 1024), (256, 1024), (1, 1)):
        assert dispatch.default_config(info, torch.float16, M, N, 4096, torch.device("cpu")) in PING_PONG_TILES
    assert all(config.num_warps == 4 for config in PING_PONG_TILES)
    for config in PING_PONG_TILES:  # the ring and two C tiles fit
        ws.check_config(config, 2, consumers=2)
    assert ws.smem_bytes(MID_TILE, 2, consumers=2) == 4 * 32768 + 2 * 32768
    _, meta = planned(1000, 1504, 704, MID_TILE, consumers=2)
    assert meta["CONSUMERS"] == 2 and meta["CONSUMER_REGS"] == ws.CONSUMER_REGISTERS
    assert planned(1000, 1504, 704, MID_TILE)[1]["CONSUMERS"] == 1


@pytest.mark.parametrize(
    "config, message",
    [
        (TWO_WARPGROUPS, "each of its two consumers is one warpgroup, so num_warps must be 4; got 8"),
        (MID_TILE.with_(num_stages=7), r".* needs 262144 bytes .*2 C staging buffer.* num_stages <= 6"),
    ],
)
def test_ping_pong_refuses_what_it_cannot_run(config, message):
    with pytest.raises(ValueError, match=f"tma_ping_pong: {message}"):
        ws.check_config(config, 2, consumers=2)


def test_ping_pong_register_budget_fits_the_sm():
    # setmaxnreg acts per warpgroup: the load warp's group (padded to 4 warps) at LOAD_REGISTERS,
    # the second consumer at CONSUMER_REGISTERS, and the first (the default partition) gets what
    # is left of 64K, which must hold a 128 x 128 fp32 accumulator (128 a thread) and more.
    left = 65536 // 128 - ws.LOAD_REGISTERS - ws.CONSUMER_REGISTERS
    assert ws.CONSUMER_REGISTERS % 8 == 0 and left // 8 * 8 >= 200


def test_k_zero_is_refused_before_any_launch(monkeypatch):
    monkeypatch.setattr(ws, "require_sm90", lambda name, device: None)
    monkeypatch.setattr(ws, "mma_for", lambda name, device: ws.WGMMA)
    a, b, c = torch.empty(64, 0, dtype=torch.float16), torch.empty(0, 64, dtype=torch.float16), torch.empty(64, 64)
    with pytest.raises(ValueError, match="K must be >= 1"):
        ws.plan(a, b, c, MID_TILE)
