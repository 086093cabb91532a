"""How a graph compiled by Inductor calls tritongemm's operators: a plain Python call.

Left to itself, Inductor runs a custom operator as a fallback kernel, `torch.ops.tritongemm.
linear.default(...)` in the code it generates: through the dispatcher, which boxes the nine
arguments into C++ values and back into Python objects, and the operator's Autograd kernel,
before the implementation starts. On the H100 machine a compiled Qwen2-7B decode step spent about
30 us more per linear than `torch.compile` spends on its cuBLAS call. The lowerings here have
the generated code call the implementation itself (`direct_linear(x, weight, ...)`, imported at
the top of the generated module), as Inductor calls cuBLAS through `extern_kernels.mm`.

In a graph of static shapes an `mm`, `linear`, `gated_pair` or `moe_decode` node goes further:
it becomes a `Site`, created once at the top of the generated module and called as `site(x,
weight, ..., out=buf)` into the buffer Inductor allocates (or reuses) for it, as
`extern_kernels.mm(..., out=buf)` is. Every tensor of such a node has the same sizes, strides,
dtype and device on every run (Inductor lays its buffers out once; Dynamo's guards hold the
graph's inputs to the ones traced), so the plan its first run finds serves each later run whose
tensors are 16-byte aligned as the first run's were: the per-call look-up (the problem's key,
the plan cache's lock) and the output's allocation leave the hot path. On the H100 machine a
compiled decode-sized linear cost about 4.5 us of host time more than `torch.compile`'s cuBLAS
call before, and about 4-7 us less after (scripts/probes/host/compiled_host.py).

A compiled graph records no autograd (AOTAutograd differentiates the operator when it traces,
with its registered backward), so the implementation is all a call needs. Inductor's IR is
internal and moves between releases: everything that touches it lives here, C++ wrappers
(AOTInductor) keep the fallback kernel, and where this torch's Inductor lacks what the lowering
reads, the lowerings are not installed and graphs take the fallback (right, only slower).
"""

from __future__ import annotations

import threading
import warnings

import torch

from tritongemm.blocks.gated_pair import gated_pair_impl, gated_pair_op, planned_pair
from tritongemm.core import device_info, operators
from tritongemm.core.operators import config_of
from tritongemm.core.plans import PLANS
from tritongemm.dense.linear import linear_impl, linear_op, planned_call
from tritongemm.dense.matmul import lookup, mm_impl, mm_op
from tritongemm.grouped.api import grouped_mm_impl, grouped_mm_op
from tritongemm.grouped.moe import moe_combine_impl, moe_combine_op
from tritongemm.grouped.moe_decode import moe_decode_impl, moe_decode_op, planned_decode

_LOCK = threading.Lock()
_installed: bool | None = None  # None: not tried yet; False: this Inductor refused


def install() -> bool:
    """Install the lowerings, once per process (later calls return at once). Called as Dynamo
    traces a graph that holds a tritongemm operator (core/operators.py `traced`), so that importing
    tritongemm never imports Inductor. False where this torch's Inductor lacks what the lowering needs."""
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
    return mm_impl(a, b, kernel_name, config)


def direct_linear(x, weight, bias=None, residual=None, activation=None, alpha=1.0, out_dtype=None,
                  kernel_name="auto", config=None):  # fmt: skip
    return linear_impl(x, weight, bias, residual, activation, alpha, out_dtype, kernel_name, config)


def direct_grouped_mm(a, b, offs=None, out_dtype=None, glu=None):
    return grouped_mm_impl(a, b, offs, out_dtype, glu)


def direct_gated_pair(rows, weight, activation, kernel_name="auto"):
    return gated_pair_impl(rows, weight, activation, kernel_name)


def direct_moe_combine(rows, order, weights):
    return moe_combine_impl(rows, order, weights)


def direct_moe_decode(x, gate_up, down, top_k_index, top_k_weights, glu):
    return moe_decode_impl(x, gate_up, down, top_k_index, top_k_weights, glu)


class Site:
    """An `mm`, `linear`, `gated_pair` or `moe_decode` node of a compiled graph of static shapes,
    as its generated code calls it: `site(*arguments, out=buf)`, the operator's arguments in schema
    order and the output buffer Inductor laid out for it (contiguous, the result's size and dtype).

    The first run plans as the direct call does (checked, then kept in core.plans.PLANS) and keeps what
    launches the plan; a later run launches it at once when its tensors' data pointers, out's
    included, are 16-byte aligned (the one fact of a plan's key a graph doesn't fix) and the plan
    cache was not cleared since (`tritongemm.plans.clear()`, after a tuning run). The lowering
    makes sites of GEMMs on 16-bit operands only (`mm` with a 2-D a): a float32 plan reads torch's
    TF32 switch, which may change between runs. Where a call can't be kept (an empty problem, a
    misaligned tensor, SMs spared by `device_info.sparing_sms`, a plan that can't write into out)
    it runs through the direct path, then a copy into out."""

    __slots__ = ("_build", "_direct", "_tensors", "_run", "_generation")

    def __init__(self, operator: str, tensors: tuple[int, ...]):
        self._build, self._direct = _SITES[operator]
        self._tensors = tensors  # the tensor arguments' places, out not counted
        self._run = None  # (arguments, out) -> None, the kept launch
        self._generation = -1  # PLANS.generation when it was kept

    def __call__(self, *args, out: torch.Tensor) -> None:
        run = self._run
        if run is not None and self._generation == PLANS.generation and not device_info.spare_sms():
            address = out.data_ptr()
            for i in self._tensors:
                address |= args[i].data_ptr()
            if not address & 15:
                run(args, out)
                return
        generation = PLANS.generation
        run = self._build(args, out)  # plans on a miss, checking the arguments
        if run is None:
            self._run = None
            out.copy_(self._direct(*args))  # the direct path's result
            return
        self._run, self._generation = run, generation
        run(args, out)


