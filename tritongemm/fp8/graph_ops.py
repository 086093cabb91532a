"""The fp8 calls a training step makes, as `torch.library` operators for graphs: while
`torch.compile` traces, each call is one node that Dynamo and AOTAutograd take whole (its fake
implementation gives the outputs' shapes, strides and dtypes), so a layer built from them compiles
with fullgraph=True; eager calls skip the dispatcher and run the functions themselves.

- `tritongemm::fp8_quantize(x, recipe, block_rows)`: `quantize_fp8(x, recipe)`, block_rows 128 for
  a weight's 128 x 128 blocks (1 otherwise);
- `tritongemm::fp8_quantize_pair(x, recipe)`: `quantize_fp8_pair` (fp8/pair.py);
- `tritongemm::fp8_quantize_transposed(x, recipe)`: `quantize_fp8_transposed` (the same file);
- `tritongemm::fp8_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, recipe)`: `scaled_mm`;
- `tritongemm::fp8_quantize_segments_t(x, offs)`: `quantize_fp8_segments_t` (fp8/grouped.py; qt's
  columns past offs[-1] are left unwritten, as no GEMM reads them);
- `tritongemm::fp8_scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype)`: `scaled_grouped_mm`.
None has a backward: the autograd.Functions that call them (fp8/training.py, fp8/grouped_training.py)
are differentiated.
"""

from __future__ import annotations

import torch

from tritongemm.core import operators
from tritongemm.core.operators import LIB
from tritongemm.fp8.api import quantize_fp8, scaled_mm
from tritongemm.fp8.grouped import quantize_fp8_segments_t, scaled_grouped_mm
from tritongemm.fp8.pair import quantize_fp8_pair, quantize_fp8_transposed
from tritongemm.fp8.recipes import SCALE_BLOCK, scale_shape

E4M3 = torch.float8_e4m3fn

LIB.define("fp8_quantize(Tensor x, str recipe, int block_rows) -> (Tensor, Tensor)")
LIB.define("fp8_quantize_pair(Tensor x, str recipe) -> (Tensor, Tensor, Tensor, Tensor)")
LIB.define("fp8_quantize_transposed(Tensor x, str recipe) -> (Tensor, Tensor)")
LIB.define("fp8_scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, ScalarType out_dtype, "
           "str recipe) -> Tensor")  # fmt: skip
LIB.define("fp8_quantize_segments_t(Tensor x, Tensor offs) -> (Tensor, Tensor)")
LIB.define("fp8_scaled_grouped_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs, "
           "ScalarType out_dtype) -> Tensor")  # fmt: skip


def quantize(x: torch.Tensor, recipe: str, block_rows: int = 1):
    if recipe == "block":
        return quantize_fp8(x, "block", block=(block_rows, SCALE_BLOCK))
    return quantize_fp8(x, recipe)


def _quantize_pair_impl(x, recipe):
    q, s, qt, st = quantize_fp8_pair(x, recipe)
    return q, s, qt, (st.clone() if st is s else st)  # an operator's outputs may not alias each other


def _scaled_mm_impl(a, b, scale_a, scale_b, bias, out_dtype, recipe):
    return scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, recipe=recipe)


LIB.impl("fp8_quantize", quantize, "CompositeExplicitAutograd")
LIB.impl("fp8_quantize_pair", _quantize_pair_impl, "CompositeExplicitAutograd")
LIB.impl("fp8_quantize_transposed", quantize_fp8_transposed, "CompositeExplicitAutograd")
LIB.impl("fp8_scaled_mm", _scaled_mm_impl, "CompositeExplicitAutograd")
LIB.impl("fp8_quantize_segments_t", quantize_fp8_segments_t, "CompositeExplicitAutograd")
LIB.impl("fp8_scaled_grouped_mm", scaled_grouped_mm, "CompositeExplicitAutograd")
quantize_op = torch.ops.tritongemm.fp8_quantize.default
quantize_pair_op = torch.ops.tritongemm.fp8_quantize_pair.default
quantize_transposed_op = torch.ops.tritongemm.fp8_quantize_transposed.default
scaled_mm_op = torch.ops.tritongemm.fp8_scaled_mm.default
segments_t_op = torch.ops.tritongemm.fp8_quantize_segments_t.default
scaled_grouped_mm_op = torch.ops.tritongemm.fp8_scaled_grouped_mm.default


def _scale_of(shape: tuple, recipe: str, block_rows: int, x: torch.Tensor) -> torch.Tensor:
    """The scale quantize_fp8 gives for an x of `shape` (recipes.scale_shape), as a fake."""
    return x.new_empty(scale_shape(shape, recipe, (block_rows, SCALE_BLOCK)), dtype=torch.float32)


@torch.library.register_fake("tritongemm::fp8_quantize", lib=LIB)
def _quantize_fake(x, recipe, block_rows):
    operators.traced()
    return x.new_empty(x.shape, dtype=E4M3), _scale_of(tuple(x.shape), recipe, block_rows, x)


@torch.library.register_fake("tritongemm::fp8_quantize_pair", lib=LIB)
def _quantize_pair_fake(x, recipe):
    operators.traced()
    R, C = x.shape
    rows = SCALE_BLOCK if recipe == "block" else 1
    return (x.new_empty((R, C), dtype=E4M3), _scale_of((R, C), recipe, rows, x),
            x.new_empty((C, R), dtype=E4M3), _scale_of((C, R), recipe, rows, x))  # fmt: skip


@torch.library.register_fake("tritongemm::fp8_quantize_transposed", lib=LIB)
def _quantize_transposed_fake(x, recipe):
    operators.traced()
    R, C = x.shape
    return x.new_empty((C, R), dtype=E4M3), _scale_of((C, R), recipe, SCALE_BLOCK if recipe == "block" else 1, x)


@torch.library.register_fake("tritongemm::fp8_scaled_mm", lib=LIB)
def _scaled_mm_fake(a, b, scale_a, scale_b, bias, out_dtype, recipe):
    operators.traced()
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


@torch.library.register_fake("tritongemm::fp8_quantize_segments_t", lib=LIB)
def _segments_t_fake(x, offs):
    operators.traced()
    R, C = x.shape
    return x.new_empty((C, R), dtype=E4M3), x.new_empty((offs.shape[0], C), dtype=torch.float32)


@torch.library.register_fake("tritongemm::fp8_scaled_grouped_mm", lib=LIB)
def _scaled_grouped_mm_fake(a, b, scale_a, scale_b, offs, out_dtype):
    operators.traced()
    if b.dim() == 3:  # rows: (M, N)
        return a.new_empty((a.shape[0], b.shape[2]), dtype=out_dtype)
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[1]), dtype=out_dtype)  # K groups: (G, M, N)


def graph_or_direct_grouped():
    """(quantize, quantize_segments_t, scaled_grouped_mm): the MoE layer's calls, the operators
    while compiling, else the functions."""
    if torch.compiler.is_compiling():
        return quantize_op, segments_t_op, scaled_grouped_mm_op
    return quantize, quantize_fp8_segments_t, scaled_grouped_mm


def graph_or_direct():
    """(quantize, quantize_pair, quantize_transposed, scaled_mm): the operators while compiling,
    else the functions."""
    if torch.compiler.is_compiling():
        return quantize_op, quantize_pair_op, quantize_transposed_op, scaled_mm_op
    return quantize, quantize_fp8_pair, quantize_fp8_transposed, _scaled_mm_impl
