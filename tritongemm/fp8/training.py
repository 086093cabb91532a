"""`Fp8TrainingLinear`: an `nn.Linear` that trains in fp8. Its bf16 (or fp16, fp32) weight stays
the parameter the optimizer updates; each step quantizes it and the activations dynamically
(scales from the current tensors' absmax) and runs all three GEMMs of the layer on fp8 operands:

    forward   Y  = X  Wᵀ   reduces over K: X per token (row) along K,  W per output channel along K
    dX        dX = dY W    reduces over N: dY per token along N,        Wᵀ per input channel along N
    dW        dW = dYᵀ X   reduces over M: dYᵀ per output channel along M, Xᵀ per input channel along M

Each operand is quantized along the axis its GEMM reduces over, so one outlier spoils only the
scale of the row it is in. X, dY and W are each needed along two axes: `quantize_fp8_pair`
(fp8/pair.py) writes both fp8 copies (X along K and Xᵀ along M; dY along N and dYᵀ along M; W
along K and Wᵀ along N) from one cast pass over the tensor, and Wᵀ's copy is saved for the
backward (1 byte a parameter until then). With `save_weight_t=False` Wᵀ is quantized in the
backward from the weight itself instead (`quantize_fp8_transposed`: the pair's kernels writing
the transposed copy alone), so nothing of the weight's is kept between the forward and the
backward but the parameter, as FSDP, which frees a gathered weight after the forward, needs; it
reads W twice a step (about 5% of a 4096 x 14336 layer's fp8 step on the H200).

All operands are e4m3: with a scale per row (or per tensor) taken from the current absmax, the
gradients' range fits e4m3's, and its extra mantissa bit halves the rounding error against
e5m2's (torchao's float8 recipes and DeepSeek-V3 choose e4m3 for the same reason).

Recipes: "tensor" (one scale per operand), "row" (per token / per channel, as above), and
"block" (DeepSeek-V3's: 1 x 128 blocks of X and dY, 128 x 128 of W) for the forward and dX.
`wgrad="bf16"` computes dW from the unquantized tensors, as torchao's row-wise recipe with a
high-precision weight gradient does; the block recipe takes only that, since its dW needs 1 x 128
scales on both operands (DeepGEMM's "1D1D" kernel), which `scaled_mm`'s block kernel does not take.

Under `torch.compile` each quantization and each GEMM is one node (fp8/graph_ops.py), so the
layer compiles with fullgraph=True and AOTAutograd traces the backward through the
autograd.Function below.
"""

from __future__ import annotations

import dataclasses

import torch

from tritongemm.dense.matmul import matmul
from tritongemm.fp8.graph_ops import graph_or_direct
from tritongemm.fp8.recipes import RECIPES, SCALE_BLOCK

WGRADS = ("fp8", "bf16")
EXPERTS = ("bf16", "fp8")  # Fp8TrainingConfig.experts
DEFAULT_WGRAD = {"tensor": "fp8", "row": "fp8", "block": "bf16"}
# The dtypes a layer trains in: its weight's and its input's (the output is in the input's).
TRAIN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _as_scale_b(scale: torch.Tensor, recipe: str) -> torch.Tensor:
    """An (N, K) operand's scale as scaled_mm takes it for b = that operand transposed: row-wise
    (N, 1) -> (1, N); tensor-wise and block-wise as they are."""
    return scale.T if recipe == "row" else scale


