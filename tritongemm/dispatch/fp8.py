"""How scaled_mm's kernel="auto" chooses among the fp8 kernels (core/registry.py's `scaled_mm`
rows), and each one's default tile: the rules below, measured on the H100 and the H200. Only a
plan's build asks (fp8/build.py); nothing here runs on a plan-cache hit."""

from __future__ import annotations

import torch

import tritongemm.fp8.block as fp8_block
import tritongemm.fp8.odd_width as fp8_odd_width
import tritongemm.fp8.tma as fp8_tma
import tritongemm.fp8.ws as fp8_ws
from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.core.registry import dtype_name
from tritongemm.fp8.recipes import SCALE_BLOCK
from tritongemm.ladder.odd_width import wave_fill
from tritongemm.primitives.tiling import cdiv

# "auto"'s tiles, from scripts/probes/fp8/fp8_configs.py (results/h100/probes/fp8/fp8-configs.csv, the H100;
# results/h200/probes/fp8/fp8-ws-configs-large.csv and -small.csv, an H200):
# - M > 64, where TMA takes the call on Hopper: the warp-specialized persistent rungs, fp8_ws for
#   tensor- and row-wise scales and fp8_block for block scales, on the largest of their tiles
#   (TILES, largest first) that gives at least half the SMs a tile (_filling_tile).
#   - M >= 2048: 128 x 256 on two warpgroups. fp8_ws 1.03-1.10x torch's _scaled_mm on the H200,
#     where fp8_tma's 128 x 256 (one tile a program) gave 0.94-1.09x, below 1 on 6 of 18; fp8_block
#     0.86-0.98x torch's block-wise on the H100, where fp8_tma's 128 x 128 gave 0.50-0.57x.
#   - M <= 128, tensor- and row-wise: of fp8_ws's 64 x 128 and 64 x 64 (256 deep) and
#     fp8_odd_width's 64 x 96, the tile that fills its waves best (_wave_filling_tile). A decode
#     step streams the weight, and an SM without a tile is bandwidth lost. On the H100
#     (probes/fp8/fp8-odd-m128.csv, tensor-wise): 128 x 6144 x 4096 takes 64 x 96 (128 tiles) at
#     1.05x torch's where 64 x 128 (96 tiles) ran 0.92-0.95x; 128 x 28672 x 4096 64 x 64 (7 waves
#     97% full) at 0.99x where the earlier rule's 128 x 256 (112 tiles) ran 0.94x; 64 x 64 at
#     N = 4096 as before. Row-wise the same tiles win (1.47-1.50x at 6144 against 1.29x).
#     bench fp8 then gave tensor-wise 0.999 geomean at M <= 128 (probes/fp8/fp8-bench-m128-odd-width.csv,
#     kernel-only) where results/h100/fp8.csv had 0.966. Where that tile is 64 x 64 in one wave
#     on a K of at most 4096, rung 4 runs it (_decode_tile; probes/fp8/fp8-m128-rung4.txt, H100):
#     128 x 4096 x 4096 at 1.13x torch's tensor-wise (two runs: 6.02 and 6.10 us) where fp8_ws
#     ran 0.98x, 2.08x against 1.78x row-wise; at K = 14336 0.91x against fp8_ws's 0.99x.
#   - M = 128 before that rule, the H200: the rule's tiles were the probe's best ws tile on each
#     of the four weights (64 x 128 at N = 6144, 64 x 64 at N = 4096, 128 x 256 at N = 28672), tensor-wise 0.91-1.01x
#     torch's where the `tl` rung's 64-row tiles gave 0.68-0.84x; block-wise 0.91-1.07x where the
#     tiles before gave 0.51-0.86x. Filling every SM instead (the rule before, for block scales)
#     took 64 x 64 at N = 6144, 192 tiles for 132 SMs: 0.67x. At 128 x 4096 x 4096 the `tl` rung's
#     64 x 64 x 256 tile ran faster still (1.05x against the rule's 0.91x); fp8_ws's 64-row tiles
#     now step 256 of K too (H100, probes/fp8/fp8-ws-deep-m128.csv: 0.98x there, 0.85x 128 deep).
# - M <= 16 on Hopper, tensor- and row-wise scales: fp8_swap_ab's 16 tokens x 64 weight rows x 512
#   (results/h100/probes/fp8/fp8-swap-m16.csv, the H100): tensor-wise 0.92-1.04x torch's where the `tl`
#   rung's 64 x 32 tile gave 0.73-0.99x, row-wise 1.07-2.59x where 1.08-2.35x. Narrower, 16 x 32
#   (twice the programs at 4096 weight rows), ran 0.53-0.80x at N = 4096 and 6144 against 0.92-1.05x
#   (probes/fp8/fp8-swap-m16-narrow.csv): 16 x 4096 x 4096 stays at ~0.92x, half the SMs pulling its weight.
# - Block scales at M <= 16 on Hopper, K <= _SWAP_BLOCK_MAX_K: fp8_swap_ab's tile (_SWAP_BLOCK_TILE).
# - Else block scales at M <= 64 on Hopper, weights of _BLOCK_GLUON_FROM_WEIGHT elements or more:
#   fp8_block's 64-row tiles, the larger of the two that gives half the SMs a tile
#   (results/h100/probes/fp8/fp8-block-small-partitions.csv and fp8-block-m16-rule.csv, M = 16):
#   1.00-1.13x torch's at 16 x 28672 x 4096 (64 x 128) and 0.91-0.93x at 16 x 4096 x 14336
#   (64 x 64), where the `tl` rung gave 0.82-0.89x and 0.69-0.77x; on the smaller weights the
#   `tl` rung stays ahead (1.00x against 0.95-0.97x at 6144 x 4096, 1.28x against 1.07-1.13x at
#   4096 x 4096).
# - Else at M <= 64, or where TMA can't take the call: the `tl` rung, a 64-row tile narrow enough
#   that the tiles along N fill the SMs (a 128 x 128 tile left 100 of 132 idle at 16 x 4096 x 4096,
#   0.34x torch's tensor-wise), deep along K where the scales allow. At M = 16 the ws tiles ran
#   0.45-0.78x torch's tensor-wise, the `tl` rung 0.64-0.92x.
# The wide tile serves both rungs on Hopper: the `tl` rung's best at M > 128 too, where the Gluon one can't run.
_WIDE = MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
_BLOCK_TL = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=SCALE_BLOCK, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
_SMALL_M = 128
_TL_MAX_M = 64
# fp8_swap_ab's: 16 tokens (C.T's columns) x 64 of the weight's rows, 512 deep (the probe's best of
# 16 x 32, 64, 128 and 256 or 512 deep; 120 KB of ring, past an Ada SM's 100 KB).
_SWAP_TILE = MatmulConfig(BLOCK_M=16, BLOCK_N=64, BLOCK_K=512, GROUP_SIZE_M=8, num_warps=4, num_stages=3)
_SWAP_MAX_M = 16
# Not split along K. Split among S programs a tile where K >= 2N, as bf16's swap_ab does
# (results/h100/probes/fp8/fp8-swap-split.txt, .csv, .patch; H100, tensor- and row-wise): kernel-only
# 0-8% faster at 1-16 x 4096 x 14336 and x 3584 x 18944 (16 x 8192 x 28672 has tiles enough not
# to split). But eagerly 0.73-1.03x the unsplit tile, tensor-wise 0.73-0.93x: the second launch and
# the workspace's allocation cost up to 11 us a call, more than the split saves on a 24-30 us kernel.
# Under block scales the swapped tile steps one 128-wide K block at a time (promotion), 8 slots
# deep: 80 KB in flight, within an Ada SM's 100 KB. `auto` takes it for block scales at M <= 16 on
# Hopper, K up to _SWAP_BLOCK_MAX_K (scripts/probes/fp8/fp8_configs.py --swap --recipes block, M = 16):
# - the H100 (results/h100/probes/fp8/fp8-swap-block-m16.csv): 1.47x torch's block-wise at 6144 x 4096,
#   1.51x at 4096 x 4096, 1.07x at 28672 x 4096, where the rule before gave 0.99x, 1.28x and 1.02x
#   (results/h100/fp8.csv);
# - an H200 (results/h200/probes/fp8/fp8-swap-block-m16.csv, the rule before beside it): 1.52x, 1.56x
#   and 1.03x, where it gave 0.99x, 1.28x and 0.90x.
# At K = 14336 it ran 0.92x (H100) and 0.81x (H200), where fp8_block's 64 x 64 tile, which stays,
# ran 0.96x and 0.89x: its 64 programs' steps take as long as at K = 4096, torch's do not.
_SWAP_BLOCK_TILE = _SWAP_TILE.with_(BLOCK_K=SCALE_BLOCK, num_stages=8)
_SWAP_BLOCK_MAX_K = 4096
# Rung 4's ring on the 64 x 64 x 256 tile at decode sizes (_decode_tile): 4 slots (3 ran 0.93x
# torch's where 4 ran 1.13x at 128 x 4096 x 4096), for K up to 4096 (at K = 14336 fp8_ws's
# persistent loop stays ahead, 0.99x against 0.91x).
_ONE_TILE_STAGES = 4
_ONE_TILE_MAX_K = 4096
_BLOCK_GLUON_FROM_WEIGHT = 1 << 25  # N * K: 28672 x 4096 and 4096 x 14336 take fp8_block at M <= 64


