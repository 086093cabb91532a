"""Dense launch plans: everything a `matmul` call needs that depends only on its problem, built once.

The first call for a problem validates it, chooses the kernel and config, decides which operands
need a copy, and compiles the kernel for the problem's specialization; the `Plan` it builds goes
into the plan cache (core/plans.py) under the problem's key, and every later call with that key looks the
plan up and launches. On a cache hit nothing is checked, chosen or compiled again: the key holds
every fact those decisions read, so a problem that differs in any of them misses.

The key: the kernel and config asked for; each operand's dtype, device, shape and strides (and
out's, when given); whether each data pointer is 16-byte aligned (Triton specializes on it, TMA
requires it); whether an operand is a negated view; for fp32, torch's TF32 switch; and the SMs
left free (`device_info.sparing_sms`: a persistent kernel's grid is planned from it). What is
not in it is either checked on every call (out's aliasing, autograd flags) or the same for every
problem with this key (a fresh output's layout). ConSan's instrumentation mode is read when a
plan is built: it is set in the environment before a sanitizer run starts, as scripts/ci/sanitize.sh does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import Fused
from tritongemm.core.problem import allow_tf32, tensor_facts


@dataclass(frozen=True)
class Plan:
    kernel: str  # the kernel that runs ("auto" resolved; "zeros" for an empty problem)
    config: MatmulConfig | str | None
    resolve_neg: bool  # a or b is a negated view: materialize it first
    prepare: object  # (a, b, out) -> (a, b, c): the registry's plan_operands, decided
    launch: object  # (a, b, c[, bias, residual, preact]) -> None, compiled for this geometry
    device_index: int | None  # the CUDA device the launch must run on; None on the CPU
    compact: bool  # the kernel's c is a row-padded view: return c.contiguous() when out is None

    def run(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, *epilogue) -> torch.Tensor:
        """`epilogue`: linear's bias, residual and pre-activation output (dense/linear.py), or nothing."""
        if self.resolve_neg:  # (resolve_neg() of a tensor that is not negated returns it)
            a, b = a.resolve_neg(), b.resolve_neg()
        a, b, c = self.prepare(a, b, out)
        # torch.cuda.current_device() without its lazy-init check: building the plan initialized CUDA.
        if self.device_index is None or torch._C._cuda_getDevice() == self.device_index:
            self.launch(a, b, c, *epilogue)
        else:
            with torch.cuda.device(self.device_index):
                self.launch(a, b, c, *epilogue)
        if out is None:
            return c.contiguous() if self.compact else c
        if c is not out:
            out.copy_(c)
        else:  # written behind autograd's back: bump the version as an in-place op would, so that a
            torch.autograd.graph.increment_version(out)  # backward that saved `out` raises, not misleads
        return out


def problem_key(a, b, out, kernel, config, fused: Fused | None = None) -> tuple:
    """Every fact a plan's decisions read (see the module docstring). Raises for operands that
    are not strided tensors; the caller then lets `checks.gemm` give the proper error."""
    tf32 = a.dtype == torch.float32 and allow_tf32()
    out_facts = None if out is None else tensor_facts(out)
    fused_facts = None if fused is None else fused.key()
    spare = device_info.spare_sms()
    return kernel, config, tensor_facts(a), tensor_facts(b), out_facts, tf32, fused_facts, spare
