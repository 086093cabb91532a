"""tools/launch.py and tools/schedule.py: kernel -> ordering, programs per SM, waves, and the
picture's numbers (which must be tile_order's, the mapping the kernels are tested against)."""

import numpy as np
import pytest

from tritongemm.cli import main
from tritongemm.core import registry
from tritongemm.core.config import MatmulConfig
from tritongemm.primitives import tiling as tile_order
from tritongemm.tools import launch, schedule

# (kernel, scheduler) -> the tile_order ordering it follows
ORDERINGS = [
    ("naive", "grouped", "column_major"),
    ("grouped", "grouped", "grouped"),
    ("persistent", "grouped", "persistent"),
    ("persistent", "chunked", "persistent"),  # the triton.language rung has no chunked scheduler
    ("tma_pipelined", "grouped", "column_major"),
    ("tma_persistent", "grouped", "persistent"),
    ("tma_persistent", "chunked", "chunked"),
    ("tma_persistent_pipelined", "grouped", "persistent"),
    ("tma_persistent_pipelined", "chunked", "chunked"),
    ("swap_ab", "grouped", "column_major"),  # C.T's tiles row by row: C's column by column
    ("tma_warp_specialized", "chunked", "chunked"),
    ("tma_ping_pong", "grouped", "persistent"),
    ("odd_width", "grouped", "persistent"),
    ("odd_width", "chunked", "chunked"),
]


@pytest.mark.parametrize("kernel, scheduler, ordering", ORDERINGS)
def test_kernel_follows_ordering(kernel, scheduler, ordering):
    assert launch.ordering_of(kernel, scheduler) == ordering


def test_every_rung_is_modelled_or_refused_with_a_reason():
    """A new rung of the registry must be given a tile order here, or a reason the tools refuse it."""
    rungs = [k.name for k in registry.all_kernels("matmul")]
    assert sorted(rungs) == sorted([*launch.TILE_ORDERS, *launch.SPLITS_K])  # each in one of them, once
    assert launch.KERNELS == tuple(r for r in rungs if r in launch.TILE_ORDERS)  # in ladder order
    assert schedule.KERNELS == launch.KERNELS and set(schedule.REFUSED) == set(launch.SPLITS_K)


@pytest.mark.parametrize("kernel", sorted(launch.SPLITS_K))
def test_a_rung_that_splits_k_is_refused_by_name(kernel):
    with pytest.raises(ValueError, match=f"kernel '{kernel}' splits K across programs"):
        launch.ordering_of(kernel)


# (kernel, config, bytes per element) -> programs one H100 SM holds
RESIDENT = [
    ("grouped", MatmulConfig(128, 256, 64, num_warps=8, num_stages=3), 2, 1),  # 145 KB of smem
    ("grouped", MatmulConfig(128, 128, 64, num_warps=4, num_stages=4), 2, 1),  # 129 KB
    ("naive", MatmulConfig(64, 64, 64, num_warps=4, num_stages=4), 2, 3),  # 65 KB
    ("naive", MatmulConfig(64, 64, 32, num_warps=4, num_stages=2), 2, 5),  # registers: 96 x 128 threads
    ("persistent", MatmulConfig(64, 64, 64, num_warps=4, num_stages=4), 2, 1),  # one program per SM by design
]


@pytest.mark.parametrize("kernel, config, itemsize, expected", RESIDENT)
def test_programs_per_sm(kernel, config, itemsize, expected):
    assert launch.programs_per_sm(kernel, config, itemsize) == expected


def test_one_tile_kernels_run_in_waves_of_launch_order():
    config = MatmulConfig(BLOCK_M=16, BLOCK_N=16, GROUP_SIZE_M=2)
    plan = launch.plan("grouped", 80, 48, config, num_sms=3, resident=2)  # 5 x 3 tiles, 6 in flight
    expected = tile_order.schedule("grouped", 5, 3, 2).order // 6
    np.testing.assert_array_equal(plan.wave, expected)
    assert (plan.num_waves, plan.wave_size) == (3, 6)


def test_persistent_waves_are_steps():
    config = MatmulConfig(BLOCK_M=16, BLOCK_N=16, GROUP_SIZE_M=2, scheduler="chunked")
    plan = launch.plan("tma_persistent", 80, 48, config, num_sms=4)  # 15 tiles, 4 programs x 4 steps
    s = tile_order.schedule("chunked", 5, 3, num_programs=4)
    np.testing.assert_array_equal(plan.wave, s.step)
    assert (plan.num_waves, plan.wave_size) == (4, 4)


@pytest.mark.parametrize("kernel, scheduler, _", ORDERINGS)
def test_picture_numbers_are_tile_order(kernel, scheduler, _):
    width = 48 if kernel == "odd_width" else 16  # an odd width: 32 + 16
    config = MatmulConfig(BLOCK_M=16, BLOCK_N=width, GROUP_SIZE_M=3, scheduler=scheduler)
    plan = launch.plan(kernel, 100, 5 * width - 10, config, num_sms=5)
    s = tile_order.schedule(launch.ordering_of(kernel, scheduler), 7, 5, 3, num_programs=5)
    labels = schedule.cell_labels(plan)
    for (i, j), text in np.ndenumerate(labels):
        if launch.ordering_of(kernel, scheduler) in ("persistent", "chunked"):
            assert text == f"{s.program[i, j]}/{s.step[i, j]}"
        else:
            assert text == str(s.order[i, j])


@pytest.mark.parametrize("kernel", launch.KERNELS)
def test_schedule_command_writes_png(kernel, tmp_path, capsys):
    out = tmp_path / f"{kernel}.png"
    argv = f"schedule 512 384 --kernel {kernel} --sms 8 --group-size-m 2 --out {out}".split()
    assert main(argv) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out


def test_large_grid_draws_without_numbers(tmp_path):
    config = MatmulConfig(BLOCK_M=128, BLOCK_N=256)
    plan = launch.plan("grouped", 8192, 8192, config)  # 2048 tiles: colour only
    assert schedule.draw(plan, tmp_path / "big.png").stat().st_size > 0


def test_swap_ab_is_drawn_a_program_a_tile_with_k_whole(tmp_path, capsys):
    assert (
        main(f"schedule 64 512 --kernel swap_ab --block-m 16 --block-n 64 --sms 4 --out {tmp_path / 's.png'}".split())
        == 0
    )
    assert "swap_ab (column_major, K whole: split_k=1) 64x512, tiles 16x64: 4x8 = 32 tiles, " in capsys.readouterr().out


def test_odd_width_takes_its_own_tile_by_default(tmp_path, capsys):
    assert main(f"schedule 512 2560 --kernel odd_width --out {tmp_path / 'o.png'}".split()) == 0
    assert "odd_width (persistent, GROUP_SIZE_M=8) 512x2560, tiles 64x192: 8x14 = 112 tiles" in capsys.readouterr().out


def test_bad_kernel_says_what_is_expected():
    with pytest.raises(ValueError, match="unknown kernel 'fast'; expected one of"):
        launch.ordering_of("fast")


def test_odd_widths_are_drawn_in_rung_6_s_order_and_other_widths_refused(tmp_path, capsys):
    out = tmp_path / "odd.png"
    argv = f"schedule 512 2560 --kernel tma_persistent_pipelined --block-m 64 --block-n 160 --out {out}".split()
    assert main(argv) == 0
    assert "8x16 = 128 tiles, 128 persistent programs, 1 steps" in capsys.readouterr().out
    assert main("schedule 512 2560 --block-n 100".split()) != 0
    assert "the sum of two (96, 160, 192, ...), but got '100'" in capsys.readouterr().err
