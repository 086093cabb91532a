"""batch_invariant=True's choice: a plan whose sum over K, for each element of C, is the same
arithmetic whatever M is, so that a row of A gives the same bits alone or in any batch.

What makes cuBLAS's results change with M is its choice: another kernel, another tile and, at
small M, K split among several programs whose partial sums are added at the end. Each of those
changes the order of the additions, and so the last bits. The plans here never split K: every
element is one fp32 accumulator walking K from 0 to K in steps of BLOCK_K, each step one MMA
(or, for fp32 without TF32, FMAs) added into it, then the epilogue in fp32 and one rounding. The
kernel and tile may still change with M, within one *class* of kernels whose per-element
arithmetic is the same:
- the Gluon class (Hopper, fp16/bf16, C in the inputs' dtype): every member's MMA is WGMMA's
  16-deep step in K order, whatever its M and N, and its epilogue the same arithmetic (apply_gl,
  or apply_tl, its mirror). Members: rung 6 on its rules' tile, and at decode sizes
  (`decode_config`, chosen for the loads in flight rather than the FLOPs) swap-AB's `tl` kernel
  unsplit up to SWAP_M rows, whose dot Triton lowers to the same WGMMA (m64n16k16, the weight's
  64 rows on the instruction's tall side; tests/test_gluon_compile.py checks), and rung 6 on
  DECODE_TILES up to DECODE_M. TMA-unreadable operands get aligned copies for rung 6 whatever the
  problem's size (`auto` would move small ones to a `tl` rung of another class).
- the `tl` class (everything else: the CPU's interpreter, fp32, an fp32 output of bf16 inputs,
  GPUs other than Hopper): swap-AB unsplit at M <= SKINNY_M and rung 2 above, both through
  primitives/tl/tiles.py's one K loop, on one BLOCK_K per dtype.
That the members of a class agree bit for bit is what tests/test_batch_invariant.py checks
(the `tl` class under the interpreter; both on a GPU), not what this docstring asserts.

Every member must also stop at the same place in K: a zero-filled step past K adds +0, which
turns a sum of -0 into +0. So a BLOCK_K above 64 is taken only where it divides K (`block_k_for`),
and rung 6's ring is no deeper than its tile's K-steps plus one, since its prologue runs
num_stages - 1 steps whatever K is (`_fit_ring`): then each member runs cdiv(K, BLOCK_K) steps,
which end at K, or for K not a multiple of 64 at the same multiple of 64.

The price: no split of K, which is what fills the SMs at decode sizes (few tiles, a long K), and
no measured table (its winners split, or differ in class).
"""

from __future__ import annotations

import torch

from tritongemm.core import device_info, registry
from tritongemm.core.config import MatmulConfig
from tritongemm.core.registry import HALF, KernelInfo
from tritongemm.dispatch import tiles
from tritongemm.ladder import swap_ab

GLUON_CLASS = "tma_persistent_pipelined"
TL_SKINNY, TL_WIDE = "swap_ab", "grouped"
# Decode sizes in the Gluon class. H200, 2026-12-04, kernel-only against cuBLAS, bf16, Llama-3-8B's
# weights (scripts/probes/invariant/small_m_tiles.py, results/h200/probes/invariant/): every rung-6
# tile tried gave the 8192-row batch's bits, and which one is fastest follows the programs it makes.
# A tile streams its weight slice at about the same rate whatever its width, so the widest that
# still gives most SMs a tile wins: 64 x 32 x 128 at 64 x 4096 x 4096 (128 tiles, 0.996x, where the
# 64 x 64 x 64 of the wide rules ran 0.857x), 64 x 64 x 128 at 128 rows (1.025-1.057x against
# 0.851-0.936x), 128 x 128 x 64 at 128 x 14336 x 4096 (112 tiles, 0.999x against 0.929x).
DECODE_M = 256
DECODE_TILES = (
    tiles.BIG_TILE,
    tiles.MID_TILE.with_(num_stages=6),
    tiles.SMALL_TILE.with_(num_stages=8),
    tiles.TINY_TILE.with_(BLOCK_K=128, num_stages=6),
    tiles.TINY_TILE.with_(BLOCK_N=32, BLOCK_K=128, num_stages=8),
)
_DECODE_BUSY_SMS = 0.8  # 112 tiles on 132 SMs beat 224 (two waves, the second 70% full)
# Up to 16 rows rung 6 pads 48 of its 64; swap-AB's tl kernel (16 tokens x 64 weight rows x 256 of
# K a step) made 0.88-1.08x cuBLAS at M = 1 and 16 (results/h200/invariant.csv; 0.88-0.90x where 4096
# rows make 64 tiles for a K of 14336), where rung 6's best tile made 0.54-0.87x in the probe.
SWAP_M = 16
SWAP_TILE = MatmulConfig(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_SIZE_M=1, num_warps=4, num_stages=3, split_k=1)
# Swap-AB below, rung 2 from here: where `auto` moves from its skinny rules to its wide ones.
SKINNY_M = 128
# The `tl` class's one BLOCK_K per dtype: rung 2's on the GPU, the interpreter's tiles' on the CPU.
_TL_BLOCK_K = {torch.float32: tiles.FP32_CONFIG.BLOCK_K}
_TL_BLOCK_K_HALF = tiles.BIG_CONFIG.BLOCK_K
_INTERPRETER_BLOCK_K = tiles.INTERPRETER_CONFIG.BLOCK_K


