"""Host-side helpers the `triton.language` launchers share."""

from __future__ import annotations

import math

import torch

from tritongemm.core import device_info
from tritongemm.core.epilogue import PLAIN, Epilogue
from tritongemm.primitives.launch import compile_launch

_INT32_LIMIT = 2**31


def max_offset(t: torch.Tensor) -> int:
    """Largest element offset from the data pointer that indexing `t` can produce."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))


def needs_int64(*tensors: torch.Tensor) -> bool:
    """True when a tile offset could pass 2**31 and int32 index math would wrap."""
    return any(max_offset(t) >= _INT32_LIMIT for t in tensors)


def alignment_hints(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[int, ...]:
    """For (M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn): the power
    of two up to 8 each is a multiple of, where Triton can't see it itself (1 where it can: it
    specializes multiples of 16 and the value 1 on its own). The kernels' ALIGN constexpr."""
    values = (a.shape[0], b.shape[1], a.shape[1], *a.stride(), *b.stride(), *c.stride())
    return tuple(1 if v % 16 == 0 else math.gcd(v, 8) for v in values)


def input_precision(dtype: torch.dtype) -> str:
    """fp32 dots follow torch's TF32 switch, as torch.matmul does; fp16/bf16 ignore it."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def gemm_args(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple:
    """The pointer / size / stride arguments every ladder kernel starts with."""
    M, K = a.shape
    N = b.shape[1]
    return (
        a, b, c,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        c.stride(0), c.stride(1),
    )  # fmt: skip


def planned_launch(
    kernel, grid, a, b, c, constexprs: dict, trace=None, epilogue: Epilogue = PLAIN, bias=None, residual=None,
    preact=None, *, middle: tuple | None = None,
):  # fmt: skip
    """Compile a ladder kernel for this geometry and return `launch(a, b, c, bias=None,
    residual=None, preact=None)` for tensors of the same geometry (see primitives/launch.py). Every ladder
    kernel takes `gemm_args`, then its own arguments, then the epilogue's. Rungs 1-3 take
    `trace_ptr` there (the optional tile trace of _tiles.record_tile; 0, never written, when off,
    as Epilogue.pointers says why) and the TRACE constexpr; a kernel without them passes `middle`,
    the same for every call of the plan."""
    args = gemm_args(a, b, c)
    sizes_and_strides = args[3:]
    if middle is None:
        middle = (0 if trace is None else trace,)
        constexprs = constexprs | {"TRACE": trace is not None}
    fixed = epilogue.fixed_args(residual, preact)
    runtime = (*args, *middle, *epilogue.pointers(bias, residual, preact), *fixed)
    compiled = compile_launch(kernel, grid, runtime, {**constexprs, **epilogue.constexprs()}, c.device)
    if epilogue.plain:  # matmul's launch, in the fewest steps
        return lambda a, b, c, *_: compiled(a, b, c, *sizes_and_strides, *middle, 0, 0, 0, *fixed)

    def launch(a, b, c, bias=None, residual=None, preact=None):
        compiled(a, b, c, *sizes_and_strides, *middle, *epilogue.pointers(bias, residual, preact), *fixed)

    return launch


def common_constexprs(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> dict:
    """The meta-parameters every ladder kernel takes besides its tile: precision, index width and
    alignment facts."""
    return dict(
        INPUT_PRECISION=input_precision(a.dtype),
        INT64=needs_int64(a, b, c),
        ALIGN=alignment_hints(a, b, c),
    )


def sm_count(device: torch.device) -> int:
    """Programs a persistent kernel launches at most: one per SM on a GPU, the interpreter's
    'virtual SMs' on the CPU."""
    if device.type == "cuda":
        return device_info.sm_count(device)
    return device_info.INTERPRETER_SMS
