"""An all-gather + GEMM whose shards are pushed, planned once per geometry (paths.py's default path
where the gathered A is not kept).

Each rank runs its own shard's GEMM at once and copies its shard straight into a slot of every
peer's symmetric buffer, a copy engine's copy, then sets the peer's arrival word for it; the GEMM
over the other chunks (gathered.py) reads them in this rank's buffer, where they land, waiting for
each piece's word in the kernel. No rank first copies its shard into its own buffer: that copy,
within one GPU, the driver runs on the SMs, where it held back the own chunk's GEMM queued beside
it (results/h100/probes/tp/dtod-copy-takes-sms.txt; docs/tensor-parallel.md, "Pushed, not pulled").

Per call, on three streams (exchange.py's):
- compute: this rank's own shard's GEMM;
- side: reset this rank's words; a barrier (every rank has reset its words, and read its buffer
  for its last call: its side stream first waited for its compute stream, which had waited for
  that call's GEMM); each piece's copy into its receiver's slot and the write of its word there;
- peer GEMMs: behind the barrier (an event) and a stream wait on the first piece's word (the
  driver's cuStreamWaitValue32: no SM), the GEMM over the other chunks. Queued at once, its
  programs would take SMs from the own chunk's GEMM and spin there (gathered.py).
No barrier at the end: nothing reads a pusher's buffer.

Everything a call does not change is made when the plan is (`PushedGather`): the two GEMMs'
launches, the views of the peers' slots and words, the streams. A call is its launches and a few
tensor views, where the general path made about 300 Python calls (scripts/probes/tp/tp_host.py).
"""

from __future__ import annotations

import torch

from tritongemm.core import device_info
from tritongemm.core.plans import planned
from tritongemm.core.problem import tensor_facts
from tritongemm.distributed import exchange
from tritongemm.distributed import gathered as gathered_gemm


def plan_for(a2: torch.Tensor, b: torch.Tensor, bias, activation, group):
    """The PushedGather for this call's geometry, or None where it can't run (no symmetric memory
    or device-side arrival words, the gathered chunks' GEMM can't run, a group of one): the caller
    then takes the general path. Planned once per geometry and group, in PLANS; building one may
    grow the group's buffer, a collective every rank makes in the same call, as their geometries
    agree. Whether it plans reads only what every rank's call shares (the geometry, the group, this
    machine's torch), never this rank's pointers, so that every rank takes the same path: ranks on
    different paths would wait at each other's barriers forever. (A shard the own chunk's launch
    can't read, `run` copies.)"""
    key = ("pushed", tensor_facts(a2), tensor_facts(b), tensor_facts(bias), activation, group.group_name)
    return plan_once(key, lambda: PushedGather.build(a2, b, bias, activation, group))


def plan_once(key: tuple, build):
    """What `build()` makes for `key`, made once and kept in PLANS, a refusal (None) too, so that a
    geometry a pushed path can't run is not planned again: both pushed ops' plan_for."""
    held = planned(key, lambda: build() or _UNPLANNED)
    return None if held is _UNPLANNED else held


_UNPLANNED = object()  # what the cache keeps for a geometry this path can't run, so it is not retried


def can_push(world: int, device: torch.device) -> bool:
    """Whether a pushed path runs here: a group of two or more on CUDA, with symmetric memory, the
    stream memory operations that set and reset arrival words, and the driver's wait on them. The
    same on every rank of a machine (nothing of the call's tensors but their device's type)."""
    if world < 2 or device.type != "cuda" or exchange._symmetric_memory() is None:
        return False
    return exchange.announces_arrivals() and exchange._wait_value32() is not None


def _push_piece(piece: torch.Tensor, slot: torch.Tensor, peer_words: torch.Tensor, word: int) -> None:
    """On the current (side) stream: `piece` into a peer's `slot`, a copy engine's copy, then the
    peer's word set (a stream memory operation, which torch fences after the copy: no SM). A
    module function, so that a test can hold the pieces back."""
    slot.copy_(piece)
    torch.ops.symm_mem.stream_write_value32_(peer_words, word, 1)


