"""`tritongemm.batch_invariant()`: torch's own matrix products and row reductions, on one device
type, computed by batch-invariant kernels while the context is open, so that a model (or a
serving engine) that calls torch gets results for a sequence that do not depend on the batch
around it, without patching.

It overrides the aten operators' kernels for that device type through a `torch.library` library
of the "aten" namespace, as Thinking Machines' batch_invariant_ops does: mm, addmm and bmm (and
so torch.matmul, F.linear, `@` and nn.Linear, which reach them, and autograd's backward of them),
softmax and log-softmax, and mean over dimensions. The override is process-wide: every thread's
calls take it while any context is open (contexts nest; the last to close restores torch's).
Eager calls only: torch.compile lowers these operators to kernels of its own.

A dtype none of the kernels takes (float64, integers, or bf16 on the CPU, which the interpreter
computes wrongly) raises, naming the operator: a silent fall back to torch's kernel would break
the promise without saying so.
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings

import torch

from tritongemm.core import registry
from tritongemm.core.registry import INTERPRETER_DTYPES
from tritongemm.dense.linear import direct_linear
from tritongemm.dense.matmul import lookup
from tritongemm.grouped.api import direct as grouped_direct

INVARIANT = registry.BATCH_INVARIANT
GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DEVICE_TYPES = {"cuda": "CUDA", "cpu": "CPU"}
_lock = threading.Lock()
_open: dict[str, tuple[int, torch.library.Library]] = {}  # device type -> (open contexts, its library)


def _check(op: str, t: torch.Tensor) -> None:
    """That a kernel here takes t's dtype (the operator's operands share it)."""
    served = INTERPRETER_DTYPES if t.device.type == "cpu" else GPU_DTYPES
    if t.dtype not in served:
        names = ", ".join(registry.dtype_name(d) for d in served)
        # RuntimeError, as torch's own "not implemented for" errors: a TypeError from a kernel of
        # aten::mm would become `@`'s NotImplemented, and Python's "unsupported operand type(s)".
        raise RuntimeError(f"tritongemm.batch_invariant: aten::{op} on {t.device.type} takes {names}, but got "
                        f"{registry.dtype_name(t.dtype)}; call it outside the context")  # fmt: skip


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check("mm", a)
    return lookup(a, b, None, INVARIANT, None).run(a, b, None)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """beta * bias + alpha * (a @ b) as linear's epilogue: a 0-D or 1-D bias as its bias, a 2-D
    one (broadcast or whole) as its residual, each added in fp32 before the one rounding. By rank,
    not by shape: at M = 1 a whole (M, N) bias is (1, N) too, and must take its path at every M."""
    _check("addmm", a)
    M, N = a.shape[0], b.shape[1]
    if beta == 0:  # torch's rule: bias is not read, so NaN in it does not propagate
        return direct_linear(a, b.T, None, None, None, alpha, None, INVARIANT, None)
    bias = bias if beta == 1 else bias * beta
    if bias.dim() <= 1:
        row = bias.reshape(-1).expand(N).contiguous()
        return direct_linear(a, b.T, row, None, None, alpha, None, INVARIANT, None)
    return direct_linear(a, b.T, None, bias.expand(M, N), None, alpha, None, INVARIANT, None)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """grouped_mm's batched form on its invariant tile: one launch, whose tile reads neither the
    number of matrices nor their rows."""
    _check("bmm", a)
    return grouped_direct(a, b, None, a.dtype, None, invariant=True)


def _rows(x: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, list[int]]:
    """x with `dims` moved last and folded into one, as a contiguous (rows, N); the kept shape."""
    dims = sorted(d % x.dim() for d in dims) if x.dim() else []
    kept = [d for d in range(x.dim()) if d not in dims]
    moved = x.permute(*kept, *dims) if dims else x.unsqueeze(-1)
    N = math.prod(x.shape[d] for d in dims)
    return moved.reshape(-1, N).contiguous(), [x.shape[d] for d in kept]


def _rowwise():
    """The row kernels' module, imported on first use: Triton reads TRITON_INTERPRET when a kernel
    is decorated, which a program may set after importing tritongemm."""
    from tritongemm.invariant import rowwise

    return rowwise


def _softmax_like(op: str, log: bool):
    def impl(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
        _check(op, x)
        out_dtype = torch.float32 if half_to_float else x.dtype
        if x.dim() == 0:
            return (torch.zeros_like if log else torch.ones_like)(x, dtype=out_dtype)
        moved = x.movedim(dim, -1)
        rows = moved.reshape(-1, moved.shape[-1]).contiguous()
        y = _rowwise().softmax_rows(rows, out_dtype, log)
        return y.view(moved.shape).movedim(-1, dim)

    return impl


def _mean_dim(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    _check("mean.dim", x)
    dims = tuple(range(x.dim())) if not dim else tuple(dim)
    rows, kept = _rows(x, dims)
    y = _rowwise().mean_rows(rows, dtype or x.dtype).view(kept)
    if keepdim:
        for d in sorted(d % max(x.dim(), 1) for d in dims):
            y = y.unsqueeze(d)
    return y


_OVERRIDES = {
    "mm": _mm,
    "addmm": _addmm,
    "bmm": _bmm,
    "_softmax": _softmax_like("_softmax", log=False),
    "_log_softmax": _softmax_like("_log_softmax", log=True),
    "mean.dim": _mean_dim,
}


def _install(device_type: str) -> torch.library.Library:
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point
        warnings.simplefilter("ignore", UserWarning)
        for op, impl in _OVERRIDES.items():
            library.impl(op, impl, DEVICE_TYPES[device_type])
    return library


@contextlib.contextmanager
def batch_invariant(device_type: str = "cuda"):
    """While open, torch's mm, addmm, bmm (and what reaches them: matmul, linear, `@`), softmax,
    log_softmax and mean on `device_type` tensors ("cuda", or "cpu" under TRITON_INTERPRET=1)
    run tritongemm's batch-invariant kernels: a row's result is the same bits whatever else is
    in the batch. Process-wide while open; contexts nest.

        >>> with tritongemm.batch_invariant():
        ...     logits = model(input_ids).logits      # each sequence's logits, whatever the batch
    """
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"batch_invariant: expected device_type to be one of {tuple(DEVICE_TYPES)}, "
                         f"but got {device_type!r}")  # fmt: skip
    with _lock:
        count, library = _open.get(device_type, (0, None))
        _open[device_type] = (count + 1, library or _install(device_type))
    try:
        yield
    finally:
        with _lock:
            count, library = _open[device_type]
            if count == 1:
                del _open[device_type]
                library._destroy()
            else:
                _open[device_type] = (count - 1, library)


def is_open(device_type: str = "cuda") -> bool:
    """Whether a batch_invariant() context is open for `device_type`."""
    return device_type in _open
