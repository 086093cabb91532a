"""The ladder: every kernel the library has, what it needs, and how `matmul` launches it.

A rung module registers itself with `register(KernelInfo(...))` at import; `tritongemm.kernels()`
lists them in ladder order and `matmul(kernel="auto")` picks among the available ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tritongemm import device_info
from tritongemm.config import MatmulConfig

# launch(a, b, c, config): a (M, K), b (K, N), c (M, N), all of one dtype on one device, already
# validated by the API, with M, N, K > 0. Writes every element of c.
Launcher = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, MatmulConfig], None]
# plan(a, b, c, config) -> launch(a, b, c): the same, split in two: everything that depends only
# on the geometry (checks, grid, meta-parameters, compilation) done once, and a launcher for any
# tensors of that geometry (same shapes, strides, dtype, device and 16-byte alignment).
Planner = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, MatmulConfig], Callable[..., None]]


def plain_operands(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, out_dtype: torch.dtype):
    """The preparation of kernels without layout rules: operands as given, out or a new c."""
    if out is not None:
        return lambda a, b, out: (a, b, out)
    shape = (a.shape[0], b.shape[1])
    if out_dtype != a.dtype:
        return lambda a, b, out: (a, b, a.new_empty(shape, dtype=out_dtype))
    return lambda a, b, out: (a, b, a.new_empty(shape))  # 1 us less than torch.empty(shape, dtype=, device=)


@dataclass(frozen=True)
class KernelInfo:
    name: str  # what `matmul(kernel=...)` takes
    rung: int  # position on the ladder: each rung adds one idea to the one below
    idea: str  # that idea, in one line
    dtypes: tuple[torch.dtype, ...]  # operand dtypes it computes
    interpretable: bool  # runs under TRITON_INTERPRET=1 on CPU tensors
    min_capability: tuple[int, int]  # oldest CUDA compute capability it compiles for
    launch: Launcher
    plan: Planner
    default_config: Callable[[torch.dtype, int, int, int, torch.device], MatmulConfig]
    # Why this kernel can't take these operands as they are (None = it can), e.g. TMA alignment;
    # kernel="auto" passes such operands over to a kernel that can (or copies them: aligned_copy_fits).
    unsupported_reason: Callable[[torch.Tensor, torch.Tensor], str | None] = lambda a, b: None
    # For a kernel whose plan_operands copies an operand it can't read in place into an aligned
    # buffer (the TMA kernels): whether such a copy serves these operands (None: it copies nothing).
    # kernel="auto" takes that route for a large enough problem (dispatch.STAGING_MIN_FLOPS).
    aligned_copy_fits: Callable[[torch.Tensor, torch.Tensor], bool] | None = None
    # Whether C may have another dtype than the operands (linear's out_dtype): the triton.language
    # kernels cast at the store; the Gluon ones size and type C's shared-memory tile by the operands'.
    any_out_dtype: bool = True
    # plan_operands(a, b, out, out_dtype) -> prepare(a, b, out) -> (a, b, c): what `launch` gets, decided once
    # per geometry. A kernel with layout rules prepares copies of the operands that break them,
    # and a c of its own when it can't write to out (None: no out given), which `matmul` then
    # copies into out.
    plan_operands: Callable = plain_operands
    # Newest capability it runs on, for instructions a later architecture dropped (WGMMA: sm_90 only).
    max_capability: tuple[int, int] | None = None
    # Not yet verified on a GPU, or verified but not yet faster than the rungs below it: kernel= by
    # name runs it; "auto", `tritongemm tune` and the benchmarks' default kernel lists leave it out.
    experimental: bool = False
    # What `gpu` in describe() adds about capabilities it compiles for but has never run on.
    never_run_on: str = ""
    # Takes configs whose BLOCK_N is the sum of two powers of two (MatmulConfig.odd_width).
    odd_widths: bool = False

    def available_on(self, device: torch.device) -> bool:
        return self.unavailable_reason(device) is None

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why this kernel does not run on `device` (None: it does), in words for a person."""
        device = torch.device(device)
        if device.type == "cpu":
            if not self.interpretable:
                return "Gluon kernel: needs a CUDA GPU (Gluon has no interpreter)"
            if not interpreter_active():
                return "CPU tensors run under the Triton interpreter only: set TRITON_INTERPRET=1 before importing"
            return None
        if device.type != "cuda":
            return f"runs on CUDA tensors, not on {device.type}"
        capability = device_info.capability(device)
        if not self.min_capability <= capability <= (self.max_capability or capability):
            return f"needs compute capability {self.capability_range()}, this GPU is {sm_name(capability)}"
        return None

    def dtypes_on(self, device: torch.device) -> tuple[torch.dtype, ...]:
        """The operand dtypes it computes correctly on `device`: on the CPU, the interpreter's."""
        if torch.device(device).type == "cpu":
            return tuple(d for d in self.dtypes if d in INTERPRETER_DTYPES)
        return self.dtypes

    def capability_range(self) -> str:
        low = sm_name(self.min_capability)
        if self.max_capability is None:
            return f"{low} or newer"
        return (
            f"{low} only" if self.max_capability == self.min_capability else f"{low} to {sm_name(self.max_capability)}"
        )

    def describe(self) -> dict:
        return {
            "name": self.name,
            "rung": self.rung,
            "idea": self.idea,
            "dtypes": [str(d).removeprefix("torch.") for d in self.dtypes],
            "interpreter": self.interpretable,
            "interpreter_dtypes": [str(d).removeprefix("torch.") for d in self.dtypes if d in INTERPRETER_DTYPES]
            if self.interpretable
            else [],
            "gpu": self.capability_range() + (f" ({self.never_run_on})" if self.never_run_on else ""),
            "experimental": self.experimental,
        }


# Triton's interpreter (3.6 to 3.9) has no bf16: it computes a bf16 tl.dot on the raw bit
# patterns, relative error ~1e10. CPU tensors of that dtype are refused, never computed wrongly.
INTERPRETER_DTYPES = (torch.float16, torch.float32)


def sm_name(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


_KERNELS: dict[str, KernelInfo] = {}


def register(info: KernelInfo) -> KernelInfo:
    _KERNELS[info.name] = info
    return info


def _load_kernels() -> None:
    """Import the kernel modules (they register themselves) on first use, not when tritongemm is
    imported: Triton decides at decoration time whether a kernel runs in its interpreter, so a
    program may still set TRITON_INTERPRET after `import tritongemm`."""
    import tritongemm.hopper  # noqa: F401
    import tritongemm.ladder  # noqa: F401


def all_kernels() -> list[KernelInfo]:
    _load_kernels()
    return sorted(_KERNELS.values(), key=lambda k: k.rung)


def get(name: str) -> KernelInfo:
    _load_kernels()
    if name not in _KERNELS:
        raise ValueError(
            f"matmul: unknown kernel {name!r}; expected 'auto' or one of {[k.name for k in all_kernels()]}"
        )
    return _KERNELS[name]


def interpreter_active() -> bool:
    """True when the `triton.language` kernels were decorated under TRITON_INTERPRET=1.

    Triton reads the variable when `@triton.jit` runs, i.e. when a kernel module is imported, so
    setting it later has no effect: we ask a decorated kernel instead of the environment.
    """
    from tritongemm.ladder._tiles import INTERPRETED

    return INTERPRETED