# batch_invariant=True's choice (dispatch/invariant.py says why K is never split): on Hopper, with
# operands TMA takes, the persistent Gluon rung of the recipe at every M, on the tile `auto`'s
# `_filling_tile` gives (fp8 WGMMA's 32-deep steps in K order, the scales in the epilogue, or for
# block scales each 128-deep block promoted into an fp32 total, whatever the tile); elsewhere the
# `tl` rung on one tile for every M. Not fp8_swap_ab (another kernel's arithmetic at M <= 16) nor
# `auto`'s tl tiles at M <= 64.
_INVARIANT_TL_TILE = _BLOCK_TL


def choose_invariant(a, b, c, recipe: str) -> tuple[str, MatmulConfig, str]:
    """(kernel, config, why) for scaled_mm's batch_invariant=True."""
    M, N = c.shape
    if a.device.type != "cuda":
        return (
            "fp8_grouped",
            default_config(recipe, M, N, a.shape[1], a.device, "fp8_grouped"),
            "the interpreter's tile",
        )
    hopper = device_info.capability(a.device) == (9, 0)
    if hopper and fp8_tma.unsupported_reason(a, b, c, recipe) is None:
        sms = device_info.sm_count(a.device)
        if recipe == "block":
            return "fp8_block", _filling_tile(fp8_block.TILES, M, N, sms), "the block-scaled Gluon rung, K whole"
        return "fp8_ws", _filling_tile(fp8_ws.TILES, M, N, sms), "the warp-specialized Gluon rung, K whole"
    return "fp8_grouped", _INVARIANT_TL_TILE, "the `tl` rung on one tile for every M"


