"""The tensor-parallel GEMMs' paths on (rows, K) matrices (overlapped.py's public functions and
operators run them): each chunk's GEMM while other chunks travel (exchange.py), the pushed forms
where they run (pushed.py, pushed_scatter.py), and the sequential baseline (`overlap=False`)."""

from __future__ import annotations

import torch

from tritongemm.core import device_info
from tritongemm.core.epilogue import Epilogue, Fused
from tritongemm.dense.linear import linear
from tritongemm.dense.matmul import lookup, matmul
from tritongemm.distributed import gathered as gathered_gemm
from tritongemm.distributed import pushed as pushed_gather
from tritongemm.distributed import pushed_scatter
from tritongemm.distributed.exchange import (
    all_gather_tensor,
    arrival_words,
    exchanges_for,
    rank_and_world,
    reduce_scatter_tensor,
)
from tritongemm.distributed.reduce import reduce_partials


def all_gather_rows(a2, b, bias, activation, group, how: tuple, keep_gathered: bool):
    """`overlapped._all_gather_matmul`, run: (A or None, C)."""
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


def reduce_scatter_rows(a2, b, alpha, bias, activation, residual2, group, how: tuple) -> torch.Tensor:
    """`overlapped._matmul_reduce_scatter`, run."""
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
