"""`Linear`: a drop-in `torch.nn.Linear` whose forward is `tritongemm.linear`, with an
activation fused into its epilogue; `tritongemm.nn.Linear`, and what `tritongemm.patch` puts in
place of a model's `nn.Linear` modules, sharing their parameters.

    >>> up = tritongemm.nn.Linear(4096, 14336, activation="silu", device="cuda")   # SiLU in the epilogue
"""

from __future__ import annotations

import torch

from tritongemm.core.checks import invariant_kernel
from tritongemm.core.epilogue import ACTIVATIONS
from tritongemm.dense.linear import linear


class Linear(torch.nn.Linear):
    """`torch.nn.Linear` computed by `tritongemm.linear`: y = activation(x @ weight.T + bias),
    the activation applied in the GEMM's epilogue, before the one rounding to x's dtype.

    Same parameters, state_dict keys and initialization as `torch.nn.Linear`, so checkpoints load
    both ways. `activation` is None, "relu", "gelu", "gelu_tanh" or "silu"; `kernel` and
    `batch_invariant` are what `tritongemm.linear` takes.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        activation: str | None = None,
        kernel: str = "auto",
        batch_invariant: bool = False,
    ) -> None:
        if activation not in ACTIVATIONS:  # checked before the weight is allocated
            raise ValueError(f"Linear: expected activation to be one of {ACTIVATIONS}, but got {activation!r}")
        invariant_kernel(kernel, batch_invariant, "Linear")  # the same errors as linear's, at construction
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation
        self.kernel = kernel
        self.batch_invariant = batch_invariant

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, activation: str | None = None, kernel: str = "auto",
                    batch_invariant: bool = False) -> Linear:  # fmt: skip
        """A `Linear` computing what `module` computes (then `activation`), holding `module`'s own
        Parameter objects: gradients, optimizer state and in-place updates are shared, and no
        weight is allocated or copied. The module's hooks are not carried over."""
        # Built on the meta device, where the weight and its initialization cost nothing, then
        # given the module's parameters in place of the meta ones.
        new = cls(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            device="meta",
            activation=activation,
            kernel=kernel,
            batch_invariant=batch_invariant,
        )
        new.weight = module.weight
        new.bias = module.bias
        new.train(module.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, activation=self.activation, kernel=self.kernel,
                      batch_invariant=self.batch_invariant)  # fmt: skip

    def extra_repr(self) -> str:
        invariant = ", batch_invariant=True" if self.batch_invariant else ""
        return f"{super().extra_repr()}, activation={self.activation!r}, kernel={self.kernel!r}{invariant}"