def choose(a, b, c, recipe: str) -> tuple[str, MatmulConfig | None]:
    """(kernel, config) for scaled_mm's "auto": the measured choice above, by M and what the GPU has."""
    return _decide(a, b, c, recipe)[:2]


def explain(a, b, c, recipe: str) -> str:
    """What scaled_mm's "auto" takes for operands like these (c: the output) and why."""
    kernel, config, why = _decide(a, b, c, recipe)
    M, K = a.shape
    config = config or default_config(recipe, M, c.shape[1], K, a.device, kernel)
    dtype = dtype_name(a.dtype)
    return f"{M} x {c.shape[1]} x {K} {dtype} {recipe}-wise on {a.device}: {kernel}, {config.short()}\n  because {why}"


def _decide(a, b, c, recipe: str) -> tuple[str, MatmulConfig | None, str]:
    """`choose`'s (kernel, config), and which rule gave them, in words for `explain`."""
    M, N = c.shape
    if a.device.type != "cuda":
        return "fp8_grouped", None, "not a CUDA device: the `tl` rung under the interpreter"
    hopper = device_info.capability(a.device) == (9, 0)  # the GPU the tiles were measured on
    if hopper and M <= _SWAP_MAX_M and (recipe != "block" or a.shape[1] <= _SWAP_BLOCK_MAX_K):
        tile = _SWAP_BLOCK_TILE if recipe == "block" else _SWAP_TILE
        return "fp8_swap_ab", tile, f"M <= {_SWAP_MAX_M} on Hopper: the tokens on the MMA's narrow side"
    large_block_weight = recipe == "block" and N * a.shape[1] >= _BLOCK_GLUON_FROM_WEIGHT
    if hopper and (M > _TL_MAX_M or large_block_weight):
        if fp8_tma.unsupported_reason(a, b, c, recipe) is None:
            sms = device_info.sm_count(a.device)
            if recipe != "block" and M <= _SMALL_M:
                return (*_decode_tile(M, N, a.shape[1], sms), f"M <= {_SMALL_M}: the tile that fills its waves best")
            if recipe != "block":
                why = "TMA takes the operands: the warp-specialized rung on the largest tile that fills half the SMs"
                return "fp8_ws", _filling_tile(fp8_ws.TILES, M, N, sms), why
            # At M <= 64 (large weights only): a warpgroup's 64 rows.
            tiles = fp8_block.TILES if M > _TL_MAX_M else fp8_block.ONE_WARPGROUP_TILES
            tile = _filling_tile(tiles, M, N, sms)
            why = "block scales, TMA takes the operands: the block-scaled warp-specialized rung"
            if fp8_block.cluster_for(tile, M, fp8_block.consumers_for(tile)) > 1:
                why += ", on clusters of two CTAs that share the weight's tile (TMA multicast, triton >= 3.8)"
            return "fp8_block", tile, why
    if M > _SMALL_M:
        # Elsewhere the first default: the wide tile's 144 KB ring is more than an Ada SM's 100 KB.
        why = "not Hopper, or TMA can't take the operands: the `tl` rung's wide tile"
        return "fp8_grouped", _WIDE if hopper and recipe != "block" else _BLOCK_TL, why
    wide = cdiv(M, 64) * cdiv(N, 64) >= device_info.sm_count(a.device)
    deep = recipe != "block" and hopper  # 96 KB of ring, near an Ada SM's 100 KB
    tile = MatmulConfig(BLOCK_M=64, BLOCK_N=64 if wide else 32, BLOCK_K=256 if deep else SCALE_BLOCK,
                        GROUP_SIZE_M=8, num_warps=4, num_stages=3 if deep else 4)  # fmt: skip
    return "fp8_grouped", tile, f"M <= {_SMALL_M}: the `tl` rung on 64-row tiles narrow enough to fill the SMs"


