"""Input validation for `tritongemm.matmul` and `tritongemm.linear`: every problem found before
anything launches, each message naming the argument, what was given and what was expected.

A call is checked once, on its problem's first call: `gemm` (matmul's) and `linear` check every
argument, the kernel named and its config, and return what the plan is built from (a
`problem.Gemm`, which the dispatch and the builder read without checking again). What only a
call's own tensors decide, out's aliasing and autograd, `check_out_call` checks on every call."""

from __future__ import annotations

import torch

from tritongemm.core import device_info, registry
from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import ACTIVATIONS, Fused
from tritongemm.core.problem import Gemm
from tritongemm.core.registry import KernelInfo, dtype_name, sm_name

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _shape(t: torch.Tensor) -> str:
    return "x".join(str(s) for s in t.shape) if t.dim() else "scalar"


def gemm(a, b, out, kernel, config, fused: Fused | None = None) -> Gemm:
    """matmul's problem, checked: the operands (a 2-D (M, K) here: an N-D one is folded first, as
    torch.matmul folds it), out's geometry, the kernel and its config. `fused`: linear's epilogue,
    whose arguments `linear` checked."""
    check_operands(a, b)
    if out is not None:
        check_out(out, a, b)  # what the geometry decides; the caller checks aliasing per call
    out_dtype = a.dtype if fused is None else fused.out_dtype
    info = _kernel(kernel, config, a.dtype, a.device, out_dtype)
    return Gemm.of(a, b, out, out_dtype, kernel, info, config, fused)


def linear(x, weight, bias, residual, activation, alpha, out_dtype, kernel, config) -> tuple[torch.dtype, KernelInfo]:
    """linear's arguments (see dense.linear.linear), the kernel and its config, checked: (the
    output's dtype, the kernel's registry row or None for "auto"). Its GEMM's operands, x folded to
    (M, K) and weight.T, are then right by construction: `Gemm` is made from them unchecked."""
    out_dtype = check_linear(x, weight, bias, residual, activation, alpha, out_dtype)
    return out_dtype, _kernel(kernel, config, x.dtype, x.device, out_dtype)


def invariant_kernel(kernel, batch_invariant, op: str):
    """The kernel= a call runs: batch_invariant=True makes "auto" the BATCH_INVARIANT policy
    (dispatch/invariant.py), which chooses among plans whose sum over K does not depend on M."""
    if batch_invariant is False:
        return kernel
    if batch_invariant is not True:
        raise TypeError(f"{op}: expected batch_invariant to be a bool, but got {batch_invariant!r}")
    if kernel != "auto":
        raise ValueError(f"{op}: batch_invariant=True chooses the kernel itself (one whose sum over K does not "
                         f"depend on M), so kernel must be 'auto', but got {kernel!r}")  # fmt: skip
    return registry.BATCH_INVARIANT


def _kernel(kernel, config, dtype: torch.dtype, device: torch.device, out_dtype: torch.dtype) -> KernelInfo | None:
    """The kernel asked for (its registry row; None for "auto"), checked against the operands'
    device and dtypes, and the config against it. For "auto", that some rung runs here: every rule
    of the dispatch ends with rung 1, which takes any operands its device runs."""
    if not isinstance(kernel, str):
        raise TypeError(f"matmul: expected kernel to be a str, but got {type(kernel).__name__}")
    if kernel == registry.BATCH_INVARIANT and config is not None:
        raise ValueError(f"matmul: batch_invariant=True chooses its own tiles, so config must be None, but got "
                         f"{config.short() if isinstance(config, MatmulConfig) else config!r}")  # fmt: skip
    info = registry.get(kernel) if kernel not in registry.POLICIES else None
    runs = info or registry.get(registry.AUTO_FALLBACK)
    check_device(runs, device)
    check_kernel_dtype(runs, dtype, device)
    if info is not None:
        check_out_dtype(info, dtype, out_dtype)
    check_config(info, config, device)
    return info


