"""Fuzzing `tritongemm.matmul`: random shapes, dtypes, kernels, configs and memory layouts against
the fp64 reference, under the per-dtype bound of `tritongemm.core.reference.tolerance`.

Each case also checks what a bound on the error can't see: every element of `out` is written
(it starts as NaN), nothing around the views is read or written (their storage is NaN outside
them), and the inputs are left as they were. A failure prints a one-line command that replays
exactly that case.

On the CPU (the Triton interpreter, fp16 / fp32, the `triton.language` rungs and "auto") the run
is bounded for CI: shapes up to 300, and no more than 6 tiles along any axis so each case stays
under a second. On a GPU every kernel and dtype runs, on larger shapes, with configs from a short
list (each distinct config is a compile). FUZZ_EXAMPLES sets the number of cases over the whole
test (the H100 run uses 10400), FUZZ_SEED another sequence than the fixed default one, and
FUZZ_KEEP_GOING=1 records every failing case instead of stopping at the first.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import zlib
from dataclasses import dataclass

import pytest
import torch
from cases import DEVICE, DTYPES, LADDER, ON_GPU
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.dense.plan import Plan
from tritongemm.dispatch.tiles import INTERPRETER_CONFIG

_IS_SM90 = ON_GPU and torch.cuda.get_device_capability() == (9, 0)
GLUON = (
    "tma_pipelined",
    "tma_persistent",
    "tma_persistent_pipelined",
    "split_k",
    "tma_warp_specialized",  # rungs 9 and 11 are experimental, fuzzed as issue 15 asks
    "tma_ping_pong",
    "split_tail",  # rung 12, experimental: its row cut and the tail's split meet odd shapes here
    "odd_width",  # rung 13, experimental: its two-part tiles meet odd edges here
)
# stream_k (rung 10) is experimental, so the shared LADDER leaves it out; it has no spin-wait that
# could hang a run, and the fuzz count covers it.
KERNELS = (*LADDER, "stream_k", "auto", *(GLUON if _IS_SM90 else ()))
GLUON_DTYPES = (torch.float16, torch.bfloat16)

# CPU: no more than this many tiles along an axis (the interpreter runs ~200 tile steps a second).
CPU_MAX_DIM, CPU_MAX_TILES = 300, 6
GPU_MAX_DIM = 1536


def _gpu_configs() -> dict[str, tuple[MatmulConfig | None, ...]]:
    """A short list per kernel: the compile of each config x specialization dominates a GPU run."""
    ladder = (
        None,
        MatmulConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_SIZE_M=4, num_warps=4, num_stages=3),
        MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_SIZE_M=8, num_warps=4, num_stages=3),
    )
    configs = {name: ladder for name in (*LADDER, "stream_k")} | {"auto": (None,)}
    # swap_ab's tiles are (tokens, weight rows); its split counts are drawn explicitly too (0
    # fills the SMs), so the workspace and the fixed-order reduction see 1 to 7 pieces a tile.
    skinny = MatmulConfig(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=4)
    configs["swap_ab"] = (
        None,
        skinny.with_(split_k=1),
        skinny.with_(BLOCK_M=32, BLOCK_K=64, split_k=3),
        skinny.with_(BLOCK_M=64, BLOCK_N=128, BLOCK_K=32, split_k=0),
        skinny.with_(BLOCK_N=32, BLOCK_K=256, num_stages=3, split_k=7),
    )
    if _IS_SM90:
        from tritongemm.dispatch.tiles import MID_TILE, SMALL_TILE, TINY_TILE, WARP_SPECIALIZED_BIG_TILE

        # MID_TILE with 6 slots: rung 6's rules' deepest ring (hopper.DEEP_RING_STAGES), its C
        # buffer beside it within 3 KB of the 227 KB a block may have
        deep = MID_TILE.with_(num_stages=6)
        gluon = (None, TINY_TILE, SMALL_TILE.with_(scheduler="chunked", GROUP_SIZE_M=1), deep)
        configs |= {name: gluon for name in GLUON}
        configs["split_k"] = (None, TINY_TILE.with_(split_k=2), SMALL_TILE.with_(split_k=5))
        # rung 9's two-warpgroup tile is its default only where its tiles fill the SMs (not here)
        configs["tma_warp_specialized"] = (*gluon, WARP_SPECIALIZED_BIG_TILE)
        from tritongemm.ladder import odd_width

        configs["odd_width"] = (None, *odd_width.TILES, odd_width.TILES[0].with_(scheduler="chunked", GROUP_SIZE_M=1))
    return configs


def _repr_without_defaults(obj) -> str:
    fields = [f for f in dataclasses.fields(obj) if getattr(obj, f.name) != f.default]
    return f"{type(obj).__name__}({', '.join(f'{f.name}={getattr(obj, f.name)!r}' for f in fields)})"


@dataclass(frozen=True)
class Layout:
    """Where a (rows, cols) view sits in its storage."""

    transposed: bool = False  # the .T of a row-major (cols, rows) tensor
    pad: int = 0  # storage rows are longer than the view's by this many elements
    offset: int = 0  # elements of storage before the view (a slice that starts inside a tensor)
    broadcast: str = ""  # inputs only: "rows", "cols" or "all" is a stride-0 expand() of one row / column / element

    def __repr__(self) -> str:
        return _repr_without_defaults(self)


@dataclass(frozen=True)
class FuzzCase:
    kernel: str
    dtype: str  # "float16", "bfloat16" or "float32"
    M: int
    N: int
    K: int
    a: Layout = Layout()
    b: Layout = Layout()
    out: Layout | None = None  # None: matmul allocates the result
    config: MatmulConfig | None = None
    tf32: bool = False  # torch.backends.cuda.matmul.allow_tf32 during the call (fp32 only)
    seed: int = 0

    def __repr__(self) -> str:
        return _repr_without_defaults(self)

    def repro(self) -> str:
        """A shell command that replays this case (from the repository root)."""
        return f'FUZZ_CASE="{self!r}" python -m pytest -q -p no:cacheprovider tests/test_fuzz.py::test_replay'


# ---------------------------------------------------------------------------------------------
# Building and checking one case
# ---------------------------------------------------------------------------------------------


# NaN elements after every view's storage, so that reading or writing just past it shows.
_GUARD = 32


def _storage_view(rows: int, cols: int, layout: Layout, dtype, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """A random (rows, cols) view laid out as `layout` says, in NaN-filled storage; returns
    (view, storage). The broadcast dims are laid out with size 1 and then expanded."""
    base_rows = 1 if layout.broadcast in ("rows", "all") else rows
    base_cols = 1 if layout.broadcast in ("cols", "all") else cols
    outer, inner = (base_cols, base_rows) if layout.transposed else (base_rows, base_cols)
    leading_dim = inner + layout.pad
    storage = torch.full((layout.offset + outer * leading_dim + _GUARD,), math.nan, dtype=dtype)
    view = torch.as_strided(storage, (outer, inner), (leading_dim, 1), layout.offset)
    view.copy_(torch.randn(outer, inner, generator=gen))
    storage = storage.to(DEVICE)
    view = torch.as_strided(storage, (outer, inner), (leading_dim, 1), layout.offset)
    view = view.T if layout.transposed else view
    return view.expand(rows, cols), storage


def _poisoned_out(rows: int, cols: int, layout: Layout, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    outer, inner = (cols, rows) if layout.transposed else (rows, cols)
    leading_dim = inner + layout.pad
    storage = torch.full((layout.offset + outer * leading_dim + _GUARD,), math.nan, dtype=dtype, device=DEVICE)
    view = torch.as_strided(storage, (outer, inner), (leading_dim, 1), layout.offset)
    return (view.T if layout.transposed else view), storage


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t's bit patterns, so that NaN == NaN."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _inside(view: torch.Tensor, storage: torch.Tensor) -> torch.Tensor:
    """Boolean mask over `storage`: the elements `view` covers."""
    mask = torch.zeros(storage.numel(), dtype=torch.bool, device=storage.device)
    offset = view.storage_offset() - storage.storage_offset()
    torch.as_strided(mask, view.shape, view.stride(), offset).fill_(True)
    return mask


def _error(result: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """rel_error against the fp64 reference; for fp32, relative to |a| @ |b| instead of to C.

    In fp32 the output's rounding is negligible and the error is the accumulation's (and TF32's,
    which drops 13 bits of every operand: Triton's tl.dot truncates them, and the 11 TF32 cases
    over the bound in a 2000-case H100 run each matched a truncating emulation to 3 digits). Both
    act on the products and partial sums, up to ||a|| ||b||, so where C cancels to far less the
    error relative to C is no measure of the kernel: 1x1x128 TF32 gave 4.3e-3 against a bound of
    2e-3, and swap_ab's 1215x128x128 fp32 (IEEE) with both operands broadcast (|| |a| @ |b| || =
    3200 ||C||) 3.5e-5 against 2e-5, the error torch.matmul's fp32 result has on the same data.
    Measured against |a| @ |b| the bound holds for any data. Half dtypes round the output, an
    error relative to C, so they are measured against C."""
    ref = reference_matmul(a, b)
    if a.dtype != torch.float32:
        return rel_error(result, ref)
    scale = torch.linalg.norm(reference_matmul(a.abs(), b.abs())).item()
    diff = torch.linalg.norm(result.double() - ref).item()
    return diff / scale if scale > 0 else diff


def check(case: FuzzCase) -> None:
    """Run one case and check it; any failure raises AssertionError ending in the reproduction."""
    try:
        _check(case)
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n  reproduce: {case.repro()}") from e


def _check(case: FuzzCase) -> None:
    dtype = getattr(torch, case.dtype)
    gen = torch.Generator().manual_seed(case.seed)
    a, a_storage = _storage_view(case.M, case.K, case.a, dtype, gen)
    b, b_storage = _storage_view(case.K, case.N, case.b, dtype, gen)
    out = out_storage = None
    if case.out is not None:
        out, out_storage = _poisoned_out(case.M, case.N, case.out, dtype)
    before = {
        name: _bits(s).clone()
        for name, s in (("a", a_storage), ("b", b_storage), ("out", out_storage))
        if s is not None
    }

    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = case.tf32
    try:
        result = tritongemm.matmul(a, b, out=out, kernel=case.kernel, config=case.config)
        bound = tolerance(dtype, case.K)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32

    assert result.shape == (case.M, case.N) and result.dtype == dtype and result.device == a.device, (
        f"result is {tuple(result.shape)} {result.dtype} on {result.device}"
    )
    if out is not None:
        assert result is out, "matmul returned a new tensor instead of out"
    assert not result.isnan().any(), "some elements of the result were not written (or read NaN from outside a view)"
    err = _error(result, a, b)
    assert err <= bound, f"relative error {err:.3e} > bound {bound:.3e}"
    for name, storage in (("a", a_storage), ("b", b_storage)):
        assert torch.equal(_bits(storage), before[name]), f"input {name} (or the storage around it) was modified"
    if out is not None:
        outside = ~_inside(out, out_storage)
        assert torch.equal(_bits(out_storage)[outside], before["out"][outside]), "wrote outside the out view"


# ---------------------------------------------------------------------------------------------
# The strategy
# ---------------------------------------------------------------------------------------------


def _dim(max_dim: int, block: int) -> st.SearchStrategy[int]:
    """0 to max_dim, weighted towards tiny sizes and tile edges (multiples of the block +- 1)."""
    edges = sorted(
        {m * block + d for m in range(1, max_dim // block + 1) for d in (-1, 0, 1)} & set(range(max_dim + 1))
    )
    return st.one_of(st.integers(0, 4), st.sampled_from(edges or [max_dim]), st.integers(1, max_dim))


_INPUT_LAYOUTS = st.builds(
    Layout,
    transposed=st.booleans(),
    pad=st.sampled_from((0, 0, 1, 8, 13)),
    offset=st.sampled_from((0, 0, 3, 8, 64)),
    broadcast=st.sampled_from(("", "", "", "", "", "rows", "cols", "all")),
)
_OUT_LAYOUTS = st.one_of(
    st.none(),
    st.builds(
        Layout, transposed=st.booleans(), pad=st.sampled_from((0, 0, 5, 8)), offset=st.sampled_from((0, 0, 3, 8))
    ),
)
_CPU_CONFIGS = st.one_of(
    st.none(),
    st.builds(
        MatmulConfig,
        BLOCK_M=st.sampled_from((16, 32, 64)),
        BLOCK_N=st.sampled_from((16, 32, 64)),
        BLOCK_K=st.sampled_from((16, 32, 64)),
        GROUP_SIZE_M=st.integers(1, 8),
        num_warps=st.sampled_from((1, 2, 4, 8)),
        num_stages=st.integers(1, 4),
    ),
)


@st.composite
def fuzz_cases(draw, kernel: str, dtype: torch.dtype) -> FuzzCase:
    if ON_GPU:
        config = draw(st.sampled_from(_gpu_configs()[kernel]))
        blocks = (config.BLOCK_M, config.BLOCK_N, config.BLOCK_K) if config else (64, 64, 64)
        caps = (GPU_MAX_DIM,) * 3
    else:
        config = None if kernel == "auto" else draw(_CPU_CONFIGS)
        tile = config or INTERPRETER_CONFIG
        blocks = (tile.BLOCK_M, tile.BLOCK_N, tile.BLOCK_K)
        caps = tuple(min(CPU_MAX_DIM, CPU_MAX_TILES * block) for block in blocks)
    M, N, K = (draw(_dim(cap, block)) for cap, block in zip(caps, blocks))
    return FuzzCase(
        kernel=kernel,
        dtype=str(dtype).removeprefix("torch."),
        M=M,
        N=N,
        K=K,
        a=draw(_INPUT_LAYOUTS),
        b=draw(_INPUT_LAYOUTS),
        out=draw(_OUT_LAYOUTS),
        config=config,
        tf32=dtype == torch.float32 and draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------

PARAMS = [(k, d) for k in KERNELS for d in DTYPES if k not in GLUON or d in GLUON_DTYPES]
# CPU default: 200 cases, about 40 s on 2 cores with -n 2.
EXAMPLES_PER_TEST = math.ceil(int(os.environ.get("FUZZ_EXAMPLES", 25 * len(PARAMS))) / len(PARAMS))
KEEP_GOING = os.environ.get("FUZZ_KEEP_GOING") == "1"
FUZZ_SEED = os.environ.get("FUZZ_SEED")
# Where each case is appended as a JSON line, when set (the GPU script counts cases from it).
FUZZ_LOG = os.environ.get("FUZZ_LOG")


def _log(case: FuzzCase, error: str | None, seconds: float) -> None:
    if FUZZ_LOG:
        os.makedirs(FUZZ_LOG, exist_ok=True)
        record = {"case": repr(case), "kernel": case.kernel, "dtype": case.dtype}
        line = json.dumps(record | {"ok": error is None, "error": error, "seconds": round(seconds, 3)})
        with open(os.path.join(FUZZ_LOG, f"cases-{os.getpid()}.jsonl"), "a") as f:
            f.write(line + "\n")


@pytest.mark.parametrize("kernel, dtype", PARAMS, ids=[f"{k}-{str(d).removeprefix('torch.')}" for k, d in PARAMS])
def test_fuzz(kernel, dtype):
    failures: list[str] = []

    @settings(
        max_examples=EXAMPLES_PER_TEST,
        deadline=None,
        database=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate) if KEEP_GOING else tuple(Phase),
    )
    @given(case=fuzz_cases(kernel, dtype))
    def run(case):
        start = time.perf_counter()
        try:
            check(case)
        except AssertionError as e:
            _log(case, str(e), time.perf_counter() - start)
            if not KEEP_GOING:
                raise
            failures.append(str(e))
        else:
            _log(case, None, time.perf_counter() - start)

    # A fixed sequence per kernel and dtype (CI runs the same cases every time; the inner
    # function is one for all parameters, so derandomize=True would give every test the same).
    run = hypothesis_seed(zlib.crc32(f"{kernel}-{dtype}-{FUZZ_SEED or 0}".encode()))(run)
    run()
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures)


@pytest.mark.skipif("FUZZ_CASE" not in os.environ, reason="replays one case: set FUZZ_CASE to a printed FuzzCase(...)")
def test_replay():
    case = eval(os.environ["FUZZ_CASE"], {"FuzzCase": FuzzCase, "Layout": Layout, "MatmulConfig": MatmulConfig})
    check(case)


def test_repro_line_replays_the_same_case():
    case = FuzzCase(
        "grouped", "float16", 5, 7, 9, a=Layout(transposed=True, broadcast="rows"), config=MatmulConfig(16, 16, 16)
    )
    command = case.repro()
    assert command.startswith('FUZZ_CASE="FuzzCase(') and command.endswith("tests/test_fuzz.py::test_replay")
    text = command.split('"')[1]
    assert eval(text, {"FuzzCase": FuzzCase, "Layout": Layout, "MatmulConfig": MatmulConfig}) == case


def test_a_wrong_result_is_caught_with_its_reproduction(monkeypatch):
    """The checks fire: a kernel that skips the last column of C fails, naming the case."""
    real = Plan.run

    def drop_last_column(plan, a, b, out):
        result = real(plan, a, b, out)
        result[:, -1:] = math.nan if out is not None else 0
        return result

    monkeypatch.setattr(Plan, "run", drop_last_column)
    case = FuzzCase("naive", "float32", 9, 9, 9, out=Layout(pad=3), config=MatmulConfig(16, 16, 16))
    with pytest.raises(AssertionError, match=r"not written[\s\S]*reproduce: FUZZ_CASE="):
        check(case)