class _Fp8LinearFunction(torch.autograd.Function):
    """y = x @ weight.T + bias with the three GEMMs in fp8 (the module docstring's table). With
    an fp8 weight gradient, x's transposed fp8 copy (scaled along M) is made in the pass that
    quantizes x for the forward and saved instead of x: half of x's bytes until the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe: str, wgrad: str, save_weight_t: bool):
        quantize, quantize_pair, _, mm = graph_or_direct()
        if wgrad == "fp8":
            x_fp8, x_scale, xt_fp8, xt_scale = quantize_pair(x, recipe)
            x_saved = (xt_fp8, xt_scale)
        else:
            x_fp8, x_scale = quantize(x, recipe, 1)
            x_saved = (x,)
        if save_weight_t and ctx.needs_input_grad[0]:  # Wᵀ (K, N) along N for dX, from the same pass
            w_fp8, w_scale, wt_fp8, wt_scale = quantize_pair(weight, recipe)
            wt_saved = (wt_fp8, wt_scale)
        else:
            w_fp8, w_scale = quantize(weight, recipe, SCALE_BLOCK if recipe == "block" else 1)
            wt_saved = ()
        ctx.save_for_backward(weight, *x_saved, *wt_saved)
        ctx.recipe, ctx.wgrad, ctx.x_dtype, ctx.has_bias = recipe, wgrad, x.dtype, bias is not None
        return mm(x_fp8, w_fp8.T, x_scale, _as_scale_b(w_scale, recipe), bias, x.dtype, recipe)

    @staticmethod
    def backward(ctx, dy):
        quantize, quantize_pair, quantize_transposed, mm = graph_or_direct()
        recipe, fp8_wgrad = ctx.recipe, ctx.wgrad == "fp8"
        weight, *saved = ctx.saved_tensors
        x_count = 2 if fp8_wgrad else 1  # Xᵀ's fp8 copy and its scale, or X itself
        saved, wt_saved = saved[:x_count], saved[x_count:]
        dy = dy.contiguous()  # autograd may hand an expanded or strided gradient
        want_dx, want_dw, want_db = ctx.needs_input_grad[:3]
        if fp8_wgrad and want_dw:  # dY along N for dX and dYᵀ along M for dW, from one pass
            dy_fp8, dy_scale, dyt_fp8, dyt_scale = quantize_pair(dy, recipe)
        else:
            dy_fp8, dy_scale = quantize(dy, recipe, 1)
        dx = dw = db = None
        if want_dx:  # Wᵀ (K, N) along N: the forward's, or from W read row-major in tiles (fp8/pair.py)
            wt_fp8, wt_scale = wt_saved if wt_saved else quantize_transposed(weight, recipe)
            dx = mm(dy_fp8, wt_fp8.T, dy_scale, _as_scale_b(wt_scale, recipe), None, ctx.x_dtype, recipe)
        if want_dw and fp8_wgrad:
            xt_fp8, xt_scale = saved
            dw = mm(dyt_fp8, xt_fp8.T, dyt_scale, _as_scale_b(xt_scale, recipe), None, weight.dtype, recipe)
        elif want_dw:  # from the tensors as they are, at the weight's precision
            (x,) = saved
            dw = matmul(dy.T.to(weight.dtype), x.to(weight.dtype))
        if ctx.has_bias and want_db:
            db = dy.sum(0, dtype=torch.float32).to(weight.dtype)
        return dx, dw, db, None, None, None


@dataclasses.dataclass(frozen=True)
class Fp8TrainingConfig:
    """How `patch(model, fp8_training=...)` trains a model's Linears in fp8, as `Fp8TrainingLinear`
    takes it: `recipe` "tensor", "row" or "block"; `wgrad` "fp8" or "bf16" (None: the recipe's
    default); `save_weight_t` False for FSDP. A recipe's name alone is `Fp8TrainingConfig(recipe)`.
    `experts`: how a MoE model's experts train, "bf16" (tritongemm's grouped GEMMs) or "fp8"
    (fp8/grouped_training.py; recipe "row" with an fp8 weight gradient only): on the H200 the fp8
    experts ran 0.34-0.49x the bf16 ones, so they are taken only when asked for."""

    recipe: str = "row"
    wgrad: str | None = None
    save_weight_t: bool = True
    experts: str = "bf16"

    def __post_init__(self):
        _check_options(self.recipe, self.wgrad, self.save_weight_t, "Fp8TrainingConfig")
        if self.experts not in EXPERTS:
            raise ValueError(f"Fp8TrainingConfig: expected experts to be one of {EXPERTS}, but got {self.experts!r}")
        if self.experts == "fp8" and (self.recipe, self.weight_gradient) != ("row", "fp8"):
            got = f"recipe {self.recipe!r}" if self.recipe != "row" else f"wgrad={self.weight_gradient!r}"
            raise ValueError(f"Fp8TrainingConfig: experts='fp8' trains with recipe 'row' and an fp8 weight gradient, "
                             f"but got {got}")  # fmt: skip

    @property
    def weight_gradient(self) -> str:
        """wgrad, the recipe's default where None: "fp8" or "bf16"."""
        return weight_gradient_of(self.recipe, self.wgrad)

    def layer(self, module: torch.nn.Linear) -> Fp8TrainingLinear:
        """`Fp8TrainingLinear.from_linear(module)` with this configuration."""
        return Fp8TrainingLinear.from_linear(module, self.recipe, self.wgrad, self.save_weight_t)


