"""`Fp8TrainingLinear`: an `nn.Linear` that trains in fp8. Its bf16 (or fp16, fp32) weight stays
the parameter the optimizer updates; each step quantizes it and the activations dynamically
(scales from the current tensors' absmax) and runs all three GEMMs of the layer on fp8 operands:

    forward   Y  = X  Wᵀ   reduces over K: X per token (row) along K,  W per output channel along K
    dX        dX = dY W    reduces over N: dY per token along N,        Wᵀ per input channel along N
    dW        dW = dYᵀ X   reduces over M: dYᵀ per output channel along M, Xᵀ per input channel along M

Each operand is quantized along the axis its GEMM reduces over, so one outlier spoils only the
scale of the row it is in. `quantize_fp8` reads a transposed view as it is and writes its fp8
copy row-major, so the transposed copies the backward GEMMs need (Wᵀ, dYᵀ, Xᵀ) are made in the
quantizing pass itself, not by a second one.

All operands are e4m3: with a scale per row (or per tensor) taken from the current absmax, the
gradients' range fits e4m3's, and its extra mantissa bit halves the rounding error against
e5m2's (torchao's float8 recipes and DeepSeek-V3 choose e4m3 for the same reason).

Recipes: "tensor" (one scale per operand), "row" (per token / per channel, as above), and
"block" (DeepSeek-V3's: 1 x 128 blocks of X and dY, 128 x 128 of W) for the forward and dX.
`wgrad="bf16"` computes dW from the unquantized tensors, as torchao's row-wise recipe with a
high-precision weight gradient does; the block recipe takes only that, since its dW needs 1 x 128
scales on both operands (DeepGEMM's "1D1D" kernel), which `scaled_mm`'s block kernel does not take.

Under `torch.compile` each GEMM is one `torch.ops.tritongemm.fp8_product` node (its two
quantizations and the scaled GEMM, opaque to Inductor), so the layer compiles with
fullgraph=True and AOTAutograd traces the backward through the autograd.Function below.
"""

from __future__ import annotations

import torch

from tritongemm.core import operators
from tritongemm.core.operators import LIB
from tritongemm.dense.matmul import matmul
from tritongemm.fp8.api import quantize_fp8, scaled_mm
from tritongemm.fp8.recipes import RECIPES, SCALE_BLOCK

