"""The ladder: every kernel the library has, what it needs, and how `matmul` launches it.

A rung module registers itself with `register(KernelInfo(...))` at import; `tritongemm.kernels()`
lists them in ladder order and `matmul(kernel="auto")` picks among the available ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tritongemm.config import MatmulConfig

# launch(a, b, c, config): a (M, K), b (K, N), c (M, N), all of one dtype on one device, already
# validated by the API, with M, N, K > 0. Writes every element of c.
Launcher = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, MatmulConfig], None]


@dataclass(frozen=True)
class KernelInfo:
    name: str  # what `matmul(kernel=...)` takes
    rung: int  # position on the ladder: each rung adds one idea to the one below
    idea: str  # that idea, in one line
    dtypes: tuple[torch.dtype, ...]  # operand dtypes it computes
    interpretable: bool  # runs under TRITON_INTERPRET=1 on CPU tensors
    min_capability: tuple[int, int]  # oldest CUDA compute capability it compiles for
    launch: Launcher
    default_config: Callable[[torch.dtype, int, int, int, torch.device], MatmulConfig]
    # Why this kernel can't take these operands as they are (None = it can), e.g. TMA alignment.
    unsupported_reason: Callable[[torch.Tensor, torch.Tensor], str | None] = lambda a, b: None
    # The same for the output; `matmul` then computes into a fresh tensor and copies.
    out_unsupported_reason: Callable[[torch.Tensor], str | None] = lambda c: None

    def available_on(self, device: torch.device) -> bool:
        if device.type == "cpu":
            return self.interpretable and interpreter_active()
        if device.type != "cuda":
            return False
        return torch.cuda.get_device_capability(device) >= self.min_capability

    def describe(self) -> dict:
        return {
            "name": self.name,
            "rung": self.rung,
            "idea": self.idea,
            "dtypes": [str(d).removeprefix("torch.") for d in self.dtypes],
            "interpreter": self.interpretable,
            "min_capability": sm_name(self.min_capability),
        }


def sm_name(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


_KERNELS: dict[str, KernelInfo] = {}


def register(info: KernelInfo) -> KernelInfo:
    _KERNELS[info.name] = info
    return info


def all_kernels() -> list[KernelInfo]:
    return sorted(_KERNELS.values(), key=lambda k: k.rung)


def get(name: str) -> KernelInfo:
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
