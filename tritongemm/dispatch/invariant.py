"""batch_invariant=True's choice: a plan whose sum over K, for each element of C, is the same
arithmetic whatever M is, so that a row of A gives the same bits alone or in any batch.

What makes cuBLAS's results change with M is its choice: another kernel, another tile and, at
small M, K split among several programs whose partial sums are added at the end. Each of those
changes the order of the additions, and so the last bits. The plans here never split K: every
element is one fp32 accumulator walking K from 0 to K in steps of BLOCK_K, each step one MMA
(or, for fp32 without TF32, FMAs) added into it, then the epilogue in fp32 and one rounding. The
kernel and tile may still change with M, within one *class* of kernels whose per-element
arithmetic is the same:
- the Gluon class (Hopper, fp16/bf16, C in the inputs' dtype): rung 6 on the tile its rules give
  for M, N and K. Every tile's MMA is WGMMA's 16-deep step in K order, whatever its M and N, and
  the epilogue is the same code; TMA-unreadable operands get aligned copies (whatever the
  problem's size: `auto` would move small ones to a `tl` rung, another class).
- the `tl` class (everything else: the CPU's interpreter, fp32, an fp32 output of bf16 inputs,
  GPUs other than Hopper): swap-AB unsplit at M <= SKINNY_M and rung 2 above, both through
  primitives/tl/tiles.py's one K loop, on one BLOCK_K per dtype.
That the members of a class agree bit for bit is what tests/test_batch_invariant.py checks
(the `tl` class under the interpreter; both on a GPU), not what this docstring asserts.

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
        config = tiles.persistent_pipelined_config(M, N, K, device_info.sm_count(a.device))
        return registry.get(GLUON_CLASS), config, "batch_invariant: the Gluon class, rung 6 on its rules' tile, K whole"
    on_gpu = a.is_cuda
    block_k = _TL_BLOCK_K.get(a.dtype, _TL_BLOCK_K_HALF) if on_gpu else _INTERPRETER_BLOCK_K
    if M <= SKINNY_M:
        config = swap_ab.default_config(a.dtype, M, N, K, a.device).with_(split_k=1, BLOCK_K=block_k)
        return registry.get(TL_SKINNY), config, f"batch_invariant: the tl class, M <= {SKINNY_M}: swap-AB, K unsplit"
    sms = device_info.sm_count(a.device) if on_gpu else device_info.INTERPRETER_SMS
    config = tiles.ladder_config(a.dtype, M, N, K, num_sms=sms, interpret=not on_gpu).with_(BLOCK_K=block_k)
    return registry.get(TL_WIDE), config, f"batch_invariant: the tl class, M > {SKINNY_M}: rung 2"
