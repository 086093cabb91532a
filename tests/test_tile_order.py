"""The pure-Python tile orderings, and proof that the kernels follow them: each kernel runs with
TRACE=True and records, for every tile, which program computed it and at which step."""

import numpy as np
import pytest
import torch
from cases import DEVICE

from tritongemm.core.config import MatmulConfig
from tritongemm.ladder import grouped, naive, persistent
from tritongemm.primitives import tiling as tile_order
from tritongemm.primitives.tl import host as _host

ORDERING_OF = {"naive": "column_major", "grouped": "grouped", "persistent": "persistent"}
LAUNCHERS = {"naive": naive.launch, "grouped": grouped.launch, "persistent": persistent.launch}


@pytest.mark.parametrize("ordering", tile_order.ORDERINGS)
@pytest.mark.parametrize("num_pid_m, num_pid_n, group", [(1, 1, 1), (5, 4, 3), (7, 9, 8), (12, 3, 1), (6, 6, 6)])
def test_every_tile_is_computed_exactly_once(ordering, num_pid_m, num_pid_n, group):
    s = tile_order.schedule(ordering, num_pid_m, num_pid_n, group, num_programs=4)
    assert (s.program >= 0).all()
    assert sorted(s.order.ravel().tolist()) == list(range(num_pid_m * num_pid_n))
    pairs = set(zip(s.program.ravel().tolist(), s.step.ravel().tolist()))
    assert len(pairs) == num_pid_m * num_pid_n  # no program computes two tiles at one step


def test_group_size_one_is_row_major():
    s = tile_order.schedule("grouped", 3, 4, group_size_m=1)
    assert s.order.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_grouped_order_walks_down_groups_of_rows():
    s = tile_order.schedule("grouped", 5, 3, group_size_m=2)
    # rows 0-1 form group 0 (column-major inside), rows 2-3 group 1, row 4 a partial group.
    assert s.order.tolist() == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11], [12, 13, 14]]


def test_chunked_gives_contiguous_ranges():
    s = tile_order.schedule("chunked", 3, 3, num_programs=4)  # 9 tiles, 3 per program
    assert s.program.tolist() == [[0, 1, 2], [0, 1, 2], [0, 1, 2]]
    assert s.step.tolist() == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]


@pytest.mark.parametrize("kernel", list(LAUNCHERS))
@pytest.mark.parametrize("M, N, group", [(80, 64, 2), (100, 50, 3), (16, 160, 8)])
def test_kernel_follows_python_twin(kernel, M, N, group):
    config = MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_SIZE_M=group, num_stages=1)
    num_pid_m, num_pid_n = tile_order.cdiv(M, 16), tile_order.cdiv(N, 16)
    a = torch.randn(M, 16, device=DEVICE, dtype=torch.float16)
    b = torch.randn(16, N, device=DEVICE, dtype=torch.float16)
    c = torch.empty(M, N, device=DEVICE, dtype=torch.float16)
    trace = torch.full((num_pid_m, num_pid_n, 2), -1, dtype=torch.int32, device=DEVICE)
    LAUNCHERS[kernel](a, b, c, config, trace=trace)

    expected = tile_order.schedule(
        ORDERING_OF[kernel], num_pid_m, num_pid_n, group, num_programs=_host.sm_count(DEVICE)
    )
    np.testing.assert_array_equal(trace[..., 0].cpu().numpy(), expected.program)
    np.testing.assert_array_equal(trace[..., 1].cpu().numpy(), expected.step)


@pytest.mark.parametrize("chunks, own", [(2, 0), (2, 1), (4, 0), (4, 3), (3, 1)])
@pytest.mark.parametrize(
    "chunk_pid_m, num_pid_n, group, pieces",
    [(4, 10, 8, 1), (3, 5, 2, 1), (1, 7, 8, 1), (4, 10, 8, 2), (6, 5, 2, 3), (4, 3, 1, 4)],
)
def test_arrival_order_covers_every_other_chunk_once_in_landing_order(
    chunks, own, chunk_pid_m, num_pid_n, group, pieces
):
    """distributed/gathered.py's GEMM: every tile of every chunk but this rank's own exactly once,
    the chunks in the order exchange.py pulls them (own - 1, own - 2, ...), each chunk's pieces in
    row order, each tile in the piece whose arrival word it waits on (chunk * pieces + piece)."""
    tiles = (chunks - 1) * chunk_pid_m * num_pid_n
    pid_m, pid_n, piece = tile_order.arrival_tile(np.arange(tiles), chunks, own, chunk_pid_m, num_pid_n, group, pieces)
    covered = set(zip(pid_m.tolist(), pid_n.tolist()))
    expected = {(m, n) for m in range(chunks * chunk_pid_m) for n in range(num_pid_n) if m // chunk_pid_m != own}
    assert covered == expected and len(covered) == tiles
    assert (pid_m // (chunk_pid_m // pieces) == piece).all()
    landing = [(own - s) % chunks * pieces + p for s in range(1, chunks) for p in range(pieces)]
    firsts = [landing.index(p) for p in piece.tolist()]
    assert firsts == sorted(firsts), "a piece's tiles before an earlier-landing piece's"
