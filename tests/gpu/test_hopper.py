"""The Hopper Gluon kernels (rungs 4-6) against the fp64 reference, and their schedulers against
primitives/tiling/__init__.py. Needs an sm_90 GPU; run with ``pytest tests/gpu/test_hopper.py -n 8`` (compiling
~300 kernel variants dominates the time).

The launchers are called directly (not through `tritongemm.matmul`), so every config reaches the
kernel as written. Operands are fresh `torch.randn`, C is poisoned with NaN, and operands whose
shape breaks TMA's 16-byte stride rule live in padded storage (any M, N, K is then legal).
"""

import itertools

import numpy as np
import pytest
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.dispatch.tiles import DEEP_RING_STAGES, TILES
from tritongemm.ladder import tma_persistent, tma_persistent_pipelined, tma_pipelined
from tritongemm.primitives import tiling as tile_order
from tritongemm.primitives.tiling.gluon import scheduler_for

_IS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _IS_SM90, reason="needs an sm_90 (Hopper) GPU: WGMMA and TMA"),
]

LAUNCH = {
    "tma_pipelined": tma_pipelined.launch,
    "tma_persistent": tma_persistent.launch,
    "tma_persistent_pipelined": tma_persistent_pipelined.launch,
}
PERSISTENT = ("tma_persistent", "tma_persistent_pipelined")
DTYPES = (torch.float16, torch.bfloat16)
# a row-major (n) or the transpose of a (K, M) tensor (t: a weight gradient's dY^T); then b
# row-major (n) or the transpose of an (N, K) weight (t): every pair is read in place.
LAYOUTS = ("nn", "nt", "tn", "tt")
SCHEDULERS = (("chunked", 1), ("grouped", 1), ("grouped", 8))


def make_operand(rows: int, cols: int, dtype: torch.dtype, transposed: bool = False) -> torch.Tensor:
    """A (rows, cols) random view whose storage rows are padded to 16 bytes when needed, so TMA
    can read it whatever its shape; transposed: the .T of a (cols, rows) such tensor."""
    outer, inner = (cols, rows) if transposed else (rows, cols)
    storage = torch.randn(outer, _padded(inner), device="cuda", dtype=dtype)
    view = storage[:, :inner]
    return view.T if transposed else view