def _keepable(out, tensors) -> bool:
    """Whether a site may keep this call's plan for later runs: every tensor aligned, no SMs spared
    (the plan's key holds the spared count)."""
    return not device_info.spare_sms() and all(t.data_ptr() % 16 == 0 for t in (*tensors, out))


def _mm_site(args, out):
    """`run(args, out)` for an `mm` node's later calls, or None where none can be kept."""
    a, b, kernel_name, config = args
    if a.dim() != 2 or not _keepable(out, (a, b)):
        return None
    with torch.no_grad():  # as mm_impl: the operator's own autograd differentiates it
        plan = lookup(a, b, out, kernel_name, config_of(config))
    if plan.kernel == "zeros":  # an empty problem
        return None
    return lambda args, out: plan.run(args[0], args[1], out)


def _linear_site(args, out):
    """`run(args, out)` for a `linear` node's later calls: its plan's launch into out, where the
    call's own tensors serve it as they are (linear.LinearCall.as_given); else None."""
    x, weight, bias, residual, activation, alpha, out_dtype, kernel_name, config = args
    tensors = [t for t in (x, weight, bias, residual) if t is not None]
    if not _keepable(out, tensors):
        return None
    call = planned_call(x, weight, bias, residual, activation, alpha, out_dtype, kernel_name,
                              config_of(config), False)  # fmt: skip
    if not call.as_given or not out.is_contiguous() or out.dtype != call.out_dtype:
        return None
    launch, device = call.plan.launch, call.plan.device_index

    def run(args, out):
        if device is not None and torch._C._cuda_getDevice() != device:  # a graph runs on its device: never
            out.copy_(linear_impl(*args))
            return
        launch(args[0], args[1], out, args[2], args[3], None)

    return run


def _gated_pair_site(args, out):
    """`run(args, out)` for a `gated_pair` node's later calls: its plan's call into out, where it
    writes into one (blocks/gated_pair.planned_pair); else None."""
    rows, weight, activation, kernel_name = args
    if not _keepable(out, (rows, weight)):
        return None
    call, writes_into = planned_pair(rows, weight, activation, kernel_name)
    if not writes_into or not out.is_contiguous():
        return None
    return lambda args, out: call(args[0], args[1], out)


def _moe_decode_site(args, out):
    """`run(args, out)` for a `moe_decode` node's later calls: its plan's two launches into out.
    Kept where the router's index and weights are contiguous, so that their flat views, which the
    kernels read, start where they do: the call then passes them as they are."""
    x, gate_up, down, top_k_index, top_k_weights, glu = args
    if not _keepable(out, (x, gate_up, down, top_k_index, top_k_weights)):
        return None
    if not (top_k_index.is_contiguous() and top_k_weights.is_contiguous() and out.is_contiguous()):
        return None
    call = planned_decode(x, gate_up, down, top_k_index, top_k_weights, glu)
    return lambda args, out: call(*args[:5], out)


# Per operator: what builds a site's kept launch, and the direct path for a call it doesn't keep.
_SITES = {
    "mm": (_mm_site, mm_impl),
    "linear": (_linear_site, linear_impl),
    "gated_pair": (_gated_pair_site, gated_pair_impl),
    "moe_decode": (_moe_decode_site, moe_decode_impl),
}


