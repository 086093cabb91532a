"""Tensor-parallel GEMMs: an all-gather before a GEMM, a reduce-scatter after one, with the
communication hidden under the GEMMs.

    all_gather_matmul(a_shard, b)   C = all_gather(a_shard) @ b     a column-parallel layer
    matmul_reduce_scatter(a, b)     C = reduce_scatter(a @ b)       a row-parallel layer

Run one after the other, the GPUs idle while the collective runs. Here the rows split into one
chunk per rank and each chunk's GEMM (tritongemm's kernels) runs while other chunks travel
(exchange.py):

    all-gather:      GEMM(own shard) | receive shard r-1 ... ; GEMM(shard r-1) | receive r-2 ...
    reduce-scatter:  GEMM(rows of rank r+1) ; send it | GEMM(rows of rank r+2) ; ... GEMM(own rows)

so the exposed communication is one chunk's, not all of it. The sequential path
(`overlap=False`: NCCL's collective, then one GEMM over all rows, or the reverse) is kept as the
baseline the benchmark measures against.

Semantics follow `torch.ops.symm_mem.fused_all_gather_matmul(A, [B], gather_dim, group_name)` and
`fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)`: the same shapes,
gathered / scattered dimensions and outputs, for one B.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from tritongemm.core import checks
from tritongemm.core.epilogue import ACTIVATIONS
from tritongemm.core.operators import LIB
from tritongemm.core.problem import requires_grad
from tritongemm.dense.matmul import matmul
from tritongemm.distributed.exchange import TRANSPORTS, all_gather_tensor, rank_and_world, reduce_scatter_tensor

REDUCE_OPS = ("sum", "avg")


# --- the public functions --------------------------------------------------------------------


def all_gather_matmul(
    a_shard: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    gather_dim: int = 0,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    return_a: bool = False,
    overlap: bool = True,
    transport: str = "auto",
):
    """activation(all_gather(a_shard, gather_dim) @ b + bias), the all-gather hidden under the GEMM.

    Args:
        a_shard: (..., K), this rank's shard of A along `gather_dim` (not the last dimension);
            every rank's of the same shape. float16, bfloat16 or float32.
        b: (K, N), this rank's B (a column-parallel layer's weight shard, transposed: `w.T`).
        group: the process group (default: the world).
        bias, activation: `tritongemm.linear`'s epilogue, applied in each chunk's GEMM.
        return_a: also return the gathered A (a backward needs it).
        overlap: False runs the sequential baseline: NCCL's all-gather, then one GEMM.
        transport: how the overlapped chunks travel: "auto" (symmetric memory, copy-engine
            copies, on CUDA; torch.distributed's point-to-point, NCCL or gloo, elsewhere),
            "symm_mem" or "nccl".

    Returns:
        C of A's gathered shape with N last, or (A, C) with `return_a`. On every rank. As
        torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], gather_dim, group_name) returns
        (A, [C]); C is a view whose gathered dimension is moved into place, as torch's is.

    Differentiable in a_shard, b and bias (not with an activation): the backward is a
    `matmul_reduce_scatter`, overlapped the same way; with `return_a` the gathered A's gradient
    comes back to the shards too (a reduce-scatter of it, on every rank alike).
    """
    group = group or dist.group.WORLD
    world = rank_and_world(group)[1]
    gather_dim = _check_gather(a_shard, b, gather_dim, bias, activation)
    _check_transport("all_gather_matmul", transport)
    bias = None if bias is None else bias.contiguous().resolve_neg()  # the kernels read a plain row
    moved = a_shard.movedim(gather_dim, 0)
    lead = moved.shape[:-1]
    a2 = moved.reshape(-1, moved.shape[-1])
    if torch.is_grad_enabled() and requires_grad(a2, b, bias):
        _refuse_activation_grad("all_gather_matmul", activation)
        gathered, c2 = _AllGatherMatmul.apply(a2, b, bias, group, (overlap, transport), return_a)
    else:
        gathered, c2 = _all_gather_matmul(a2.contiguous(), b, bias, activation, group, (overlap, transport), return_a)
    c = _unfold(c2, world, lead, gather_dim)
    return (_unfold(gathered, world, lead, gather_dim), c) if return_a else c


def matmul_reduce_scatter(
    a: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    scatter_dim: int = 0,
    reduce_op: str = "sum",
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    overlap: bool = True,
    transport: str = "auto",
) -> torch.Tensor:
    """activation(reduce_scatter(a @ b, scatter_dim) + bias) + residual, the reduce-scatter hidden
    under the GEMM.

    Args:
        a: (..., K), this rank's A (a row-parallel layer's input: K is sharded), the size along
            `scatter_dim` (not the last dimension) divisible by the group's size.
        b: (K, N), this rank's B (the layer's weight shard, transposed: `w.T`).
        reduce_op: "sum" or "avg" over the ranks.
        bias, activation, residual: `tritongemm.linear`'s epilogue, applied once after the
            reduction, in the same pass (reduce.py); residual has the output's shape.
        overlap: False runs the sequential baseline: one GEMM, then NCCL's reduce-scatter.
        transport: as for `all_gather_matmul`.

    Returns:
        This rank's shard of the reduced product: a's shape with `scatter_dim` divided by the
        group's size and N last, as torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b,
        reduce_op, scatter_dim, group_name) returns it. The partial products are summed in fp32
        in rank order and rounded once.

    Differentiable in a, b, bias and residual (not with an activation): the backward is an
    `all_gather_matmul`, overlapped the same way.
    """
    group = group or dist.group.WORLD
    world = rank_and_world(group)[1]
    scatter_dim = _check_scatter(a, b, scatter_dim, world, reduce_op, bias, activation, residual)
    _check_transport("matmul_reduce_scatter", transport)
    bias = None if bias is None else bias.contiguous().resolve_neg()
    residual = None if residual is None else residual.resolve_neg()
    N = b.shape[1]
    moved = a.movedim(scatter_dim, 0)
    lead = [moved.shape[0] // world, *moved.shape[1:-1]]
    a2 = moved.reshape(-1, moved.shape[-1])
    residual2 = None if residual is None else residual.movedim(scatter_dim, 0).reshape(-1, N)
    alpha = 1.0 / world if reduce_op == "avg" else 1.0
    if torch.is_grad_enabled() and requires_grad(a2, b, bias, residual2):
        _refuse_activation_grad("matmul_reduce_scatter", activation)
        c2 = _MatmulReduceScatter.apply(a2, b, bias, residual2, alpha, group, (overlap, transport))
    else:
        c2 = _matmul_reduce_scatter(a2, b, alpha, bias, activation, residual2, group, (overlap, transport))
    return c2.view(*lead, N).movedim(0, scatter_dim)


# --- the compiled and eager paths, on (rows, K) matrices -----------------------------------


def _all_gather_matmul(a2, b, bias, activation, group, how: tuple, keep_gathered: bool = True):
    """(A, C) for a contiguous (m, K) shard: A (world * m, K) in rank order, C (world * m, N).
    `how`: (overlap, transport). Without `keep_gathered` A is None: the overlapped path then
    never copies this rank's own shard into it (its GEMM reads the shard), 2 x the shard's bytes
    of memory traffic less beside the first GEMM. While torch.compile traces, the operator
    (below), which runs `paths.all_gather_rows`."""
    if torch.compiler.is_compiling():
        gathered, c2 = all_gather_matmul_op(a2, b, group.group_name, bias, activation, *how, keep_gathered)
        return (gathered if keep_gathered else None), c2
    return _paths().all_gather_rows(a2, b, bias, activation, group, how, keep_gathered)


def _matmul_reduce_scatter(a2, b, alpha, bias, activation, residual2, group, how: tuple) -> torch.Tensor:
    """This rank's (m, N) rows of epilogue(alpha * sum over ranks of a2 @ b), a2 (world * m, K).
    `how`: (overlap, transport). While torch.compile traces, the operator (below), which runs
    `paths.reduce_scatter_rows`."""
    if torch.compiler.is_compiling():
        return matmul_reduce_scatter_op(a2, b, group.group_name, alpha, bias, activation, residual2, *how)
    return _paths().reduce_scatter_rows(a2, b, alpha, bias, activation, residual2, group, how)


def _paths():
    """paths.py, imported on the first call: its paths plan kernels (gathered.py, reduce.py), and
    with them import Triton, whose decoration of a kernel reads TRITON_INTERPRET."""
    from tritongemm.distributed import paths

    return paths


def _unfold(t2: torch.Tensor, world: int, lead, dim: int) -> torch.Tensor:
    """The (world * rows, X) result of a gather as the gathered tensor: world blocks of `lead`
    rows each, concatenated along `dim` (a view, as torch's fused op returns)."""
    if len(lead) == 1:  # a matrix gathered along its rows is t2 itself (three views fewer a call)
        return t2
    return t2.view(world, *lead, t2.shape[-1]).flatten(0, 1).movedim(0, dim)


# --- autograd: each op's backward is the other one --------------------------------------------


class _AllGatherMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a2, b, bias, group, how, return_a):
        keep = return_a or ctx.needs_input_grad[1]  # the gathered A: the caller's, or for b's gradient
        gathered, c2 = _all_gather_matmul(a2.contiguous(), b, bias, None, group, how, keep)
        ctx.save_for_backward(gathered, b)
        ctx.group, ctx.how, ctx.return_a = group, how, return_a
        if gathered is not None and not return_a:  # the caller never sees it: no gradient to bring back
            ctx.mark_non_differentiable(gathered)
        return gathered, c2

    @staticmethod
    def backward(ctx, grad_gathered, grad_c):
        gathered, b = ctx.saved_tensors
        grad_c = grad_c.contiguous()
        grad_a = grad_b = grad_bias = None
        if ctx.needs_input_grad[0]:  # d/d(shard) of the gathered rows' products: a reduce-scatter
            grad_a = _matmul_reduce_scatter(grad_c, b.T, 1.0, None, None, None, ctx.group, ctx.how)
            if ctx.return_a:  # every rank's copy of the shard's rows, summed (zeros where unused)
                from_copies = torch.empty_like(grad_a)
                reduce_scatter_tensor(from_copies, grad_gathered.contiguous(), group=ctx.group)
                grad_a = grad_a + from_copies
        if ctx.needs_input_grad[1]:
            grad_b = matmul(gathered.T, grad_c)
        if ctx.needs_input_grad[2]:
            grad_bias = grad_c.sum(0)
        return grad_a, grad_b, grad_bias, None, None, None