def check_operands(a, b, op: str = "matmul", a_name: str = "a") -> None:
    """A GEMM's (..., M, K) and (K, N) operands, for `op` (matmul's, or another function's that
    names its first operand `a_name`)."""
    for name, t in ((a_name, a), ("b", b)):
        _check_dense(op, name, t)
    if a.dim() < 2:
        raise ValueError(
            f"{op}: expected {a_name} to have 2 or more dimensions, (..., M, K), but got a "
            f"{a.dim()}D tensor of shape {tuple(a.shape)}"
        )
    if b.dim() != 2:
        batched = f" (with {a_name} of shape {tuple(a.shape)}); batched GEMM, a 3D b, is not supported yet"
        raise ValueError(
            f"{op}: expected b to be a 2D tensor (K, N), but got a {b.dim()}D tensor of shape "
            f"{tuple(b.shape)}{batched if b.dim() > 2 else ''}"
        )
    _check_dtype_and_device(op, (a_name, a), ("b", b))
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"mat1 and mat2 shapes cannot be multiplied ({_shape(a)} and {_shape(b)})")


def _check_dense(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: expected {name} to be a torch.Tensor, but got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(
            f"{op}: {name} has layout {t.layout}, but only dense (torch.strided) tensors are supported; "
            f"pass {name}.to_dense()"
        )


def _check_dtype_and_device(op: str, *named: tuple[str, torch.Tensor]) -> None:
    """The operands of one GEMM: each of a supported dtype, all of the same one, on one device."""
    for name, t in named:
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"{op}: {name} has dtype {dtype_name(t.dtype)}, but only float16, bfloat16 and float32 are supported"
            )
    (first, a), (second, b) = named
    if a.dtype != b.dtype:
        raise TypeError(
            f"{op}: expected {first} and {second} to have the same dtype, "
            f"but got {first}: {dtype_name(a.dtype)} != {second}: {dtype_name(b.dtype)}"
        )
    if a.device != b.device:
        raise ValueError(
            f"{op}: expected {first} and {second} to be on the same device, "
            f"but got {first} on {a.device} and {second} on {b.device}"
        )


def check_device(kernel: KernelInfo, device: torch.device) -> None:
    reason = kernel.unavailable_reason(device)
    if reason is None:
        return
    if device.type == "cpu" and kernel.interpretable:
        raise ValueError(
            "matmul: the operands are CPU tensors, but the Triton kernels run on CUDA tensors, or on the CPU "
            "only under the Triton interpreter: set TRITON_INTERPRET=1 before importing tritongemm"
        )
    if device.type == "cpu":
        raise ValueError(
            f"matmul: kernel {kernel.name!r} has no interpreter path and needs a CUDA tensor, but got a CPU tensor"
        )
    if device.type != "cuda":
        raise ValueError(f"matmul: expected CUDA tensors, but got tensors on {device}")
    have = sm_name(device_info.capability(device))
    raise ValueError(
        f"matmul: kernel {kernel.name!r} needs a GPU of compute capability {kernel.capability_range()}, "
        f"but {device} is {have}"
    )


def check_kernel_dtype(kernel: KernelInfo, dtype: torch.dtype, device: torch.device) -> None:
    if dtype not in kernel.dtypes:
        supported = ", ".join(dtype_name(d) for d in kernel.dtypes)
        raise TypeError(
            f"matmul: kernel {kernel.name!r} supports {supported}, but the operands are {dtype_name(dtype)}"
        )
    if dtype not in kernel.dtypes_on(device):
        supported = ", ".join(dtype_name(d) for d in kernel.dtypes_on(device))
        raise TypeError(
            f"matmul: the operands are {dtype_name(dtype)} CPU tensors, but the Triton interpreter computes "
            f"{dtype_name(dtype)} dots wrongly (on raw bit patterns), so the CPU takes {supported} only; "
            f"use a CUDA GPU for {dtype_name(dtype)}, or convert with .to(torch.float32)"
        )


