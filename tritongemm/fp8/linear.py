"""`Fp8Linear`: an inference-only `nn.Linear` whose weight is stored in fp8 with its scales, and
whose input is quantized on the fly: each call is `quantize_fp8(x)`, then `scaled_mm` with the
bias and activation in its epilogue, the output in x's dtype. `tritongemm.patch(model, fp8=...)`
puts it in place of a model's `nn.Linear` modules.

Activations and weights follow one recipe: "row" (per token and per output channel), "block" (1 x
128 blocks of a token, 128 x 128 blocks of the weight: DeepSeek-V3's) or "tensor". Training in
fp8 is not offered: a call that autograd would differentiate is refused, not silently cut off.

Layers that read one input (attention's q, k and v projections; a gated MLP's gate and up) can
share its quantization (`SharedQuantization`, which `patch` gives them): the first of them called
with an input quantizes it and keeps the result for the others, so a transformer layer quantizes
four inputs, not seven.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritongemm.core.checks import invariant_kernel
from tritongemm.core.epilogue import ACTIVATIONS
from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts
from tritongemm.core.registry import BATCH_INVARIANT
from tritongemm.fp8.api import plan_quantize, plan_scaled_mm, quantize_fp8, scaled_mm
from tritongemm.fp8.recipes import RECIPES, SCALE_BLOCK

# The dtypes an Fp8Linear takes in and gives back (its output is in the input's dtype).
IO_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class Fp8Linear(torch.nn.Module):
    """y = activation(x @ dequantized(weight).T + bias), computed from fp8 operands.

    Buffers: `weight_fp8` (N, K) in float8_e4m3fn, `weight_scale` as `scaled_mm` takes scale_b
    ((1, N) for "row", (ceil(N / 128), K / 128) for "block", one element for "tensor"), and the
    bias (N,) in its own dtype, or None. Build one with `from_linear`. `batch_invariant`: each
    row of y the same bits whatever else x holds (scaled_mm's; row and block recipes only, as a
    tensor-wise input scale is the whole batch's absmax).
    """

    def __init__(self, weight_fp8, weight_scale, bias, recipe: str, activation: str | None = None, *,
                 batch_invariant: bool = False) -> None:  # fmt: skip
        super().__init__()
        if recipe not in RECIPES:
            raise ValueError(f"Fp8Linear: expected recipe to be one of {RECIPES}, but got {recipe!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"Fp8Linear: expected activation to be one of {ACTIVATIONS}, but got {activation!r}")
        invariant_kernel("auto", batch_invariant, "Fp8Linear")
        if batch_invariant and recipe == "tensor":
            raise ValueError("Fp8Linear: batch_invariant=True needs a row's scale to be its own (recipe 'row' or "
                             "'block'), but got recipe 'tensor', whose scale is the whole batch's absmax")  # fmt: skip
        self.out_features, self.in_features = weight_fp8.shape
        self.recipe, self.activation, self.batch_invariant = recipe, activation, batch_invariant
        self.register_buffer("weight_fp8", weight_fp8)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", bias)
        self.shared: SharedQuantization | None = None  # set by SharedQuantization.install

    @classmethod
    @torch.no_grad()
    def from_linear(cls, module: torch.nn.Linear, recipe: str = "row", activation: str | None = None, *,
                    batch_invariant: bool = False) -> Fp8Linear:  # fmt: skip
        """`module`'s weight quantized once (per output channel, in 128 x 128 blocks or as a whole,
        as `recipe` says); its bias kept as it is (a copy: the module's parameter is not shared)."""
        reason = fp8_unsupported_reason(module, recipe)
        if reason is not None:
            raise ValueError(f"Fp8Linear.from_linear: {reason}")
        weight = module.weight.detach()
        if recipe == "block":
            weight_fp8, scale = quantize_fp8(weight, "block", block=(SCALE_BLOCK, SCALE_BLOCK))
        else:
            weight_fp8, scale = quantize_fp8(weight, recipe)
            scale = scale.T if recipe == "row" else scale  # (N, 1) per channel -> scale_b's (1, N)
        bias = None if module.bias is None else module.bias.detach().clone()
        return cls(weight_fp8, scale.contiguous(), bias, recipe, activation, batch_invariant=batch_invariant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError(
                "Fp8Linear computes inference only (fp8 training is not offered), but x requires grad: call the model "
                "under torch.no_grad() or torch.inference_mode()"
            )
        buffers = self._buffers  # read once: nn.Module's attribute look-up costs a microsecond a buffer
        weight, scale, bias = buffers["weight_fp8"], buffers["weight_scale"], buffers["bias"]
        if torch.compiler.is_compiling():  # the public calls, which Dynamo traces as they are
            *lead, K = x.shape
            x_fp8, x_scale = quantize_fp8(x.reshape(-1, K), self.recipe)
            y = scaled_mm(x_fp8, weight.T, x_scale, scale, bias=bias, out_dtype=x.dtype, activation=self.activation,
                          batch_invariant=self.batch_invariant, recipe=self.recipe)  # fmt: skip
            return y.view(*lead, self.out_features)
        quantized = None if self.shared is None else self.shared.quantized(self, x)
        # The hot path: one plan per input geometry (every fact the plan reads is in the key),
        # the quantization's and the GEMM's planned calls composed, checked once. Calling the
        # public quantize_fp8 and scaled_mm instead took 47 us of host time a call on the H100
        # machine at 1 x 4096 -> 4096, where nn.Linear takes 19 (scripts/probes/fp8/fp8_host_probe.py).
        key = ("Fp8Linear", self.recipe, self.activation, self.batch_invariant, quantized is None, tensor_facts(x),
               tensor_facts(weight), tensor_facts(scale), tensor_facts(bias))  # fmt: skip
        call = planned(key, lambda: self._plan(x, weight, scale, bias, quantized))
        return call(x, weight, scale, bias, quantized)

    def _plan(self, x, weight, scale, bias, quantized):
        """`call(x, weight, scale, bias, quantized) -> y` for tensors like these: x quantized (unless
        `quantized`, the group's, is given) and multiplied by plans made once."""
        if x.dtype not in IO_DTYPES:
            raise TypeError(f"Fp8Linear: expected x of dtype bfloat16, float16 or float32, but got {x.dtype}")
        *lead, K = x.shape
        shape, flat = (*lead, self.out_features), x.dim() == 2
        quantize = plan_quantize(x.reshape(-1, K), self.recipe) if quantized is None else None
        x_fp8, x_scale = quantized if quantized is not None else quantize(x.reshape(-1, K))
        kernel = BATCH_INVARIANT if self.batch_invariant else "auto"
        gemm = plan_scaled_mm(x_fp8, weight.T, x_scale, scale, bias, None, self.activation, 1.0, x.dtype, kernel, None,
                              self.recipe)  # fmt: skip

        def call(x, weight, scale, bias, quantized):
            x_fp8, x_scale = quantized if quantized is not None else quantize(x if flat else x.reshape(-1, K))
            y = gemm(x_fp8, weight.T, x_scale, scale, bias, None)
            return y if flat else y.view(shape)

        return call

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.recipe!r}, activation={self.activation!r}"
                + (", batch_invariant=True" if self.batch_invariant else ""))  # fmt: skip