def _install() -> None:
    from torch._inductor import ir
    from torch._inductor.lowering import constrain_to_fx_strides, fallback_handler, register_lowering
    from torch._inductor.virtualized import V

    def in_schema_order(node, refs):
        """An extern kernel's argument references (its tensors first, then its constants) back in
        the operator's schema order, by `node.slots` (one per argument, True for a tensor)."""
        tensors, constants = iter(refs[: len(node.inputs)]), iter(refs[len(node.inputs) :])
        return [next(tensors) if is_tensor else next(constants) for is_tensor in node.slots]

    class DirectCall(ir.ExternKernelAlloc):
        """`name(*arguments)`, the operator's arguments in its schema's order."""

        def codegen_args(self):
            return in_schema_order(self, super().codegen_args())

        def codegen(self, wrapper):
            name = self.python_kernel_name
            wrapper.add_import_once(f"from tritongemm.inductor import {name.removeprefix('tritongemm_')} as {name}")
            super().codegen(wrapper)

    class SiteCall(ir.ExternKernelOut):
        """`site(*arguments, out=buf)` (`Site`): the site made once, at the top of the generated
        module, for this node; Inductor allocates (or reuses) `buf`. Arguments as in DirectCall."""

        def codegen_args(self):
            return in_schema_order(self, super().codegen_args())

        def codegen(self, wrapper):
            tensors = tuple(i for i, is_tensor in enumerate(self.slots) if is_tensor)
            wrapper.add_import_once("from tritongemm.inductor import Site as tritongemm_Site")
            wrapper.add_import_once(f"{self.python_kernel_name} = tritongemm_Site({self.operator!r}, {tensors!r})")
            super().codegen(wrapper)

    def static(inputs, size) -> bool:
        """Whether a node's tensors have sizes and strides without symbols: a graph of static shapes."""
        try:
            exprs = [*size, *(e for node in inputs for e in (*node.get_size(), *node.get_stride()))]
        except (NotImplementedError, AttributeError):  # a node without strides of its own
            return False
        return not any(getattr(e, "free_symbols", None) for e in exprs)

    def lower_to(op, name: str, output, site: str | None = None, site_takes=lambda *arguments: True):
        """Lower `op` to a DirectCall of `name`, or where `site` names it, `site_takes(*arguments)`
        holds and the shapes are static, a SiteCall; `output(*arguments)` -> (dtype, size) of its
        result."""
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
                if site is not None and site_takes(*values) and static(inputs, size):
                    node = SiteCall(layout, inputs, constant_args=constants)
                    node.python_kernel_name, node.operator = f"tritongemm_site_{node.get_name()}", site
                else:
                    node = DirectCall(layout, inputs, constant_args=constants, python_kernel_name=f"tritongemm_{name}")
            except (TypeError, AttributeError) as exc:  # an Inductor whose extern node takes other arguments
                warnings.warn(f"tritongemm: {op} takes the dispatcher in this graph ({exc})", RuntimeWarning, 2)
                return fallback(*args, **kwargs)
            node.slots = slots
            return ir.TensorBox.create(node)

        register_lowering(op, type_promotion_kind=None)(lower)

    def half(operand) -> bool:
        """A 16-bit GEMM operand: a site keeps no float32 plan, which reads torch's TF32 switch
        (a setting that may change between runs of a graph)."""
        return operand.get_dtype() in (torch.float16, torch.bfloat16)

    def contiguous(*tensors) -> bool:
        """Whether every tensor given (None aside) is laid out contiguously, as traced."""
        try:
            return all(t is None or list(t.get_stride()) == ir.FlexibleLayout.contiguous_strides(t.get_size())
                       for t in tensors)  # fmt: skip
        except (NotImplementedError, AttributeError):
            return False

    def whole_rows(*columns) -> bool:
        """Whether rows of these many 16-bit elements are whole multiples of 16 bytes (TMA's rule)."""
        try:
            return all(int(n) % 8 == 0 for n in columns)
        except TypeError:  # a symbolic size
            return False

    # The fake implementations' outputs (each family's operator): contiguous, of these dtypes and sizes.
    lower_to(
        mm_op,
        "direct_mm",
        lambda a, b, *_: (a.get_dtype(), [*a.get_size()[:-1], b.get_size()[1]]),
        "mm",
        lambda a, *_: half(a) and len(a.get_size()) == 2,  # an N-D a folds on each call (api.matmul)
    )
    lower_to(
        linear_op,
        "direct_linear",
        lambda x, weight, bias, residual, activation, alpha, out_dtype, *_: (
            out_dtype or x.get_dtype(),
            [*x.get_size()[:-1], weight.get_size()[0]],
        ),
        "linear",
        # A call that would take a copy before its launch (linear.LinearCall.as_given false) would
        # take the direct path and a copy into out as well, on every run: the lowering gives such
        # a node a direct call instead, by its layout (x contiguous, rows of 16-byte multiples).
        lambda x, weight, bias, residual, *_: (
            half(x) and contiguous(x, weight, bias, residual) and whole_rows(x.get_size()[-1], weight.get_size()[0])
        ),
    )
    lower_to(grouped_mm_op, "direct_grouped_mm", _grouped_output)
    lower_to(
        gated_pair_op,
        "direct_gated_pair",
        lambda rows, weight, *_: (rows.get_dtype(), [rows.get_size()[0], weight.get_size()[0] // 2]),
        "gated_pair",
        lambda rows, weight, *_: half(rows) and whole_rows(weight.get_size()[0] // 2),  # else C's rows are padded
    )
    lower_to(
        moe_combine_op,
        "direct_moe_combine",
        lambda rows, order, weights: (rows.get_dtype(), [weights.get_size()[0], rows.get_size()[1]]),
    )
    lower_to(moe_decode_op, "direct_moe_decode", lambda x, *_: (x.get_dtype(), list(x.get_size())), "moe_decode")


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


operators.on_trace(install)  # every operator's fake implementation runs it as a graph is traced
