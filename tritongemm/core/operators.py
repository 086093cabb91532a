"""What every family's `torch.library` operators share: the one library of the `tritongemm`
namespace, the autograd kernel that skips the dispatcher where no autograd records, the config
label an operator takes, and the hook that has Inductor call the implementations directly.

What `torch.compile` needs to put a tritongemm GEMM into a graph: an operator with a schema, a
fake implementation that gives the output's shape, strides and dtype without running anything
(Dynamo and AOTAutograd trace with it, symbolic shapes included), and autograd registered on the
operator, so that the backward is traced too. Each family defines its operators in the module of
its public function, in the order Liger's and QuACK's op files keep (the direct path, the
operator, its autograd, the public function): `tritongemm.matmul` and `tritongemm.linear` call
the operators only while compiling, since in eager mode the dispatcher would add about 11 us to
every call (H100 machine, torch 2.11), and eager calls take the direct path, which is the
operator's implementation anyway.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tritongemm.core.config import MatmulConfig
from tritongemm.core.problem import requires_grad

# Defined with torch.library's low-level API, not `custom_op`: a compiled graph calls an operator
# on every run, and custom_op's layers around the implementation (its own dispatch wrapper, an
# aliasing check of the output) cost 5.9 us a call against 4.1 us for a definition with the
# same fake and autograd registrations (this repository's CPU machine, an empty implementation).
LIB = torch.library.Library("tritongemm", "DEF")  # the registrations live as long as this object
# A call that records no autograd, on tensors of a backend (no fake, functional or batched tensor,
# no dispatch mode): the operator's Autograd kernel runs the implementation itself.
_BACKENDS = (torch._C.DispatchKey.CUDA, torch._C.DispatchKey.CPU)


def register_autograd(op, impl, setup_context, backward) -> None:
    """`op`'s Autograd kernel: what `torch.library.register_autograd` installs (an autograd.Function
    whose forward redispatches below autograd, `setup_context` and `backward` as that API takes
    them), except where no autograd is recorded. There it calls `impl` straight away when the
    dispatcher would reach it next anyway, instead of a second trip through the dispatcher: every
    call of a compiled graph (AOTAutograd runs the forward graph without autograd) took 146 us of
    profiled host time a call, the redispatch 110 of them (Qwen2-7B's decode on the H100 machine).
    """
    defaults = [a.default_value if a.has_default_value() else None for a in op._schema.arguments]

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, keyset, *args):
            with torch._C._AutoDispatchBelowAutograd():
                output = op.redispatch(keyset & torch._C._after_autograd_keyset, *args)
            # A graph calls the operator without its trailing defaults (AOTAutograd drops them):
            # `setup_context` and `backward` see every argument, the ones left out needing no gradient.
            setup_context(ctx, (*args, *defaults[len(args) :]), output)
            ctx.given = len(args)
            return output

        @staticmethod
        def backward(ctx, *grads):
            given = ctx.needs_input_grad[1:]  # not the keyset's
            ctx.needs_input_grad = (*given, *[False] * (len(defaults) - len(given)))
            return (None, *backward(ctx, *grads))[: 1 + ctx.given]

    def autograd_kernel(keyset, *args):
        if torch.is_grad_enabled() and requires_grad(*args):
            return Function.apply(keyset, *args)
        below = keyset & torch._C._after_autograd_keyset
        if below.highestPriorityTypeId() in _BACKENDS:
            return impl(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(below, *args)

    LIB.impl(op._opname, autograd_kernel, "Autograd", with_keyset=True)


def no_context(ctx, inputs, output) -> None:
    """`setup_context` of an operator whose backward only refuses."""


def config_of(label: str | None) -> MatmulConfig | str | None:
    """An operator's `config` argument (None, "autotune" or a `MatmulConfig.short()` label: an
    operator takes strings, not Python objects) as `matmul(config=...)` takes it."""
    return MatmulConfig.parse(label) if label is not None and label != "autotune" else label


def label_of(config: MatmulConfig | str | None) -> str | None:
    """The inverse of `config_of`, for a call that becomes an operator while compiling."""
    return config.short() if isinstance(config, MatmulConfig) else config


# What runs the first time a graph holding an operator is traced: inductor.py adds the installing
# of its lowerings. The fake implementations call `traced()`: they run, for real, whenever a graph
# holding an operator is traced, and only then, so a program that never compiles never imports
# Inductor.
_ON_TRACE: list[Callable[[], object]] = []


def on_trace(hook: Callable[[], object]) -> None:
    _ON_TRACE.append(hook)


def traced() -> None:
    for hook in _ON_TRACE:
        hook()
