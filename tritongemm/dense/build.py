"""How a dense plan is built, on a problem's first call, from the problem its checks made
(core/checks.py): choose the kernel and config (dispatch/), decide the operands' copies, compile.
What it returns, a `plan.Plan`, is kept in the plan cache; nothing here runs on a hit."""

from __future__ import annotations

import contextlib

import torch
from triton.runtime.errors import OutOfResources

from tritongemm import dispatch
from tritongemm.core import registry
from tritongemm.core.problem import Gemm
from tritongemm.dense.plan import Plan


def build_plan(problem: Gemm) -> Plan:
    """Choose and compile the plan of a checked problem (core/checks.py: `gemm`, or linear's)."""
    a, b, out, out_dtype, fused = problem.a, problem.b, problem.out, problem.out_dtype, problem.fused
    device_index = a.device.index if a.is_cuda else None
    if problem.empty:  # nothing to launch: an empty result, or zeros when K = 0
        assert fused is None, "linear computes an empty reduction's epilogue itself"
        prepare = registry.plain_operands(a, b, out, out_dtype)
        return Plan("zeros", None, problem.resolve_neg, prepare, _zero_fill, device_index, False)
    info, chosen, why = dispatch.choose(problem.kernel, problem.config, a, b, out_dtype)
    try:
        return _compiled_plan(problem, info, chosen, device_index)
    except (ValueError, TypeError, OutOfResources):
        if not why.startswith(dispatch.TABLE):
            raise
    # A table's winner for this bucket was measured on another problem in it, and a kernel's limits
    # (a grid axis, shared memory) can refuse a config for this one: the rules choose instead.
    info, chosen, _ = dispatch.choose(problem.kernel, problem.config, a, b, out_dtype, use_table=False)
    return _compiled_plan(problem, info, chosen, device_index)


def _compiled_plan(problem: Gemm, info, config, device_index) -> Plan:
    a, b, out, fused = problem.a, problem.b, problem.out, problem.fused
    defaulted = config is None
    if defaulted:
        config = dispatch.default_config(info, a.dtype, problem.M, problem.N, problem.K, a.device)
    prepare = info.plan_operands(a, b, out, problem.out_dtype)
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
    return Plan(info.name, config, problem.resolve_neg, prepare, launch, device_index, not c.is_contiguous())


def _zero_fill(a, b, c, *epilogue) -> None:
    c.zero_()
