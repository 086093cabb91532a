"""fp8 with tensor- or row-wise scales on rung 9: the warp-specialized persistent kernel
(tma_warp_specialized.py) on fp8 operands, its epilogue dequantizing each finished tile.

A tensor- or row-wise scale is the same all along K, so it factors out of the sum and waits for
the epilogue (docs/fp8.md): the K loop is exactly rung 9's, with one WGMMA instruction taking 32
fp8 elements of K where bf16 takes 16. fp8_tma runs these recipes on rung 4's loop, one tile a
program: ahead of cuBLAS at M = 2048 (1.03-1.13x on the H100) and mostly behind it at M = 8192
(0.90-1.04x, below 1 on 6 of 10), where every program's prologue and epilogue stall its tensor
cores. Here a load warp runs ahead through the ring and the next tile's loads go out during this
tile's epilogue.

Only what fp8 changes is here: the checks (fp8_tma.unsupported_reason: one fp8 dtype, K-major
operands, a bf16 or fp16 C), descriptors on the fp8 tensors, C's staging buffer sized by C's
dtype, and a launch that takes the scales with every call (fp8_tma.planned_scaled_launch).
scaled_mm's "auto" chooses it where measured (dispatch/fp8.py `choose`); kernel="fp8_ws" names it.
"""

from __future__ import annotations

from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Epilogue
from tritongemm.fp8.tma import check_scaled_call, planned_scaled_launch
from tritongemm.ladder.tma_warp_specialized import _tma_warp_specialized_kernel, c_pieces, check_config, programs
from tritongemm.primitives.gluon.descriptors import descriptor
from tritongemm.primitives.gluon.mma import WGMMA

NAME = "fp8_ws"
# 128 x 256 on two warpgroups, as rung 9's big tile: 4 slots of 48 KB and a 32 KB bf16 C half.
DEFAULT_CONFIG = MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_SIZE_M=8, num_warps=8, num_stages=4)
# "auto"'s tiles, largest first (dispatch/fp8.py `_filling_tile`): narrower ones give more SMs a tile
# at decode sizes, with deeper rings to keep the weight streaming (scripts/probes/fp8/fp8_configs.py). The
# 64-row ones step 256 of K: the same bytes in flight in half the K-steps (ring waits, MMA issues);
# tensor-wise at M = 128 on the H100 (probes/fp8/fp8-ws-deep-m128.csv) 0.95-0.98x torch's where 128
# deep gave 0.85-0.93x.
TILES = (
    DEFAULT_CONFIG,
    DEFAULT_CONFIG.with_(BLOCK_N=128, num_stages=6),
    DEFAULT_CONFIG.with_(BLOCK_M=64, BLOCK_N=128, BLOCK_K=256, num_warps=4, num_stages=4),
    DEFAULT_CONFIG.with_(BLOCK_M=64, BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=6),
)


def plan(a, b, c, scale_a, scale_b, recipe: str, config: MatmulConfig, spec: Epilogue, bias=None, residual=None,
         *, num_programs: int | None = None, consumers: int = 1):  # fmt: skip
    """`launch(a, b, c, scale_a, scale_b, bias, residual)` for tensors of this geometry, checked
    and compiled once; raises ValueError naming what it can't take. `consumers=2` is ping-pong
    (one warpgroup each); `num_programs` replaces the SM count (tests: several tiles a program)."""
    check_scaled_call(NAME, a, b, c, recipe, epilogue_scales_only=True)
    if a.shape[1] == 0:  # scaled_mm never launches for K = 0; a tile's release would have no load to match
        raise ValueError(f"{NAME}: K must be >= 1, but got K = 0 (a zero sum needs no kernel)")
    check_config(config, 1, consumers=consumers, c_elem_bytes=c.element_size(), name=NAME)
    pieces = c_pieces(config, 1, consumers, c_elem_bytes=c.element_size())
    desc = (descriptor(a, (config.BLOCK_M, config.BLOCK_K)), descriptor(b.T, (config.BLOCK_N, config.BLOCK_K)),
            descriptor(c, (config.BLOCK_M, config.BLOCK_N // pieces)))  # fmt: skip
    grid, constexprs = programs(config, c, config.BLOCK_N, WGMMA, consumers, num_programs, scales=recipe)
    constexprs.update(A_M_MAJOR=False, B_K_MAJOR=True, **spec.constexprs())
    return planned_scaled_launch(_tma_warp_specialized_kernel, grid, desc, constexprs, spec, scale_a, scale_b, (),
                                 bias, residual)  # fmt: skip
