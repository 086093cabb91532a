"""Which program computes which output tile: the pure-Python twin of the kernels' pid -> tile math.

Every kernel in the ladder splits C (M x N) into a grid of BLOCK_M x BLOCK_N tiles,
``num_pid_m = cdiv(M, BLOCK_M)`` rows by ``num_pid_n = cdiv(N, BLOCK_N)`` columns, and
numbers the tiles somehow. The numbering decides which tiles run at the same time and so how
often the same A row-panel or B column-panel is found in L2 instead of DRAM.

The functions here are plain integer arithmetic that works on Python ints and on numpy arrays
alike, so the tools (schedule pictures, the L2 simulator) and the tests call them directly. Beside
them, the kernels' copies of the same formulas in each language: ``tl.py`` (`@triton.jit`) and
``gluon.py`` (`@gluon.jit`, and the persistent schedulers built on them); tests/test_tile_order.py
and the GPU tests check that the copies agree with this file by letting a kernel record which
program computed which tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ORDERINGS = ("column_major", "grouped", "persistent", "chunked")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grouped_tile(pid, num_pid_m, num_pid_n, group_size_m):
    """Tile of program ``pid`` when tiles are visited in groups of GROUP_SIZE_M rows.

    Inside a group the order is column-major, so GROUP_SIZE_M consecutive programs share one B
    column-panel and the group as a whole re-reads only GROUP_SIZE_M A row-panels.
    GROUP_SIZE_M = 1 is plain row-major order. The last group is shorter when num_pid_m is not a
    multiple of GROUP_SIZE_M.
    """
    num_pid_in_group = group_size_m * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * group_size_m
    group_size = np.minimum(num_pid_m - first_pid_m, group_size_m)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size
    pid_n = (pid % num_pid_in_group) // group_size
    return pid_m, pid_n


def column_major_tile(pid, num_pid_m):
    """Tile of a 2D launch grid (pid_m, pid_n) = (program_id(0), program_id(1)).

    The hardware hands out blocks with axis 0 fastest, so launch order runs down a column of C.
    """
    return pid % num_pid_m, pid // num_pid_m


# The chunked persistent scheduler gives each program a contiguous range of tile ids and
# delinearizes them the same way, along M first, so a program's chunk walks down a column of C.
chunked_tile = column_major_tile


@dataclass(frozen=True)
class Schedule:
    """For every output tile (indexed [pid_m, pid_n]): which program computed it, at which step of
    that program's loop, and its position in the global launch order."""

    program: np.ndarray  # (num_pid_m, num_pid_n) int
    step: np.ndarray  # (num_pid_m, num_pid_n) int; 0 for one-tile-per-program kernels
    order: np.ndarray  # (num_pid_m, num_pid_n) int; the tile id the ordering gives it
    num_programs: int


def schedule(
    ordering: str,
    num_pid_m: int,
    num_pid_n: int,
    group_size_m: int = 1,
    num_programs: int | None = None,
) -> Schedule:
    """Who computes each tile under ``ordering`` (one of ORDERINGS).

    ``persistent`` is the strided persistent loop (program p takes tile ids p, p + P, p + 2P, ...,
    each mapped through the grouped order); ``chunked`` gives program p a contiguous range of tile
    ids. Both need ``num_programs`` (P); the launchers use min(number of SMs, number of tiles).
    """
    num_tiles = num_pid_m * num_pid_n
    tile_id = np.arange(num_tiles)
    if ordering == "column_major":
        pid_m, pid_n = column_major_tile(tile_id, num_pid_m)
        program, step, programs = tile_id, np.zeros_like(tile_id), num_tiles
    elif ordering == "grouped":
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, group_size_m)
        program, step, programs = tile_id, np.zeros_like(tile_id), num_tiles
    elif ordering in ("persistent", "chunked"):
        if num_programs is None or num_programs < 1:
            raise ValueError(f"schedule: ordering {ordering!r} needs num_programs >= 1, got {num_programs}")
        programs = min(num_programs, num_tiles)
        if ordering == "persistent":
            pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, group_size_m)
            program, step = tile_id % programs, tile_id // programs
        else:
            pid_m, pid_n = chunked_tile(tile_id, num_pid_m)
            per_program = cdiv(num_tiles, programs)
            program, step = tile_id // per_program, tile_id % per_program
    else:
        raise ValueError(f"schedule: unknown ordering {ordering!r}; expected one of {ORDERINGS}")

    out = [np.full((num_pid_m, num_pid_n), -1, dtype=np.int64) for _ in range(3)]
    for grid, values in zip(out, (program, step, tile_id)):
        grid[pid_m, pid_n] = values
    return Schedule(program=out[0], step=out[1], order=out[2], num_programs=programs)


def arrival_tile(tile_id, chunks: int, own: int, chunk_pid_m: int, num_pid_n: int, group_size_m: int, pieces: int = 1):
    """Tile of ``tile_id`` in a GEMM over an all-gather's rows that starts before they have all
    landed (``gluon.arrival_scheduler``, ``distributed/gathered.py``). C's rows are
    ``chunks`` chunks of ``chunk_pid_m`` rows of tiles, chunk r gathered from rank r, each in
    ``pieces`` pieces of ``chunk_pid_m // pieces`` rows of tiles that travel one after another.
    This rank's own chunk, ``own``, is another GEMM's (it waits on nothing); the tile ids run over
    the others in the order they land, own - 1, own - 2, ... (mod chunks, as exchange.py pulls
    them and pushed.py pushes them), piece by piece, each piece's tiles in grouped order within
    it, so that no group spans two pieces.

    Returns (pid_m, pid_n, piece): the tile and the piece whose arrival it waits for, numbered
    chunk * pieces + (piece within the chunk), its arrival word's index."""
    piece_pid_m = chunk_pid_m // pieces
    per_piece = piece_pid_m * num_pid_n
    landing = tile_id // per_piece
    chunk = (own + chunks - 1 - landing // pieces) % chunks
    piece = chunk * pieces + landing % pieces
    pid_m, pid_n = grouped_tile(tile_id % per_piece, piece_pid_m, num_pid_n, group_size_m)
    return piece * piece_pid_m + pid_m, pid_n, piece
