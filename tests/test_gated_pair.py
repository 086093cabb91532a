"""The gated pair on rungs 6 and 9 (blocks/gated_pair.py): C = act(A @ gate.T) * (A @ up.T) for a
weight [gate; up] (2N, K), each tile's B slot the gate's rows above the up projection's. On the
CPU its host side (configs, shared memory, grid, refusals); on an sm_90 GPU every case against
the pair in fp64, each in a process of its own (test_warp_specialized.run_isolated)."""

import pytest
import torch
from cases import ON_HOPPER, Case
from test_warp_specialized import run_isolated

from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.dispatch.tiles import BIG_TILE, MID_TILE, RULES, SMALL_TILE, TINY_TILE, gated_config
from tritongemm.ladder import tma_persistent_pipelined as rung6
from tritongemm.ladder import tma_warp_specialized as rung9
from tritongemm.primitives.gluon import pipeline
from tritongemm.primitives.gluon.mma import WGMMA

RUNGS = {"tma_persistent_pipelined": rung6, "tma_warp_specialized": rung9}

# ---------------------------------------------------------------------------------------------
# Host side (CPU)
# ---------------------------------------------------------------------------------------------


def test_c_is_half_the_mma_width_and_has_its_own_buffer():
    # 4 x 48 KB of ring and a 128 x 128 C tile (32 KB): the big tile keeps 4 slots and C whole
    assert rung9.c_pieces(BIG_TILE, 2, gated=True) == 1
    assert rung9.smem_bytes(BIG_TILE, 2, gated=True) == 4 * 49152 + 32768
    rung9.check_config(BIG_TILE, 2, gated=True)
    assert rung9.smem_bytes(MID_TILE, 2, gated=True) == 4 * 32768 + 16384
    ring = pipeline.plan_ring(BIG_TILE, 2, gated=True)  # where the plain GEMM steals B slots
    assert not ring.steal_b and ring.epi_split == 1 and ring.smem_bytes == 4 * 49152 + 32768
    with pytest.raises(ValueError, match="a gated pair on 128x256x64 g8 w8 s5 needs 278528 bytes"):
        pipeline.plan_ring(BIG_TILE.with_(num_stages=5), 2, gated=True)


@pytest.mark.parametrize("kernel", RUNGS)
def test_gated_config_is_the_rungs_rule_on_twice_the_width(kernel):
    assert gated_config(kernel, 8192, 14336, 4096, 132) == BIG_TILE  # 4 slots, also where rung 9 takes 3
    for M, N in ((1, 64), (256, 1024), (1000, 1504), (2048, 18944)):
        config = gated_config(kernel, M, N, 4096, 132)
        assert config.BLOCK_N == 256 or config == RULES[kernel](M, 2 * N, 4096, 132)
        pipeline.plan_ring(config, 2, gated=True)
        rung9.check_config(config, 2, gated=True)


@pytest.fixture
def planned(monkeypatch):
    """A rung's plan(...) on CPU tensors, stopped before compiling: returns (grid, constexprs)."""
    monkeypatch.setattr(pipeline, "require_sm90", lambda kernel, device: None)
    monkeypatch.setattr(device_info, "sm_count", lambda device: 132)
    for module in RUNGS.values():
        monkeypatch.setattr(module, "mma_for", lambda kernel, device: WGMMA)  # as on the H100
        monkeypatch.setattr(module, "planned_launch", lambda kernel, grid, desc, constexprs, c, **_: (grid, constexprs))


def _operands(M, N, K):
    """a (M, K), b the transpose of a (2N, K) weight, C (M, N)."""
    weight = torch.empty(2 * N, K, dtype=torch.float16)
    return torch.empty(M, K, dtype=torch.float16), weight.T, torch.empty(M, N, dtype=torch.float16)


@pytest.mark.parametrize("kernel", RUNGS)
def test_the_grid_counts_c_tiles_of_half_the_mma_width(planned, kernel):
    (grid,), meta = RUNGS[kernel].plan(*_operands(1000, 1504, 704), BIG_TILE, glu="silu")
    assert grid == 8 * 12 and meta["GLU"] == "silu" and meta["B_K_MAJOR"]  # 128 x 128 C tiles
    a, b, c = _operands(1000, 1504, 704)
    plain = RUNGS[kernel].plan(a, torch.empty(704, 1504, dtype=torch.float16), c, BIG_TILE)
    assert plain[1]["GLU"] == "none"


