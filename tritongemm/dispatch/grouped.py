"""How grouped_mm's kernels and tiles are chosen (core/registry.py's `grouped_mm` rows), by the
groups' mean size and what the GPU has, as the H100 measured them; and the dense gated pair's
decode tile. Only a plan's build asks (grouped/build.py); nothing here runs on a plan-cache hit."""

from __future__ import annotations

import tritongemm.grouped.k_ws as grouped_k_ws
import tritongemm.grouped.ws as grouped_ws
from tritongemm.core import device_info
from tritongemm.core.registry import dtype_name

# The GPU's tiles, by the groups' mean size (rows / groups), from scripts/probes/grouped/grouped_configs.py on
# the H100 (results/h100/probes/grouped/grouped-configs.csv): a decode step gives each expert a few rows,
# and a 32-row tile streaming 128 of K a step reads the weights fastest (1.06-1.67x
# torch._grouped_mm where the first 64 x 64 x 32 tile gave 0.2-0.6x); MoE prefill gives them
# hundreds, and the widest tile that fits wins (0.91-1.16x, where 128 x 128 gave 0.78-1.06x).
_GPU_TILES = {
    "large": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3),
    "small": dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=4),
}
_LARGE_GROUP_ROWS = 128  # mean rows per group from which the large tile serves
# A dense gated pair of at most DECODE_PAIR_ROWS rows (decode: one group, the weight streamed once)
# takes 32 output columns a tile, so its many tiles fill the programs' rounds evenly. The small
# tile's 128 columns left the last round mostly idle: Qwen2-7B's 18944 make 148 tiles for 132
# programs. On the H100 at 1 and 16 rows (bf16, results/h100/probes/blocks/decode-pair-tiles-2e40889.txt
# and -a34a049.txt): Qwen2-7B's pair 93.5-96.4 us (2.8-2.9 TB/s of weight) against 115-119 (2.3),
# cuBLAS's ungated pair GEMM 98-102; Llama-3-8B's 82.1-84.3 against 84.6-87.4, cuBLAS 81.6-82.8.
# 16 x 16 tiles streamed slower (2.3 TB/s), 64 wide ones as fast on Llama and slower on Qwen2.
# The MLP block's forward went to 1.06-1.13x torch's unfused block, from 0.93-1.03x
# (probes/blocks/mlp-decode-a34a049.csv and results/h100/mlp.csv since a11ffab, against efef208's).
DECODE_PAIR_ROWS = 16
_DECODE_PAIR_TILE = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, GROUP_SIZE_M=1, num_warps=4, num_stages=4)
_CPU_TILE = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_SIZE_M=2)  # the interpreter: small tiles keep tests quick


def tile(rows: int, groups: int, on_cpu: bool, glu: str | None, itemsize: int) -> dict:
    """The kernels' tile and launch settings for `rows` over `groups` groups of `itemsize`-byte
    operands. A gated pair keeps two accumulators: half the large tile's width keeps them in the
    registers one held. fp32 operands take half the K-step (`_for_itemsize`)."""
    if on_cpu:
        return _CPU_TILE
    tile = dict(_GPU_TILES["large" if rows >= _LARGE_GROUP_ROWS * max(groups, 1) else "small"])
    if glu:
        tile["BLOCK_N"] = min(tile["BLOCK_N"], 128)
    return _for_itemsize(tile, itemsize)


# The fp8 weight gradient's K-group tile (fp8/grouped.py): 128 x 128 x 64, 8 warps, compiles for
# sm_90 without spills (triton 3.6, 3.7), where the large tile spills 1.2 KB a thread (bf16's too).
# Not yet timed on a GPU.
_FP8_K_GROUPS_TILE = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=1, num_warps=8, num_stages=3)


def scaled_tile(form: str, rows: int, groups: int, on_cpu: bool) -> dict:
    """The tile of fp8's scaled grouped GEMMs (grouped/tl.py with SCALED): `tile`'s for row groups,
    a K-group tile of its own for the weight gradient."""
    if form == "k" and not on_cpu:
        return dict(_FP8_K_GROUPS_TILE)
    return tile(rows, groups, on_cpu, None, 1)


def invariant_tile(on_cpu: bool, glu: str | None, itemsize: int) -> dict:
    """batch_invariant=True's tile: the `tl` kernel on one tile whatever the groups' sizes (where
    `tile` and the Gluon kernels follow their mean, so an expert's rows would be summed by another
    kernel when the other experts' counts change). The small tile, decode's: on the H100 it ran
    1.06-1.67x torch._grouped_mm at a few rows a group and 0.78-1.06x (against the large tile's
    0.91-1.16x) at prefill's hundreds (the notes on _GPU_TILES)."""
    if on_cpu:
        return _CPU_TILE
    tile = dict(_GPU_TILES["small"])
    if glu:
        tile["BLOCK_N"] = min(tile["BLOCK_N"], 128)
    return _for_itemsize(tile, itemsize)


