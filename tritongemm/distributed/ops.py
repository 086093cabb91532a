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

from tritongemm.core import checks, device_info
from tritongemm.core.epilogue import ACTIVATIONS, Epilogue, Fused
from tritongemm.dense.api import lookup, matmul
from tritongemm.dense.linear import _requires_grad, linear
from tritongemm.distributed import gathered as gathered_gemm
from tritongemm.distributed import pushed as pushed_gather
from tritongemm.distributed import pushed_scatter
from tritongemm.distributed.exchange import (
    TRANSPORTS,
    all_gather_tensor,
    arrival_words,
    exchanges_for,
    rank_and_world,
    reduce_scatter_tensor,
)
from tritongemm.distributed.reduce import reduce_partials

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
    if torch.is_grad_enabled() and _requires_grad(a2, b, bias):
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
    if torch.is_grad_enabled() and _requires_grad(a2, b, bias, residual2):
        _refuse_activation_grad("matmul_reduce_scatter", activation)
        c2 = _MatmulReduceScatter.apply(a2, b, bias, residual2, alpha, group, (overlap, transport))
    else:
        c2 = _matmul_reduce_scatter(a2, b, alpha, bias, activation, residual2, group, (overlap, transport))
    return c2.view(*lead, N).movedim(0, scatter_dim)


# --- the overlapped and sequential paths, on (rows, K) matrices ------------------------------


def _all_gather_matmul(a2, b, bias, activation, group, how: tuple, keep_gathered: bool = True):
    """(A, C) for a contiguous (m, K) shard: A (world * m, K) in rank order, C (world * m, N).
    `how`: (overlap, transport). Without `keep_gathered` A is None: the overlapped path then
    never copies this rank's own shard into it (its GEMM reads the shard), 2 x the shard's bytes
    of memory traffic less beside the first GEMM. While torch.compile traces, the operator
    (tritongemm/ops.py), which runs `all_gather_rows`."""
    if torch.compiler.is_compiling():
        from tritongemm import ops

        gathered, c2 = ops.all_gather_matmul(a2, b, group.group_name, bias, activation, *how, keep_gathered)
        return (gathered if keep_gathered else None), c2
    return all_gather_rows(a2, b, bias, activation, group, how, keep_gathered)


def all_gather_rows(a2, b, bias, activation, group, how: tuple, keep_gathered: bool):
    """`_all_gather_matmul`, run."""
    overlap, transport = how
    if overlap and not keep_gathered and transport != "nccl" and a2.numel() and _pushes():
        # Each rank copies its shard into its peers' memory (pushed.py), where it can. (With the
        # gathered A kept, each shard is pulled into it instead: pushed, the chunks land in the
        # group's buffer, and copying them out would take the SMs.)
        pushed = pushed_gather.plan_for(a2, b, bias, activation, group)
        if pushed is not None:
            return None, pushed.run(a2, b, bias)
    rank, world = rank_and_world(group)
    m, K = a2.shape
    gathered = a2.new_empty((world * m, K))
    c2 = a2.new_empty((world * m, b.shape[1]))
    if not overlap or a2.numel() == 0:
        if a2.numel():
            all_gather_tensor(gathered, a2, group=group)
        _gemm_into(gathered, b, c2, bias, activation)
        return (gathered if keep_gathered else None), c2
    shards, outs = gathered.view(world, m, K), c2.view(world, m, -1)
    exchanges = exchanges_for(a2.device, group, transport)
    with device_info.sparing_sms(exchanges.spare_sms):  # room for the transport's kernels beside the GEMMs
        # The other chunks' GEMM: one over all their rows, which waits for each chunk in the
        # kernel (gathered.py), where it runs; else one GEMM per chunk as it lands.
        own, whole, words, pieces = _gathered_gemm(gathered, b, c2, bias, activation, rank, exchanges)
        # This rank's own shard's GEMM first: it waits on nothing, and the host's time on the rest
        # hides under it. (Queued after the shard's publishing copy, it started after that copy's
        # end in a CUDA graph: 30 us later, H200 pair.)
        if own is not None and OWN_CHUNK_ON_SHARED_TILES and gathered_gemm.own_fits(a2):
            own(a2, b, outs[rank], bias)
        else:
            _gemm_into(a2, b, outs[rank], bias, activation)
        if whole is not None:
            exchanges.reset_arrivals(words)
        exchanges.publish(a2)
        # The shards' transfers run back to back beside the compute stream (none depends on a
        # GEMM), which works through the chunks as they land. Each chunk's reader is queued as
        # soon as its transfer is (`gather` yields it), before the host queues the next one.
        spread = whole is None and _spread_chunks(m, b.shape[1], a2.device)
        landings = exchanges.gather(a2, shards, keep_own=keep_gathered, words=words, pieces=pieces)
        for step, (source, handles) in enumerate(landings):
            if whole is None:
                with exchanges.landed(handles, spread):
                    _gemm_into(shards[source], b, outs[source], bias, activation)
            elif step == 0:
                # Queued once the first chunk has landed, not at once: its programs would take SMs
                # from the own chunk's GEMM and spin there (four H100s, q,k,v at 8192 tokens: 1.20x
                # the sequential path against 1.49x; docs/tensor-parallel.md). (Its first piece, where
                # the chunks travel in pieces: `handles` mark that.) The rest they wait for.
                with exchanges.landed(handles):
                    whole(gathered, b, c2, bias)
    exchanges.finish()
    return (gathered if keep_gathered else None), c2