class _MatmulReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a2, b, bias, residual2, alpha, group, how):
        ctx.save_for_backward(a2, b)
        ctx.alpha, ctx.group, ctx.how = alpha, group, how
        return _matmul_reduce_scatter(a2, b, alpha, bias, None, residual2, group, how)

    @staticmethod
    def backward(ctx, grad_c):
        a2, b = ctx.saved_tensors
        grad_c = grad_c.contiguous()
        scaled = grad_c * ctx.alpha if ctx.alpha != 1.0 else grad_c
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:  # every rank's rows need every shard's gradient: an all-gather
            gathered, grad_a = _all_gather_matmul(scaled, b.T, None, None, ctx.group, ctx.how, ctx.needs_input_grad[1])
        elif ctx.needs_input_grad[1]:
            gathered = scaled.new_empty((rank_and_world(ctx.group)[1] * scaled.shape[0], scaled.shape[1]))
            all_gather_tensor(gathered, scaled, group=ctx.group)
        if ctx.needs_input_grad[1]:
            grad_b = matmul(a2.T, gathered)
        grad_bias = grad_c.sum(0) if ctx.needs_input_grad[2] else None
        grad_residual = grad_c if ctx.needs_input_grad[3] else None
        return grad_a, grad_b, grad_bias, grad_residual, None, None, None


