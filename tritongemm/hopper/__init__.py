"""Hopper (sm_90) kernels in Gluon: TMA loads, mbarriers, WGMMA, persistent schedulers.

Rungs 4-6 of the ladder, one module each, built from the shared pieces:
  descriptors.py  which operands TMA takes as they are; their descriptors
  mma.py          the WGMMA accumulator as a value
  pipeline.py     the shared-memory ring (loads, MMAs, epilogue) and its footprint
  schedulers.py   which tiles a persistent program computes, in which order
Importing this package makes no CUDA call; the kernels compile on first launch.
"""

import torch

from tritongemm.config import MatmulConfig
from tritongemm.hopper import tma_persistent, tma_persistent_pipelined, tma_pipelined
from tritongemm.hopper.descriptors import tma_out_unsupported_reason, tma_unsupported_reason
from tritongemm.hopper.schedulers import sm_count
from tritongemm.registry import KernelInfo, register

# The largest WGMMA instruction (n = 256) on two warpgroups: 128 fp32 accumulator registers per
# thread, 3 x 48 KB of operand buffers. The seed's H100 best for fp16 (674 TFLOP/s at 8192^2 x 16K).
BIG_TILE = MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
MID_TILE = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=4)
SMALL_TILE = MatmulConfig(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)


H100_SMS = 132


def choose_config(M: int, N: int, num_sms: int, scheduler: str = "grouped") -> MatmulConfig:
    """The tile for an M x N output on a GPU with `num_sms` SMs (pure; CPU-testable).

    Big tiles feed the tensor cores best, but when they leave most SMs without a tile, smaller
    ones win back the idle SMs.
    """
    for config in (BIG_TILE, MID_TILE):
        if _num_tiles(M, N, config) >= num_sms:
            return config.with_(scheduler=scheduler)
    return SMALL_TILE.with_(scheduler=scheduler)


def _num_tiles(M: int, N: int, config: MatmulConfig) -> int:
    return -(-M // config.BLOCK_M) * -(-N // config.BLOCK_N)


def default_config(dtype: torch.dtype, M: int, N: int, K: int, device: torch.device) -> MatmulConfig:
    """The registry's hook. Without a CUDA device (tools, CPU tests) it answers for an H100 SXM."""
    device = torch.device(device)
    return choose_config(M, N, sm_count(device) if device.type == "cuda" else H100_SMS)


_COMMON = dict(
    dtypes=(torch.float16, torch.bfloat16),
    interpretable=False,
    min_capability=(9, 0),  # WGMMA and TMA; sm_90 only (see the report: needs a max too)
    default_config=default_config,
    unsupported_reason=tma_unsupported_reason,
    out_unsupported_reason=tma_out_unsupported_reason,
)

register(
    KernelInfo(
        name="tma_pipelined",
        rung=4,
        idea="TMA loads into a ring of smem buffers on mbarriers, async WGMMA, loads issued ahead",
        launch=tma_pipelined.launch,
        **_COMMON,
    )
)
register(
    KernelInfo(
        name="tma_persistent",
        rung=5,
        idea="persistent programs over a tile scheduler, reusing barriers and MMA state",
        launch=tma_persistent.launch,
        **_COMMON,
    )
)
register(
    KernelInfo(
        name="tma_persistent_pipelined",
        rung=6,
        idea="next tile's loads issued during this tile's drain; TMA store overlaps the next tile",
        launch=tma_persistent_pipelined.launch,
        **_COMMON,
    )
)
