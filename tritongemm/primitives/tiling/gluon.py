"""Persistent tile schedulers: which output tiles one persistent program computes, in which order.

A persistent kernel launches P = min(#SMs, #tiles) programs and each loops over its share of the
tiles. Both schedulers have the same interface, so a kernel takes the class as a constexpr:

    scheduler = Scheduler.initialize(M, N, BLOCK_M, BLOCK_N)
    for idx in range(scheduler.get_num_tiles()):
        pid_m, pid_n = scheduler.get_tile(idx)

The formulas are Gluon copies of `tritongemm.primitives.tiling` (the "chunked" ordering, and
`grouped_tile` on the strided tile ids of the "persistent" ordering); tests/gpu/test_hopper.py
records what a kernel computes and compares it with `tile_order.schedule`.
"""

# No `from __future__ import annotations`: aggregates check field types against real annotations.
import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.core import _aggregate as aggregate

from tritongemm.core import device_info


@aggregate
class ChunkedScheduler:
    """Program p owns the contiguous tile ids [p * cdiv(T, P), (p + 1) * cdiv(T, P)), delinearized
    along M first, so consecutive steps of one program walk down a column of C and keep reusing its
    B column-panel. The last programs may get fewer tiles, or none."""

    start: gl.tensor  # first tile id of this program
    end: gl.tensor  # one past its last tile id
    num_pid_m: gl.tensor

    @gluon.constexpr_function
    def __init__(self, start, end, num_pid_m):
        self.start = start
        self.end = end
        self.num_pid_m = num_pid_m

    @gluon.jit
    def initialize(M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_tiles = num_pid_m * gl.cdiv(N, BLOCK_N)
        tiles_per_program = gl.cdiv(num_tiles, gl.num_programs(axis=0))
        start = gl.program_id(axis=0) * tiles_per_program
        end = gl.minimum(start + tiles_per_program, num_tiles)
        return ChunkedScheduler(start, end, num_pid_m)

    @gluon.jit
    def get_num_tiles(self):
        return gl.maximum(self.end - self.start, 0)

    @gluon.jit
    def get_tile(self, idx):
        tile_id = self.start + idx
        return tile_id % self.num_pid_m, tile_id // self.num_pid_m


@gluon.jit
def grouped_tile(tile_id, num_pid_m, num_pid_in_group, GROUP_SIZE_M: gl.constexpr):
    """The tile of `tile_id` in the grouped (super-row) order of 03-matrix-multiplication, over
    num_pid_m rows of tiles, num_pid_in_group = GROUP_SIZE_M * (columns of tiles)."""
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    # The last group is shorter when num_pid_m % GROUP_SIZE_M != 0: index within the group first,
    # then wrap by its real height (the seed's `tile_id % group_size_m` skips that).
    group_size_m = gl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    in_group = tile_id % num_pid_in_group
    return first_pid_m + in_group % group_size_m, in_group // group_size_m


@functools.cache
def grouped_scheduler(group_size_m: int):
    """The strided scheduler for one GROUP_SIZE_M: program p takes tile ids p, p + P, p + 2P, ...,
    each mapped through the grouped (super-row) order of 03-matrix-multiplication.

    A class per group size, like a C++ template; cached so that each size is one class and so one
    compiled kernel.
    """
    if not isinstance(group_size_m, int) or group_size_m < 1:
        raise ValueError(f"grouped_scheduler: GROUP_SIZE_M must be an int >= 1, but got {group_size_m!r}")
    GROUP_SIZE_M = gl.constexpr(group_size_m)

    @aggregate
    class GroupedScheduler:
        first_tile: gl.tensor  # = program id
        num_pid_m: gl.tensor
        num_pid_in_group: gl.tensor  # GROUP_SIZE_M rows of tiles
        num_tiles: gl.tensor

        @gluon.constexpr_function
        def __init__(self, first_tile, num_pid_m, num_pid_in_group, num_tiles):
            self.first_tile = first_tile
            self.num_pid_m = num_pid_m
            self.num_pid_in_group = num_pid_in_group
            self.num_tiles = num_tiles

        @gluon.jit
        def initialize(M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
            num_pid_m = gl.cdiv(M, BLOCK_M)
            num_pid_n = gl.cdiv(N, BLOCK_N)
            return GroupedScheduler(gl.program_id(axis=0), num_pid_m, GROUP_SIZE_M * num_pid_n, num_pid_m * num_pid_n)

        @gluon.jit
        def get_num_tiles(self):
            return gl.cdiv(self.num_tiles - self.first_tile, gl.num_programs(axis=0))

        @gluon.jit
        def get_tile(self, idx):
            tile_id = self.first_tile + idx * gl.num_programs(axis=0)
            return grouped_tile(tile_id, self.num_pid_m, self.num_pid_in_group, GROUP_SIZE_M)

    # The JIT cache keys a constexpr class by its repr: one name per group size keeps them apart.
    GroupedScheduler.__name__ = GroupedScheduler.__qualname__ = f"GroupedScheduler_G{group_size_m}"
    return GroupedScheduler


@functools.cache
def arrival_scheduler(group_size_m: int, chunks: int, own: int, arrivals: int, pieces: int = 1):
    """The scheduler of a GEMM over an all-gather's rows that starts before they have all landed
    (distributed/gathered.py): C's M rows are `chunks` chunks of M // chunks rows, chunk r gathered
    from rank r, each travelling as `pieces` pieces of consecutive rows; every chunk but this
    rank's `own` (another GEMM's), in the order they land, piece by piece, each piece's tiles in
    grouped order within it (tile_order.arrival_tile), strided over the programs as
    GroupedScheduler's. `get_tile` returns a tile only once its piece has landed: it waits until
    the piece's 32-bit word at address `arrivals` + 4 * (chunk * pieces + piece) is non-zero, which
    the stream that copies the piece in sets after the copy (exchange.py). The caller asks for a
    tile just before it issues the tile's first loads, so no load reads a row still on its way.

    The address is compiled in: the words are one allocation per group and device that lives as
    long as the process (exchange.arrival_words), so a class per address is one per group.
    The rows per piece must be a multiple of BLOCK_M (the host checks): a tile never waits on two."""
    for name, value, least in (("group_size_m", group_size_m, 1), ("chunks", chunks, 2), ("arrivals", arrivals, 1),
                               ("pieces", pieces, 1)):  # fmt: skip
        if not isinstance(value, int) or value < least:
            raise ValueError(f"arrival_scheduler: {name} must be an int >= {least}, but got {value!r}")
    if not isinstance(own, int) or not 0 <= own < chunks:
        raise ValueError(f"arrival_scheduler: own must be an int in [0, {chunks}), but got {own!r}")
    GROUP_SIZE_M = gl.constexpr(group_size_m)
    CHUNKS = gl.constexpr(chunks)
    OWN = gl.constexpr(own)
    ARRIVALS = gl.constexpr(arrivals)
    PIECES = gl.constexpr(pieces)

    @aggregate
    class ArrivalScheduler:
        first_tile: gl.tensor  # = program id
        piece_pid_m: gl.tensor  # rows of tiles per piece
        num_pid_n: gl.tensor
        num_tiles: gl.tensor  # of the chunks this GEMM computes: all but one

        @gluon.constexpr_function
        def __init__(self, first_tile, piece_pid_m, num_pid_n, num_tiles):
            self.first_tile = first_tile
            self.piece_pid_m = piece_pid_m
            self.num_pid_n = num_pid_n
            self.num_tiles = num_tiles

        @gluon.jit
        def initialize(M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
            piece_pid_m = (M // (CHUNKS * PIECES)) // BLOCK_M
            num_pid_n = gl.cdiv(N, BLOCK_N)
            num_tiles = (CHUNKS - 1) * PIECES * piece_pid_m * num_pid_n
            return ArrivalScheduler(gl.program_id(axis=0), piece_pid_m, num_pid_n, num_tiles)

        @gluon.jit
        def get_num_tiles(self):
            return gl.cdiv(self.num_tiles - self.first_tile, gl.num_programs(axis=0))

        @gluon.jit
        def get_tile(self, idx):
            tile_id = self.first_tile + idx * gl.num_programs(axis=0)
            per_piece = self.piece_pid_m * self.num_pid_n
            landing = tile_id // per_piece  # the how-manieth piece to land this tile is in
            chunk = (OWN + CHUNKS - 1 - landing // PIECES) % CHUNKS
            piece = chunk * PIECES + landing % PIECES  # its index among all the pieces: its word's
            pid_m, pid_n = grouped_tile(
                tile_id % per_piece, self.piece_pid_m, GROUP_SIZE_M * self.num_pid_n, GROUP_SIZE_M
            )
            if tile_id < self.num_tiles:  # (a program without tiles asks for one past the end)
                # An acquire load at system scope: the word is written by the stream (a copy engine's
                # memory operation, not an SM), and what follows reads the rows it announces.
                # The rows are read by TMA, which goes to L2 past the SM's L1: no stale copy to fear.
                word = gl.cast(gl.to_tensor(ARRIVALS), gl.pointer_type(gl.int32)) + piece
                landed = gl.atomic_add(word, 0, sem="acquire", scope="sys")
                while landed == 0:
                    landed = gl.atomic_add(word, 0, sem="acquire", scope="sys")
            return piece * self.piece_pid_m + pid_m, pid_n

    ArrivalScheduler.__name__ = ArrivalScheduler.__qualname__ = (
        f"ArrivalScheduler_G{group_size_m}_C{chunks}_O{own}_P{pieces}_A{arrivals:x}"
    )
    return ArrivalScheduler


def scheduler_for(scheduler: str, group_size_m: int):
    """The scheduler class a `MatmulConfig` asks for (`config.scheduler`, `config.GROUP_SIZE_M`)."""
    if scheduler == "chunked":
        return ChunkedScheduler
    if scheduler == "grouped":
        return grouped_scheduler(group_size_m)
    raise ValueError(f"scheduler_for: scheduler must be 'grouped' or 'chunked', but got {scheduler!r}")


def num_persistent_programs(num_tiles: int, device, num_programs: int | None = None) -> int:
    """P = min(#SMs, #tiles): one program per SM, none idle when tiles are few. `num_programs`
    overrides the SM count (tests use it to give each program several tiles on small shapes)."""
    if num_programs is None:
        num_programs = device_info.sm_count(device)
    if num_programs < 1:
        raise ValueError(f"num_programs must be >= 1, but got {num_programs}")
    return max(1, min(num_programs, num_tiles))
