"""`grouped_mm` and `bmm`: GEMMs over ragged groups, as `torch._grouped_mm` takes them.

    a 2-D (M, K),  b 3-D (G, K, N), offs (G,)  -> (M, N)      group g: rows offs[g-1]:offs[g] of a, times b[g]
    a 3-D (G, M, K), b 3-D (G, K, N), no offs   -> (G, M, N)   a batched matmul (`bmm`)
    a 2-D (M, K),  b 2-D (K, N),    offs (G,)  -> (G, M, N)   group g: columns offs[g-1]:offs[g] of a, rows of b

`offs` holds int32 group ends (offs[-1] = 0 before the first), sorted, at most the grouped
length; an empty group is legal. Rows of a after the last end belong to no group and give zero
rows. The kernels read `offs` on the device only: no call synchronizes. So its values are checked
on the device too, without waiting (`torch._assert_async`: a bad offs fails at the next
synchronization); a CPU `offs` is checked at once.
"""

from __future__ import annotations

import torch

from tritongemm.core import operators
from tritongemm.core.checks import SUPPORTED_DTYPES, _check_dense
from tritongemm.core.epilogue import GLU_ACTIVATIONS, activate_torch, activation_backward
from tritongemm.core.operators import LIB, register_autograd
from tritongemm.core.plans import planned
from tritongemm.core.problem import allow_tf32, tensor_facts
from tritongemm.core.registry import dtype_name


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, *, out_dtype=None,
               glu: str | None = None, batch_invariant: bool = False) -> torch.Tensor:  # fmt: skip
    """The grouped product of the three forms above, accumulated in fp32. float16, bfloat16 or
    float32 operands (one dtype); `out_dtype` None (a's) or float32. Differentiable in a and b.

    `glu` ("silu": SwiGLU, "gelu", "gelu_tanh": GeGLU), row-group form only: b's 2N columns are
    [gate; up] and the result (M, N) is glu(a @ gate) * (a @ up), computed in the kernel's
    epilogue (an MoE expert's gate and up projections in one grouped GEMM).

    `batch_invariant=True`: a row's result the same bits whatever the groups' sizes (how many rows
    the other experts got): one kernel on one tile for every problem (dispatch/grouped.py
    `invariant_tile`). Eager inference only so far: with autograd recording or under
    torch.compile it is refused."""
    return grouped_mm_of_counts(a, b, offs, out_dtype, glu, offs_from_counts=False, batch_invariant=batch_invariant)


def grouped_mm_of_counts(a, b, offs, out_dtype, glu, *, offs_from_counts: bool,
                         batch_invariant: bool = False) -> torch.Tensor:  # fmt: skip
    """grouped_mm, where `offs_from_counts` says offs is the running sum of non-negative group
    sizes that add up to a's length (moe.py's, from histc), so sorted and in range by
    construction: its values are not checked again. That check is about 8 small kernels, a
    quarter of the experts' host time in a decode step (scripts/probes/model/decode_probe.py on the H100)."""
    if type(batch_invariant) is not bool:
        raise TypeError(f"grouped_mm: expected batch_invariant to be a bool, but got {batch_invariant!r}")
    form = check_grouped(a, b, offs, out_dtype)
    _check_glu(glu, form, a, b)
    if form != "batched" and not offs_from_counts:
        _check_offsets(offs, a.shape[0] if form == "m" else a.shape[1])
    records = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    if batch_invariant:
        if records or torch.compiler.is_compiling():
            raise RuntimeError("grouped_mm: batch_invariant=True computes eager inference only so far; call it "
                               "under torch.no_grad() and outside torch.compile")  # fmt: skip
        return direct(a, b, offs, out_dtype, glu, invariant=True)
    if torch.compiler.is_compiling():  # the operator (below), which Dynamo and Inductor take whole
        if glu is not None and records:
            # Training: the pair's grouped GEMM, kept for the backward as _GroupedPair keeps it, and its
            # gating left to Inductor to fuse. The operator's gated form never writes the pair, so its
            # backward computes it again: in a compiled Mixtral-shaped step on the H100, a third grouped
            # GEMM a layer, 1.35 ms on the `tl` kernel (fp32 out) of a 24.5 ms step.
            gate, up = grouped_mm_op(a, b, offs, out_dtype, None).chunk(2, dim=-1)
            return activate_torch(gate, glu) * up
        return grouped_mm_op(a, b, offs, out_dtype, glu)
    out_dtype = out_dtype or a.dtype
    if not records:  # no autograd Function's cost
        return direct(a, b, offs, out_dtype, glu)
    if form == "batched":  # groups of a's M rows each: the M form on a's rows in one run
        G, M, K = a.shape
        ends = torch.arange(1, G + 1, dtype=torch.int32, device=a.device) * M
        return _GroupedMM.apply(a.reshape(G * M, K), b, ends, out_dtype, "m").view(G, M, b.shape[2])
    if glu is None:
        return _GroupedMM.apply(a, b, offs, out_dtype, form)
    return _GroupedPair.apply(a, b, offs, out_dtype, glu)


