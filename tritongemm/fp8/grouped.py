"""fp8 grouped GEMMs with row-wise scales, and the per-group quantization a MoE layer's weight
gradient needs: the pieces fp8_grouped_linear trains experts with (fp8/grouped_training.py).

- `scaled_grouped_mm(a, b, scale_a, scale_b, offs)`: grouped_mm on fp8 operands, rows (the
  forward, dX) or K groups (dW), accumulated in fp32 and dequantized before the store: grouped_mm's
  `tl` kernels with `SCALED` (grouped/tl.py). Offsets stay on the device: nothing synchronizes.
- `quantize_fp8_segments_t(x, offs)`: each group's stretch of each column of x quantized by its
  own absmax and written transposed (fp8/grouped_build.py), so the K-group GEMM's operands are
  K-major, as Hopper's fp8 MMA reads them, and one expert's outlier scales no other's gradient.
"""

from __future__ import annotations

import torch

from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts
from tritongemm.fp8.recipes import FP8_DTYPES, OUT_DTYPES  # OUT_DTYPES: what fp8 dequantizes to, and is made from


def _build():
    """fp8/grouped_build.py, imported on the first plan (its kernel imports Triton, which reads
    TRITON_INTERPRET when a kernel is decorated)."""
    from tritongemm.fp8 import grouped_build

    return grouped_build


def _grouped_build():
    """grouped/build.py (the scaled GEMMs' plans), imported on the first plan, as grouped_mm imports it."""
    from tritongemm.grouped import build

    return build


def quantize_fp8_segments_t(x: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn):
    """(qt, scale_t): x (R, C) transposed into qt (C, R) fp8, each group's rows offs[g - 1]:offs[g]
    of each column scaled by their own absmax, scale_t (G, C) fp32: qt[c, r] * scale_t[g, c] ≈ x[r, c]
    for r in group g. Rows past offs[-1] belong to no group: their columns of qt are not written.
    Each group of each column equals `quantize_fp8` of that stretch of x.T along its row, bit for bit."""
    _check_segments(x, offs, dtype)
    key = ("quantize_fp8_segments_t", dtype, tensor_facts(x), tensor_facts(offs))
    return planned(key, lambda: _build().plan_segments_transposed(x, offs, dtype))(x, offs)


def scaled_grouped_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                      offs: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:  # fmt: skip
    """grouped_mm on fp8 operands with row-wise scales, accumulated in fp32, dequantized, rounded once.

    - rows (a 2-D (M, K), b (G, K, N)): c (M, N), rows offs[g - 1]:offs[g] of a times b[g], each
      product times scale_a[m] (M,) and scale_b[g, n] (G, N); rows past offs[-1] are zeros.
    - K groups (a (M, K), b (K, N), both 2-D): c (G, M, N), columns offs[g - 1]:offs[g] of a times
      those rows of b, times scale_a[g, m] (G, M) and scale_b[g, n] (G, N).
    """
    form = _check_scaled(a, b, scale_a, scale_b, offs, out_dtype)
    key = ("scaled_grouped_mm", form, out_dtype, *(tensor_facts(t) for t in (a, b, scale_a, scale_b, offs)))

    def build():
        return _grouped_build().grouped_call(a, b, offs, out_dtype, form, None, None, scales=(scale_a, scale_b))

    return planned(key, build)(a, b, offs, scale_a, scale_b)


def _check_offsets_tensor(offs, who: str) -> None:
    if not isinstance(offs, torch.Tensor) or offs.dim() != 1 or offs.dtype != torch.int32:
        got = f"{offs.dtype} of shape {tuple(offs.shape)}" if isinstance(offs, torch.Tensor) else type(offs).__name__
        raise ValueError(f"{who}: expected offs, a 1-D int32 tensor of group ends, but got {got}")


def _check_segments(x, offs, dtype) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in OUT_DTYPES:
        got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"quantize_fp8_segments_t: expected x, a 2-D bfloat16, float16 or float32 tensor, but got "
                         f"{got}")  # fmt: skip
    _check_offsets_tensor(offs, "quantize_fp8_segments_t")
    if dtype not in FP8_DTYPES:
        raise TypeError(f"quantize_fp8_segments_t: expected dtype float8_e4m3fn or float8_e5m2, but got {dtype}")
    if offs.device != x.device:
        raise ValueError(f"quantize_fp8_segments_t: expected offs on x's device {x.device}, but got {offs.device}")


def _check_scaled(a, b, scale_a, scale_b, offs, out_dtype) -> str:
    who = "scaled_grouped_mm"
    tensors = dict(a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: expected {name} to be a tensor, but got {type(t).__name__}")
    _check_offsets_tensor(offs, who)
    for name in ("a", "b"):
        if tensors[name].dtype not in FP8_DTYPES:
            raise TypeError(f"{who}: expected {name} of an fp8 dtype, but got {tensors[name].dtype}")
    for name in ("scale_a", "scale_b"):
        if tensors[name].dtype != torch.float32:
            raise TypeError(f"{who}: expected {name} of dtype float32, but got {tensors[name].dtype}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"{who}: expected out_dtype bfloat16, float16 or float32, but got {out_dtype}")
    devices = {t.device for t in (a, b, scale_a, scale_b, offs)}
    if len(devices) != 1:
        raise ValueError(f"{who}: expected every tensor on one device, but got {sorted(map(str, devices))}")
    G = offs.shape[0]
    if a.dim() == 2 and b.dim() == 3:
        form, (M, K), (Gb, Kb, N) = "m", a.shape, b.shape
        want_a, want_b = (M,), (G, N)
        if Gb != G or Kb != K:
            raise ValueError(f"{who}: expected b of shape ({G}, {K}, N) for a {tuple(a.shape)} and {G} offsets, "
                             f"but got {tuple(b.shape)}")  # fmt: skip
    elif a.dim() == 2 and b.dim() == 2:
        form, (M, K), (Kb, N) = "k", a.shape, b.shape
        want_a, want_b = (G, M), (G, N)
        if Kb != K:
            raise ValueError(f"{who}: expected b of shape ({K}, N) for a {tuple(a.shape)}, but got {tuple(b.shape)}")
    else:
        raise ValueError(f"{who}: expected a 2-D and b 3-D (row groups) or both 2-D (K groups), but got "
                         f"{a.dim()}-D and {b.dim()}-D")  # fmt: skip
    for name, want in (("scale_a", want_a), ("scale_b", want_b)):
        t = tensors[name]
        if tuple(t.shape) != want or not t.is_contiguous():
            raise ValueError(f"{who}: expected {name} contiguous of shape {want}, but got {tuple(t.shape)} with "
                             f"strides {t.stride()}")  # fmt: skip
    return form
