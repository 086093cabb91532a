"""The pure-Python twin of the row-group kernel's schedule (grouped/tl.py's _groups_along_m_kernel):
which program computes which output tile, and in which of its steps, for groups of given sizes.
For the docs' picture and the tests; the kernel computes the same from `offs` on the device.

    python3 -m tritongemm.tools.grouped_schedule --out docs/img/grouped-schedule.png
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tritongemm.primitives import tiling
from tritongemm.tools import figures


@dataclass(frozen=True)
class Tile:
    group: int  # == len(sizes) for the rows after the last group (written as zeros)
    row: int  # first output row
    col: int  # first output column
    program: int
    step: int  # the program's how-manieth tile


def schedule(sizes: list[int], tail: int, N: int, BLOCK_M: int, BLOCK_N: int, programs: int,
             group_size_m: int = 1) -> list[Tile]:  # fmt: skip
    """Every output tile of groups of `sizes` rows (then `tail` rows past the last group): each
    group's tiles numbered on from the groups before, in the ladder's L2 order within the group
    (tiling.grouped_tile), and tile t taken by program t % programs, as the kernel does."""
    tiles_n = -(-N // BLOCK_N)
    tiles, seen, start, steps = [], 0, 0, [0] * programs
    for group, rows in enumerate([*sizes, tail]):
        tiles_m = -(-rows // BLOCK_M)
        count = tiles_m * tiles_n
        for t in range(seen, seen + count):
            program = t % programs
            tile_m, tile_n = map(int, tiling.grouped_tile(t - seen, tiles_m, tiles_n, group_size_m))
            tiles.append(Tile(group, start + tile_m * BLOCK_M, tile_n * BLOCK_N, program, steps[program]))
            steps[program] += 1
        seen += count
        start += rows
    return tiles


def plot(sizes: list[int], tail: int, N: int, BLOCK_M: int, BLOCK_N: int, programs: int, group_size_m: int,
         path) -> None:  # fmt: skip
    """The output's rows and columns, each tile in its program's color with its step, the groups'
    ends as lines: ragged groups leave partial tiles, an empty group none."""
    plt = figures.pyplot()
    M = sum(sizes) + tail
    fig, ax = plt.subplots(figsize=(9, min(14, 2 + 7 * M / max(N, 1))))
    colors = plt.get_cmap("tab10")
    for tile in schedule(sizes, tail, N, BLOCK_M, BLOCK_N, programs, group_size_m):
        group_end = sum(sizes[: tile.group + 1]) if tile.group < len(sizes) else M
        height = min(BLOCK_M, group_end - tile.row)
        width = min(BLOCK_N, N - tile.col)
        zero = tile.group == len(sizes)
        ax.add_patch(plt.Rectangle((tile.col, tile.row), width, height, facecolor=colors(tile.program % 10),
                                   alpha=0.25 if zero else 0.8, edgecolor="white"))  # fmt: skip
        ax.text(tile.col + width / 2, tile.row + height / 2, f"P{tile.program}.{tile.step}", ha="center",
                va="center", fontsize=7)  # fmt: skip
    end = 0
    for g, rows in enumerate(sizes):
        end += rows
        ax.axhline(end, color="black", linewidth=1)
        ax.text(N + 2, end - rows / 2, f"expert {g}: {rows} rows", va="center", fontsize=8)
    ax.text(N + 2, M - tail / 2, f"past the last: {tail} rows (zeros)", va="center", fontsize=8)
    ax.set_xlim(0, N)
    ax.set_ylim(M, 0)
    ax.set_xlabel("output column")
    ax.set_ylabel("output row (tokens, sorted by expert)")
    ax.set_title(f"grouped_mm: {programs} persistent programs, {BLOCK_M} x {BLOCK_N} tiles in bands of "
                 f"{group_size_m} tile rows, P<program>.<step>", fontsize=9)  # fmt: skip
    figures.save(fig, path, dpi=110)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Draw the row-group kernel's schedule for a toy MoE layer.")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    # Six experts of a toy layer: ragged, one empty, one with fewer rows than a tile; three programs.
    plot([70, 0, 150, 20, 96, 40], 24, 256, 32, 64, 3, 2, args.out)
