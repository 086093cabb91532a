"""The Gluon rungs' tiles and the rules that pick one for a problem (pure Python: no Triton, no
CUDA call), for kernel="auto", `tritongemm tune` and the tools' models of a GPU."""

import torch

from tritongemm.core.config import MatmulConfig

# Tiles, largest first. Kernel-only bf16 TFLOP/s of tma_persistent_pipelined on the H100 (CUDA
# graphs, this repo's scratch benchmark), next to cuBLAS:
#                      BIG   MID  SMALL  TINY  cuBLAS
#   2048 x 2048 x 4096  702   662   445   303   705   (BIG: 128 tiles, 97% of the SMs busy)
#   2048 x 1024 x 8192  451   685   455   288   662   (BIG: 64 tiles, MID: 128)
#   1024 x 1024 x 2048  199   356   473   295   456   (SMALL: 128 tiles)
#    256 x 1024 x 8192   57   111   198   213   296   (TINY: 64 tiles, the most there are)
# The largest WGMMA instruction (n = 256) on two warpgroups, 128 fp32 accumulator registers per
# thread. 4 buffers make rung 6 steal B slots for C; at 8192^2 x 1024 that measured 0.98x cuBLAS
# against 0.94x with 3 buffers (fp16; bf16 0.98x / 0.94x), and the same from K = 2048 up.
BIG_TILE = MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=4)
# One warpgroup per tile does as well as two (2048 x 1024 x 8192: 685 with 4 warps, 666 with 8).
MID_TILE = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)
SMALL_TILE = MatmulConfig(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)
TINY_TILE = MatmulConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)
TILES = (BIG_TILE, MID_TILE, SMALL_TILE, TINY_TILE)
# Deeper rings for the tiles below BIG: a small tile does few FLOPs per byte, so what keeps its SM
# busy is how many loads are in flight, and it leaves shared memory for 6 to 12 slots. cuBLAS picks
# such kernels on the H100 where it beat this library's rules (results/h100/probes/dense/cublas-kernels.csv: 64
# x 64 tiles with 13 stages at 128 x 4096 x 4096, 64 x 32 with 16 at M = 64, 64 x 128 with 8 at
# 1000^3). Rung 6's rules take DEEP_RING_STAGES' (persistent_pipelined_config: where, and why);
# `tritongemm tune` tries every one of DEEP_RING_TILES.
DEEP_RING_STAGES = {MID_TILE: 6, SMALL_TILE: 8, TINY_TILE: 8}
DEEP_RING_TILES = (
    *(tile.with_(num_stages=stages) for tile, stages in DEEP_RING_STAGES.items()),
    TINY_TILE.with_(num_stages=12),
    MatmulConfig(BLOCK_M=64, BLOCK_N=32, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=12),
)
# Rung 9's tiles. Two MMA warpgroups on BIG_TILE's 128 x 256 with 3 buffers (C's own tile lives
# next to the ring: 4 x 48 KB + 64 KB > 227 KB) measured 0.99-1.03x cuBLAS at 8192^3 and 4096^3
# (H100, 2026-11-23, results/h100/probes/dense/ws-two-warpgroups.csv); one warpgroup on 128 x 128, 0.92-1.00x
# over the K sweep and 0.89-0.96x over the llm suite's M >= 2048 rows (ksweep-ws.csv, llm-ws.csv).
WARP_SPECIALIZED_BIG_TILE = BIG_TILE.with_(num_stages=3)
WARP_SPECIALIZED_TILES = (WARP_SPECIALIZED_BIG_TILE, MID_TILE, SMALL_TILE, TINY_TILE)
# Ping-pong's (rung 11): each consumer one warpgroup on its own tile, a C tile each beside the ring
# (128 x 128: 4 x 32 KB + 2 x 32 KB).
PING_PONG_TILES = (MID_TILE, SMALL_TILE, TINY_TILE)
# Short K: a tile has few K-steps, and the ring's slots are what carries the next tile's loads
# through the epilogue, so a deeper ring with C staged in half-tile buffers
# (tma_warp_specialized.c_pieces) pays for the wait between the halves' stores. 8192 x 8192 x K on
# the H100, 2026-11-23, each pair in one run (results/h100/probes/dense/ksweep-ring-ws.csv, ksweep-ring-pp.csv):
# rung 9 with 4 slots 0.976-0.980x cuBLAS at K = 512 against 0.933-0.947x with 3, and 1-4% slower
# from K = 1024 up (fp16 and bf16); rung 11 with 6 slots 1.094x at K = 512, 1.010-1.011x at 1024
# and 2048, against 0.940-0.987x with 4, 1-2% faster at 4096 and 8192, 6% slower at 16384 (bf16).
SHORT_K = {"tma_warp_specialized": 512, "tma_ping_pong": 2048}
WARP_SPECIALIZED_SHORT_K_TILE = BIG_TILE  # 4 slots, C in two 128 x 128 halves
PING_PONG_SHORT_K_STAGES = 6  # 6 x 32 KB + 2 x 16 KB

