"""Host-side logic of the Hopper kernels, on the CPU: which operands TMA takes, the descriptors,
the shared-memory plan, scheduler selection and default configs. The kernels themselves are
tested on an H100 by tests/gpu/test_hopper.py."""

import pytest
import torch

from tritongemm import dispatch
from tritongemm.core import registry, tma
from tritongemm.core.config import MatmulConfig
from tritongemm.core.tma import empty_output, tma_out_unsupported_reason, tma_unsupported_reason
from tritongemm.dispatch.tiles import (
    BIG_TILE,
    DEEP_RING_STAGES,
    H100_SMS,
    MID_TILE,
    SMALL_TILE,
    TILES,
    TINY_TILE,
    choose_config,
    persistent_pipelined_config,
)
from tritongemm.primitives.gluon.descriptors import make_descriptors
from tritongemm.primitives.gluon.pipeline import barriers_per_slot, check_sequential_fits, plan_ring
from tritongemm.primitives.tiling.gluon import ChunkedScheduler, grouped_scheduler, scheduler_for

F16 = torch.float16


def padded(rows: int, cols: int, dtype=F16) -> torch.Tensor:
    """(rows, cols) view of storage whose rows are padded to a multiple of 8 elements."""
    return torch.zeros(rows, -(-cols // 8) * 8, dtype=dtype)[:, :cols]


# ---------------------------------------------------------------------------------------------
# tma_unsupported_reason: (a, b, expected substring of the reason, or None)
# ---------------------------------------------------------------------------------------------

UNSUPPORTED = [
    ("contiguous fp16", lambda: (torch.zeros(64, 32, dtype=F16), torch.zeros(32, 16, dtype=F16)), None),
    (
        "contiguous bf16",
        lambda: (torch.zeros(64, 32, dtype=torch.bfloat16), torch.zeros(32, 16, dtype=torch.bfloat16)),
        None,
    ),
    (
        "b is a transposed (N, K) weight",
        lambda: (torch.zeros(64, 32, dtype=F16), torch.zeros(16, 32, dtype=F16).T),
        None,
    ),
    ("padded rows make any K legal", lambda: (padded(5, 17), padded(17, 24)), None),
    (
        "one row of a: its stride is never used",
        lambda: (torch.zeros(1, 17, dtype=F16), torch.zeros(17, 8, dtype=F16)),
        None,
    ),
    ("fp32", lambda: (torch.zeros(8, 8), torch.zeros(8, 8)), "float32"),
    ("mixed dtypes", lambda: (torch.zeros(8, 8, dtype=F16), torch.zeros(8, 8, dtype=torch.bfloat16)), "one dtype"),
    (
        "a is M-major (a weight gradient's dY^T)",
        lambda: (torch.zeros(32, 64, dtype=F16).T, torch.zeros(32, 16, dtype=F16)),
        None,
    ),
    (
        "both transposed (tt)",
        lambda: (torch.zeros(32, 64, dtype=F16).T, torch.zeros(16, 32, dtype=F16).T),
        None,
    ),
    (
        "a strided both ways",
        lambda: (torch.zeros(64, 64, dtype=F16)[::2, ::2], torch.zeros(32, 16, dtype=F16)),
        "M-major",
    ),
    (
        "a M-major with rows of 34 bytes",
        lambda: (torch.zeros(4, 17, dtype=F16)[:, :16].T, torch.zeros(4, 8, dtype=F16)),
        "row stride is 17",
    ),
    ("a rows of 34 bytes", lambda: (torch.zeros(4, 17, dtype=F16), torch.zeros(17, 8, dtype=F16)), "row stride is 17"),
    (
        "a 6 bytes off alignment",
        lambda: (torch.zeros(8 * 33, dtype=F16)[3:].view(-1)[: 8 * 32].view(8, 32), torch.zeros(32, 8, dtype=F16)),
        "16-byte aligned",
    ),
    (
        "b strided both ways",
        lambda: (torch.zeros(8, 16, dtype=F16), torch.zeros(32, 32, dtype=F16)[::2, ::2]),
        "K-major",
    ),
    (
        "contiguous C with N = 12",
        lambda: (torch.zeros(8, 16, dtype=F16), torch.zeros(12, 16, dtype=F16).T),
        "C of N = 12",
    ),
]


@pytest.mark.parametrize("make, expected", [(m, e) for _, m, e in UNSUPPORTED], ids=[n for n, _, _ in UNSUPPORTED])
def test_tma_unsupported_reason(make, expected):
    a, b = make()
    reason = tma_unsupported_reason(a, b)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason, reason


def test_n_of_1_reads_b_k_major_and_needs_a_padded_c():
    a, b = torch.zeros(3, 32, dtype=F16), torch.zeros(1, 32, dtype=F16).T  # b (32, 1): strides (1, 1)
    assert "C of N = 1" in tma_unsupported_reason(a, b)
    assert tma_unsupported_reason(a, b, empty_output(3, 1, F16, torch.device("cpu"))) is None
    assert make_descriptors(a, b, empty_output(3, 1, F16, torch.device("cpu")), 64, 64, 64).b_k_major


def test_given_output_replaces_the_contiguous_assumption():
    a, b = torch.zeros(8, 16, dtype=F16), torch.zeros(12, 16, dtype=F16).T  # N = 12
    assert tma_unsupported_reason(a, b, padded(8, 12)) is None


def test_out_must_end_its_rows_on_16_bytes():
    assert tma_out_unsupported_reason(torch.zeros(8, 16, dtype=F16)) is None
    assert tma_out_unsupported_reason(padded(8, 16)) is None
    # A padded view is readable, but the stores' 16-byte chunks would overwrite the padding.
    assert "16-byte chunks" in tma_out_unsupported_reason(padded(8, 12))
    assert "row stride" in tma_out_unsupported_reason(torch.zeros(8, 12, dtype=F16))
    assert "float32" in tma_out_unsupported_reason(torch.zeros(8, 16))


@pytest.mark.parametrize("N", (1, 12, 16))
def test_empty_output_takes_tma_stores_for_any_n(N):
    c = empty_output(5, N, torch.bfloat16, torch.device("cpu"))
    assert c.shape == (5, N) and c.stride(0) % 8 == 0 and c.stride(1) == 1
    assert c.is_contiguous() == (N % 8 == 0)
    assert (
        tma_unsupported_reason(
            torch.zeros(5, 16, dtype=torch.bfloat16), torch.zeros(16, N, dtype=torch.bfloat16).T.contiguous().T, c
        )
        is None
    )


def test_descriptor_blocks_follow_the_b_layout():
    a, c = torch.zeros(256, 128, dtype=F16), torch.zeros(256, 512, dtype=F16)
    row = make_descriptors(a, torch.zeros(128, 512, dtype=F16), c, 128, 256, 64)
    assert not row.b_k_major and row.b.block_shape == [64, 256] and row.c.block_shape == [128, 256]
    k_major = make_descriptors(a, torch.zeros(512, 128, dtype=F16).T, c, 128, 256, 64, epi_split=2)
    assert k_major.b_k_major and k_major.b.block_shape == [256, 64] and list(k_major.b.shape) == [512, 128]
    assert k_major.c.block_shape == [128, 128]
    assert row.a.block_shape == [128, 64] and row.a.layout.swizzle_byte_width == 128


def test_descriptor_blocks_follow_the_a_layout():
    b, c = torch.zeros(128, 512, dtype=F16), torch.zeros(256, 512, dtype=F16)
    m_major = make_descriptors(torch.zeros(128, 256, dtype=F16).T, b, c, 128, 256, 64)
    assert m_major.a_m_major and not m_major.b_k_major
    assert m_major.a.block_shape == [64, 128] and list(m_major.a.shape) == [128, 256]
    assert m_major.layout_constexprs() == dict(A_M_MAJOR=True, B_K_MAJOR=False)
    row = make_descriptors(torch.zeros(256, 128, dtype=F16), b, c, 128, 256, 64)
    assert not row.a_m_major and row.a.block_shape == [128, 64]


class _RecordingLaunch:
    """A compiled kernel's stand-in: `with_descriptors` returns a launch that records its arguments."""

    def __init__(self):
        self.calls = []

    def with_descriptors(self, descriptors, bind):
        self.descriptors = descriptors
        return lambda *args: self.calls.append(args)


def test_descriptor_launch_moves_the_tails_onto_the_same_b_and_c():
    from tritongemm.primitives.gluon.descriptors import descriptor_launch

    compiled = _RecordingLaunch()
    descriptor_launch(compiled, ("a", "b", "c"))("A", "B", "C", 0, 0, 0)
    assert compiled.calls[-1] == ("A", "B", "C", 0, 0, 0)
    # odd_width's tiles: the tails' two descriptors follow c's and move onto the same b and c
    descriptor_launch(compiled, ("a", "b", "c", "b tail", "c tail"), tails=True)("A", "B", "C", 7)
    assert compiled.calls[-1] == ("A", "B", "C", "B", "C", 7)
    with pytest.raises(AssertionError):
        descriptor_launch(compiled, ("a", "b", "c"), tails=True)


def test_descriptors_refuse_what_tma_cannot_read():
    with pytest.raises(ValueError, match="row stride"):
        make_descriptors(
            torch.zeros(4, 17, dtype=F16), torch.zeros(17, 8, dtype=F16), torch.zeros(4, 8, dtype=F16), 64, 64, 64
        )


# ---------------------------------------------------------------------------------------------
# Shared-memory plan
# ---------------------------------------------------------------------------------------------


def test_three_buffers_of_the_big_tile_keep_their_own_c():
    plan = plan_ring(BIG_TILE.with_(num_stages=3), 2)
    assert (plan.steal_b, plan.num_b_buffers, plan.epi_split) == (False, 3, 1)
    assert plan.smem_bytes == 3 * 48 * 1024 + 64 * 1024


def test_four_buffers_of_the_big_tile_steal_b():
    plan = plan_ring(BIG_TILE.with_(num_stages=4), 2)
    # C (64 KB) = two B slots (32 KB each): stored as two 128x128 pieces, one extra B slot.
    assert (plan.steal_b, plan.num_b_buffers, plan.epi_split) == (True, 5, 2)
    assert plan.smem_bytes == 4 * 16 * 1024 + 5 * 32 * 1024


def test_deep_k_tile_steals_one_whole_slot():
    plan = plan_ring(MatmulConfig(128, 256, 128, num_stages=2), 2)
    assert (plan.steal_b, plan.num_b_buffers, plan.epi_split) == (True, 2, 1)


def test_plans_that_cannot_fit_say_so():
    with pytest.raises(ValueError, match="shared memory"):
        plan_ring(BIG_TILE.with_(num_stages=5), 2)
    with pytest.raises(ValueError, match="tma_persistent: .* shared memory"):
        check_sequential_fits("tma_persistent", BIG_TILE.with_(num_stages=5), 2)
    with pytest.raises(ValueError, match="num_stages"):
        check_sequential_fits("tma_pipelined", BIG_TILE.with_(num_stages=1), 2)
    check_sequential_fits("tma_pipelined", BIG_TILE.with_(num_stages=4), 2)  # C overlaps the ring


# ---------------------------------------------------------------------------------------------
# Schedulers and configs
# ---------------------------------------------------------------------------------------------


def test_scheduler_selection():
    assert scheduler_for("chunked", 8) is ChunkedScheduler
    assert scheduler_for("grouped", 8) is grouped_scheduler(8)  # one class per size: one compile
    assert grouped_scheduler(1) is not grouped_scheduler(8)
    # The JIT cache tells constexpr classes apart by name.
    assert repr(grouped_scheduler(1)) != repr(grouped_scheduler(8))
    with pytest.raises(ValueError, match="scheduler"):
        scheduler_for("hilbert", 1)
    with pytest.raises(ValueError, match="GROUP_SIZE_M"):
        grouped_scheduler(0)


@pytest.mark.parametrize(
    "M, N, expected",
    [
        (8192, 8192, BIG_TILE),  # 2048 tiles: plenty
        (2048, 2048, BIG_TILE),  # 128 tiles: 97% of 132 SMs
        (2048, 1024, MID_TILE),  # 64 big tiles would idle half the SMs; 128 mid ones
        (1024, 1024, SMALL_TILE),
        (256, 1024, TINY_TILE),  # 64 tiles, the most any size gives
        (1, 1, TINY_TILE),
    ],
)
def test_choose_config(M, N, expected):
    assert choose_config(M, N, H100_SMS) == expected


@pytest.mark.parametrize(
    "M, N, K, expected",
    [
        (8192, 8192, 8192, BIG_TILE),  # 16 waves of BIG tiles against 32 of MID: BIG
        (4096, 4096, 4096, BIG_TILE),
        (1024, 14336, 4096, MID_TILE.with_(num_stages=6)),  # BIG: 3.4 waves, so 4; MID: 6.8, so 7 < 4 x 1.8
        (512, 28672, 8192, MID_TILE.with_(num_stages=6)),
        (512, 14336, 4096, BIG_TILE),  # 224 BIG tiles: 2 waves; MID: 4 > 2 x 1.8
        (777, 4096, 4096, BIG_TILE),  # 112 BIG tiles (choose_config: too few), MID's 224 spill into a 2nd wave
        (512, 4096, 4096, MID_TILE.with_(num_stages=6)),
        (1024, 1024, 1024, SMALL_TILE.with_(num_stages=8)),  # 16 K-steps: two rings of 8
        (1024, 1024, 960, SMALL_TILE),  # 15 K-steps: short of two rings
        (1000, 1000, 1000, SMALL_TILE),  # N and K not multiples of 64
        (1024, 1000, 4096, SMALL_TILE),
        (256, 1024, 8192, TINY_TILE.with_(num_stages=8)),
        (256, 256, 256, TINY_TILE),
    ],
)
def test_persistent_pipelined_config(M, N, K, expected):
    assert persistent_pipelined_config(M, N, K, H100_SMS) == expected


@pytest.mark.parametrize(
    "world, tokens, expected",
    [(4, 2048, MID_TILE.with_(num_stages=6)), (4, 4096, MID_TILE.with_(num_stages=6)), (4, 8192, BIG_TILE),
     (2, 2048, MID_TILE.with_(num_stages=6)), (2, 4096, BIG_TILE)],
)  # fmt: skip
def test_rung_6s_rule_picks_the_tile_measured_fastest_for_the_gathered_gemms(world, tokens, expected):
    """distributed/gathered.py plans both GEMMs of an all-gather on rung 6's tile for all the rows:
    q,k,v of Llama-3-70B (10240 columns over `world` ranks, K 8192) on an H200's 132 SMs, where
    forcing each tile measured these fastest (its comment; four H100s at 4096 tokens the exception)."""
    assert persistent_pipelined_config(tokens, 10240 // world, 8192, 132) == expected


@pytest.mark.parametrize(
    "world, tokens, big",
    [(4, 2048, False), (4, 4096, True), (2, 2048, True), (2, 4096, True)],
)  # fmt: skip
def test_the_shared_tile_on_h100s_weighs_a_big_wave_as_measured_there(world, tokens, big):
    """gathered.shared_tile on an H100 (131 SMs, one spared): what forcing each tile measured fastest
    for q,k,v of Llama-3-70B on two and four H100s (gathered.py's comment); elsewhere rung 6's rule."""
    from tritongemm.distributed import gathered

    config = gathered.shared_tile(tokens, 10240 // world, 8192, 131, "NVIDIA H100 80GB HBM3")
    assert (config.BLOCK_N == BIG_TILE.BLOCK_N) == big, config
    other = gathered.shared_tile(tokens, 10240 // world, 8192, 131, "NVIDIA H200")
    assert other == persistent_pipelined_config(tokens, 10240 // world, 8192, 131)


def test_rung_6_default_is_its_rules():
    info = registry.get("tma_persistent_pipelined")
    config = dispatch.default_config(info, torch.float16, 512, 4096, 4096, torch.device("cpu"))
    assert config == persistent_pipelined_config(512, 4096, 4096, H100_SMS) != choose_config(512, 4096, H100_SMS)
    rung_5 = registry.get("tma_persistent")  # rungs 4 and 5 keep choose_config's
    assert dispatch.default_config(rung_5, torch.float16, 512, 4096, 4096, torch.device("cpu")) == MID_TILE


@pytest.mark.parametrize("config", [*TILES, *(t.with_(num_stages=s) for t, s in DEEP_RING_STAGES.items())],
                         ids=lambda c: c.short())  # fmt: skip
def test_every_default_fits_every_kernel(config):
    plan_ring(config, 2)
    check_sequential_fits("tma_persistent", config, 2)


def test_default_config_works_without_a_gpu():
    config = dispatch.default_config(registry.get("tma_pipelined"), torch.bfloat16, 8192, 8192, 8192, "cpu")
    assert isinstance(config, MatmulConfig) and config == choose_config(8192, 8192, H100_SMS)


def test_registered_rungs():
    infos = {k.name: k for k in registry.all_kernels("matmul")}
    for name, rung in (("tma_pipelined", 4), ("tma_persistent", 5), ("tma_persistent_pipelined", 6)):
        info = infos[name]
        assert info.rung == rung and not info.interpretable and info.min_capability == (9, 0)
        assert info.dtypes == (torch.float16, torch.bfloat16)
        assert not info.available_on(torch.device("cpu"))


# ---------------------------------------------------------------------------------------------
# what `matmul` hands the kernels: operands TMA can read, an output it can write
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, out",
    [
        (torch.zeros(8, 7, dtype=F16), torch.zeros(7, 16, dtype=F16), None),  # a's rows end mid-chunk
        (torch.zeros(16, 8, dtype=F16).T, torch.zeros(16, 16, dtype=F16), None),  # a M-major: read in place
        (torch.zeros(16, 7, dtype=F16).T, torch.zeros(16, 16, dtype=F16), None),  # a M-major, rows of 14 bytes
        (torch.zeros(8, 16, dtype=F16), torch.zeros(16, 24, dtype=F16)[:, 1:], None),  # b offset by 1
        (torch.zeros(8, 16, dtype=F16), torch.zeros(16, 5, dtype=F16), torch.zeros(8, 5, dtype=F16)),  # N = 5
    ],
)
def test_prepare_copies_only_what_tma_cannot_take(a, b, out):
    from tritongemm.core.tma import plan_operands

    pa, pb, c = plan_operands(a, b, out, a.dtype)(a, b, out)
    assert tma_unsupported_reason(pa, pb, c) is None
    assert torch.equal(pa, a) and torch.equal(pb, b) and c.shape == (a.shape[0], b.shape[1])
    assert (pa is a) == (tma.a_descriptor_view(a)[2] is None)
    assert (c is out) == (out is not None and tma_out_unsupported_reason(out) is None)


@pytest.mark.parametrize(
    "M, b, padded",
    [
        (4096, torch.zeros(40, 3000, dtype=F16), True),  # rows of 6,000 bytes: 47 lines a row, each read twice
        (2047, torch.zeros(40, 3000, dtype=F16), False),  # too few rows of A to repay B's copy
        (4096, torch.zeros(40, 3072, dtype=F16), False),  # rows of 6,144 bytes, 48 whole lines
        (4096, torch.zeros(40, 3000, dtype=F16).T, True),  # a K-major weight view whose rows are 6,000 bytes
        (4096, torch.zeros(40, 3072, dtype=F16).T, False),
    ],
)
def test_prepare_pads_b_rows_to_128_bytes_for_large_m(M, b, padded):
    from tritongemm.core.tma import plan_operands

    a = torch.zeros(M, b.shape[0], dtype=F16)
    pa, pb, c = plan_operands(a, b, None, a.dtype)(a, b, None)
    assert pa is a and (pb is not b) == padded and torch.equal(pb, b)
    if padded:  # in B's own layout (a K-major B's copy is K-major: a copy of whole rows, no transpose)
        view, transposed, _ = tma.b_descriptor_view(pb)
        assert transposed == (b.stride(0) == 1) and view.stride(1) == 1 and view.stride(0) * 2 % 128 == 0
    assert tma_unsupported_reason(pa, pb, c) is None


@pytest.mark.parametrize(
    "t",
    [
        torch.randn(7, 3000).half(),  # rows of 6,000 bytes: copied as int64
        torch.randn(7, 3001).half()[:, 1:],  # rows start 2 bytes into 8: fp16 as it is
        torch.randn(5, 3002).bfloat16()[:, 2:],  # 4 bytes in: int32
        torch.randn(6, 1000).T.half(),  # a transposed view: element by element
        torch.randn(1, 20).half(),
        torch.randn(0, 8).half(),
        torch.randn(9, 13).float(),  # rows of 52 bytes: 4-byte elements already
    ],
)
def test_row_aligned_copy_keeps_the_bits(t):
    copy = tma._row_aligned_copy(t, 128)
    assert copy.dtype == t.dtype and copy.shape == t.shape and torch.equal(copy, t)
    assert copy.stride(1) == 1 and copy.stride(0) * copy.element_size() % 128 == 0


def test_row_aligned_copy_takes_the_widest_elements_it_can():
    t = torch.randn(7, 3000).half()
    target = torch.empty(7, 3008).half()[:, :3000]
    assert [v.dtype for v in tma._widest_views(t, target)] == [torch.int64] * 2
    odd = torch.randn(7, 3001).half()[:, 1:]
    assert tma._widest_views(odd, target)[0].dtype == torch.float16


def test_prepare_keeps_good_operands_and_out():
    from tritongemm.core.tma import plan_operands

    a, b, out = torch.zeros(8, 16, dtype=F16), torch.zeros(24, 16, dtype=F16).T, torch.zeros(8, 24, dtype=F16)
    assert plan_operands(a, b, out, a.dtype)(a, b, out) == (a, b, out)  # b as a K-major weight view: no copy


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_warps=2), "num_warps must be 4 or 8"),
        (dict(BLOCK_M=32), "BLOCK_M must be >= 64"),
        (dict(BLOCK_N=512), "BLOCK_N must be <= 256"),
    ],
)
def test_wgmma_tile_rules(change, message):
    from tritongemm.primitives.gluon.pipeline import check_wgmma_tile

    with pytest.raises(ValueError, match=message):
        check_wgmma_tile("tma_pipelined", BIG_TILE.with_(**change))
    check_wgmma_tile("tma_pipelined", BIG_TILE)


def test_consan_gets_a_barrier_each_for_a_and_b(monkeypatch):
    import triton

    monkeypatch.setattr(triton.knobs.compilation, "instrumentation_mode", "")
    assert barriers_per_slot() == 1
    monkeypatch.setattr(triton.knobs.compilation, "instrumentation_mode", "consan")
    assert barriers_per_slot() == 2


def test_the_sanitizer_workload_builds_its_cases_for_every_kernel():
    """scripts/ci/sanitize_cases.py runs only on a GPU under compute-sanitizer, where a broken case
    list costs a device call (a changed plan_operands signature once did): build every kernel's
    cases here (CPU tensors; nothing is launched)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "scripts" / "ci" / "sanitize_cases.py"
    spec = importlib.util.spec_from_file_location("sanitize_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for info in registry.all_kernels("matmul"):
        for quick in (True, False):
            cases = list(module.cases(info.name, info, quick))
            assert cases and all(len(case) == 4 for case in cases), info.name
    assert len(list(module.grouped_cases(quick=False))) == 5 and len(list(module.grouped_cases(quick=True))) == 1


# ---------------------------------------------------------------------------------------------
# Blackwell: the MMA implementation per GPU, and what the rungs that take tcgen05 plan there
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def gpu_of(monkeypatch):
    """Make device_info answer for a GPU of the given capability (no GPU needed)."""
    from tritongemm.core import device_info

    def as_gpu(capability, sms=148):
        monkeypatch.setattr(device_info, "capability", lambda device: capability)
        monkeypatch.setattr(device_info, "sm_count", lambda device: sms)

    return as_gpu


def test_each_gpu_gets_its_mma(gpu_of):
    from tritongemm.primitives.gluon.mma import WGMMA, mma_for
    from tritongemm.primitives.gluon.tcgen05 import TCGen05MMA

    cuda = torch.device("cuda")
    gpu_of((9, 0))
    assert mma_for("k", cuda) is WGMMA
    for blackwell in ((10, 0), (10, 3)):
        gpu_of(blackwell)
        assert mma_for("k", cuda) is TCGen05MMA
    for other in ((8, 0), (12, 0)):
        gpu_of(other)
        expected = f"k: needs an sm_90 .* or sm_100 .* but cuda is sm_{other[0]}{other[1]}"
        with pytest.raises(RuntimeError, match=expected):
            mma_for("k", cuda)


def test_the_rungs_that_take_tcgen05_run_on_blackwell_and_say_they_never_did(gpu_of):
    cuda = torch.device("cuda")
    gpu_of((10, 0))
    for name in ("tma_persistent_pipelined", "tma_warp_specialized"):
        info = registry.get(name)
        assert info.available_on(cuda)
        assert "compiled for sm_100, never run: no Blackwell GPU was available" in info.describe()["gpu"]
    for name in ("tma_pipelined", "tma_persistent", "split_k", "tma_ping_pong"):
        assert registry.get(name).unavailable_reason(cuda) == "needs compute capability sm_90 only, this GPU is sm_100"
    gpu_of((12, 0))  # consumer Blackwell: no tcgen05
    assert not registry.get("tma_persistent_pipelined").available_on(cuda)


def test_on_blackwell_the_ring_gives_way_to_a_whole_c_tile(gpu_of):
    """tcgen05's epilogue can't cut C into column pieces (pipeline.whole_c_config): the default
    configs there cut the ring instead, and the planners refuse a config that would need pieces."""
    from tritongemm.primitives.gluon.pipeline import whole_c_config

    assert whole_c_config(BIG_TILE, 2) == BIG_TILE.with_(num_stages=3)  # 3 x 48 KB + 64 KB
    assert whole_c_config(MID_TILE, 2) == MID_TILE  # 4 x 32 KB + 32 KB fit already
    with pytest.raises(ValueError, match="not even 2 ring slots"):
        whole_c_config(BIG_TILE.with_(BLOCK_K=256), 2)
    cuda = torch.device("cuda")
    info = registry.get("tma_persistent_pipelined")
    gpu_of((9, 0), sms=132)
    assert dispatch.default_config(info, torch.bfloat16, 8192, 8192, 8192, cuda) == BIG_TILE  # 4 slots, C in B's
    gpu_of((10, 0))
    assert dispatch.default_config(info, torch.bfloat16, 8192, 8192, 8192, cuda) == BIG_TILE.with_(num_stages=3)
