"""The fused epilogue: what `linear` does to a tile between the last MMA and the store.

    y = activation(alpha * acc + bias), then y + residual, then one rounding to C's dtype

all in fp32 while the tile is still in registers, so the output crosses memory once where
`F.linear` followed by an activation and an add crosses it three or four times. It is written
once per language, in `primitives/epilogue.py`: `apply_tl` for the `triton.language` rungs and `apply_gl`
for the Gluon ones. Here: what a call asks for (`Epilogue`, `Fused`) and the torch function the
tests and benchmarks compare both with (`reference_linear`). This half imports no Triton, so
`import tritongemm` doesn't either (Triton reads TRITON_INTERPRET when a kernel is decorated).

Which parts run is decided at compile time (constexprs), so a plain GEMM compiles to exactly the
kernel it was before; alpha's value and the bias and residual pointers are runtime arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritongemm.core.problem import tensor_facts

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
# A gated pair's (GLU: SwiGLU, GeGLU): act(gate) * up.
GLU_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


# torch's and transformers' activation modules, by class name, as the kernels' epilogue names them.
_MODULE_NAMES = {"ReLU": "relu", "SiLU": "silu", "SiLUActivation": "silu", "GELUActivation": "gelu",
                 "NewGELUActivation": "gelu_tanh", "PytorchGELUTanh": "gelu_tanh", "GELUTanh": "gelu_tanh"}  # fmt: skip


def activation_of(module) -> str | None:
    """The epilogue's name for an activation module (torch's or transformers'): "silu", "gelu",
    "gelu_tanh" or "relu"; None for any other (its own forward must then run)."""
    if isinstance(module, torch.nn.GELU):
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    return _MODULE_NAMES.get(type(module).__name__)


@dataclass(frozen=True)
class Epilogue:
    """The compile-time shape of an epilogue; the tensors come with each call."""

    activation: str | None = None
    alpha: float = 1.0
    bias: bool = False
    residual: bool = False
    preact: bool = False  # also store alpha * acc + bias, the activation's input, for the backward

    def constexprs(self) -> dict:
        return dict(
            ACTIVATION=self.activation or "none",
            HAS_ALPHA=self.alpha != 1.0,
            HAS_BIAS=self.bias,
            HAS_RESIDUAL=self.residual,
            STORE_PREACT=self.preact,
        )

    @property
    def plain(self) -> bool:
        return self == PLAIN

    def pointers(self, bias, residual, preact=None) -> tuple:
        """The kernels' bias, residual and pre-activation pointer arguments: 0 where there is
        none. The kernel never reads it (its constexpr is off), and an integer spares Triton's
        launcher the pointer query (a driver call) it makes for every tensor argument."""
        return (bias if self.bias else 0, residual if self.residual else 0, preact if self.preact else 0)

    def fixed_args(self, residual: torch.Tensor | None, preact: torch.Tensor | None = None) -> tuple:
        """The rest of the kernels' epilogue arguments, the same for every call of a plan (whose
        key holds the residual's and pre-activation's strides, and alpha): the residual's strides,
        the pre-activation's row stride (its columns are contiguous), alpha."""
        strides = tuple(residual.stride()) if self.residual else (0, 0)
        preact_rows = preact.stride(0) if self.preact else 0
        return (*strides, preact_rows, float(self.alpha))


PLAIN = Epilogue()


@dataclass(frozen=True)
class Fused:
    """One `linear` call's epilogue, checked: its spec, its tensors (the residual folded to the
    GEMM's (M, N)) and C's dtype. Lives for the call; a plan keeps only what `key` says."""

    spec: Epilogue
    bias: torch.Tensor | None
    residual: torch.Tensor | None
    out_dtype: torch.dtype
    preact: torch.Tensor | None = None  # (M, N), unit column stride: where STORE_PREACT writes

    def key(self) -> tuple:
        tensors = (self.bias, self.residual, self.preact)
        return self.spec, self.out_dtype, *map(tensor_facts, tensors)


def reference_linear(x, weight, bias=None, activation=None, residual=None, alpha=1.0, out_dtype=None):
    """What `linear` computes, in float64 torch: activation(alpha * x @ weight.T + bias) + residual,
    rounded once to `out_dtype` (default x's dtype). The tests' and benchmarks' reference."""
    y = alpha * (x.double() @ weight.double().T)
    if bias is not None:
        y = y + bias.double()
    y = activate_torch(y, activation)
    if residual is not None:
        y = y + residual.double()
    return y.to(out_dtype or x.dtype)


def activate_torch(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    """The activations as torch defines them (`F.gelu`'s erf and tanh forms, `F.silu`)."""
    if activation is None:
        return y
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu":
        return torch.nn.functional.gelu(y)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(y, approximate="tanh")
    if activation == "silu":
        return torch.nn.functional.silu(y)
    raise ValueError(f"unknown activation {activation!r}")


def activation_backward(grad: torch.Tensor, z: torch.Tensor, activation: str) -> torch.Tensor:
    """grad * activation'(z) (autograd's backward through `linear`), in one elementwise kernel:
    torch's own backward of each activation, the one F.gelu and friends run under autograd, in
    grad's dtype with fp32 arithmetic inside. (Written as torch expressions in fp32 it was ten
    kernels and 3 ms of 5 per forward + backward at 2048 x 28672 x 4096 bf16 on the H100.)"""
    aten = torch.ops.aten
    if activation == "relu":
        return aten.threshold_backward(grad, z, 0)
    if activation in ("gelu", "gelu_tanh"):
        return aten.gelu_backward(grad, z, approximate="none" if activation == "gelu" else "tanh")
    if activation == "silu":
        return aten.silu_backward(grad, z)
    raise ValueError(f"unknown activation {activation!r}")
