"""Host-side logic of the Hopper kernels, on the CPU: which operands TMA takes, the descriptors,
the shared-memory plan, scheduler selection and default configs. The kernels themselves are
tested on an H100 by tests/gpu/test_hopper.py."""

import pytest
import torch

from tritongemm import registry
from tritongemm.config import MatmulConfig
from tritongemm.hopper import BIG_TILE, H100_SMS, choose_config, default_config
from tritongemm.hopper.descriptors import make_descriptors, tma_out_unsupported_reason, tma_unsupported_reason
from tritongemm.hopper.pipeline import check_sequential_fits, plan_ring
from tritongemm.hopper.schedulers import ChunkedScheduler, grouped_scheduler, scheduler_for

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
    (
        "GEMV: N = 1 through the K-major view",
        lambda: (torch.zeros(1, 32, dtype=F16), torch.zeros(1, 32, dtype=F16).T),
        None,
    ),
    ("fp32", lambda: (torch.zeros(8, 8), torch.zeros(8, 8)), "float32"),
    ("mixed dtypes", lambda: (torch.zeros(8, 8, dtype=F16), torch.zeros(8, 8, dtype=torch.bfloat16)), "one dtype"),
    ("a column-major", lambda: (torch.zeros(32, 64, dtype=F16).T, torch.zeros(32, 16, dtype=F16)), "unit stride"),
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


def test_given_output_replaces_the_contiguous_assumption():
    a, b = torch.zeros(8, 16, dtype=F16), torch.zeros(12, 16, dtype=F16).T  # N = 12
    assert tma_unsupported_reason(a, b, padded(8, 12)) is None
    assert tma_out_unsupported_reason(padded(8, 12)) is None
    assert "row stride" in tma_out_unsupported_reason(torch.zeros(8, 12, dtype=F16))
    assert "float32" in tma_out_unsupported_reason(torch.zeros(8, 16))


def test_descriptor_blocks_follow_the_b_layout():
    a, c = torch.zeros(256, 128, dtype=F16), torch.zeros(256, 512, dtype=F16)
    row = make_descriptors(a, torch.zeros(128, 512, dtype=F16), c, 128, 256, 64)
    assert not row.b_k_major and row.b.block_shape == [64, 256] and row.c.block_shape == [128, 256]
    k_major = make_descriptors(a, torch.zeros(512, 128, dtype=F16).T, c, 128, 256, 64, epi_split=2)
    assert k_major.b_k_major and k_major.b.block_shape == [256, 64] and list(k_major.b.shape) == [512, 128]
    assert k_major.c.block_shape == [128, 128]
    assert row.a.block_shape == [128, 64] and row.a.layout.swizzle_byte_width == 128


def test_descriptors_refuse_what_tma_cannot_read():
    with pytest.raises(ValueError, match="row stride"):
        make_descriptors(
            torch.zeros(4, 17, dtype=F16), torch.zeros(17, 8, dtype=F16), torch.zeros(4, 8, dtype=F16), 64, 64, 64
        )


# ---------------------------------------------------------------------------------------------
# Shared-memory plan
# ---------------------------------------------------------------------------------------------


def test_three_buffers_of_the_big_tile_keep_their_own_c():
    plan = plan_ring(BIG_TILE, 2)
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
        (8192, 8192, (128, 256)),  # 2048 tiles: plenty
        (2048, 2304, (128, 256)),  # 144 tiles >= 132 SMs
        (2048, 1024, (128, 128)),  # 64 big tiles would idle half the SMs; 128 mid tiles
        (1000, 500, (64, 128)),
        (1, 4096, (64, 128)),
    ],
)
def test_choose_config(M, N, expected):
    config = choose_config(M, N, H100_SMS)
    assert (config.BLOCK_M, config.BLOCK_N) == expected
    assert plan_ring(config, 2) is not None  # every default fits the persistent pipelined ring


def test_default_config_works_without_a_gpu():
    config = default_config(torch.bfloat16, 8192, 8192, 8192, torch.device("cpu"))
    assert isinstance(config, MatmulConfig) and config == choose_config(8192, 8192, H100_SMS)


def test_registered_rungs():
    infos = {k.name: k for k in registry.all_kernels()}
    for name, rung in (("tma_pipelined", 4), ("tma_persistent", 5), ("tma_persistent_pipelined", 6)):
        info = infos[name]
        assert info.rung == rung and not info.interpretable and info.min_capability == (9, 0)
        assert info.dtypes == (torch.float16, torch.bfloat16)
        assert not info.available_on(torch.device("cpu"))