def direct(a, b, offs, out_dtype, glu, invariant: bool = False) -> torch.Tensor:
    """grouped_mm on checked arguments, without autograd: the operator's implementation
    (`invariant`: batch_invariant=True's plan)."""
    out_dtype = out_dtype or a.dtype
    if a.dim() == 3:
        G, M, K = a.shape
        ends = torch.arange(1, G + 1, dtype=torch.int32, device=a.device) * M
        return _launch(a.reshape(G * M, K), b, ends, out_dtype, "m", invariant=invariant).view(G, M, b.shape[2])
    return _launch(a, b, offs, out_dtype, "m" if b.dim() == 3 else "k", glu, invariant=invariant)


def output_shape(a, b, offs, glu) -> tuple[int, ...]:
    """The result's shape for checked arguments (the operator's fake implementation)."""
    if a.dim() == 3:
        return (a.shape[0], a.shape[1], b.shape[2])
    if b.dim() == 3:
        return (a.shape[0], b.shape[2] // 2 if glu else b.shape[2])
    return (offs.shape[0], a.shape[0], b.shape[1])


def bmm(a: torch.Tensor, b: torch.Tensor, *, out_dtype=None, batch_invariant: bool = False) -> torch.Tensor:
    """a (G, M, K) @ b (G, K, N) -> (G, M, N): `grouped_mm`'s batched form (`batch_invariant`: as
    grouped_mm's, a matrix's result whatever G and the others are)."""
    if not (isinstance(a, torch.Tensor) and a.dim() == 3 and isinstance(b, torch.Tensor) and b.dim() == 3):
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (a, b)]
        raise ValueError(f"bmm: expected a (G, M, K) and b (G, K, N), but got {shapes[0]} and {shapes[1]}")
    return grouped_mm(a, b, out_dtype=out_dtype, batch_invariant=batch_invariant)


def check_grouped(a, b, offs, out_dtype) -> str:
    """grouped_mm's arguments but offs' values; returns the form: "m", "batched" or "k"."""
    for name, t in (("a", a), ("b", b)):
        _check_dense("grouped_mm", name, t)
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"grouped_mm: expected {name} of dtype float16, bfloat16 or float32, but got {t.dtype}")
    if a.dtype != b.dtype:
        raise TypeError(
            f"grouped_mm: expected a and b of one dtype, but got {dtype_name(a.dtype)} and {dtype_name(b.dtype)}"
        )
    if b.device != a.device:
        raise ValueError(f"grouped_mm: expected b on {a.device}, the device of a, but got {b.device}")
    dims = (a.dim(), b.dim())
    forms = {(2, 3): "m", (3, 3): "batched", (2, 2): "k"}
    if dims not in forms:
        raise ValueError(
            f"grouped_mm: expected a and b of 2 and 3, 3 and 3, or 2 and 2 dimensions, but got shapes "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )
    form = forms[dims]
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"grouped_mm: a {tuple(a.shape)} and b {tuple(b.shape)} disagree on K ({a.shape[-1]} != {b.shape[-2]})"
        )
    if form == "batched":
        if a.shape[0] != b.shape[0]:
            raise ValueError(
                f"grouped_mm: expected a and b with one number of groups, but got {a.shape[0]} and {b.shape[0]}"
            )
        if offs is not None:
            raise ValueError("grouped_mm: a 3-D a is its own groups: expected offs=None")
    else:
        if not isinstance(offs, torch.Tensor):
            raise TypeError(f"grouped_mm: expected offs, an int32 tensor of group ends, but got {type(offs).__name__}")
        if offs.dtype != torch.int32 or offs.dim() != 1:
            raise TypeError(
                f"grouped_mm: expected offs a 1-D int32 tensor, but got {offs.dim()}-D {dtype_name(offs.dtype)}"
            )
        if offs.device != a.device:
            raise ValueError(f"grouped_mm: expected offs on {a.device}, the device of a, but got {offs.device}")
        if form == "m" and offs.shape[0] != b.shape[0]:
            raise ValueError(
                f"grouped_mm: expected offs of {b.shape[0]} group ends (b's groups), but got {offs.shape[0]}"
            )
    if out_dtype not in (None, a.dtype, torch.float32):
        allowed = "None or float32" if a.dtype == torch.float32 else f"None, {dtype_name(a.dtype)} or float32"
        raise TypeError(f"grouped_mm: expected out_dtype {allowed}, but got {out_dtype}")
    return form