def weight_gradient_of(recipe: str, wgrad: str | None) -> str:
    """The weight gradient's precision: `wgrad`, or the recipe's default where None (a known recipe)."""
    return DEFAULT_WGRAD[recipe] if wgrad is None else wgrad


def _options_reason(recipe: str, wgrad: str | None) -> str | None:
    """Why `recipe` and `wgrad` (None: the recipe's default) can't go together (None: they can)."""
    if recipe not in RECIPES:
        return f"expected recipe to be one of {RECIPES}, but got {recipe!r}"
    wgrad = weight_gradient_of(recipe, wgrad)
    if wgrad not in WGRADS:
        return f"expected wgrad to be one of {WGRADS}, but got {wgrad!r}"
    if recipe == "block" and wgrad == "fp8":
        return ("recipe 'block' takes wgrad='bf16' only: its fp8 weight gradient needs 1 x 128 scales on both "
                "operands, which scaled_mm's block kernel does not take")  # fmt: skip
    return None


def _check_options(recipe: str, wgrad: str | None, save_weight_t: bool, caller: str) -> None:
    """Raises, naming `caller`, where the options can't go together."""
    reason = _options_reason(recipe, wgrad)
    if reason is not None:
        raise ValueError(f"{caller}: {reason}")
    if not isinstance(save_weight_t, bool):
        raise TypeError(f"{caller}: expected save_weight_t to be a bool, but got {type(save_weight_t).__name__}")


def fp8_training_unsupported_reason(module: torch.nn.Linear, recipe: str, wgrad: str | None = None) -> str | None:
    """Why `module` can't train as an Fp8TrainingLinear with `recipe` and `wgrad` (None: it can)."""
    reason = _options_reason(recipe, wgrad)
    if reason is not None:
        return reason
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
    weight gradient from unquantized tensors), by default "fp8" except for "block";
    `save_weight_t` (an attribute too): keep Wᵀ's fp8 copy from the forward's pass over W (True),
    or quantize it again in the backward (False: for FSDP, which frees a gathered weight after the
    forward).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 recipe: str = "row", wgrad: str | None = None, save_weight_t: bool = True) -> None:  # fmt: skip
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._configure(self, recipe, wgrad, save_weight_t, "Fp8TrainingLinear")

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, recipe: str = "row", wgrad: str | None = None,
                    save_weight_t: bool = True):  # fmt: skip
        """An Fp8TrainingLinear sharing `module`'s parameters (no copy: an optimizer built on the
        model before keeps updating them)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = module.in_features, module.out_features
        new.weight, new.bias = module.weight, module.bias
        new._configure(module, recipe, wgrad, save_weight_t, "Fp8TrainingLinear.from_linear")
        return new

    def _configure(self, module: torch.nn.Linear, recipe: str, wgrad: str | None, save_weight_t: bool, caller: str):
        _check_options(recipe, wgrad, save_weight_t, caller)
        reason = fp8_training_unsupported_reason(module, recipe, wgrad)
        if reason is not None:
            raise ValueError(f"{caller}: {reason}")
        self.recipe, self.wgrad = recipe, weight_gradient_of(recipe, wgrad)
        self.save_weight_t = save_weight_t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in TRAIN_DTYPES:
            raise TypeError(f"Fp8TrainingLinear: expected x of dtype bfloat16, float16 or float32, but got {x.dtype}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Fp8TrainingLinear: expected x of shape (..., {self.in_features}), "
                             f"but got {tuple(x.shape)}")  # fmt: skip
        *lead, K = x.shape
        y = _Fp8LinearFunction.apply(x.reshape(-1, K), self.weight, self.bias, self.recipe, self.wgrad,
                                     self.save_weight_t)  # fmt: skip
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        extra = f"{super().extra_repr()}, recipe={self.recipe!r}, wgrad={self.wgrad!r}"
        return extra if self.save_weight_t else f"{extra}, save_weight_t=False"