# --- checks ----------------------------------------------------------------------------------


def _check_gather(a_shard, b, gather_dim, bias, activation) -> int:
    """Raises for bad arguments, naming them; returns gather_dim as a non-negative index."""
    op = "all_gather_matmul"
    gather_dim = _check_operands(op, ("a_shard", a_shard), b, ("gather_dim", gather_dim))
    _check_epilogue(op, a_shard, b, bias, activation)
    return gather_dim


def _check_scatter(a, b, scatter_dim, world, reduce_op, bias, activation, residual) -> int:
    op = "matmul_reduce_scatter"
    scatter_dim = _check_operands(op, ("a", a), b, ("scatter_dim", scatter_dim))
    if a.shape[scatter_dim] % world:
        raise ValueError(
            f"{op}: expected a.shape[{scatter_dim}] (scatter_dim) to be divisible by the group's size {world}, "
            f"but got {a.shape[scatter_dim]} (a of shape {tuple(a.shape)})"
        )
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"{op}: expected reduce_op to be one of {REDUCE_OPS}, but got {reduce_op!r}")
    _check_epilogue(op, a, b, bias, activation)
    out_shape = list(a.shape[:-1]) + [b.shape[1]]
    out_shape[scatter_dim] //= world
    checks._check_epilogue_tensor("residual", residual, tuple(out_shape), (a.dtype,), a.device, op)
    return scatter_dim