class PushedGather:
    """One pushed all-gather + GEMM geometry on one rank: `run(a2, b, bias)` returns C (world * m,
    N) for this rank's (m, K) shard a2, on the tensors' device."""

    @staticmethod
    def build(a2, b, bias, activation, group) -> PushedGather | None:
        rank, world = exchange.rank_and_world(group)
        device = a2.device
        if not can_push(world, device):
            return None
        m, K = a2.shape
        gathered = a2.new_empty((world * m, K))  # the plan's stand-in for the gathered rows
        c2 = a2.new_empty((world * m, b.shape[1]))
        with device_info.sparing_sms(1):  # the side stream's barrier runs on the SM left
            words = exchange.arrival_words(group, device)
            launches = gathered_gemm.plan(gathered, b, c2, bias, activation, rank, words)
        if launches is None:
            return None
        return PushedGather(a2, b.shape[1], group, rank, world, launches, words)

    def __init__(self, a2, n: int, group, rank: int, world: int, launches, words: torch.Tensor):
        m, K = a2.shape
        self.group, self.device, self.rank, self.world = group, a2.device, rank, world
        self.own, self.others, self.pieces = launches.own, launches.others, launches.pieces
        self.words = words
        self.c_shape, self.own_rows = (world * m, n), slice(rank * m, (rank + 1) * m)
        self.side = exchange._stream(self.device, "side")
        self.peer = exchange._stream(self.device, "peer_gemms.0")
        self.first_word = exchange.step_peers(rank, world, 1)[1] * self.pieces  # step 1's sender's first piece
        self._place(a2)

    def _place(self, a2) -> None:
        """The views of this rank's buffer and its peers' that the pushes write and the GEMM reads,
        made on the group's buffer as it is now (`run` remakes them if another call grew it), and
        set as one tuple, so that a call reads all of them from one placing."""
        m, K = a2.shape
        elements, rows, pieces = m * K, m // self.pieces, self.pieces
        workspace = exchange._workspace(self.group, self.device, self.world * elements * a2.element_size())
        arrivals = exchange._arrivals(self.group, self.device)
        sends = []  # (rows of the shard, the receiver's slot for them, the receiver's words, the word)
        for step in range(1, self.world):
            to, _ = exchange.step_peers(self.rank, self.world, step)
            for piece in range(pieces):
                start, stop = piece * rows, (m if piece == pieces - 1 else (piece + 1) * rows)
                slot = workspace.buffer(to, (stop - start, K), a2.dtype, self.rank * elements + start * K)
                whole_shard = start == 0 and stop == m
                sends.append((None if whole_shard else slice(start, stop), slot, arrivals.of(to),
                              self.rank * pieces + piece))  # fmt: skip
        landing = workspace.buffer(self.rank, (self.world * m, K), a2.dtype)
        self.placed = workspace, tuple(sends), landing

    def run(self, a2: torch.Tensor, b: torch.Tensor, bias) -> torch.Tensor:
        if not gathered_gemm.own_fits(a2):  # a shard the own launch can't read: an aligned copy of it
            a2 = torch.empty(a2.shape, dtype=a2.dtype, device=a2.device).copy_(a2)
        if not exchange.is_current(self.placed[0], self.group, self.device):
            self._place(a2)  # another call grew the group's buffer (every rank's in the same call)
        workspace, sends, landing = self.placed
        compute = torch.cuda.current_stream(self.device)
        side, peer = self.side, self.peer
        c2 = a2.new_empty(self.c_shape)
        exchange._follow(side, compute)  # the inputs, and c2's memory, as the compute stream has them
        self.own(a2, b, c2[self.own_rows], bias)
        pushing = exchange._event(("pushing", side))
        torch.cuda.set_stream(side)
        try:
            torch.ops.symm_mem.memset32_(self.words, 0, 0, self.words.numel())
            workspace.barrier()
            pushing.record(side)
            for rows, slot, peer_words, word in sends:
                _push_piece(a2 if rows is None else a2[rows], slot, peer_words, word)
            peer.wait_event(pushing)
            exchange._wait_word(peer, self.words, self.first_word)
            torch.cuda.set_stream(peer)
            self.others(landing, b, c2, bias)
        finally:
            torch.cuda.set_stream(compute)
        exchange._follow(compute, peer)
        exchange._follow(compute, side)  # the pushes read a2: the caller may write it next
        return c2