H100_SMS = 132
# A tile size is worth it while it keeps this share of the SMs busy (2048 x 2048 above: BIG's 128
# tiles on 132 SMs beat MID's 256).
_MIN_BUSY_SMS = 0.9


def choose_config(M: int, N: int, num_sms: int, tiles: tuple[MatmulConfig, ...] = TILES) -> MatmulConfig:
    """The largest of `tiles` (largest first) that gives at least 90% of the SMs a tile, else the
    one with the most tiles (pure: CPU-testable). K does not enter: every K-step costs the same
    per tile."""
    for config in tiles:
        if config.num_tiles(M, N) >= _MIN_BUSY_SMS * num_sms:
            return config
    return tiles[-1]


# Rung 6's rules (its default config: what kernel="auto" runs where its table has no entry) refine
# choose_config in two ways. H100, 2026-11-24, kernel-only, fp16 and bf16 alike
# (results/h100/probes/dense/rules-nn.csv, rules-nt.csv):
#  1. BIG against MID by waves. With every SM busy, a wave of BIG tiles took 1.8-1.9 times a wave
#     of MID ones (1024 x 14336 x 4096: 47 us against 26; 2048^2 x 4096 in the table above). So MID
#     wins where BIG's last wave is short: 1024 x 14336 x 4096 (448 BIG tiles, 3.4 waves; 896 MID,
#     6.8) ran 0.94-0.96x cuBLAS with MID against 0.86-0.90x with BIG. And BIG wins where MID would
#     spill into a short second wave: 777 x 4096 x 4096 (112 BIG tiles, 224 MID), 0.84-0.86x with
#     BIG against 0.74-0.76x with MID.
BIG_WAVE_COST = 1.8  # a wave of BIG tiles, in waves of MID tiles
#  2. Deeper rings below BIG (DEEP_RING_STAGES). The rules pick those tiles where they make about
#     one wave, so each SM has one tile, and nothing hides its loads' latency but the ring:
#       MID, 6 slots: 512 x 4096 x 4096 1.00-1.01x (0.93-0.95x with 4), 512 x 4096 x 14336
#         0.98x (0.88-0.90x);
#       SMALL, 8 slots: 1024^3 0.98-1.00x (0.80x), 256 x 4096 x 4096 1.03x (0.78x);
#       TINY, 8 slots: 128 x 4096 x 4096 0.93x (0.68x; results/h100/probes/dense/tune-deep-ring.csv).
#     Not where K is short of two rings' worth of steps (256^3, SMALL: 0.66x with 8 slots against
#     0.86x with 4), nor where N or K is not a multiple of 64 (1000^3: 0.75-0.77x with 8 slots,
#     0.79-0.81x with 4; 0.83-0.84x with MID's 6 against 0.86-0.87x with 4).


