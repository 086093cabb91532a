"""How a graph compiled by Inductor calls tritongemm's operators: a plain Python call.

Left to itself, Inductor runs a custom operator as a fallback kernel, `torch.ops.tritongemm.
linear.default(...)` in the code it generates: through the dispatcher, which boxes the nine
arguments into C++ values and back into Python objects, and the operator's Autograd kernel,
before the implementation starts. On the H100 machine a compiled Qwen2-7B decode step spent about
30 us more per linear than `torch.compile` spends on its cuBLAS call. The lowerings here have
the generated code call the implementation itself (`direct_linear(x, weight, ...)`, imported at
the top of the generated module), as Inductor calls cuBLAS through `extern_kernels.mm`.

A compiled graph records no autograd (AOTAutograd differentiates the operator when it traces,
with its registered backward), so the implementation is all a call needs. Inductor's IR is
internal and moves between releases: everything that touches it lives here, C++ wrappers
(AOTInductor) keep the fallback kernel, and where this torch's Inductor lacks what the lowering
reads, the lowerings are not installed and graphs take the fallback (right, only slower).
"""

from __future__ import annotations

import threading
import warnings

from tritongemm import ops

_LOCK = threading.Lock()
_installed: bool | None = None  # None: not tried yet; False: this Inductor refused


def install() -> bool:
    """Install the lowerings, once per process (later calls return at once). Called as Dynamo
    traces a tritongemm call (ops.traced_matmul, ops.traced_linear), so that importing tritongemm
    never imports Inductor. False where this torch's Inductor lacks what the lowering needs."""
    global _installed
    if _installed is None:
        with _LOCK:
            if _installed is None:
                try:
                    _install()
                    _installed = True
                except (ImportError, AttributeError, TypeError) as exc:
                    warnings.warn(f"tritongemm: Inductor will call the operators through the dispatcher ({exc})",
                                  RuntimeWarning, stacklevel=2)  # fmt: skip
                    _installed = False
    return _installed


# What the generated code calls: the operators' implementations, by names of their own there.
def direct_mm(a, b, kernel_name="auto", config=None):
    return ops._mm(a, b, kernel_name, config)


def direct_linear(x, weight, bias=None, residual=None, activation=None, alpha=1.0, out_dtype=None,
                  kernel_name="auto", config=None):  # fmt: skip
    return ops._linear(x, weight, bias, residual, activation, alpha, out_dtype, kernel_name, config)


def direct_grouped_mm(a, b, offs=None, out_dtype=None, glu=None):
    return ops._grouped_mm(a, b, offs, out_dtype, glu)


def direct_gated_pair(rows, weight, activation, kernel_name="auto"):
    return ops._gated_pair(rows, weight, activation, kernel_name)


def direct_moe_combine(rows, order, weights):
    return ops._moe_combine(rows, order, weights)


def direct_moe_decode(x, gate_up, down, top_k_index, top_k_weights, glu):
    return ops._moe_decode(x, gate_up, down, top_k_index, top_k_weights, glu)


def _install() -> None:
    from torch._inductor import ir
    from torch._inductor.lowering import constrain_to_fx_strides, fallback_handler, register_lowering
    from torch._inductor.virtualized import V

    class DirectCall(ir.ExternKernelAlloc):
        """`name(*arguments)`, the operator's arguments in its schema's order. An extern kernel
        passes its tensors first and its constants after them: `slots` (one per argument, True
        for a tensor) puts each back in its place."""

        def codegen_args(self):
            refs = super().codegen_args()
            tensors, constants = iter(refs[: len(self.inputs)]), iter(refs[len(self.inputs) :])
            return [next(tensors) if is_tensor else next(constants) for is_tensor in self.slots]

        def codegen(self, wrapper):
            name = self.python_kernel_name
            wrapper.add_import_once(f"from tritongemm.inductor import {name.removeprefix('tritongemm_')} as {name}")
            super().codegen(wrapper)

    def lower_to(op, name: str, output):
        """Lower `op` to a DirectCall of `name`; `output(*arguments)` -> (dtype, size) of its result."""
        schema = op._schema.arguments
        defaults = {a.name: a.default_value for a in schema if a.has_default_value()}
        fallback = fallback_handler(op, add_to_fallback_set=False)

        def lower(*args, **kwargs):
            if V.graph.cpp_wrapper:
                return fallback(*args, **kwargs)
            # The inputs' strides as traced (the fake implementation's view of them): a transposed
            # operand stays transposed, which every kernel reads in place.
            args, kwargs = constrain_to_fx_strides(V.graph.current_node, *args, **kwargs)
            given = dict(zip((a.name for a in schema), args)) | kwargs
            values = [given[a.name] if a.name in given else defaults.get(a.name) for a in schema]
            slots = tuple(isinstance(v, ir.IRNode) for v in values)
            inputs = [ir.ExternKernel.realize_input(v) for v, is_tensor in zip(values, slots) if is_tensor]
            dtype, size = output(*values)
            layout = ir.FixedLayout(values[0].get_device(), dtype, size, ir.FlexibleLayout.contiguous_strides(size))
            constants = [v for v, is_tensor in zip(values, slots) if not is_tensor]
            try:
                node = DirectCall(layout, inputs, constant_args=constants, python_kernel_name=f"tritongemm_{name}")
            except (TypeError, AttributeError) as exc:  # an Inductor whose extern node takes other arguments
                warnings.warn(f"tritongemm: {op} takes the dispatcher in this graph ({exc})", RuntimeWarning, 2)
                return fallback(*args, **kwargs)
            node.slots = slots
            return ir.TensorBox.create(node)

        register_lowering(op, type_promotion_kind=None)(lower)

    # The fake implementations' outputs (ops.py): contiguous, of these dtypes and sizes.
    lower_to(ops.mm, "direct_mm", lambda a, b, *_: (a.get_dtype(), [*a.get_size()[:-1], b.get_size()[1]]))
    lower_to(
        ops.linear,
        "direct_linear",
        lambda x, weight, bias, residual, activation, alpha, out_dtype, *_: (
            out_dtype or x.get_dtype(),
            [*x.get_size()[:-1], weight.get_size()[0]],
        ),
    )
    lower_to(ops.grouped_mm, "direct_grouped_mm", _grouped_output)
    lower_to(
        ops.gated_pair,
        "direct_gated_pair",
        lambda rows, weight, *_: (rows.get_dtype(), [rows.get_size()[0], weight.get_size()[0] // 2]),
    )
    lower_to(
        ops.moe_combine,
        "direct_moe_combine",
        lambda rows, order, weights: (rows.get_dtype(), [weights.get_size()[0], rows.get_size()[1]]),
    )
    lower_to(ops.moe_decode, "direct_moe_decode", lambda x, *_: (x.get_dtype(), list(x.get_size())))


def _grouped_output(a, b, offs, out_dtype, glu):
    """grouped_mm's result (grouped/api.output_shape) from IR nodes: (dtype, size)."""
    a_size, b_size = a.get_size(), b.get_size()
    if len(a_size) == 3:
        size = [a_size[0], a_size[1], b_size[2]]
    elif len(b_size) == 3:
        size = [a_size[0], b_size[2] // 2 if glu else b_size[2]]
    else:
        size = [offs.get_size()[0], a_size[0], b_size[1]]
    return out_dtype or a.get_dtype(), size