@pytest.mark.parametrize("kernel", RUNGS)
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(glu="relu"), "expected glu to be one of"),
        (dict(bias=torch.empty(8)), r"epilogue is act\(gate\) \* up alone, but got also \['bias'\]"),
        (dict(c=torch.empty(64, 48, dtype=torch.float16)), "twice C's 48 columns, but has 128"),
        (dict(b=torch.empty(64, 128, dtype=torch.float16)), r"b must be K-major .* strides \(128, 1\)"),
        (dict(config=MatmulConfig(64, 16, 64, num_warps=4, num_stages=2)), "BLOCK_N >= 32"),
    ],
)
def test_a_gated_pair_it_cannot_compute_is_refused(planned, kernel, change, message):
    a, b, c = _operands(64, 64, 64)
    args = dict(a=a, b=b, c=c, config=MID_TILE, glu="silu") | change
    with pytest.raises(ValueError, match=f"{kernel}: .*{message}"):
        RUNGS[kernel].plan(args.pop("a"), args.pop("b"), args.pop("c"), args.pop("config"), **args)


def test_ping_pong_refuses_a_gated_pair(planned):
    with pytest.raises(ValueError, match="tma_ping_pong: a gated pair runs on one consumer"):
        rung9.plan(*_operands(64, 64, 64), MID_TILE, glu="silu", consumers=2)


# ---------------------------------------------------------------------------------------------
# On the GPU, each case in a process of its own
# ---------------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA and WGMMA")
DTYPES = (torch.float16, torch.bfloat16)
# (case, activation, programs): C's N = case.N, the weight (2N, K). Partial tiles on every axis
# (the last tile's gate box then reads the first up rows: those columns are clipped at the store),
# C rows that need padding (N = 100: 200 bytes), one row, A M-major, several tiles a program. No
# config: through gated_pair and gated_config.
CASES = [
    (Case(1000, 1504, 704), "silu", None),
    (Case(1000, 1500, 704, config=BIG_TILE), "gelu", None),
    (Case(65, 100, 72, config=MID_TILE), "gelu_tanh", None),
    (Case(1, 4096, 256), "silu", None),
    (Case(300, 200, 16, config=TINY_TILE.with_(num_stages=2)), "silu", None),  # one K-step a tile
    (Case(1000, 1504, 704, "tn", config=MID_TILE), "silu", None),  # A M-major
    (Case(1000, 1500, 704, config=BIG_TILE), "silu", 5),
    (Case(257, 300, 136, config=SMALL_TILE.with_(num_stages=3)), "gelu", 2),
    (Case(1000, 1504, 1024, config=MID_TILE.with_(num_stages=6)), "silu", 3),  # rung 6's deep ring
]


def _run_case(spec: dict) -> None:
    """One GPU case (in the child process): through gated_pair, or with a config or several tiles
    per program through the rung's launcher, C poisoned with NaN; against the pair in fp64."""
    from tritongemm.blocks.gated_pair import gated_pair
    from tritongemm.core.epilogue import activate_torch
    from tritongemm.core.reference import rel_error, tolerance
    from tritongemm.core.tma import empty_output

    dtype = getattr(torch, spec["dtype"].removeprefix("torch."))
    config = MatmulConfig.parse(spec["config"]) if spec["config"] else None
    M, N, K, kernel, activation = spec["M"], spec["N"], spec["K"], spec["kernel"], spec["glu"]
    if spec["layout"][0] == "t":
        x = torch.randn(K, M, device="cuda", dtype=dtype).T
    else:
        x = torch.randn(M, K, device="cuda", dtype=dtype)
    weight = (torch.randn(2 * N, K, device="cuda") * K**-0.5).to(dtype)  # unit-scale pairs: the activation bends
    if config is None:
        h = gated_pair(x, weight, activation, kernel)
    else:
        h = empty_output(M, N, dtype, x.device)
        h.fill_(float("nan"))
        RUNGS[kernel].launch(x, weight.T, h, config, num_programs=spec["num_programs"], glu=activation)
    torch.cuda.synchronize()
    pair = x.double() @ weight.double().T
    expected = activate_torch(pair[:, :N], activation) * pair[:, N:]
    bound = 2 * tolerance(dtype, K)  # two products, rounded once
    err = rel_error(h, expected)
    assert h.shape == (M, N) and torch.isfinite(h).all(), f"{spec}: NaN left in C"
    assert err <= bound, f"{spec}: relative error {err:.3e} > {bound:.3e}"


