"""tools/l2.py: the L2 reuse model, on grids small enough to count by hand."""

from dataclasses import dataclass

import numpy as np
import pytest

from tritongemm.cli import main
from tritongemm.core.config import MatmulConfig
from tritongemm.tools import l2, launch

TILE = 16 * 16 * 2  # bytes of one 16-row panel slice at K = 16, 2-byte elements


@dataclass(frozen=True)
class Case:
    kernel: str
    group: int
    l2_bytes: int
    dram_panels: int  # DRAM bytes / TILE: 16-row (or 16-column) panels fetched, over all waves
    note: str


# 64 x 64 x 16 with 16 x 16 tiles: a 4 x 4 grid, 4 SMs, so a wave is 4 tiles. Ideal: 8 panels.
CASES = [
    Case("naive", 1, 0, 20, "a wave is one column: 4 A panels + 1 B panel, 4 waves"),
    Case("grouped", 1, 0, 20, "row-major: 1 A panel + 4 B panels per wave"),
    Case("grouped", 2, 0, 16, "2 x 2 squares: 2 + 2 panels per wave"),
    Case("grouped", 4, 0, 20, "a group is the whole grid, column-major inside: as naive"),
    Case("persistent", 2, 0, 16, "4 programs: step s is the same 4 tiles as grouped wave s"),
    Case("naive", 5 * TILE, 5 * TILE, 8, "one wave's 5 panels fit: the next wave finds its A panels"),
    Case("naive", 1, 4 * TILE, 20, "4 panels do not hold a 5-panel wave: no reuse across waves"),
    Case("grouped", 2, 2**20, 8, "all of A and B fit: each panel fetched once"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.kernel}-g{c.group}-l2_{c.l2_bytes}")
def test_dram_panels(case):
    config = MatmulConfig(BLOCK_M=16, BLOCK_N=16, GROUP_SIZE_M=case.group)
    plan = launch.plan(case.kernel, 64, 64, config, num_sms=4, resident=1)
    e = l2.simulate(plan, K=16, itemsize=2, l2_bytes=case.l2_bytes)
    assert e.dram_bytes == case.dram_panels * TILE, case.note
    assert e.ideal_bytes == 8 * TILE
    assert e.request_bytes == 16 * 2 * TILE  # every tile loads one A and one B panel slice
    assert e.read_hit_rate == pytest.approx(1 - case.dram_panels / 32)
    assert e.hit_rate == pytest.approx(1 - case.dram_panels / (32 + 16))  # + C: 64 x 64 x 2 bytes, all hits


def test_edge_panels_are_short():
    np.testing.assert_array_equal(l2.panel_sizes(40, 16), [16, 16, 8])
    plan = launch.plan("naive", 40, 20, MatmulConfig(BLOCK_M=16, BLOCK_N=16), num_sms=8)
    e = l2.simulate(plan, K=10, itemsize=4, l2_bytes=0)  # one wave: every panel once
    assert e.dram_bytes == e.ideal_bytes == (40 + 20) * 10 * 4


def test_h100_grouping_cuts_dram_traffic():
    """8192^3 bf16 at 128x256: a wave's panels (~90-150 MB) overflow the 50 MB L2, so the ordering
    decides the traffic; GROUP_SIZE_M = 8 reads about a third less than column-major."""
    naive = l2.estimate("naive", 8192, 8192, 8192)
    grouped = l2.estimate("grouped", 8192, 8192, 8192)
    assert grouped.launch.config.GROUP_SIZE_M == 8
    assert naive.wave_bytes.mean() > launch.H100.l2_bytes
    assert grouped.dram_bytes < 0.7 * naive.dram_bytes
    assert 0.80 < naive.read_hit_rate < grouped.read_hit_rate < 0.95


def test_small_k_fits_in_l2():
    e = l2.estimate("tma_pipelined", 8192, 8192, 512)  # A and B: 17 MB
    assert e.traffic_ratio == pytest.approx(1.0)


def test_sweep_has_one_row_per_group_size_where_it_matters():
    rows = l2.sweep(["naive", "grouped", "tma_persistent"], 2048, 2048, 1024, group_sizes=(1, 8))
    labels = [(e.launch.kernel, e.launch.ordering, e.launch.config.GROUP_SIZE_M) for e in rows]
    assert labels == [
        ("naive", "column_major", 8),
        ("grouped", "grouped", 1),
        ("grouped", "grouped", 8),
        ("tma_persistent", "persistent", 1),
        ("tma_persistent", "persistent", 8),
        ("tma_persistent", "chunked", 8),
    ]


def test_l2_command_prints_table_and_plot(tmp_path, capsys):
    out = tmp_path / "l2.png"
    argv = ["l2", "4096", "4096", "4096", "--kernels", "naive,grouped,tma_persistent", "--plot", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "column_major" in text and "chunked" in text and "G=8" in text
    assert out.stat().st_size > 0


def test_odd_width_is_modelled_on_its_tiles_under_both_schedulers():
    rows = l2.sweep(["odd_width"], 512, 2560, 8192, group_sizes=(8,))
    assert [(e.launch.ordering, e.launch.config.BLOCK_N) for e in rows] == [("persistent", 192), ("chunked", 192)]
    assert rows[0].launch.num_waves == 1  # 112 tiles of 64 x 192 on 132 SMs (rung 6's 64 x 128: 160, two waves)


@pytest.mark.parametrize("kernel", ["split_k", "stream_k", "split_tail", "swap_ab"])
def test_a_rung_that_splits_k_is_refused_by_name(kernel):
    with pytest.raises(ValueError, match=f"l2: kernel '{kernel}' splits K across programs.*does not cover"):
        l2.estimate(kernel, 64, 4096, 14336)
    assert kernel not in l2.KERNELS and kernel in l2.REFUSED


def test_a_block_for_every_kernel_leaves_odd_width_out_unless_asked(capsys):
    assert main("l2 2048 2048 1024 --block 128,128,64 --group-sizes 8".split()) == 0
    text = capsys.readouterr().out
    assert "tma_persistent_pipelined" in text and "odd_width" not in text
    assert main("l2 2048 2048 1024 --group-sizes 8".split()) == 0
    assert "odd_width" in capsys.readouterr().out  # its own tiles by default
