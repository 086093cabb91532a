"""One GEMM over an all-gather's rows, started before they have landed.

The chunked all-gather + GEMM (paths.py) runs one GEMM per gathered chunk as it lands. A chunk is a
fraction of the rows, and a persistent GEMM on a fraction loses its last wave: four H100s, q,k,v
of Llama-3-70B at 8192 tokens, each chunk 2048 x 2560 x 8192 ran 0.80x cuBLAS where the whole
8192 rows run 0.95-1.01x (docs/tensor-parallel.md). (torch's fused op runs a cuBLAS GEMM per
chunk, on two streams taken in turn, whose thread blocks share the SMs as they free up; only
under TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP, at 2049-4096 rows, one GEMM, `_async_input_mm`,
whose blocks wait inside the kernel for the rows they read.)

This one is rung 6 (ladder/tma_persistent_pipelined.py) over every chunk but this rank's own,
with a scheduler that hands out the tiles in the order the chunks land and waits, before it
hands one out, for its chunk's arrival word (primitives/tiling/gluon.arrival_scheduler). The stream
that copies a chunk in sets its word after the copy (exchange.py, a stream memory operation: no
SM): the sender's, which pushes it into this rank's memory, or, where the gathered A is kept,
this rank's side stream, which pulls it; each rank resets its words before its call's first
transfer. This rank's own chunk is a GEMM of its own, queued first on the compute stream, which
waits on nothing; this one runs beside it, on a stream of the gathered chunks', queued once the
first gathered chunk has landed (paths.py), and its programs take the SMs the own chunk's GEMM
leaves. (Queued at once, its programs took SMs from that GEMM and spun there: four H100s, q,k,v
of Llama-3-70B at 8192 tokens, 1.20x the sequential path against 1.49x,
results/h100x4/probes/tp-whole-*.csv.)

So the own chunk's GEMM runs on this one's tiles (`plan` gives both launches): this GEMM's
programs fill its last wave, so the tile's speed is what counts, not how many waves it makes
(four H100s, q,k,v at 16384 tokens: 1.51x the sequential path against 1.43x with `auto`'s 128 x
128 tiles for 4096 x 2560 x 8192). The own chunk is not folded into this GEMM: its rows would
have to be copied into the gathered A first, and its tiles wait for that copy (1.35x against
1.44x in another run; results/h100x4/probes/tp/tp-own-tiles.md).

No deadlock: the kernel is queued after the first chunk's landing, which comes after the side
streams' barrier (the one kernel the transfers wait on, on the SM the GEMMs leave free), and what
its programs then wait for needs no SM: the other chunks' copies (copy engines) and the words'
writes (stream memory operations).

From four ranks on, a chunk may travel in pieces of consecutive rows, each with a word of its
own, so that the tiles left after the last copy are a piece's, not a chunk's (`pieces_for`).

Where it can't run (not sm_90, not fp16/bf16, rows a chunk not a multiple of the tile's,
operands TMA can't read, transport NCCL), `plan` says None and the ops run a GEMM per chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from tritongemm.core import device_info
from tritongemm.core.epilogue import Epilogue, Fused
from tritongemm.core.plans import planned
from tritongemm.core.tma import tma_unsupported_reason
from tritongemm.dense.plan import problem_key
from tritongemm.dispatch.tiles import persistent_pipelined_config
from tritongemm.distributed.exchange import MAX_PIECES, announces_arrivals
from tritongemm.ladder import tma_persistent_pipelined
from tritongemm.primitives.tiling.gluon import arrival_scheduler

KERNEL = "tma_persistent_pipelined"
# Both GEMMs' tile is rung 6's rule on all M rows, as for one GEMM: they share the SMs as one would
# (the other chunks' programs take each SM the own chunk's leaves). Rung 6's weight of a BIG wave
# (1.8 MID waves, measured on one GEMM) picked the faster tile on five of six all-gathers measured
# with both tiles forced, q,k,v of Llama-3-70B at 2048 and 4096 tokens (docs/tensor-parallel.md,
# "Rung 6's weight after all"): MID at 2048 tokens on two and four H200s and on four H100s (11-16%
# faster) and at 4096 on four H200s (6%), BIG at 4096 on two H200s (7%; results/h200x2/probes/
# tp-tile-2gpu*.csv, h200x4/probes/tp-tile-4gpu*.csv). The sixth, four H100s at 4096 tokens, ran
# BIG 3% faster (h100x4/probes/tp-shared-tile.csv) on the tile counts where four H200s ran MID
# faster; a weight of 1.65, fitted to the H100s, lost 11% and 6% on the H200s. So the weight is the
# GPU's: on H100s 1.65 (SHARED_TILE_BIG_WAVE_COST), which also picks what two H100s ran fastest,
# BIG at 2048 and 4096 tokens (11% and 20% over MID; results/h100x2/probes/tp/tp-shared-tile.csv),
# and keeps MID on four H100s at 2048 (11-16% faster there).
SHARED_TILE_BIG_WAVE_COST = {"NVIDIA H100 80GB HBM3": 1.65}  # by device_info.name; else rung 6's own

# Each gathered chunk travels in pieces of consecutive rows, each announced apart (`pieces_for`):
# the GEMM starts on a chunk once its first piece has landed, and once the last chunk's last piece
# lands only that piece's tiles are left, not the chunk's. (In one piece, four H100s, q,k,v at 8192
# tokens: the last of three 94 us copies landed 174 us before the GEMM's end, its 160 tiles two
# waves on 131 SMs.) Measured with scripts/probes/tp/tp_probe.py's pieces-* variants, kernel-only
# (results/h100x4/probes/tp-pieces-*.csv, h100x2/probes/tp-pieces-*.csv):
# - four H100s, q,k,v (B 42 MB, in L2): pieces of 80 tiles won, 6%, 1% and 4% at 4096, 8192 and
#   16384 tokens over one piece (6.6%, 1.1%, 4.4% in a second run); pieces of 40 tiles lost, 10%,
#   16% and 1% at 2048, 4096 and 8192 against half as many pieces, so a piece keeps at least
#   PIECE_LEAST_WAVE_SHARE of a wave of tiles;
# - gate,up (B 235 MB, past L2) lost in pieces every time: 10% and 6% on four H100s at 2048 and
#   4096 tokens, 4% on two at 4096. A piece's tiles are in grouped order within it, so with fewer
#   rows each re-reads B's panels, from memory where B outgrows L2; and its GEMM is long beside
#   its copy, which left little to hide;
# - on two H100s, q,k,v in pieces ran -4% to +3% (2048-16384 tokens, within the runs' spread):
#   the one peer chunk lands under the own chunk's GEMM, half the work, so there is no later
#   chunk's wait for pieces to shorten. Pieces from four ranks on.
PIECE_LEAST_WAVE_SHARE = 0.5
PIECES_FROM_WORLD = 4


class Launches(NamedTuple):
    own: Callable  # own(shard, b, c_own, bias)
    others: Callable  # others(gathered, b, c, bias)
    pieces: int  # how many pieces each gathered chunk travels in (SymmetricExchanges.gather)


def plan(gathered: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias, activation, rank: int, words: torch.Tensor):
    """`Launches(own, others, pieces)`, two launches of (a, b, c, bias) computing
    activation(A @ B + bias): `others(gathered, b, c, bias)` C's rows of every chunk but `rank`'s,
    A `gathered` (world x m rows, K), each chunk in `pieces` pieces of consecutive rows, each
    piece read once `words` (exchange.arrival_words) says it landed; `own(shard, b, c_own, bias)`
    this rank's chunk, C's rows of it `c_own`, on the same tiles (where `own_fits(shard)`). None
    where the GEMM over the chunks can't run (the module docstring): the caller runs a GEMM per
    chunk. Planned once per geometry, rank and words (in PLANS, under a key of its own; SMs
    spared included)."""
    plain = bias is None and activation is None
    fused = None if plain else Fused(Epilogue(activation, 1.0, bias is not None), bias, None, c.dtype)
    key = ("gathered", problem_key(gathered, b, c, KERNEL, None, fused), rank, words.data_ptr())
    launches = planned(key, lambda: _build(gathered, b, c, fused, rank, words) or _UNPLANNED)
    return None if launches is _UNPLANNED else launches


def own_fits(shard: torch.Tensor) -> bool:
    """Whether `plan`'s `own` launch reads `shard` right: it was planned on a view of the gathered
    A, so it takes a contiguous, 16-byte aligned shard that is not a negated view (a caller's or a
    compiled graph's may be any of these; the ops then run `auto` on it)."""
    return shard.is_contiguous() and shard.data_ptr() % 16 == 0 and not shard.is_neg()


def shared_tile(M: int, N: int, K: int, sms: int, gpu: str):
    """The tile both GEMMs of an all-gather of M rows in all run on (pure): rung 6's rule with the
    GPU's weight of a BIG wave (the comment above)."""
    return persistent_pipelined_config(M, N, K, sms, SHARED_TILE_BIG_WAVE_COST.get(gpu))


def pieces_for(row_tiles: int, col_tiles: int, b_outgrows_l2: bool, world: int, sms: int) -> int:
    """How many pieces each gathered chunk of `row_tiles` x `col_tiles` tiles travels in (pure):
    one where B outgrows L2 or the group has fewer than PIECES_FROM_WORLD ranks; else the most, a
    power of two up to MAX_PIECES dividing its rows of tiles (a tile never waits on two pieces),
    that leave each piece PIECE_LEAST_WAVE_SHARE of a wave of tiles on `sms` SMs (the comment
    above)."""
    pieces = 1
    if b_outgrows_l2 or world < PIECES_FROM_WORLD:
        return pieces
    while 2 * pieces <= MAX_PIECES and row_tiles % (2 * pieces) == 0:
        if row_tiles // (2 * pieces) * col_tiles < PIECE_LEAST_WAVE_SHARE * sms:
            break
        pieces *= 2
    return pieces


def _UNPLANNED(*_):  # what the cache keeps for a geometry this GEMM can't run, so it is not retried
    raise AssertionError("gathered.plan returned no launch for this geometry")


def _build(gathered, b, c, fused, rank, words):
    device, world = gathered.device, words.numel() // MAX_PIECES
    (M, K), N = gathered.shape, b.shape[1]
    runs = (
        device.type == "cuda"
        and device_info.capability(device) == (9, 0)
        and gathered.dtype in (torch.float16, torch.bfloat16)
        and world >= 2
        and M % world == 0
        and min(M, N, K) > 0
        and tma_unsupported_reason(gathered, b, c) is None
        and announces_arrivals()
    )
    if not runs:
        return None
    sms = device_info.sm_count(device)
    rows = M // world
    config = shared_tile(M, N, K, sms, device_info.name(device))
    if rows % config.BLOCK_M:  # a tile would span two chunks
        return None
    row_tiles, col_tiles = rows // config.BLOCK_M, -(-N // config.BLOCK_N)
    b_bytes = K * N * b.element_size()
    pieces = pieces_for(row_tiles, col_tiles, b_bytes > device_info.l2_bytes(device), world, sms)
    scheduler = arrival_scheduler(config.GROUP_SIZE_M, world, rank, words.data_ptr(), pieces)
    epilogue = {} if fused is None else dict(epilogue=fused.spec, bias=fused.bias)
    others = tma_persistent_pipelined.plan(
        gathered, b, c, config, num_programs=min(sms, (world - 1) * row_tiles * col_tiles), scheduler=scheduler,
        **epilogue,
    )  # fmt: skip
    own_rows = slice(rank * rows, (rank + 1) * rows)
    own = tma_persistent_pipelined.plan(
        gathered[own_rows], b, c[own_rows], config, num_programs=min(sms, row_tiles * col_tiles), **epilogue
    )
    if fused is None:
        return Launches(lambda a, b, c, bias: own(a, b, c), lambda a, b, c, bias: others(a, b, c), pieces)
    return Launches(lambda a, b, c, bias: own(a, b, c, bias), lambda a, b, c, bias: others(a, b, c, bias), pieces)