def _matmul_reduce_scatter(a2, b, alpha, bias, activation, residual2, group, how: tuple) -> torch.Tensor:
    """This rank's (m, N) rows of epilogue(alpha * sum over ranks of a2 @ b), a2 (world * m, K).
    `how`: (overlap, transport). While torch.compile traces, the operator (tritongemm/ops.py),
    which runs `reduce_scatter_rows`."""
    if torch.compiler.is_compiling():
        from tritongemm import ops

        return ops.matmul_reduce_scatter(a2, b, group.group_name, alpha, bias, activation, residual2, *how)
    return reduce_scatter_rows(a2, b, alpha, bias, activation, residual2, group, how)


def reduce_scatter_rows(a2, b, alpha, bias, activation, residual2, group, how: tuple) -> torch.Tensor:
    """`_matmul_reduce_scatter`, run."""
    overlap, transport = how
    rank, world = rank_and_world(group)
    M, K = a2.shape
    m, N = M // world, b.shape[1]
    epilogue = dict(alpha=alpha, bias=bias, activation=activation, residual=residual2)
    if K == 0 or m * N == 0:  # every partial is zero (or empty): nothing to send
        return reduce_partials(a2.new_zeros((1, m, N)), **epilogue)
    if overlap and transport != "nccl" and PUSH_SCATTER:
        # Each rank copies its partial products into their receivers' memory (pushed_scatter.py),
        # where it can: a decision on what every rank's call shares, the geometry, never on this
        # rank's pointers. (Ranks on different paths would wait at each other's barriers forever.)
        planned = pushed_scatter.plan_for(a2, b, alpha, bias, activation, residual2, group)
        if planned is not None:
            return planned.run(a2, b, bias, residual2)
    if not overlap:
        full = a2.new_empty((M, N))
        _gemm_into(a2, b, full, None, None)
        reduced = a2.new_empty((m, N))
        reduce_scatter_tensor(reduced, full, group=group)
        plain = alpha == 1.0 and bias is None and activation is None and residual2 is None
        return reduced if plain else reduce_partials(reduced[None], **epilogue)
    rows = [a2[r * m : (r + 1) * m] for r in range(world)]
    # partials[w]: rank w's product of this rank's rows. Each GEMM for another rank's rows goes
    # out as soon as it is done, while the next one runs; this rank's own rows go last.
    partials = a2.new_empty((world, m, N))
    exchanges = exchanges_for(a2.device, group, transport)
    pending = []
    with device_info.sparing_sms(exchanges.spare_sms):
        for step, to in enumerate((rank + s) % world for s in range(1, world)):
            outbox = exchanges.outbox(step + 1, (m, N), a2.dtype, a2.device)
            _gemm_into(rows[to], b, outbox, None, None)
            pending.append(exchanges.scatter(step + 1, outbox, partials))
        _gemm_into(rows[rank], b, partials[rank], None, None)
    for handles in pending:
        exchanges.wait(handles)
    out = reduce_partials(partials, **epilogue)
    exchanges.finish()
    return out