def kernel_class(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> str:
    """ "gluon" or "tl": the class that serves these operands at every M (see the module's notes).
    Reads nothing that changes with M, but M itself past a TMA descriptor's 2**31 rows."""
    info = registry.get(GLUON_CLASS)
    hopper = a.is_cuda and device_info.capability(a.device) == (9, 0)  # rung 6 is tcgen05's elsewhere
    if hopper and a.dtype in HALF and out_dtype == a.dtype and info.unavailable_reason(a.device) is None:
        if info.unsupported_reason(a, b) is None or info.aligned_copy_fits(a, b):
            return "gluon"
    return "tl"


def choose(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> tuple[KernelInfo, MatmulConfig, str]:
    """(KernelInfo, config, why) for batch_invariant=True on a checked problem."""
    M, K = a.shape
    N = b.shape[1]
    if kernel_class(a, b, out_dtype) == "gluon":
        name, config = decode_config(M, N, K, device_info.sm_count(a.device))
        return registry.get(name), config, f"batch_invariant: the Gluon class, {name} on {config.short()}, K whole"
    on_gpu = a.is_cuda
    block_k = _TL_BLOCK_K.get(a.dtype, _TL_BLOCK_K_HALF) if on_gpu else _INTERPRETER_BLOCK_K
    if M <= SKINNY_M:
        config = swap_ab.default_config(a.dtype, M, N, K, a.device).with_(split_k=1, BLOCK_K=block_k)
        return registry.get(TL_SKINNY), config, f"batch_invariant: the tl class, M <= {SKINNY_M}: swap-AB, K unsplit"
    sms = device_info.sm_count(a.device) if on_gpu else device_info.INTERPRETER_SMS
    config = tiles.ladder_config(a.dtype, M, N, K, num_sms=sms, interpret=not on_gpu).with_(BLOCK_K=block_k)
    return registry.get(TL_WIDE), config, f"batch_invariant: the tl class, M > {SKINNY_M}: rung 2"


def block_k_for(K: int, wanted: int) -> int:
    """`wanted`, or the largest of 128 and 64 below it that divides K: the Gluon class's K-steps must
    cover the same K in every member (past K a zero-filled step adds +0, which turns a -0 sum into
    +0), so a BLOCK_K above 64 is taken only where it divides K, and then no member pads."""
    for block_k in (256, 128):
        if wanted >= block_k and K % block_k == 0:
            return block_k
    return 64


def decode_config(M: int, N: int, K: int, num_sms: int) -> tuple[str, MatmulConfig]:
    """(kernel, config) of the Gluon class for M x N x K (pure: CPU-testable): swap-AB unsplit up to
    SWAP_M rows, rung 6 on the widest of DECODE_TILES that gives 80% of the SMs a tile up to DECODE_M,
    rung 6's own rules above. Each BLOCK_K through `block_k_for`, rung 6's ring through `_fit_ring`."""
    if M <= SWAP_M:
        name, config = TL_SKINNY, SWAP_TILE
    elif M <= DECODE_M:
        # Not a tile taller than M's 64-row blocks: half of 128 rows would be padding at M = 64 (H200:
        # 128 x 128 there ran 0.77x cuBLAS at 64 x 14336 x 4096, where 64 x 128 made 1.07x).
        fitting = [
            t for t in DECODE_TILES if t.BLOCK_M <= max(64, M) and t.num_tiles(M, N) >= _DECODE_BUSY_SMS * num_sms
        ]
        name, config = GLUON_CLASS, fitting[0] if fitting else DECODE_TILES[-1]
    else:
        name, config = GLUON_CLASS, tiles.persistent_pipelined_config(M, N, K, num_sms)
    block_k = block_k_for(K, config.BLOCK_K)
    if block_k != config.BLOCK_K:  # the same shared memory a stage: more of them
        config = config.with_(BLOCK_K=block_k, num_stages=config.num_stages * config.BLOCK_K // block_k)
    return name, _fit_ring(config, K) if name == GLUON_CLASS else config


def _fit_ring(config: MatmulConfig, K: int) -> MatmulConfig:
    """`config` with at most cdiv(K, BLOCK_K) + 1 stages (and at least 2): rung 6 loads and
    multiplies num_stages - 1 K-steps per tile whatever K is (the zero-filled ones past K too), so a
    deeper ring would step past where every other member stops. A slot more than the steps buys
    nothing within a tile anyway."""
    stages = max(2, min(config.num_stages, -(-K // config.BLOCK_K) + 1))
    return config if stages == config.num_stages else config.with_(num_stages=stages)