@gpu
@pytest.mark.parametrize("kernel", RUNGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case, activation, num_programs", CASES, ids=str)
def test_gated_pair(kernel, case, activation, num_programs, dtype):
    config = case.config.short() if case.config else None
    spec = dict(M=case.M, N=case.N, K=case.K, layout=case.layout, config=config, dtype=str(dtype), kernel=kernel,
                glu=activation, num_programs=num_programs)  # fmt: skip
    run_isolated(spec, module="test_gated_pair")


@gpu
def test_auto_takes_the_measured_kernel_for_m_rows():
    """dispatch/gated_pair.py `choose`: the row-group kernel below RUNG6_FROM_ROWS rows or where TMA
    can't read the operands in place, rung 6 up to RUNG9_FROM_ROWS, rung 9 from there."""
    from tritongemm.dispatch import gated_pair as module

    weight = torch.empty(2 * 96, 64, dtype=torch.bfloat16, device="cuda")
    pipelined, warped = module.GATED_RUNGS
    six, nine = module.RUNG6_FROM_ROWS, module.RUNG9_FROM_ROWS
    for M, expected in ((1, "auto"), (six - 1, "auto"), (six, pipelined), (nine - 1, pipelined), (nine, warped)):
        rows = torch.empty(M, 64, dtype=torch.bfloat16, device="cuda")
        assert module.choose(rows, weight) == expected, M
    rows = torch.empty(4096, 65, dtype=torch.bfloat16, device="cuda")[:, :63]  # rows of 130 bytes: no TMA
    assert module.choose(rows, torch.empty(192, 63, dtype=torch.bfloat16, device="cuda")) == "auto"


@pytest.mark.parametrize("M", [1, 5, 63])
def test_the_row_group_pair_reads_no_offsets(M, monkeypatch):
    """Below RUNG6_FROM_ROWS rows `auto` runs the row-group kernel over one group of all the rows
    (grouped/build.py dense_pair_plan): it computes the pair against fp64 for a contiguous weight and a
    strided one, and a call builds no offs tensor (no fill kernel on the decode path)."""
    from tritongemm.blocks.gated_pair import gated_pair
    from tritongemm.core.epilogue import activate_torch
    from tritongemm.core.reference import rel_error, tolerance

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(M)
    x = torch.randn(M, 72, generator=gen).to(device, dtype)
    stored = torch.randn(2 * 40, 80, generator=gen).to(device, dtype)
    for weight in (stored[:, :72].contiguous(), stored[:, 8:]):  # rows 160 bytes apart, not 144
        gated_pair(x, weight, "silu")  # planned
        monkeypatch.setattr(torch, "full", lambda *args, **kwargs: pytest.fail("an offs tensor was built"))
        h = gated_pair(x, weight, "silu")
        monkeypatch.undo()
        pair = x.double() @ weight.double().T
        expected = activate_torch(pair[:, :40], "silu") * pair[:, 40:]
        assert rel_error(h, expected) <= 2 * tolerance(dtype, 72)


@pytest.mark.parametrize("M", [1, 16])
def test_the_decode_pair_tile(M):
    """dispatch/grouped.py's tile for a dense pair of at most DECODE_PAIR_ROWS rows (gated_pair on a GPU):
    a partial K-step and a partial last column tile, C poisoned, against fp64 (the interpreter on
    the CPU, where dense_pair_plan itself keeps the interpreter's small tile)."""
    from tritongemm.core.epilogue import activate_torch
    from tritongemm.core.reference import rel_error, tolerance
    from tritongemm.dispatch import grouped as choice
    from tritongemm.grouped import build

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(M)
    x = torch.randn(M, 300, generator=gen).to(device, dtype)  # K: one step of 256 and a partial one
    weight = (torch.randn(2 * 70, 300, generator=gen) * 300**-0.5).to(device, dtype)  # 70: 32 + 32 + 6
    tile = choice.decode_pair_tile(x.element_size())
    assert M <= choice.DECODE_PAIR_ROWS and tile["BLOCK_N"] == 32
    call = build.grouped_call(x, weight.t().unsqueeze(0), None, dtype, "m", "gelu", tile, whole=True)
    h = torch.full((M, 70), float("nan"), dtype=dtype, device=device)
    call(x, weight, None, h)
    pair = x.double() @ weight.double().T
    expected = activate_torch(pair[:, :70], "gelu") * pair[:, 70:]
    assert torch.isfinite(h).all()
    assert rel_error(h, expected) <= 2 * tolerance(dtype, 300)
