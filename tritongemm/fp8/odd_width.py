"""fp8 with tensor- or row-wise scales on tiles of an odd width (odd_width.py): 96, 160 or 192
columns in two parts, so that a decode-sized GEMM's tiles fill one wave of the GPU.

At M = 128 an fp8 GEMM is the weight's stream: 25 MB at 128 x 6144 x 4096, 16 tokens' or 128
tokens' arithmetic is small beside it. The weight moves at the rate of the SMs that pull it, so
an SM without a tile is bandwidth lost: fp8_ws's 64 x 128 tiles cut that weight into 96, for 132
SMs (0.88-0.95x torch's tensor-wise on the H100), and 64 x 64 into 192, a wave and a half. 64 x 96
cuts it into 128, one wave 97% full; cuBLAS runs it on 128 CTAs too (96 x 64 tiles, clusters of
two). Rung 13's loop is the one here: a persistent program per SM, a ring of three boxes a slot
(A's, B's main part and B's tail), two WGMMAs a K-step, each part scaled and stored on its own.

Only what fp8 changes is here, as in fp8_ws.py: the checks (fp8_tma.unsupported_reason), the
descriptors on the fp8 tensors with C's staging sized by C's dtype, and a launch that takes the
scales with every call (fp8_tma.planned_scaled_launch). scaled_mm's "auto" chooses it where
measured (dispatch/fp8.py `choose`); kernel="fp8_odd_width" names it.
"""

from __future__ import annotations

from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Epilogue
from tritongemm.fp8.tma import check_scaled_call, planned_scaled_launch
from tritongemm.ladder.odd_width import _odd_width_kernel, check_config, split_width
from tritongemm.primitives.gluon.descriptors import descriptor
from tritongemm.primitives.tiling.gluon import num_persistent_programs, scheduler_for

NAME = "fp8_odd_width"
# One warpgroup's 64 rows by 96 columns (64 + 32), 256 of K a step as fp8_ws's 64-row tiles: five
# slots of 40 KB and C's 12 KB.
DEFAULT_CONFIG = MatmulConfig(BLOCK_M=64, BLOCK_N=96, BLOCK_K=256, GROUP_SIZE_M=8, num_warps=4, num_stages=5)


def plan(a, b, c, scale_a, scale_b, recipe: str, config: MatmulConfig, spec: Epilogue, bias=None, residual=None,
         *, num_programs: int | None = None):  # fmt: skip
    """`launch(a, b, c, scale_a, scale_b, bias, residual)` for tensors of this geometry, checked
    and compiled once; raises ValueError naming what it can't take. `num_programs` replaces the
    SM count (tests: several tiles a program)."""
    check_scaled_call(NAME, a, b, c, recipe, epilogue_scales_only=True)
    check_config(config, a.element_size(), c_elem_bytes=c.element_size(), name=NAME)
    main_n, tail_n = split_width(config.BLOCK_N)
    BM, BK = config.BLOCK_M, config.BLOCK_K
    desc = (descriptor(a, (BM, BK)), descriptor(b.T, (main_n, BK)), descriptor(c, (BM, main_n)))
    tails = (descriptor(b.T, (tail_n, BK)), descriptor(c, (BM, tail_n)))
    grid = (num_persistent_programs(config.num_tiles(*c.shape), c.device, num_programs),)
    constexprs = dict(
        Scheduler=scheduler_for(config.scheduler, config.GROUP_SIZE_M), NUM_BUFFERS=config.num_stages,
        A_M_MAJOR=False, B_K_MAJOR=True, SCALES=recipe, num_warps=config.num_warps, **spec.constexprs(),
    )  # fmt: skip
    return planned_scaled_launch(_odd_width_kernel, grid, desc, constexprs, spec, scale_a, scale_b, (), bias,
                                 residual, tails)  # fmt: skip