def _for_itemsize(tile: dict, itemsize: int) -> dict:
    """`tile` (for 16-bit operands) for operands of `itemsize` bytes: 4-byte ones take half the
    K-step, so that the ring of stages keeps the shared memory of 16-bit ones."""
    return dict(tile, BLOCK_K=tile["BLOCK_K"] * 2 // max(itemsize, 2))


# Mean rows per group from which the warp-specialized Gluon kernel (grouped/ws.py) serves plain row
# groups. On the H100 (scripts/probes/grouped/grouped_configs.py --ws, probes/grouped/grouped-ws-
# configs-wide.csv) it ran 1.03-1.19x torch._grouped_mm at 128-768 rows a group (the three MoE
# layers at 2048 and 8192 tokens) where the `tl` kernel gave 0.93-1.17x. At 2048 rows a group the
# two runs disagree: timed alone, 0.94x against the `tl` kernel's 1.02x; in `bench grouped`'s
# sustained run, under the power cap, 0.99x against 0.92x (the `tl` kernel issues twice the
# instructions: docs/grouped.md). A gated pair (`--glu --ws`, probes/grouped/grouped-ws-glu.csv):
# 1.25-1.42x torch's two-step pair at 128-2048 rows a group, the `tl` kernel's pair 1.08-1.36x.
# Below 128 the `tl` kernel's small tile was not measured against it.
WS_FROM_MEAN_ROWS = 128


def takes_ws(a, b, out_dtype, glu) -> bool:
    """Whether grouped_ws serves these row groups, plain or a gated pair (a checked, non-empty
    problem): a's dtype out, WS_FROM_MEAN_ROWS, an sm_90 GPU, operands it reads in place
    (grouped_ws.unsupported_reason) and output rows on 16 bytes (its TMA store)."""
    if out_dtype != a.dtype or a.device.type != "cuda" or a.shape[1] == 0:
        return False
    if a.shape[0] // b.shape[0] < WS_FROM_MEAN_ROWS or device_info.capability(a.device) != (9, 0):
        return False
    if b.shape[2] // (2 if glu else 1) * a.element_size() % 16:  # C's rows, which it stores by TMA
        return False
    return grouped_ws.unsupported_reason(a, b, glu) is None


# Mean rows per group (along K) from which the K-group Gluon kernel (grouped/k_ws.py) serves
# the weight gradient's layouts. On the H100 (scripts/probes/grouped/grouped_configs.py --form k --ws,
# results/h100/probes/grouped/grouped-k-ws-configs.csv) it ran 0.72-1.16x torch._grouped_mm at 128-2048
# rows a group (the three MoE layers' weight gradients at 2048 and 8192 tokens) where the `tl`
# kernel gave 0.60-0.89x. Below 128 it was not measured.
K_WS_FROM_MEAN_ROWS = 128


def takes_k_ws(a, b, out_dtype, groups: int) -> bool:
    """Whether grouped_k_ws serves these K groups (a checked, non-empty problem): a's dtype out,
    K_WS_FROM_MEAN_ROWS, an sm_90 GPU, and the weight gradient's layouts, which it reads in place
    (grouped_k_ws.unsupported_reason)."""
    if out_dtype != a.dtype or a.device.type != "cuda" or a.shape[1] // groups < K_WS_FROM_MEAN_ROWS:
        return False
    if device_info.capability(a.device) != (9, 0):
        return False
    return grouped_k_ws.unsupported_reason(a, b) is None


def decode_pair_tile(itemsize: int) -> dict:
    """The decode tile for operands of `itemsize` bytes (`_for_itemsize`)."""
    return _for_itemsize(_DECODE_PAIR_TILE, itemsize)


def explain(a, b, glu: str | None = None) -> str:
    """What grouped_mm takes for row groups like these (a (rows, K), b (groups, K, N)) and why."""
    rows, groups = a.shape[0], b.shape[0]
    width = b.shape[2] // (2 if glu else 1)
    if takes_ws(a, b, a.dtype, glu):
        kernel, why = "grouped_mm_ws", f"an sm_90 GPU, {rows // groups} rows a group (>= {WS_FROM_MEAN_ROWS})"
        shown = "its own tiles (grouped/ws.py default_config)"
    else:
        kernel = "grouped_mm_rows"
        why = f"{rows // max(groups, 1)} rows a group, or not an sm_90 GPU, or operands TMA can't read in place"
        chosen = tile(rows, groups, a.device.type == "cpu", glu, a.element_size())
        shown = ", ".join(f"{k}={v}" for k, v in chosen.items())
    dtype = dtype_name(a.dtype)
    problem = f"{groups} groups of {rows} rows x {width} x {a.shape[1]} {dtype} on {a.device}"
    return f"{problem}: {kernel}, {shown}\n  because {why}"
