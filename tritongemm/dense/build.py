"""How a dense plan is built, on a problem's first call: validate (raising before anything
launches), choose the kernel and config (dispatch/), decide the operands' copies, compile.
What it returns, a `plan.Plan`, is kept in the plan cache; nothing here runs on a hit."""

from __future__ import annotations

import contextlib

import torch
from triton.runtime.errors import OutOfResources

from tritongemm import dispatch
from tritongemm.core import checks, registry
from tritongemm.core.epilogue import Fused
from tritongemm.dense.plan import Plan


def build_plan(a, b, out, kernel, config, fused: Fused | None = None) -> Plan:
    """Validate the problem (raising before anything launches), choose, and compile. `fused`:
    linear's epilogue, already checked (dense/linear.py)."""
    checks.check_operands(a, b)
    if not isinstance(kernel, str):
        raise TypeError(f"matmul: expected kernel to be a str, but got {type(kernel).__name__}")
    if out is not None:
        checks.check_out(out, a, b)  # what the geometry decides; the caller checks aliasing per call
    resolve_neg = a.is_neg() or b.is_neg()
    a, b = a.resolve_neg(), b.resolve_neg()
    out_dtype = a.dtype if fused is None else fused.out_dtype
    info, chosen, why = dispatch.choose(kernel, config, a, b, out_dtype)
    checks.check_config(info, chosen, a.device)
    M, K = a.shape
    N = b.shape[1]
    device_index = a.device.index if a.is_cuda else None
    if M == 0 or N == 0 or K == 0:  # nothing to launch: an empty result, or zeros when K = 0
        assert fused is None, "linear computes an empty reduction's epilogue itself"
        prepare = registry.plain_operands(a, b, out, out_dtype)
        return Plan("zeros", None, resolve_neg, prepare, _zero_fill, device_index, False)
    try:
        return _compiled_plan(info, chosen, a, b, out, out_dtype, fused, resolve_neg, device_index)
    except (ValueError, TypeError, OutOfResources):
        if not why.startswith(dispatch.TABLE):
            raise
    # A table's winner for this bucket was measured on another problem in it, and a kernel's limits
    # (a grid axis, shared memory) can refuse a config for this one: the rules choose instead.
    info, chosen, _ = dispatch.choose(kernel, config, a, b, out_dtype, use_table=False)
    return _compiled_plan(info, chosen, a, b, out, out_dtype, fused, resolve_neg, device_index)


def _compiled_plan(info, config, a, b, out, out_dtype, fused, resolve_neg, device_index) -> Plan:
    checks.check_config(info, config, a.device)
    defaulted = config is None
    if defaulted:
        M, K = a.shape
        config = dispatch.default_config(info, a.dtype, M, b.shape[1], K, a.device)
    prepare = info.plan_operands(a, b, out, out_dtype)
    pa, pb, c = prepare(a, b, out)  # this call's own operands, to plan (and compile) on
    epilogue = {} if fused is None else dict(epilogue=fused.spec, bias=fused.bias, residual=fused.residual,
                                             preact=fused.preact)  # fmt: skip
    while True:
        try:
            with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
                launch = info.plan(pa, pb, c, config, **epilogue)
            break
        except OutOfResources:
            # The default configs size shared memory for the operands' ring. An fp32 output adds
            # the epilogue's layout change (128 KB for a 128 x 256 tile), which a persistent `tl`
            # kernel, whose ring lives across its epilogues, can't always fit beside it (H100:
            # bf16 linear to fp32 at 512 x 28672 x 4096 needed 272 KB of 227). One stage less
            # each time; a config the caller gave is the caller's to change.
            if not defaulted or config.num_stages == 1:
                raise
            config = config.with_(num_stages=config.num_stages - 1)
    return Plan(info.name, config, resolve_neg, prepare, launch, device_index, not c.is_contiguous())


def _zero_fill(a, b, c, *epilogue) -> None:
    c.zero_()
