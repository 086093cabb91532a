"""Test cases as data, and the one function that checks a GEMM against the fp64 reference."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import reference_matmul, rel_error, tolerance

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
LADDER = ("naive", "grouped", "persistent", "swap_ab")
HOPPER = ("tma_pipelined", "tma_persistent", "tma_persistent_pipelined", "split_k")
ON_HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0)
# The interpreter computes a bf16 tl.dot on raw bit patterns (Triton has no bf16 there), so bf16
# is checked on the GPU only.
DTYPES = (torch.float16, torch.bfloat16, torch.float32) if ON_GPU else (torch.float16, torch.float32)

# How an operand is laid out in memory. a is (M, K) and b is (K, N) in every case.
LAYOUTS = (
    "nn",  # both row-major, contiguous
    "tn",  # a is the transposed view of a (K, M) tensor
    "nt",  # b is the transposed view of an (N, K) tensor (nn.Linear's weight)
    "tt",  # both transposed views
    "padded",  # leading dimensions padded by 8 elements (a[:, :K] of an (M, K + 8) tensor)
    "offset",  # views that start 3 elements into their storage (unaligned for TMA)
)


@dataclass(frozen=True)
class Case:
    M: int
    N: int
    K: int
    layout: str = "nn"
    config: MatmulConfig | None = None

    def __str__(self) -> str:
        cfg = f"-{self.config.short().replace(' ', '')}" if self.config else ""
        return f"{self.M}x{self.N}x{self.K}-{self.layout}{cfg}"


def make_operand(rows: int, cols: int, transposed: bool, layout: str, dtype, gen) -> torch.Tensor:
    """A (rows, cols) view of random data, laid out in its storage as `layout` says."""
    outer, inner = (cols, rows) if transposed else (rows, cols)
    leading_dim = inner + (8 if layout == "padded" else 0)
    offset = 3 if layout == "offset" else 0
    storage = torch.randn(offset + outer * leading_dim, generator=gen).to(dtype=dtype, device=DEVICE)
    t = torch.as_strided(storage, (outer, inner), (leading_dim, 1), offset)
    return t.T if transposed else t


def make_operands(case: Case, dtype: torch.dtype, seed_text: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random a (M, K) and b (K, N) for a case; the seed comes from the case's name so a
    failure reproduces, and no two cases share data."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case}{dtype}{seed_text}".encode()))
    a = make_operand(case.M, case.K, case.layout in ("tn", "tt"), case.layout, dtype, gen)
    b = make_operand(case.K, case.N, case.layout in ("nt", "tt"), case.layout, dtype, gen)
    return a, b


def check_matmul(case: Case, kernel: str, dtype: torch.dtype) -> None:
    """Run one case with a NaN-poisoned out= and compare with the fp64 reference."""
    a, b = make_operands(case, dtype, kernel)
    out = torch.full((case.M, case.N), float("nan"), dtype=dtype, device=DEVICE)
    result = tritongemm.matmul(a, b, out=out, kernel=kernel, config=case.config)
    assert result is out
    err = rel_error(out, reference_matmul(a, b))
    bound = tolerance(dtype, case.K)
    assert err <= bound, f"{kernel} {case} {dtype}: relative error {err:.3e} > bound {bound:.3e}"


def fused_linear_error(
    kernel: str, config, lead: tuple[int, ...], N: int, K: int, activation: str, alpha: float, seed: int
) -> tuple[float, float]:
    """tritongemm.linear with every epilogue part (bias, `activation`, residual, alpha) on fp32
    (*lead, K) activations and an (N, K) weight against the fp64 reference: (error, bound)."""
    from tritongemm.core.epilogue import reference_linear

    gen = torch.Generator().manual_seed(seed)
    x, w = (torch.randn(shape, generator=gen).to(DEVICE) for shape in ((*lead, K), (N, K)))
    bias, residual = torch.randn(N, generator=gen).to(DEVICE), torch.randn(*lead, N, generator=gen).to(DEVICE)
    y = tritongemm.linear(
        x, w, bias, activation=activation, residual=residual, alpha=alpha, kernel=kernel, config=config
    )
    ref = reference_linear(x, w, bias, activation=activation, residual=residual, alpha=alpha)
    return rel_error(y, ref), tolerance(torch.float32, K)