@dataclass
class _Kept:
    """An input's quantization, kept for the layers of the group that have not taken it yet."""

    input: torch.Tensor
    version: int
    result: tuple[torch.Tensor, torch.Tensor]
    waiting: list  # the layers that may still take it


class SharedQuantization:
    """One input's quantization for a group of Fp8Linears of one recipe that read it one after
    the other (q, k and v; gate and up): the first called with an input quantizes it and keeps
    the result; each other layer of the group takes it once when called with that same tensor
    object, unmodified since (its version counter). Any other input is quantized afresh.

    The kept result lives no longer than the parent module's forward (a hook drops it, also
    after an exception), so a layer left uncalled (cross-attention's k and v read another input)
    keeps nothing alive. An inference tensor (torch.inference_mode) has no version counter to
    tell an in-place change by, so its quantization is never kept: each layer quantizes it. Not
    thread-safe: one group, one forward at a time, as in a model. Under torch.compile each layer
    quantizes its own input."""

    def __init__(self, recipe: str, layers: list[Fp8Linear]) -> None:
        self.recipe = recipe
        self.layers = layers
        self._kept: _Kept | None = None

    @classmethod
    def install(cls, layers: list, parent: torch.nn.Module) -> SharedQuantization | None:
        """Share one quantization among `layers`, children of `parent` (None, and nothing done,
        unless they are two or more Fp8Linears of one recipe and width, none sharing already)."""
        if len(layers) < 2 or not all(isinstance(layer, Fp8Linear) and layer.shared is None for layer in layers):
            return None
        if len({(layer.recipe, layer.in_features) for layer in layers}) != 1:
            return None
        shared = cls(layers[0].recipe, list(layers))
        for layer in layers:
            layer.shared = shared
        parent.register_forward_hook(shared.forward_done, always_call=True)
        return shared

    def quantized(self, layer: Fp8Linear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.is_inference():
            return quantize_fp8(x.reshape(-1, x.shape[-1]), self.recipe)
        kept = self._kept
        if kept is not None and kept.input is x and kept.version == x._version and layer in kept.waiting:
            kept.waiting.remove(layer)
            if not kept.waiting:
                self._kept = None
            return kept.result
        result = quantize_fp8(x.reshape(-1, x.shape[-1]), self.recipe)
        self._kept = _Kept(x, x._version, result, [other for other in self.layers if other is not layer])
        return result

    def takes(self, width: int) -> bool:
        """Whether the kernel before the group (an RMSNorm: blocks/rms_norm.py) can quantize its
        inputs of this width for it, a program holding whole rows: per-token rows, or 1 x 128
        blocks of a width that is a multiple of 128. Not tensor-wise: that needs the whole
        tensor's absmax before any cast."""
        return self.recipe == "row" or (self.recipe == "block" and width % 128 == 0)

    def offer(self, x: torch.Tensor, result: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Keep `result`, x's quantization made by the kernel that made x, for every layer of the
        group: each takes it when called with x (`quantized`), as if the first had made it."""
        self._kept = _Kept(x, x._version, result, list(self.layers))

    def forward_done(self, module, args, output) -> None:
        """The parent's forward hook: nothing kept past it."""
        self._kept = None

    def __repr__(self) -> str:
        return f"SharedQuantization(recipe={self.recipe!r})"


def fp8_unsupported_reason(module: torch.nn.Linear, recipe: str) -> str | None:
    """Why `module` can't become an Fp8Linear with `recipe` (None: it can)."""
    if recipe not in RECIPES:
        return f"expected recipe to be one of {RECIPES}, but got {recipe!r}"
    if module.weight.dtype not in IO_DTYPES:
        return f"{module.weight.dtype} weights: fp8 quantizes bfloat16, float16 or float32"
    if recipe == "block" and module.in_features % SCALE_BLOCK:
        return f"in_features = {module.in_features}: block scales need a multiple of {SCALE_BLOCK}"
    return None