def _gemm_into(a, b, out, bias, activation) -> None:
    """out = activation(a @ b + bias) by tritongemm's kernels, writing `out` in place (a chunk of
    the op's output): `matmul`'s plan, or `linear`'s epilogue planned with an out tensor."""
    if bias is None and activation is None:
        matmul(a, b, out=out)
    elif out.numel() == 0 or a.shape[1] == 0:  # no kernel: linear computes an empty sum's epilogue
        out.copy_(linear(a, b.T, bias, activation=activation))
    else:
        fused = Fused(Epilogue(activation, 1.0, bias is not None), bias, None, out.dtype)
        lookup(a, b, out, "auto", None, fused).run(a, b, out, bias, None, None)


# Whether all_gather_rows may run the gathered chunks as one GEMM that waits for them in the
# kernel (gathered.py) where it can: on by default; scripts/probes/tp/tp_probe.py turns it off to compare.
WHOLE_GATHERED_GEMM = True
# Whether that GEMM's chunks are pushed (each rank copies its shard into its peers' memory) rather
# than pulled (each publishes its shard in its own buffer, which its peers copy from) where the
# gathered A is not kept: publishing is a copy on the SMs, which held back the own chunk's GEMM
# (docs/tensor-parallel.md). On by default; scripts/probes/tp/tp_probe.py turns it off to compare.
PUSH_GATHER = True
# Whether a reduce-scatter's partial products are pushed (each rank copies them into their
# receivers' memory as soon as each is computed) rather than pulled (each receiver copies them from
# its senders' buffers after a barrier of every rank, a step at a time): pushed_scatter.py. On by
# default; scripts/probes/tp/tp_probe.py turns it off to compare.
PUSH_SCATTER = True
# Whether this rank's own chunk's GEMM then runs on that GEMM's tiles rather than on `auto`'s for
# its shape: the other chunks' GEMM fills its last wave, so what counts is the tile's speed, not
# how many waves it makes (four H100s, q,k,v of Llama-3-70B: results/h100x4/probes/tp/tp-own-tiles.csv,
# docs/tensor-parallel.md). On by default; scripts/probes/tp/tp_probe.py turns it off to compare.
OWN_CHUNK_ON_SHARED_TILES = True


def _pushes() -> bool:
    """Whether an all-gather that keeps no gathered A may push (pushed.py, which runs the own chunk
    on the gathered chunks' GEMM's tiles): the switches above, as they are now."""
    return PUSH_GATHER and WHOLE_GATHERED_GEMM and OWN_CHUNK_ON_SHARED_TILES


def _gathered_gemm(gathered, b, c2, bias, activation, rank, exchanges):
    """(own, others, words, pieces): gathered.plan's two launches for this call, the arrival words
    the second waits on and the pieces each chunk travels in, or (None, None, None, 1): the chunks
    then run a GEMM each."""
    if not (WHOLE_GATHERED_GEMM and exchanges.announces):
        return None, None, None, 1
    words = arrival_words(exchanges.group, gathered.device)
    launches = gathered_gemm.plan(gathered, b, c2, bias, activation, rank, words)
    return (None, None, None, 1) if launches is None else (launches.own, launches.others, words, launches.pieces)


def _spread_chunks(m: int, n: int, device: torch.device) -> bool:
    """Whether the gathered chunks' GEMMs (m x n each) should run side by side, each on a stream of
    its own (exchange.py `SymmetricExchanges.landed`): where one is at most two waves of 128 x 256
    tiles on the SMs the ops plan for. A threshold on a fixed tile, not on the one `auto` runs
    (128 x 128 at 2048 x 2560, say): it is what was measured, on four H100s, every all-gather of
    bench tp (scripts/probes/tp/tp_probe.py, docs/tensor-parallel.md)."""
    if device.type != "cuda":
        return False
    tiles = -(-m // 128) * -(-n // 256)
    return tiles <= 2 * device_info.sm_count(device)


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