def persistent_pipelined_config(
    M: int, N: int, K: int, num_sms: int, big_wave_cost: float | None = None
) -> MatmulConfig:
    """Rung 6's default (pure: CPU-testable): choose_config's tile, weighed by waves between BIG
    and MID (a wave of BIG costing `big_wave_cost` waves of MID, BIG_WAVE_COST unless a caller
    measured another for its GEMMs), with a deeper ring below BIG where K is long (the notes above)."""
    weight = BIG_WAVE_COST if big_wave_cost is None else big_wave_cost
    config = choose_config(M, N, num_sms)
    if config in (BIG_TILE, MID_TILE):
        big_waves = -(-BIG_TILE.num_tiles(M, N) // num_sms)
        mid_waves = -(-MID_TILE.num_tiles(M, N) // num_sms)
        config = MID_TILE if mid_waves < weight * big_waves else BIG_TILE
    stages = DEEP_RING_STAGES.get(config)
    whole_lines = N % 64 == 0 and K % 64 == 0
    if stages is not None and whole_lines and K >= 2 * stages * config.BLOCK_K:
        config = config.with_(num_stages=stages)
    return config


def warp_specialized_config(M: int, N: int, K: int, num_sms: int) -> MatmulConfig:
    """Rung 9's default (pure: CPU-testable, and what `tritongemm predict` models)."""
    config = choose_config(M, N, num_sms, WARP_SPECIALIZED_TILES)
    short_k = config == WARP_SPECIALIZED_BIG_TILE and K <= SHORT_K["tma_warp_specialized"]
    return WARP_SPECIALIZED_SHORT_K_TILE if short_k else config


def ping_pong_config(M: int, N: int, K: int, num_sms: int) -> MatmulConfig:
    """Rung 11's default (pure)."""
    config = choose_config(M, N, num_sms, PING_PONG_TILES)
    short_k = config == MID_TILE and K <= SHORT_K["tma_ping_pong"]
    return config.with_(num_stages=PING_PONG_SHORT_K_STAGES) if short_k else config


# The rungs whose rules go beyond choose_config (the others': `default_config`), as pure functions
# of (M, N, K, SM count): the registry's hook runs them on the device's SMs, tools/launch.py on a
# modelled GPU's.
RULES = {
    "tma_persistent_pipelined": persistent_pipelined_config,
    "tma_warp_specialized": warp_specialized_config,
    "tma_ping_pong": ping_pong_config,
}


def gated_config(kernel: str, M: int, N: int, K: int, num_sms: int) -> MatmulConfig:
    """Rung 6's or 9's default for a gated pair with C (M, N) (pure): the rung's rule on the MMA's
    M x 2N, whose tiles are C's; on the big tile with 4 slots, since C's tile is half the MMA's
    width (4 x 48 KB + 32 KB fits 227 KB, C in a buffer of its own). From the plain GEMM's
    measurements (bench mlp times the gated kernels on these, docs/blocks.md; not tuned apart)."""
    config = RULES[kernel](M, 2 * N, K, num_sms)
    return BIG_TILE if config.BLOCK_N == BIG_TILE.BLOCK_N else config


# --- the `triton.language` rungs' tiles ---
# The interpreter runs every program in numpy on the CPU: small tiles keep the tests quick and
# still exercise the masks (tests pass explicit configs to hit tile +- 1 boundaries).
INTERPRETER_CONFIG = MatmulConfig(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=4, num_warps=4, num_stages=1)


FP32_CONFIG = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
BIG_CONFIG = MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
MID_CONFIG = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)
SMALL_CONFIG = MatmulConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)


def ladder_config(dtype: torch.dtype, M: int, N: int, K: int, *, num_sms: int, interpret: bool) -> MatmulConfig:
    """The `triton.language` rungs' default (naive, grouped, persistent, stream_k) on Hopper-class
    GPUs (or the interpreter), pure.

    128x256x64 with 8 warps and 3 stages is what Triton's tutorials found fastest on H100 for
    fp16/bf16; when that leaves most SMs idle (fewer tiles than SMs) smaller tiles win.
    fp32 operands take twice the shared memory per element, so BLOCK_K halves.
    """
    if interpret:
        return INTERPRETER_CONFIG
    if dtype == torch.float32:
        return FP32_CONFIG
    if BIG_CONFIG.num_tiles(M, N) >= num_sms:
        return BIG_CONFIG
    if M > 64 and MID_CONFIG.num_tiles(M, N) >= num_sms // 2:
        return MID_CONFIG
    return SMALL_CONFIG