WGRADS = ("fp8", "bf16")
DEFAULT_WGRAD = {"tensor": "fp8", "row": "fp8", "block": "bf16"}
# The dtypes a layer trains in: its weight's and its input's (the output is in the input's).
TRAIN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _quantized(t: torch.Tensor, recipe: str, weight_role: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` (R, C) in fp8, scaled per `recipe` along C, with its scale shaped as `scaled_mm` takes
    it: as scale_a for an activation-role operand, as scale_b (its (N, K) weight's) otherwise."""
    if recipe == "block":
        block = (SCALE_BLOCK, SCALE_BLOCK) if weight_role else None
        return quantize_fp8(t, "block", block=block)
    t_fp8, scale = quantize_fp8(t, recipe)
    return t_fp8, (scale.T if weight_role and recipe == "row" else scale)


def fp8_product(a: torch.Tensor, b_rows: torch.Tensor, recipe: str, out_dtype: torch.dtype,
                bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """a (M, R) @ b_rows (N, R)ᵀ on fp8 operands, each quantized along R, the reduced axis: one of
    the layer's three GEMMs. Either may be a transposed view; its fp8 copy is row-major."""
    a_fp8, scale_a = _quantized(a, recipe)
    b_fp8, scale_b = _quantized(b_rows, recipe, weight_role=True)
    return scaled_mm(a_fp8, b_fp8.T, scale_a, scale_b, bias=bias, out_dtype=out_dtype, recipe=recipe)


# The operator, for graphs: eager calls take fp8_product itself (no dispatcher on the hot path).
LIB.define("fp8_product(Tensor a, Tensor b_rows, str recipe, ScalarType out_dtype, Tensor? bias=None) -> Tensor")
LIB.impl("fp8_product", fp8_product, "CompositeExplicitAutograd")
fp8_product_op = torch.ops.tritongemm.fp8_product.default


@torch.library.register_fake("tritongemm::fp8_product", lib=LIB)
def _fp8_product_fake(a, b_rows, recipe, out_dtype, bias=None):
    operators.traced()
    if a.dim() != 2 or b_rows.dim() != 2 or a.shape[1] != b_rows.shape[1]:
        raise ValueError(f"fp8_product: expected a (M, R) and b_rows (N, R), but got {tuple(a.shape)} and "
                         f"{tuple(b_rows.shape)}")  # fmt: skip
    return a.new_empty((a.shape[0], b_rows.shape[0]), dtype=out_dtype)


def _product(a, b_rows, recipe, out_dtype, bias=None):
    """fp8_product, as a graph node while compiling."""
    if torch.compiler.is_compiling():
        return fp8_product_op(a, b_rows, recipe, out_dtype, bias)
    return fp8_product(a, b_rows, recipe, out_dtype, bias)


class _Fp8LinearFunction(torch.autograd.Function):
    """y = x @ weight.T + bias with the three GEMMs in fp8 (the module docstring's table)."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe: str, wgrad: str):
        ctx.save_for_backward(x, weight)
        ctx.recipe, ctx.wgrad, ctx.has_bias = recipe, wgrad, bias is not None
        return _product(x, weight, recipe, x.dtype, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        recipe = ctx.recipe
        dy = dy.contiguous()  # autograd may hand an expanded or strided gradient
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _product(dy, weight.T, recipe, x.dtype)
        if ctx.needs_input_grad[1]:
            if ctx.wgrad == "bf16":  # from the tensors as they are, at the weight's precision
                dw = matmul(dy.T.to(weight.dtype), x.to(weight.dtype))
            else:
                dw = _product(dy.T, x.T, recipe, weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(0, dtype=torch.float32).to(weight.dtype)
        return dx, dw, db, None, None


def fp8_training_unsupported_reason(module: torch.nn.Linear, recipe: str, wgrad: str | None = None) -> str | None:
    """Why `module` can't train as an Fp8TrainingLinear with `recipe` and `wgrad` (None: it can)."""
    if recipe not in RECIPES:
        return f"expected recipe to be one of {RECIPES}, but got {recipe!r}"
    wgrad = DEFAULT_WGRAD[recipe] if wgrad is None else wgrad
    if wgrad not in WGRADS:
        return f"expected wgrad to be one of {WGRADS}, but got {wgrad!r}"
    if recipe == "block" and wgrad == "fp8":
        return ("recipe 'block' takes wgrad='bf16' only: its fp8 weight gradient needs 1 x 128 scales on both "
                "operands, which scaled_mm's block kernel does not take")  # fmt: skip
    if module.weight.dtype not in TRAIN_DTYPES:
        return f"{module.weight.dtype} weights: fp8 training quantizes bfloat16, float16 or float32"
    if recipe == "block" and (module.in_features % SCALE_BLOCK or module.out_features % SCALE_BLOCK):
        return (f"in_features = {module.in_features}, out_features = {module.out_features}: block scales need "
                f"multiples of {SCALE_BLOCK} (the forward reduces over in_features, dX over out_features)")  # fmt: skip
    return None


class Fp8TrainingLinear(torch.nn.Linear):
    """`torch.nn.Linear` trained in fp8: y = x @ weight.T + bias, the forward and both gradients
    computed by `scaled_mm` on operands quantized each step (the module docstring says how).

    Same parameters, state_dict keys and initialization as `torch.nn.Linear`: the weight and bias
    stay in their dtype for the optimizer, checkpoints load both ways, and `from_linear` shares a
    module's parameters. `recipe` is "tensor", "row" or "block"; `wgrad` "fp8" or "bf16" (the
    weight gradient from unquantized tensors), by default "fp8" except for "block".
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 recipe: str = "row", wgrad: str | None = None) -> None:  # fmt: skip
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        reason = fp8_training_unsupported_reason(self, recipe, wgrad)
        if reason is not None:
            raise ValueError(f"Fp8TrainingLinear: {reason}")
        self.recipe, self.wgrad = recipe, DEFAULT_WGRAD[recipe] if wgrad is None else wgrad

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, recipe: str = "row", wgrad: str | None = None):
        """An Fp8TrainingLinear sharing `module`'s parameters (no copy: an optimizer built on the
        model before keeps updating them)."""
        reason = fp8_training_unsupported_reason(module, recipe, wgrad)
        if reason is not None:
            raise ValueError(f"Fp8TrainingLinear.from_linear: {reason}")
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = module.in_features, module.out_features
        new.weight, new.bias = module.weight, module.bias
        new.recipe, new.wgrad = recipe, DEFAULT_WGRAD[recipe] if wgrad is None else wgrad
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in TRAIN_DTYPES:
            raise TypeError(f"Fp8TrainingLinear: expected x of dtype bfloat16, float16 or float32, but got {x.dtype}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Fp8TrainingLinear: expected x of shape (..., {self.in_features}), "
                             f"but got {tuple(x.shape)}")  # fmt: skip
        *lead, K = x.shape
        y = _Fp8LinearFunction.apply(x.reshape(-1, K), self.weight, self.bias, self.recipe, self.wgrad)
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe!r}, wgrad={self.wgrad!r}"