def _check_glu(glu, form: str, a, b) -> None:
    if glu is not None and (glu not in GLU_ACTIVATIONS or form != "m" or b.shape[2] % 2):
        raise ValueError(
            f"grouped_mm: glu takes one of {GLU_ACTIVATIONS}, for a 2-D a and a 3-D b of an even number of columns "
            f"([gate; up]), but got glu={glu!r} with shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )


def _check_offsets(offs: torch.Tensor, length: int) -> None:
    """offs sorted, from 0 to at most `length`: at once on the CPU, without a wait on a GPU (one
    kernel eagerly, tl.py `_check_offsets_kernel`; torch ops under torch.compile)."""
    if offs.numel() == 0:
        return
    compiling = torch.compiler.is_compiling()
    if offs.device.type == "cuda" and not compiling:
        _check_offsets_on_device(offs, length)
        return
    ok = (offs[0] >= 0) & (offs[-1] <= length) & (offs[1:] >= offs[:-1]).all()
    message = f"grouped_mm: expected offs sorted group ends between 0 and {length}"
    if offs.device.type == "cpu" and not compiling:
        if not bool(ok):
            raise ValueError(f"{message}, but got {offs.tolist()}")
    else:
        torch._assert_async(ok, message)


def _check_offsets_on_device(offs: torch.Tensor, length: int) -> None:
    """The check's one launch; its launcher kept with the plans, one a device (nothing in the
    kernel is specialized, so one binary serves every offs)."""
    length = min(length, 2**31 - 1)  # int32 offsets: a larger length admits every end they can hold
    key = ("grouped_mm offsets check", offs.device.index)

    planned(key, lambda: _build().offsets_check_launch(offs, length))(offs, offs.shape[0], length)


class _GroupedMM(torch.autograd.Function):
    """Eager autograd for grouped_mm without a gated pair; under torch.compile the operator's
    serves (below). Both take their gradients from `grouped_grads`."""

    @staticmethod
    def forward(ctx, a, b, offs, out_dtype, form):
        ctx.save_for_backward(a, b, offs)
        return _launch(a, b, offs, out_dtype, form)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        a, b, offs = ctx.saved_tensors
        grads = grouped_grads(grad, a, b, None, ctx.needs_input_grad[:2], _mm_on(offs))
        return *grads, None, None, None


class _GroupedPair(torch.autograd.Function):
    """Eager autograd for a gated pair (row groups): the pair [g | u] as one grouped GEMM, kept
    for the backward, and gated by one elementwise kernel (primitives/glu.py); the backward is one
    more such kernel for d[g | u], then the plain form's gradients. Recomputing the pair instead
    (the fused kernel never writes it) cost a third grouped GEMM in fp32 and seven torch kernels,
    as GatedMLP measured it (docs/blocks.md)."""

    @staticmethod
    def forward(ctx, a, b, offs, out_dtype, glu):
        pair = _launch(a, b, offs, out_dtype, "m")
        ctx.save_for_backward(a, b, offs, pair)
        ctx.glu = glu
        return _build().glu_forward(pair, glu)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        a, b, offs, pair = ctx.saved_tensors
        d_pair = _build().glu_backward(grad, pair, ctx.glu, a.dtype)
        grads = grouped_grads(d_pair, a, b, None, ctx.needs_input_grad[:2], _mm_on(offs))
        return *grads, None, None, None


def _mm_on(offs):
    """`mm(a, b, out_dtype, glu=None)`: eager grouped_mm on these offs, in the form b's rank says."""

    def mm(a, b, out_dtype, glu=None):
        return _launch(a, b, offs, out_dtype, "m" if b.dim() == 3 else "k", glu)

    return mm


def grouped_grads(grad, a, b, glu, needs, mm) -> tuple:
    """(grad_a, grad_b) of the row-group form (b 3-D) or the K-group form (b 2-D), with
    `mm(a, b, out_dtype, glu=None)` running grouped_mm on the call's offs (eager: the kernels;
    compiled: the operator). Each form is differentiated with the other, or itself:
        row groups  C = A @ B[g]          dA = dC @ B[g]^T (rows),   dB[g] = A_g^T dC_g (K groups, on A^T;
                                          dB[g]^T = dC_g^T A_g where B is a transposed view, as MoE weights are)
        K groups    C[g] = A_g @ B_g      dA^T = B @ dC[g]^T (rows), dB = A^T @ dC[g] (rows)
    A gated pair's gradient (the operator's, where a graph calls it with glu and autograd records)
    is [gate; up]'s, from the pair recomputed in fp32 and torch expressions, which Inductor fuses.
    grouped_mm itself keeps the pair where autograd records: eager (_GroupedPair) and compiled."""
    if glu is not None:
        grad = _glu_backward(grad, mm(a, b, torch.float32), glu)
    grad = grad.to(a.dtype)
    grad_a = grad_b = None
    if b.dim() == 3:
        if needs[0]:
            grad_a = mm(grad, b.transpose(1, 2), a.dtype)
        if needs[1] and _is_transposed(b):
            # Written as b is laid out (an MoE weight (G, N, K) read transposed): dB[g]^T = dC_g^T A_g.
            # In (G, K, N) order autograd would copy it to the weight's layout: in a Mixtral
            # training step on an H200, 19 ms of copies, longer than the weight-gradient GEMMs.
            grad_b = mm(grad.T, a, b.dtype).transpose(1, 2)
        elif needs[1]:
            grad_b = mm(a.T, grad, b.dtype)
    else:
        if needs[0]:
            grad_a = mm(b, grad.transpose(1, 2), a.dtype).T
        if needs[1]:
            grad_b = mm(a.T, grad, b.dtype)
    return grad_a, grad_b


def _is_transposed(b: torch.Tensor) -> bool:
    """Whether a (G, K, N) b is the transposed view of a contiguous (G, N, K) tensor."""
    return b.stride(1) == 1 and b.stride(2) != 1 and b.shape[1] > 1


def _glu_backward(grad: torch.Tensor, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """d[gate; up] of y = act(gate) * up, in fp32, from the pair's product."""
    gate, up = gate_up.chunk(2, dim=-1)
    grad = grad.float()
    return torch.cat([activation_backward(grad * up, gate, activation), grad * activate_torch(gate, activation)], -1)


def _launch(a, b, offs, out_dtype, form, glu=None, tile=None, invariant: bool = False) -> torch.Tensor:
    """The kernel of `form` on checked operands (tl.py), into a new output. The hot path: a
    plan per problem (every fact `_plan` reads in its key), built and compiled once, kept in
    core.plans.PLANS with linear's (bounded, thread-safe); later calls allocate and launch. `tile`
    replaces the dispatch's choice, unplanned (scripts/probes/grouped/grouped_configs.py sweeps it)."""
    if tile is not None:
        return _build().grouped_call(a, b, offs, out_dtype, form, glu, tile)(a, b, offs)
    key = ("grouped_mm", form, glu, out_dtype, tensor_facts(a), tensor_facts(b), tensor_facts(offs), allow_tf32(),
           invariant)  # fmt: skip
    call = planned(key, lambda: _build().grouped_call(a, b, offs, out_dtype, form, glu, None, invariant=invariant))
    return call(a, b, offs)


def _build():
    """grouped/build.py, imported on the first plan: it imports the kernels, and with them Triton,
    whose decoration of a kernel reads TRITON_INTERPRET (a program may set it after import tritongemm)."""
    from tritongemm.grouped import build

    return build


def grouped_mm_ws(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, *, glu: str | None = None) -> torch.Tensor:
    """grouped_mm's row-group form (a 2-D, b (G, K, N) the transpose of contiguous (G, N, K)
    weights) on the Hopper Gluon kernel (grouped/ws.py), planned once per geometry. Checked and
    timed on the H100 (docs/grouped.md); grouped_mm takes it for plain row groups of
    WS_FROM_MEAN_ROWS rows or more on average (dispatch/grouped.py), and this entry point for any
    (its tests, `bench grouped`). `glu`: b's N holds [gate; up] per group, as grouped_mm's."""
    form = check_grouped(a, b, offs, None)
    if form != "m" or glu not in (None, *GLU_ACTIVATIONS):
        raise ValueError(f"grouped_mm_ws: the row-group form (a 2-D, b 3-D) and glu None or one of {GLU_ACTIVATIONS}")
    _check_offsets(offs, a.shape[0])
    if 0 in (*a.shape, *b.shape):  # nothing for a descriptor to describe: the row-group kernel's zeros
        return direct(a, b, offs, None, glu)
    key = ("grouped_ws", glu, tensor_facts(a), tensor_facts(b), tensor_facts(offs))

    return planned(key, lambda: _build().grouped_ws_call(a, b, offs, glu))(a, b, offs)


def reference_grouped_mm(a, b, offs=None, out_dtype=None, glu=None) -> torch.Tensor:
    """grouped_mm in float64, group by group: the tests' and benchmarks' reference."""
    form = check_grouped(a, b, offs, out_dtype)
    dtype = out_dtype or a.dtype
    if form == "batched":
        return (a.double() @ b.double()).to(dtype)
    ends = [int(e) for e in offs.tolist()]
    starts = [0, *ends[:-1]]
    if form == "k":
        return torch.stack([a[:, s:e].double() @ b[s:e].double() for s, e in zip(starts, ends)]).to(dtype)
    c = a.new_zeros((a.shape[0], b.shape[2]), dtype=torch.float64)
    for g, (s, e) in enumerate(zip(starts, ends)):
        c[s:e] = a[s:e].double() @ b[g].double()
    if glu is not None:
        gate, up = c.chunk(2, dim=-1)
        c = activate_torch(gate, glu) * up
    return c.to(dtype)


# ----------------------------------------------------------------------------------------------
# The operator: the grouped GEMM whole, for graphs that hold it
# ----------------------------------------------------------------------------------------------


LIB.define("grouped_mm(Tensor a, Tensor b, Tensor? offs=None, ScalarType? out_dtype=None, str? glu=None) -> Tensor")


def grouped_mm_impl(a, b, offs=None, out_dtype=None, glu=None):
    return direct(a, b, offs, out_dtype, glu)


LIB.impl("grouped_mm", grouped_mm_impl, "CompositeExplicitAutograd")
grouped_mm_op = torch.ops.tritongemm.grouped_mm.default


@torch.library.register_fake("tritongemm::grouped_mm", lib=LIB)
def _grouped_mm_fake(a, b, offs=None, out_dtype=None, glu=None):
    operators.traced()
    check_grouped(a, b, offs, out_dtype)
    return a.new_empty(output_shape(a, b, offs, glu), dtype=out_dtype or a.dtype)


def _setup_grouped_context(ctx, inputs, output):
    a, b, offs, _, glu = inputs
    ctx.save_for_backward(a, b, offs)
    ctx.glu = glu


def _grouped_backward(ctx, grad):
    a, b, offs = ctx.saved_tensors
    needs = ctx.needs_input_grad[:2]
    if a.dim() == 3:  # batched: dA = dC @ B^T, dB = A^T @ dC, batch by batch
        grad = grad.to(a.dtype)
        grad_a = grouped_mm_op(grad, b.transpose(1, 2), None, a.dtype) if needs[0] else None
        grad_b = grouped_mm_op(a.transpose(1, 2), grad, None, b.dtype) if needs[1] else None
        return grad_a, grad_b, None, None, None

    def mm(x, y, out_dtype, glu=None):
        return grouped_mm_op(x, y, offs, out_dtype, glu)

    return *grouped_grads(grad, a, b, ctx.glu, needs, mm), None, None, None


register_autograd(grouped_mm_op, grouped_mm_impl, _setup_grouped_context, _grouped_backward)