def _check_operands(op: str, named_a: tuple, b, named_dim: tuple) -> int:
    (a_name, a), (dim_name, dim) = named_a, named_dim
    checks.check_operands(a, b, op, a_name)
    an_int = isinstance(dim, int) and not isinstance(dim, bool)
    if not an_int or not -a.dim() <= dim < a.dim() or dim % a.dim() == a.dim() - 1:
        raise ValueError(
            f"{op}: expected {dim_name} to be a dimension of {a_name} (shape {tuple(a.shape)}) other than the "
            f"last, K: one of {list(range(a.dim() - 1))} (or {list(range(-a.dim(), -1))}), but got {dim!r}"
        )
    return dim % a.dim()


def _check_epilogue(op: str, a, b, bias, activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: expected activation to be one of {ACTIVATIONS}, but got {activation!r}")
    checks._check_epilogue_tensor("bias", bias, (b.shape[1],), (a.dtype,), a.device, op)


def _check_transport(op: str, transport) -> None:
    if transport not in TRANSPORTS:
        raise ValueError(f"{op}: expected transport to be one of {TRANSPORTS}, but got {transport!r}")


def _refuse_activation_grad(op: str, activation) -> None:
    if activation is not None:
        raise NotImplementedError(
            f"{op}: activation={activation!r} has no backward yet; call it under torch.no_grad(), or apply the "
            "activation to its output"
        )


# --- the operators --------------------------------------------------------------------------
# Dynamo can't trace what the ops do between their GEMMs (streams, events, symmetric-memory
# handles, point-to-point sends), so a compiled graph calls each as one operator on (rows, K)
# matrices. A process group is named by its group_name, as torch's symm_mem operators take it.
# The autograd Functions around them (above) give the backward, which calls the
# other operator; the operators themselves are never differentiated.

LIB.define(
    "all_gather_matmul(Tensor a, Tensor b, str group_name, Tensor? bias, str? activation, bool overlap, "
    "str transport, bool keep_gathered) -> (Tensor, Tensor)"
)


def all_gather_matmul_impl(a, b, group_name, bias, activation, overlap, transport, keep_gathered):
    gathered, c = _paths().all_gather_rows(
        a, b, bias, activation, _group(group_name), (overlap, transport), keep_gathered
    )
    return (a.new_empty((0, a.shape[1])) if gathered is None else gathered), c


LIB.impl("all_gather_matmul", all_gather_matmul_impl, "CompositeExplicitAutograd")
all_gather_matmul_op = torch.ops.tritongemm.all_gather_matmul.default


@torch.library.register_fake("tritongemm::all_gather_matmul", lib=LIB)
def _all_gather_matmul_fake(a, b, group_name, bias, activation, overlap, transport, keep_gathered):
    rows = _group(group_name).size() * a.shape[0]
    return a.new_empty((rows if keep_gathered else 0, a.shape[1])), a.new_empty((rows, b.shape[1]))


LIB.define(
    "matmul_reduce_scatter(Tensor a, Tensor b, str group_name, float alpha, Tensor? bias, str? activation, "
    "Tensor? residual, bool overlap, str transport) -> Tensor"
)


def matmul_reduce_scatter_impl(a, b, group_name, alpha, bias, activation, residual, overlap, transport):
    return _paths().reduce_scatter_rows(
        a, b, alpha, bias, activation, residual, _group(group_name), (overlap, transport)
    )


LIB.impl("matmul_reduce_scatter", matmul_reduce_scatter_impl, "CompositeExplicitAutograd")
matmul_reduce_scatter_op = torch.ops.tritongemm.matmul_reduce_scatter.default


@torch.library.register_fake("tritongemm::matmul_reduce_scatter", lib=LIB)
def _matmul_reduce_scatter_fake(a, b, group_name, alpha, bias, activation, residual, overlap, transport):
    return a.new_empty((a.shape[0] // _group(group_name).size(), b.shape[1]))


def _group(group_name: str):
    return distributed_c10d._resolve_process_group(group_name)