def _decode_tile(M: int, N: int, K: int, sms: int) -> tuple[str, MatmulConfig]:
    """(kernel, tile) at M = 65-128 on Hopper: `_wave_filling_tile`'s, on rung 4 (fp8_tma, one
    tile a program) where that tile is fp8_ws's 64 x 64, its tiles one wave, and K short: a
    persistent program with one tile has nothing to overlap, and rung 4 skips its setup."""
    kernel, tile = _wave_filling_tile(M, N, sms)
    if kernel == "fp8_ws" and tile.BLOCK_N == 64 and tile.num_tiles(M, N) <= sms and K <= _ONE_TILE_MAX_K:
        return "fp8_tma", tile.with_(num_stages=_ONE_TILE_STAGES)
    return kernel, tile


def _wave_filling_tile(M: int, N: int, sms: int) -> tuple[str, MatmulConfig]:
    """(kernel, tile) at decode sizes: of fp8_ws's two 64-row tiles and fp8_odd_width's 64 x 96,
    the one whose tiles fill their waves of the SMs best (odd_width.wave_fill), the larger where
    two fill as well."""
    candidates = [("fp8_ws", t) for t in fp8_ws.TILES if t.BLOCK_M == 64] + [
        ("fp8_odd_width", fp8_odd_width.DEFAULT_CONFIG)
    ]
    return max(candidates, key=lambda kt: (round(wave_fill(kt[1], M, N, sms), 2), kt[1].BLOCK_M * kt[1].BLOCK_N))


def _filling_tile(tiles: tuple[MatmulConfig, ...], M: int, N: int, sms: int) -> MatmulConfig:
    """The first (largest) of `tiles` whose grid gives at least half the SMs a tile, else the last."""
    return next((t for t in tiles if 2 * t.num_tiles(M, N) >= sms), tiles[-1])


def default_config(recipe: str, M: int, N: int, K: int, device: torch.device, kernel: str) -> MatmulConfig:
    """The tile of `kernel` without one given (`choose`'s, or a caller's kernel=)."""
    if kernel == "fp8_tma":
        return fp8_tma.default_config(recipe)
    if kernel in DEFAULT_CONFIGS:
        return DEFAULT_CONFIGS[kernel]
    if kernel == "fp8_swap_ab" and device.type == "cuda":  # 256 deep: 60 KB of ring for an Ada SM
        if recipe == "block":
            return _SWAP_BLOCK_TILE
        return _SWAP_TILE if device_info.capability(device) == (9, 0) else _SWAP_TILE.with_(BLOCK_K=256)
    if device.type == "cpu":  # the interpreter: small tiles keep the tests quick
        return MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=SCALE_BLOCK, GROUP_SIZE_M=4, num_warps=4, num_stages=1)
    return _BLOCK_TL


# Each persistent Gluon rung's own default tile (its module's DEFAULT_CONFIG).
DEFAULT_CONFIGS = {"fp8_block": fp8_block.DEFAULT_CONFIG, "fp8_ws": fp8_ws.DEFAULT_CONFIG,
                   "fp8_odd_width": fp8_odd_width.DEFAULT_CONFIG}  # fmt: skip
