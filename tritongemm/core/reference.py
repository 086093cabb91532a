"""The fp64 reference and the accuracy bound every check in the project uses (tests, benchmarks,
the demo): one definition, so "correct" means the same thing everywhere."""

from __future__ import annotations

import math

import torch

# Relative Frobenius error allowed at K = 256, per operand dtype. fp16 / bf16 outputs are rounded
# to 11 / 8 significant bits (unit roundoff 4.9e-4 / 3.9e-3); TF32 cuts fp32 operands to 11
# bits (Triton truncates, cuBLAS may round: up to twice the error); exact fp32 accumulates in 24.
_BASE_TOLERANCE = {
    torch.float16: 1e-3,
    torch.bfloat16: 8e-3,
    "tf32": 2e-3,
    "ieee": 2e-5,
}


def reference_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b computed in float64, on the operands' device."""
    return a.double() @ b.double()


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F; inf when out holds NaN/Inf where ref is finite."""
    diff = out.double() - ref
    if not torch.isfinite(diff).all():
        return math.inf
    denom = torch.linalg.norm(ref).item()
    num = torch.linalg.norm(diff).item()
    return num / denom if denom > 0 else num


def tolerance(dtype: torch.dtype, K: int, *, allow_tf32: bool | None = None) -> float:
    """Largest rel_error accepted for a GEMM with operands of `dtype` and inner dimension K.

    Rounding errors of K products add up like a random walk, so the bound grows with sqrt(K).
    fp32 follows torch's TF32 switch (read now unless `allow_tf32` is given).
    """
    if dtype == torch.float32:
        tf32 = torch.backends.cuda.matmul.allow_tf32 if allow_tf32 is None else allow_tf32
        base = _BASE_TOLERANCE["tf32" if tf32 else "ieee"]
    else:
        base = _BASE_TOLERANCE[dtype]
    return base * max(1.0, math.sqrt(K / 256))


# Hopper's fp8 MMA keeps about 14 significant bits in its accumulator (DeepSeek-V3's report
# measured it), not fp32's 24, so a sum of fp8 products is only that exact between promotions to
# fp32 registers, in cuBLAS's kernels and ours. On the H100 with fp32 outputs: 5e-5 at 1 x 1 x 128,
# 3.3e-4 at 17 x 200 x 512 (row-wise scales), against 2e-5 for fp32's sum.
_FP8_MMA_TOLERANCE = 1e-3  # at K = 256, growing as the others


def fp8_tolerance(out_dtype: torch.dtype, K: int) -> float:
    """Largest rel_error accepted for a scaled GEMM of fp8 operands into `out_dtype`: the output's
    rounding or the fp8 MMA's accumulation, whichever is larger."""
    return max(tolerance(out_dtype, K, allow_tf32=False), _FP8_MMA_TOLERANCE * max(1.0, math.sqrt(K / 256)))
