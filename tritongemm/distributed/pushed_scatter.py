"""A GEMM + reduce-scatter whose partial products are pushed, planned once per geometry (paths.py's
path on CUDA GPUs with symmetric memory).

Rank r's product of rank `to`'s rows is one of `to`'s partial products. Per call:
- side stream: reset this rank's arrival words; a barrier (every rank has reset its words, and
  its last call's sum has read its slots: its side stream first waited for its compute stream);
- compute stream, for each step s (to = r + s, exchange.step_peers): the GEMM of rows[to] into a
  local outbox; then, on the side stream once that GEMM is done, a copy engine's copy of the outbox
  straight into slot r of `to`'s symmetric buffer and the write of `to`'s word r (pushed.py's
  `_push_piece`: no SM);
- compute stream: this rank's own rows' GEMM into its own slot; then, once a third stream has
  seen the words reset and then each peer's word set (the driver's cuStreamWaitValue32: no SM),
  the sum of the slots with the epilogue (reduce.py).

The pulled path it replaces (paths.py's general one, SymmetricExchanges.scatter) waited at a barrier
of every rank after each step's GEMM (a receiver pulled once every sender had written the step's
outbox) and at one more at the end: world barriers a call, each as late as the slowest rank's
GEMM. Pushed, a partial leaves as soon as its own GEMM is done and no rank waits for another's
GEMM, only for the partials it sums; the call has one barrier, at its start.

Everything a call does not change is made with the plan (`PushedScatter`): the GEMMs' plans, the
views of the peers' slots and words, the sum's compiled launch. The host's time a call of o's
reduce-scatter at 2048 tokens on four H200s (scripts/probes/tp/tp_host.py): 275 us, the general path's 622
(docs/tensor-parallel.md, "Partials pushed too").
"""

from __future__ import annotations

import functools

import torch

from tritongemm.core import device_info
from tritongemm.core.problem import tensor_facts
from tritongemm.dense.matmul import lookup
from tritongemm.distributed import exchange, pushed
from tritongemm.distributed.reduce import planned_reduce


def plan_for(a2: torch.Tensor, b: torch.Tensor, alpha: float, bias, activation, residual2, group):
    """The PushedScatter for this call's geometry, or None where it can't run (not CUDA, no
    symmetric memory or device-side arrival words, a group of one): the caller then takes the
    general path. Planned once per geometry and group, in PLANS; building one may grow the group's
    buffer, a collective every rank makes in the same call, as their geometries agree. Whether it
    plans reads only what every rank's call shares (the geometry, the group, this machine's torch),
    so that every rank takes the same path.

    The key holds a2's address modulo 16, not only whether it is aligned: the GEMMs are planned on
    a2's rows of each rank, whose alignment follows from it (a2 a shard of a larger activation's
    columns may start anywhere, on each rank somewhere else)."""
    key = ("pushed scatter", tensor_facts(a2), a2.data_ptr() % 16, tensor_facts(b), float(alpha), tensor_facts(bias),
           activation, tensor_facts(residual2), group.group_name)  # fmt: skip
    return pushed.plan_once(key, lambda: PushedScatter.build(a2, b, alpha, bias, activation, residual2, group))