def check_out_dtype(kernel: KernelInfo, dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    if out_dtype != dtype and not kernel.any_out_dtype:
        raise TypeError(
            f"linear: kernel {kernel.name!r} writes the output in the inputs' dtype ({dtype_name(dtype)}), "
            f"but out_dtype is {dtype_name(out_dtype)}; use kernel='auto' or a triton.language kernel"
        )


def check_linear(x, weight, bias, residual, activation, alpha, out_dtype) -> torch.dtype:
    """linear's own arguments (see dense/linear.linear); returns the output dtype. The GEMM's operands
    are then checked as matmul's."""
    for name, t in (("x", x), ("weight", weight)):
        _check_dense("linear", name, t)
    if x.dim() < 1:
        raise ValueError("linear: expected x to have 1 or more dimensions, (..., K), but got a scalar")
    if weight.dim() != 2:
        raise ValueError(
            f"linear: expected weight to be a 2D tensor (out_features, in_features), but got a {weight.dim()}D "
            f"tensor of shape {tuple(weight.shape)}"
        )
    _check_dtype_and_device("linear", ("x", x), ("weight", weight))
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"mat1 and mat2 shapes cannot be multiplied ({_shape(x)} and {_shape(weight.T)})")
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: expected activation to be one of {ACTIVATIONS}, but got {activation!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not abs(alpha) < float("inf"):
        raise TypeError(f"linear: expected alpha to be a finite real number, but got {alpha!r}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    allowed = (x.dtype,) if x.dtype == torch.float32 else (x.dtype, torch.float32)
    if out_dtype not in allowed:
        names = " or ".join(dtype_name(d) for d in allowed)
        raise TypeError(
            f"linear: expected out_dtype to be None, {names} for {dtype_name(x.dtype)} x, but got {out_dtype}"
        )
    N = weight.shape[0]
    _check_epilogue_tensor("bias", bias, (N,), (x.dtype,), x.device)
    _check_epilogue_tensor(
        "residual", residual, (*x.shape[:-1], N), tuple(dict.fromkeys((out_dtype, x.dtype))), x.device
    )
    return out_dtype


def _check_epilogue_tensor(name: str, t, shape: tuple, dtypes: tuple, device: torch.device, op="linear") -> None:
    if t is None:
        return
    _check_dense(op, name, t)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: expected {name} of shape {tuple(shape)}, but got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = " or ".join(dtype_name(d) for d in dtypes)
        raise TypeError(f"{op}: expected {name} to have dtype {names}, but got {dtype_name(t.dtype)}")
    if t.device != device:
        raise ValueError(f"{op}: expected {name} on {device}, the operands' device, but got {t.device}")


def check_config(kernel: KernelInfo | None, config, device: torch.device) -> None:
    """`config` for `kernel` (None: "auto", whose rules give a config to rung 6's tiles and the
    ladder below it, never to the odd widths or to autotuning)."""
    if config is None:
        return
    name = "auto" if kernel is None else kernel.name
    if isinstance(config, MatmulConfig):
        if config.odd_width and not (kernel is not None and kernel.odd_widths):
            raise ValueError(
                f"matmul: kernel {name!r} takes tiles whose BLOCK_N is a power of two, but got "
                f"BLOCK_N={config.BLOCK_N}, an odd width, which only kernel 'odd_width' takes"
            )
        return
    if config == "autotune":
        if name != "grouped":
            raise ValueError(
                f"matmul: config='autotune' is available for kernel 'grouped' only, but kernel is {name!r}"
            )
        if device.type != "cuda":
            raise ValueError(
                "matmul: config='autotune' times each candidate config on a GPU, but the operands are "
                f"{device.type.upper()} tensors; pass config=None (the default tile) or a MatmulConfig"
            )
        return
    raise TypeError(f"matmul: expected config to be None, a MatmulConfig or 'autotune', but got {config!r}")


def check_out(out, a: torch.Tensor, b: torch.Tensor, shape: tuple[int, ...] | None = None) -> None:
    """What the problem's geometry decides about out (checked once per launch plan). `shape`: the
    result's, when a is N-D; else (M, N)."""
    check_out_metadata(out, a, shape or (a.shape[0], b.shape[1]))
    if out.is_neg():
        raise ValueError(
            "matmul: out is a negated view (out.is_neg(), e.g. the .imag of a conjugate), which the kernels "
            "would write unnegated; pass a tensor without the negative bit"
        )
    if out.numel() and may_overlap_itself(out):
        raise ValueError(
            f"matmul: out has strides {out.stride()} for shape {tuple(out.shape)}, so several of its elements share "
            f"memory; expected an out whose elements are all distinct"
        )


def check_out_metadata(out, a: torch.Tensor, shape: tuple[int, ...]) -> None:
    """out's type, layout, shape, dtype and device: what torch.compile can check while tracing."""
    check_out_shape(out, shape)
    if out.dtype != a.dtype:
        raise TypeError(f"matmul: expected out to have dtype {dtype_name(a.dtype)}, but got {dtype_name(out.dtype)}")
    if out.device != a.device:
        raise ValueError(f"matmul: expected out to be on {a.device}, like the operands, but it is on {out.device}")


def check_out_shape(out, expected: tuple[int, ...]) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"matmul: expected out to be a torch.Tensor, but got {type(out).__name__}")
    if out.layout != torch.strided:
        raise TypeError(f"matmul: out has layout {out.layout}, but only a dense (torch.strided) out is supported")
    if tuple(out.shape) != tuple(expected):
        raise ValueError(f"matmul: expected out to have shape {tuple(expected)}, but got {tuple(out.shape)}")


def check_out_call(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """What only this call's tensors decide about out (checked on every call): autograd and aliasing."""
    check_out_grad(out, a, b)
    for name, t in (("a", a), ("b", b)):
        if overlaps(out, t):
            raise ValueError(
                f"matmul: out overlaps the memory of input {name}; pass an out that does not alias the inputs"
            )


def check_out_grad(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    # As torch.matmul: with an input that requires grad the result would silently have no grad_fn.
    if torch.is_grad_enabled() and (out.requires_grad or a.requires_grad or b.requires_grad):
        needs_grad = [name for name, t in (("out", out), ("a", a), ("b", b)) if t.requires_grad]
        raise RuntimeError(
            "matmul: out=... arguments don't support automatic differentiation, but "
            f"{' and '.join(needs_grad)} {'requires' if len(needs_grad) == 1 else 'require'} grad"
        )


def may_overlap_itself(t: torch.Tensor) -> bool:
    """True unless t's strides provably give every element its own address (torch's rule: sorted
    by stride, each dimension of size > 1 must step past all of the smaller ones)."""
    dims = sorted((abs(st), sz) for sz, st in zip(t.shape, t.stride()) if sz > 1)
    span = 1
    for stride, size in dims:
        if stride < span:
            return True
        span = stride * size
    return False


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    lo = hi = t.data_ptr()
    for size, stride in zip(t.shape, t.stride()):
        step = (size - 1) * stride * t.element_size()
        lo, hi = (lo + step, hi) if step < 0 else (lo, hi + step)
    return lo, hi + t.element_size()


def overlaps(x: torch.Tensor, y: torch.Tensor) -> bool:
    """True when x and y may share memory (same storage and intersecting byte ranges)."""
    if x.numel() == 0 or y.numel() == 0 or x.device != y.device:
        return False
    if x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr():
        return False
    x_lo, x_hi = _byte_range(x)
    y_lo, y_hi = _byte_range(y)
    return x_lo < y_hi and y_lo < x_hi