def make_output(M: int, N: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """C (M, N) as a view of NaN-filled storage with 16 spare bytes per row past the padding;
    returns (c, storage)."""
    storage = torch.full((M, _padded(N) + 8), float("nan"), device="cuda", dtype=dtype)
    return storage[:, :N], storage


def _padded(n: int) -> int:
    return -(-n // 8) * 8


def check(kernel: str, M: int, N: int, K: int, dtype, layout: str, config: MatmulConfig, **launch_kw) -> None:
    a = make_operand(M, K, dtype, transposed=layout[0] == "t")
    b = make_operand(K, N, dtype, transposed=layout[1] == "t")
    c, storage = make_output(M, N, dtype)
    LAUNCH[kernel](a, b, c, config, **launch_kw)
    err = rel_error(c, reference_matmul(a, b))
    bound = tolerance(dtype, K)
    assert err <= bound, f"{kernel} {M}x{N}x{K} {dtype} {layout} {config.short()}: error {err:.3e} > {bound:.3e}"
    # TMA clips stores at N, in whole 16-byte chunks (triton-lang/triton#11583): the chunk that
    # holds column N - 1 may be overwritten up to its end, the next one must keep the poison.
    assert storage[:, _padded(N) :].isnan().all(), f"{kernel} wrote past the 16-byte chunk of column N={N}"


# ---------------------------------------------------------------------------------------------
# The seed's parametrization (07-persistence.py), crossed with dtype, B layout and scheduler
# ---------------------------------------------------------------------------------------------

SEED_SHAPES = ((208, 416, 304), (2000, 1000, 2000))
SEED_BLOCKS = ((64, 64, 64), (128, 256, 64))
WARPS = (4, 8)
BUFFERS = {"tma_pipelined": (2, 3, 4), "tma_persistent": (2, 3, 4), "tma_persistent_pipelined": (3, 4)}


def _seed_params():
    for kernel, buffers in BUFFERS.items():
        schedulers = SCHEDULERS if kernel in PERSISTENT else (("grouped", 8),)
        for (M, N, K), (bm, bn, bk), nb, nw, (sched, group) in itertools.product(
            SEED_SHAPES, SEED_BLOCKS, buffers, WARPS, schedulers
        ):
            config = MatmulConfig(bm, bn, bk, GROUP_SIZE_M=group, num_warps=nw, num_stages=nb, scheduler=sched)
            yield pytest.param(kernel, M, N, K, config, id=f"{kernel}-{M}x{N}x{K}-{config.short().replace(' ', '')}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel, M, N, K, config", list(_seed_params()))
def test_seed_matrix(kernel, M, N, K, config, dtype, layout):
    check(kernel, M, N, K, dtype, layout, config)


# ---------------------------------------------------------------------------------------------
# Boundaries: 1, 15/16/17, primes, one tile +- 1 on each axis, K shorter than the ring
# ---------------------------------------------------------------------------------------------

SMALL = MatmulConfig(64, 64, 64, GROUP_SIZE_M=8, num_warps=4, num_stages=3)
BIG = MatmulConfig(128, 256, 64, GROUP_SIZE_M=1, num_warps=8, num_stages=4, scheduler="chunked")  # steals B
BOUNDARY_SHAPES = (
    (1, 1, 1),
    (1, 16, 16),
    (15, 17, 16),
    (16, 15, 17),
    (17, 16, 15),
    (1, 256, 1024),  # one row: a 128-row TMA box over a 1-row tensor
    (127, 256, 64),
    (129, 256, 64),
    (128, 255, 64),
    (128, 257, 64),
    (128, 256, 63),
    (128, 256, 65),
    (37, 41, 43),
    (251, 509, 1021),  # primes
    (3, 5, 1000),  # long K, tiny output
)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", (SMALL, BIG), ids=lambda c: c.short().replace(" ", ""))
@pytest.mark.parametrize("M, N, K", BOUNDARY_SHAPES, ids=lambda s: str(s))
@pytest.mark.parametrize("kernel", LAUNCH)
def test_boundaries(kernel, M, N, K, config, dtype, layout):
    check(kernel, M, N, K, dtype, layout, config)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", TILES, ids=lambda c: c.short().replace(" ", ""))
@pytest.mark.parametrize("kernel", LAUNCH)
def test_default_tiles(kernel, config, dtype):
    check(kernel, 300, 500, 700, dtype, "nt", config)
    check(kernel, 300, 500, 700, dtype, "tn", config)


# Rung 6's rules' deeper rings (hopper.DEEP_RING_STAGES; `tune` tries them on every Gluon rung):
# where the rules take them (1000 x 1024 x 1024: a partial last row of tiles), and past where they
# would, as a named config may be: K of one step or a prime, shorter than the ring.
DEEP_RINGS = tuple(tile.with_(num_stages=stages) for tile, stages in DEEP_RING_STAGES.items())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", DEEP_RINGS, ids=lambda c: c.short().replace(" ", ""))
@pytest.mark.parametrize("M, N, K", ((1000, 1024, 1024), (129, 256, 64), (37, 41, 43), (300, 500, 700)), ids=str)
@pytest.mark.parametrize("kernel", LAUNCH)
def test_deep_rings(kernel, M, N, K, config, dtype, layout):
    check(kernel, M, N, K, dtype, layout, config)


def test_contiguous_operands_take_no_padding():
    """The common case: plain contiguous a, b, c (no padded storage)."""
    a = torch.randn(300, 520, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(520, 136, device="cuda", dtype=torch.bfloat16)
    for kernel, launch in LAUNCH.items():
        c = torch.full((300, 136), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch(a, b, c, SMALL)
        assert rel_error(c, reference_matmul(a, b)) <= tolerance(torch.bfloat16, 520), kernel


# ---------------------------------------------------------------------------------------------
# Several tiles per program: the cross-tile pipeline, barrier phases over many laps, and the
# stolen-B epilogue when its two free slots wrap around the end of the ring
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_programs", (1, 3, 7))
@pytest.mark.parametrize("scheduler, group", SCHEDULERS)
@pytest.mark.parametrize(
    "config",
    (BIG, BIG.with_(num_stages=3), SMALL, MatmulConfig(128, 128, 128, num_warps=8, num_stages=2)),
    ids=lambda c: c.short().replace(" ", ""),
)
@pytest.mark.parametrize("layout", ("nn", "tn"))
@pytest.mark.parametrize("kernel", PERSISTENT)
def test_many_tiles_per_program(kernel, layout, config, scheduler, group, num_programs):
    # K = 700: 11 K-steps of 64, so with a 5-slot B ring the stolen slots wrap at the first tile.
    config = config.with_(scheduler=scheduler, GROUP_SIZE_M=group)
    check(kernel, 1000, 1500, 700, torch.float16, layout, config, num_programs=num_programs)


# ---------------------------------------------------------------------------------------------
# Under ConSan, A and B get a barrier each (pipeline.barriers_per_slot): the same pipeline
# ---------------------------------------------------------------------------------------------

MODULES = {
    module.__name__.rsplit(".", 1)[1]: module for module in (tma_pipelined, tma_persistent, tma_persistent_pipelined)
}


@pytest.mark.parametrize("config", (SMALL, BIG), ids=lambda c: c.short().replace(" ", ""))
@pytest.mark.parametrize("kernel", LAUNCH)
def test_split_barriers_give_the_same_bits(kernel, config, monkeypatch):
    """The variant ConSan checks computes exactly what users run, bit for bit, over several
    tiles per program and (BIG) the stolen-B epilogue."""
    a = make_operand(1000, 700, torch.float16)
    b = make_operand(700, 1500, torch.float16, transposed=True)
    launch_kw = {"num_programs": 3} if kernel in PERSISTENT else {}
    results = []
    for per_slot in (1, 2):
        monkeypatch.setattr(MODULES[kernel], "barriers_per_slot", lambda per_slot=per_slot: per_slot)
        c, _ = make_output(1000, 1500, torch.float16)
        LAUNCH[kernel](a, b, c, config, **launch_kw)
        results.append(c)
    assert rel_error(results[0], reference_matmul(a, b)) <= tolerance(torch.float16, 700)
    assert torch.equal(results[0], results[1])


# ---------------------------------------------------------------------------------------------
# The Gluon schedulers compute exactly tile_order's formulas
# ---------------------------------------------------------------------------------------------


@gluon.jit
def _record_schedule_kernel(
    program_ptr, step_ptr, M, N, Scheduler: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr
):
    scheduler = Scheduler.initialize(M, N, BLOCK_M, BLOCK_N)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    for idx in range(scheduler.get_num_tiles()):
        pid_m, pid_n = scheduler.get_tile(idx)
        gl.store(program_ptr + pid_m * num_pid_n + pid_n, gl.program_id(axis=0))
        gl.store(step_ptr + pid_m * num_pid_n + pid_n, idx)


@pytest.mark.parametrize("num_programs", (1, 4, 7, 132))
@pytest.mark.parametrize("num_pid_m, num_pid_n", ((1, 1), (5, 4), (7, 9), (12, 3), (33, 17)))
@pytest.mark.parametrize("scheduler, group", (("chunked", 1), ("grouped", 1), ("grouped", 3), ("grouped", 8)))
def test_scheduler_matches_tile_order(scheduler, group, num_pid_m, num_pid_n, num_programs):
    BLOCK_M, BLOCK_N = 64, 32
    M, N = num_pid_m * BLOCK_M - 5, num_pid_n * BLOCK_N - 3  # partial last tiles count as tiles
    programs = min(num_programs, num_pid_m * num_pid_n)
    program = torch.full((num_pid_m, num_pid_n), -1, device="cuda", dtype=torch.int32)
    step = torch.full_like(program, -1)
    _record_schedule_kernel[(programs,)](
        program, step, M, N, scheduler_for(scheduler, group), BLOCK_M, BLOCK_N, num_warps=1
    )
    ordering = "chunked" if scheduler == "chunked" else "persistent"
    expected = tile_order.schedule(ordering, num_pid_m, num_pid_n, group, num_programs=programs)
    np.testing.assert_array_equal(program.cpu().numpy(), expected.program)
    np.testing.assert_array_equal(step.cpu().numpy(), expected.step)


# ---------------------------------------------------------------------------------------------
# kernel="auto" on operands TMA can't read in place: a large problem goes through aligned copies
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, expected", [(2100, "tma_persistent_pipelined"), (1024, "grouped")])
def test_auto_copies_misaligned_operands_only_for_a_large_problem(dtype, M, expected):
    """Rows of 1000 and 1030 fp16 elements (2000 and 2060 bytes): b's are not 16-byte multiples.
    2100 rows make 4.3e9 FLOPs, past dispatch.STAGING_MIN_FLOPS; 1024 stay under it."""
    import tritongemm

    a = torch.randn(M, 1000, device="cuda", dtype=dtype)
    b = torch.randn(1000, 1031, device="cuda", dtype=dtype)[:, :1030]
    out = torch.full((M, 1030), float("nan"), device="cuda", dtype=dtype)
    tritongemm.matmul(a, b, out=out)
    assert rel_error(out, reference_matmul(a, b)) <= tolerance(dtype, 1000)
    assert tritongemm.dense.matmul.lookup(a, b, out, "auto", None).kernel == expected