class PushedScatter:
    """One pushed GEMM + reduce-scatter geometry on one rank: `run(a2, b, bias, residual2)` returns
    this rank's (m, N) rows of epilogue(alpha * sum over ranks of a2 @ b), a2 (world * m, K)."""

    @staticmethod
    def build(a2, b, alpha, bias, activation, residual2, group) -> PushedScatter | None:
        rank, world = exchange.rank_and_world(group)
        if not pushed.can_push(world, a2.device) or a2.numel() * b.shape[1] == 0:
            return None
        return PushedScatter(a2, b, alpha, bias, activation, residual2, group, rank, world)

    def __init__(self, a2, b, alpha, bias, activation, residual2, group, rank: int, world: int):
        m, N = a2.shape[0] // world, b.shape[1]
        self.group, self.device, self.rank, self.world, self.m = group, a2.device, rank, world, m
        self.to = [exchange.step_peers(rank, world, step)[0] for step in range(1, world)]
        self.outbox_shape = (world - 1, m, N)
        outbox = a2.new_empty(self.outbox_shape)  # this call's, to plan on
        landing = a2.new_empty((world, m, N))  # a stand-in for this rank's slots, to plan on
        # The steps' GEMMs leave an SM for the side stream's barrier, which runs beside the first.
        with device_info.sparing_sms(1):
            plan = functools.partial(lookup, kernel="auto", config=None)
            self.step_gemms = [plan(self._rows(a2, to), b, box) for to, box in zip(self.to, outbox)]
            self.own_gemm = plan(self._rows(a2, rank), b, landing[rank])
        self.reduce = planned_reduce(landing, alpha=alpha, bias=bias, activation=activation, residual=residual2)
        self.words = exchange.arrival_words(group, self.device)
        self.sources = [exchange.step_peers(rank, world, step)[1] for step in range(1, world)]
        self.side = exchange._stream(self.device, "side")
        self.waiter = exchange._stream(self.device, "arrivals")
        self._place(a2.dtype, N)

    def _rows(self, a2, r: int) -> torch.Tensor:
        return a2[r * self.m : (r + 1) * self.m]

    def _place(self, dtype: torch.dtype, n: int) -> None:
        """The views of this rank's slots and its peers' that the pushes write and the sum reads,
        made on the group's buffer as it is now (`run` remakes them if another call grew it), and
        set as one tuple, so that a call reads all of them from one placing."""
        plane = self.m * n
        workspace = exchange._workspace(self.group, self.device, self.world * plane * dtype.itemsize)
        arrivals = exchange._arrivals(self.group, self.device)
        slots = tuple((workspace.buffer(to, (self.m, n), dtype, self.rank * plane), arrivals.of(to)) for to in self.to)
        landing = workspace.buffer(self.rank, (self.world, self.m, n), dtype)
        self.placed = workspace, slots, landing

    def run(self, a2: torch.Tensor, b: torch.Tensor, bias, residual2) -> torch.Tensor:
        if not exchange.is_current(self.placed[0], self.group, self.device):
            self._place(a2.dtype, b.shape[1])  # another call grew the group's buffer (every rank's in the same call)
        workspace, slots, landing = self.placed
        compute, side, waiter, words = torch.cuda.current_stream(self.device), self.side, self.waiter, self.words
        outbox = a2.new_empty(self.outbox_shape)
        exchange._follow(side, compute)  # the inputs and the outbox's memory, as the compute stream has them
        reset = exchange._event(("words reset", side))
        for step, (to, gemm, (slot, peer_words)) in enumerate(zip(self.to, self.step_gemms, slots)):
            gemm.run(self._rows(a2, to), b, outbox[step])
            if step == 0:  # (queued after the first GEMM: in a CUDA graph, it then starts first, 3 us earlier)
                with exchange._on(side, compute):
                    torch.ops.symm_mem.memset32_(words, 0, 0, words.numel())
                    workspace.barrier()
                reset.record(side)
            done = exchange._event(("partial", step))
            done.record(compute)
            side.wait_event(done)
            with exchange._on(side, compute):
                pushed._push_piece(outbox[step], slot, peer_words, self.rank)
        self.own_gemm.run(self._rows(a2, self.rank), b, landing[self.rank])
        # The peers' partials, waited for beside the own GEMM: on the compute stream, between the GEMM
        # and the sum, a wait for a word already set took 3-5 us (two H200s, o at 2048 tokens). (Queued
        # after the GEMM: streams that share one of the GPU's hardware queues run in queueing order.)
        waiter.wait_event(reset)  # else a word the last call set could pass for this call's
        for source in self.sources:
            exchange._wait_word(waiter, words, source)
        landed = exchange._event(("partials landed", waiter))
        landed.record(waiter)
        compute.wait_event(landed)
        out = self.reduce(landing, bias, residual2)
        exchange._follow(compute, side)  # the pushes read the outbox, freed on the compute stream
        return out
