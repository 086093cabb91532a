"""Launch plans: everything a `matmul` call needs that depends only on its problem, built once.

The first call for a problem validates it, chooses the kernel and config, decides which operands
need a copy, and compiles the kernel for the problem's specialization; the `Plan` it builds goes
into a bounded LRU cache under the problem's key, and every later call with that key looks the
plan up and launches. On a cache hit nothing is checked, chosen or compiled again: the key holds
every fact those decisions read, so a problem that differs in any of them misses.

The key: the kernel and config asked for; each operand's dtype, device, shape and strides (and
out's, when given); whether each data pointer is 16-byte aligned (Triton specializes on it, TMA
requires it); whether an operand is a negated view; for fp32, torch's TF32 switch; and the SMs
left free (`device_info.sparing_sms`: a persistent kernel's grid is planned from it). What is
not in it is either checked on every call (out's aliasing, autograd flags) or the same for every
problem with this key (a fresh output's layout). ConSan's instrumentation mode is read when a
plan is built: it is set in the environment before a sanitizer run starts, as scripts/sanitize.sh does.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from tritongemm import checks, device_info, dispatch, registry
from tritongemm.config import MatmulConfig
from tritongemm.epilogue import Fused

# A problem is a geometry, not a pointer: a training step or a decoder has a few dozen (each
# `linear` problem holds two entries: its GEMM's plan and its call, fused.LinearCall). 512 keeps
# every plan of a large model's layers, for several batch sizes, and bounds a shape-sweeping
# program's memory; a miss costs one plan build (checks and a descriptor build, no recompile).
CAPACITY = 512


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
        """`epilogue`: linear's bias, residual and pre-activation output (fused.py), or nothing."""
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
    are not strided tensors; the caller then lets `build_plan` give the proper error."""
    tf32 = a.dtype == torch.float32 and _allow_tf32()
    out_facts = None if out is None else tensor_facts(out)
    fused_facts = None if fused is None else fused.key()
    spare = device_info.spare_sms()
    return kernel, config, tensor_facts(a), tensor_facts(b), out_facts, tf32, fused_facts, spare


def tensor_facts(t: torch.Tensor | None) -> tuple | None:
    """What a plan reads of an operand: dtype, device, shape, strides, whether its data pointer is
    16-byte aligned, whether it is a negated view."""
    if t is None:
        return None
    return t.dtype, t.device, t.shape, t.stride(), t.data_ptr() % 16 == 0, t.is_neg()


# What `torch.backends.cuda.matmul.allow_tf32` returns, read without its module's __getattr__:
# 0.06 us a call instead of 0.5 (measured on this repository's CPU machine), on every fp32 call.
_allow_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", None) or (lambda: torch.backends.cuda.matmul.allow_tf32)


def build_plan(a, b, out, kernel, config, fused: Fused | None = None) -> Plan:
    """Validate the problem (raising before anything launches), choose, and compile. `fused`:
    linear's epilogue, already checked (fused.py)."""
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
    except (ValueError, TypeError, _out_of_resources()):
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
        config = info.default_config(a.dtype, M, b.shape[1], K, a.device)
    prepare = info.plan_operands(a, b, out, out_dtype)
    pa, pb, c = prepare(a, b, out)  # this call's own operands, to plan (and compile) on
    epilogue = {} if fused is None else dict(epilogue=fused.spec, bias=fused.bias, residual=fused.residual,
                                             preact=fused.preact)  # fmt: skip
    while True:
        try:
            with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
                launch = info.plan(pa, pb, c, config, **epilogue)
            break
        except _out_of_resources():
            # The default configs size shared memory for the operands' ring. An fp32 output adds
            # the epilogue's layout change (128 KB for a 128 x 256 tile), which a persistent `tl`
            # kernel, whose ring lives across its epilogues, can't always fit beside it (H100:
            # bf16 linear to fp32 at 512 x 28672 x 4096 needed 272 KB of 227). One stage less
            # each time; a config the caller gave is the caller's to change.
            if not defaulted or config.num_stages == 1:
                raise
            config = config.with_(num_stages=config.num_stages - 1)
    return Plan(info.name, config, resolve_neg, prepare, launch, device_index, not c.is_contiguous())


def _out_of_resources() -> type[Exception]:
    """Triton's OutOfResources, imported only once an exception is being matched against it
    (an `except` clause evaluates its class then): importing tritongemm must not import triton,
    which reads TRITON_INTERPRET as kernels are decorated."""
    from triton.runtime.errors import OutOfResources

    return OutOfResources


def _zero_fill(a, b, c, *epilogue) -> None:
    c.zero_()


class PlanCache:
    """A bounded, thread-safe LRU map from problem keys to plans."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0
        # How many times `clear` ran: what holds a plan outside the cache (a compiled graph's call
        # site, inductor.Site) drops it when this moves, as the cache itself did.
        self.generation = 0

    def find(self, a, b, out, kernel, config, fused: Fused | None = None) -> Plan | None:
        """The plan for this call's problem if one was built, else None (nothing is built or
        checked: a plan exists only for a problem whose checks passed)."""
        try:
            return self._hit(problem_key(a, b, out, kernel, config, fused))
        except (AttributeError, RuntimeError, TypeError):
            return None

    def lookup(self, a, b, out, kernel, config, fused: Fused | None = None) -> Plan:
        """The plan for this call's problem, built (and validated) on a miss."""
        try:
            key = problem_key(a, b, out, kernel, config, fused)
            plan = self._hit(key)
        except (AttributeError, RuntimeError, TypeError):  # not a strided tensor, an unhashable config
            return build_plan(a, b, out, kernel, config, fused)  # which raises the proper error, or plans uncached
        if plan is not None:
            return plan
        plan = build_plan(a, b, out, kernel, config, fused)  # outside the lock: it may compile for seconds
        self.remember(key, plan)
        return plan

    def find_key(self, key: tuple):
        """What `remember` keeps under `key`, else None: `linear` keeps its calls here (fused.py),
        under keys of their own, so that one bound and one `clear` cover them too."""
        return self._hit(key)

    def remember(self, key: tuple, value) -> None:
        """Keep `value` under `key`, the least recently used entry going when the cache is full."""
        with self._lock:
            self.misses += 1
            self._plans[key] = value
            self._plans.move_to_end(key)
            while len(self._plans) > self.capacity:
                self._plans.popitem(last=False)
                self.evictions += 1

    def _hit(self, key: tuple) -> Plan | None:
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                self.hits += 1
            return plan

    def info(self) -> dict:
        with self._lock:
            return dict(size=len(self._plans), capacity=self.capacity, hits=self.hits, misses=self.misses,
                        evictions=self.evictions)  # fmt: skip

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self.hits = self.misses = self.evictions = 0
            self.generation += 1


PLANS = PlanCache()
