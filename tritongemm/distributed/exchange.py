"""The communication half of an overlapped GEMM: transfers on a stream of their own.

A GEMM split into one chunk per rank can start on the chunk it already holds while the others
are in flight. On a GPU that needs two streams at least: the GEMMs run on the caller's (compute)
stream, the transfers on a side stream, and events order the two only where one reads what the
other writes (the symmetric transport runs the gathered chunks' GEMMs on a third).

Two transports: `SymmetricExchanges` (CUDA: peers pull from each other's symmetric buffers with
copy-engine copies, the default) and `Exchanges` (torch.distributed's point-to-point sends and
receives: NCCL's kernels on a GPU, gloo's threads on the CPU, where `wait` blocks the host
instead).

Step s of an op pairs each rank r with r + s (it sends there) and r - s (it receives from
there), for s = 1 .. world - 1: every rank takes the same step at once, so each send meets its
receive and no step waits on another. That is a direct exchange, not a ring: on NVLink (a
switch joins every pair of GPUs) a chunk crosses once instead of being forwarded.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import warnings
import weakref

import torch
import torch.distributed as dist

# The streams of each device beside the caller's, made once: a stream is a driver object, not a
# per-call cost. "side" carries the transfers, "peer_gemms.i" the GEMMs of the i-th chunk that came
# from a peer.
_STREAMS: dict[tuple[int, str], torch.cuda.Stream] = {}
_STREAMS_LOCK = threading.Lock()


def _stream(device: torch.device, role: str) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _STREAMS_LOCK:
        if (index, role) not in _STREAMS:
            _STREAMS[index, role] = torch.cuda.Stream(device=index)
        return _STREAMS[index, role]


# Events made once per thread and reused: a stream's wait on an event takes the event's last
# record at the time it is queued, so recording it again later (the next call) moves no earlier
# wait. torch's `Stream.wait_stream` makes a fresh event each time; on the H200 pair's host one
# op's nine such waits and arrivals cost 5-15 us of host time each (probe_wip, 2026-11-27).
_EVENTS = threading.local()
_EVENTS_HELD = 64  # per thread: the streams an op waits on (a caller's own streams among them)


def _event(key) -> torch.cuda.Event:
    held = getattr(_EVENTS, "held", None)
    if held is None:
        held = _EVENTS.held = {}
    event = held.get(key)
    if event is None:
        if len(held) >= _EVENTS_HELD:
            held.clear()
        event = held[key] = torch.cuda.Event()
    return event


def _follow(waiter: torch.cuda.Stream, leader: torch.cuda.Stream) -> None:
    """`waiter.wait_stream(leader)` on an event made once."""
    event = _event(("follow", leader))
    event.record(leader)
    waiter.wait_event(event)


@contextlib.contextmanager
def _on(stream: torch.cuda.Stream, back: torch.cuda.Stream):
    """Inside: `stream` is its device's current stream; after: `back` (the stream that was).
    `torch.cuda.stream(...)` does the same and asks for the current device and streams first, on
    the host's path of every call: an op switches streams four times."""
    torch.cuda.set_stream(stream)
    try:
        yield
    finally:
        torch.cuda.set_stream(back)


# Each live group's (rank, size). Held weakly: a group kept alive past destroy_process_group by a
# cache (an lru_cache did) was torn down at the interpreter's exit instead, and gloo's threads
# aborted the process now and then ("terminate called without an active exception").
_GROUP_FACTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GROUP_FACTS_LOCK = threading.Lock()


def rank_and_world(group) -> tuple[int, int]:
    """This process's rank in `group` and the group's size, asked of torch.distributed once per
    group rather than several times a call (about 10 us of the host's time each): a group's
    ranks never change."""
    if torch.compiler.is_compiling():  # Dynamo reads a group's rank and size itself, not through a lock
        return dist.get_rank(group), dist.get_world_size(group)
    with _GROUP_FACTS_LOCK:
        facts = _GROUP_FACTS.get(group)
    if facts is None:
        facts = dist.get_rank(group), dist.get_world_size(group)
        with _GROUP_FACTS_LOCK:
            _GROUP_FACTS[group] = facts
    return facts


def step_peers(rank: int, world: int, step: int) -> tuple[int, int]:
    """(to, from): the ranks `rank` sends to and receives from at `step` (the module docstring)."""
    return (rank + step) % world, (rank - step) % world


class Exchanges:
    """The point-to-point exchanges of one op call, through NCCL (or gloo): the transport for any
    device. Made where the op starts: on a GPU the side stream first waits for everything the
    compute stream has queued (the op's inputs, and its fresh buffers, whose memory the compute
    stream may still be using for earlier work).

    The ops see two patterns (paths.py): a gather, where every shard goes to every rank, and a
    scatter of partial products, where the GEMM for rank `to`'s rows goes to rank `to`."""

    spare_sms = 0  # SMs the ops' GEMMs leave free for this transport's kernels (none asked for here)
    announces = False  # whether `gather` can announce each landed chunk in device memory (arrival_words)

    def __init__(self, device: torch.device, group):
        self.group = group
        self.rank, self.world = rank_and_world(group)
        self.on_gpu = device.type == "cuda"
        if self.on_gpu:
            self.compute = torch.cuda.current_stream(device)
            self.side = _stream(device, "side")
            _follow(self.side, self.compute)

    def peers(self, step: int) -> tuple[int, int]:
        """(to, from): the group ranks this rank sends to and receives from at `step`."""
        return step_peers(self.rank, self.world, step)

    def publish(self, shard: torch.Tensor) -> None:
        """Make `shard` readable by the peers (a gather's first step, beside this rank's own GEMM):
        nothing for point-to-point, where `gather` sends it."""

    def gather(
        self,
        shard: torch.Tensor,
        shards: torch.Tensor,
        keep_own: bool = True,
        words: torch.Tensor | None = None,
        pieces: int = 1,
    ) -> list[tuple[int, object]]:
        """Start moving every rank's `shard` into `shards` (world, *shard.shape), this rank's too
        where `keep_own`, beside whatever the compute stream has queued; returns (source, handle)
        per other rank, in the order they should arrive. `words`, `pieces`: only where `announces`."""
        assert words is None and pieces == 1, "point-to-point transfers announce no arrival in device memory"
        steps = map(self.peers, range(1, self.world))
        pending = [(source, self._swap(shard, to, shards[source], source)) for to, source in steps]
        if keep_own:
            self._on_side(lambda: shards[self.rank].copy_(shard))
        return pending

    def outbox(self, step: int, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """Where the GEMM for step `step`'s receiver writes its partial product."""
        return torch.empty(shape, dtype=dtype, device=device)

    def scatter(self, step: int, outbox: torch.Tensor, partials: torch.Tensor):
        """Send `outbox` (just written by the compute stream) to this step's receiver, and receive
        this rank's rows' partial product from this step's sender into partials[sender]."""
        to, source = self.peers(step)
        if self.on_gpu:
            _follow(self.side, self.compute)
        return self._swap(outbox, to, partials[source], source)

    def wait(self, handles) -> None:
        """Until `handles` complete: on a GPU the compute stream waits (the host goes on queueing
        work), on the CPU the host does."""
        for handle in handles:
            handle.wait()  # NCCL: makes the current stream, the compute one here, wait

    @contextlib.contextmanager
    def landed(self, handles, spread: bool = False):
        """Inside: work that reads what `handles` bring (a gathered chunk's GEMM), queued to run
        once they land. Here on the compute stream, one chunk's GEMM after another (`spread`, a
        hint that the chunk's GEMM would run better beside the others, is for the subclass)."""
        self.wait(handles)
        yield

    def finish(self) -> None:
        """The compute stream waits for the side stream's last work: after this, anything the
        caller queues or frees is ordered after every send and receive of the op."""
        if self.on_gpu:
            _follow(self.compute, self.side)

    def _swap(self, send: torch.Tensor, to: int, recv: torch.Tensor, source: int):
        ops = [dist.P2POp(dist.isend, send, dist.get_global_rank(self.group, to), self.group),
               dist.P2POp(dist.irecv, recv, dist.get_global_rank(self.group, source), self.group)]  # fmt: skip
        if not self.on_gpu:
            return dist.batch_isend_irecv(ops)
        with _on(self.side, self.compute):  # NCCL orders its own stream after the current one
            return dist.batch_isend_irecv(ops)

    def _on_side(self, work) -> None:
        if not self.on_gpu:
            work()
            return
        with _on(self.side, self.compute):
            work()


class SymmetricExchanges(Exchanges):
    """The same exchanges through symmetric memory, on CUDA GPUs where torch has it: each rank
    publishes into a buffer every peer maps, and peers pull from it with copies, which the copy
    engines run. NCCL's point-to-point kernels run on SMs: on the H100 pair they took SMs from the
    GEMM beside them (its chunk ran 1.37-1.43x longer), which ate the overlap; a copy takes none.

    Device-side barriers order a rank's write into its buffer before its peers' reads, and their
    reads before its next write. They are kernels of one block, and they run on the side stream
    with the copies, so that no GEMM waits on a peer, only on the chunk it reads. A persistent
    GEMM holds every SM it is given, so the ops plan theirs on all SMs but `spare_sms` (paths.py,
    `device_info.sparing_sms`), and the barriers run on the one left free. (With the barriers on
    the compute stream, H100 pair, 8192 tokens of Llama-3-70B's q/k/v: the shard's copy into the
    buffer and the wait for the peer, 50-120 us, came before the first GEMM, and the last
    barrier's wait for the slower peer after the last.)

    The buffer is one per group and device (`_workspace`), grown when a call needs more: growing
    is a collective and a synchronization, so a CUDA graph must be captured after an eager call of
    its largest shape.

    An all-gather that keeps no gathered A pushes instead, with no publishing copy (pushed.py)."""

    announces = True

    def __init__(self, device: torch.device, group):
        super().__init__(device, group)
        self.spare_sms = 1 if self.world > 1 else 0  # for the barriers' one block; a group of one has none
        self.workspace = None  # the group's buffer, once a step has asked for it
        self.peer_gemms = []  # the streams the gathered chunks' GEMMs ran on, so far

    @contextlib.contextmanager
    def landed(self, handles, spread: bool = False):
        """Here beside the compute stream's GEMM of this rank's shard, on a stream of the gathered
        chunks', as torch's fused op runs its cuBLAS GEMMs: a chunk is a fraction of the rows, its
        persistent GEMM's last wave leaves SMs idle, and the next chunk's programs take them as
        they free up. With `spread`, each chunk's GEMM on a stream of its own, beside the other
        chunks' too; else one after another on one stream. The ops spread a chunk whose GEMM is
        at most two waves of tiles (paths.py `_spread_chunks`): with few tiles a program, the GEMMs
        share the SMs well; with many, three persistent GEMMs at once each finished later than
        queued one after another (four H100s, Llama-3-70B's q,k,v at 16384 tokens: 1.25x the
        sequential path against 1.38x; at 2048, 1.28x against 1.15x)."""
        if spread or not self.peer_gemms:
            self.peer_gemms.append(_stream(self.compute.device, f"peer_gemms.{len(self.peer_gemms)}"))
        stream = self.peer_gemms[-1]
        for handle in handles:  # (each recorded on the side stream, after its wait for the compute stream)
            stream.wait_event(handle.event)
        with _on(stream, self.compute):
            yield

    def publish(self, shard: torch.Tensor) -> None:
        if self.world == 1:  # no peer to read it
            return
        self.workspace = _workspace(self.group, shard.device, shard.numel() * shard.element_size())
        with _on(self.side, self.compute):  # beside this rank's own GEMM, queued before
            self.workspace.buffer(self.rank, shard.shape, shard.dtype).copy_(shard)
            self.workspace.barrier()  # every rank's shard is in its buffer

    def gather(
        self,
        shard: torch.Tensor,
        shards: torch.Tensor,
        keep_own: bool = True,
        words: torch.Tensor | None = None,
        pieces: int = 1,
    ):
        """As `Exchanges.gather`, but yielding each (source, handles) as soon as its copy is
        queued, so that the caller queues the work that reads it before the host goes on to the
        next copy (the host's time per copy is 25-35 us on the H200 pair's host; a GEMM on the
        first chunk then starts that much earlier for each chunk after it). With `words`
        (`reset_arrivals`'), each pulled shard's word is set to 1 once it has landed (a memory
        operation of the stream, after the copy: no SM), for a kernel that waits on them.

        With `pieces` (and `words`), each shard travels as that many copies of consecutive rows,
        piece p of rank r's shard announced by word r * pieces + p, so that a kernel waiting on
        them starts on a shard's first rows while its last are on their way; the handles yielded
        for a shard then mark its first piece's landing, and the copies of its other pieces are
        queued after the caller's work on it."""
        assert pieces == 1 or words is not None, "pieces are announced by words: without them, one copy a shard"
        rows = shard.shape[0] // pieces
        for step, (_, source) in enumerate(map(self.peers, range(1, self.world))):
            landing = self.workspace.buffer(source, shard.shape, shard.dtype)
            for piece in range(pieces):
                part = slice(piece * rows, (piece + 1) * rows if piece < pieces - 1 else None)
                with _on(self.side, self.compute):
                    shards[source][part].copy_(landing[part])
                    if words is not None:
                        torch.ops.symm_mem.stream_write_value32_(words, source * pieces + piece, 1)
                    if piece == 0:
                        arrival = _Arrival(self.side, step)
                if piece == 0:
                    yield source, [arrival]
        if keep_own:
            with _on(self.side, self.compute):
                shards[self.rank].copy_(shard)

    def reset_arrivals(self, words: torch.Tensor) -> None:
        """Zero this group's arrival `words` (`arrival_words`) on the side stream ahead of this
        call's transfers: a kernel that waits on them must be queued after the reset (after the
        first chunk's arrival will do), so that no word set by the previous call reads as landed.
        (The previous call's readers are done by then: the side stream waited for the compute
        stream when this call began, and the compute stream for them when that one ended.)"""
        with _on(self.side, self.compute):
            torch.ops.symm_mem.memset32_(words, 0, 0, words.numel())

    def outbox(self, step: int, shape, dtype: torch.dtype, device) -> torch.Tensor:
        elements = shape[0] * shape[1]
        if step == 1:  # the buffer for every step's outbox, asked for once a call
            self.workspace = _workspace(self.group, device, (self.world - 1) * elements * dtype.itemsize)
        return self.workspace.buffer(self.rank, shape, dtype, (step - 1) * elements)

    def scatter(self, step: int, outbox: torch.Tensor, partials: torch.Tensor):
        _, source = self.peers(step)
        _follow(self.side, self.compute)  # this rank's GEMM of this step is in its outbox
        elements = outbox.numel()
        with _on(self.side, self.compute):
            self.workspace.barrier()  # and every peer's
            # The sender wrote this rank's rows in its outbox of the same step.
            partials[source].copy_(self.workspace.buffer(source, outbox.shape, outbox.dtype, (step - 1) * elements))
            return [_Arrival(self.side, step - 1)]

    def finish(self) -> None:
        if self.workspace is not None:  # no rank writes its buffer again before its peers have read it
            with _on(self.side, self.compute):
                self.workspace.barrier()
        for stream in self.peer_gemms:
            _follow(self.compute, stream)
        super().finish()


class _Arrival:
    """A copy's completion, as NCCL's handles look to `Exchanges.wait`: the stream that waits on it
    waits for the event recorded after the copy. The event is the thread's `index`-th arrival's,
    made once (`_event`): the waits on it are queued before the next call records it again."""

    def __init__(self, stream: torch.cuda.Stream, index: int):
        self.event = _event(("arrival", stream.device_index, index))
        self.event.record(stream)

    def wait(self) -> None:
        torch.cuda.current_stream().wait_event(self.event)


TRANSPORTS = ("auto", "symm_mem", "nccl")


def exchanges_for(device: torch.device, group, transport: str = "auto") -> Exchanges:
    """The op's transport: "auto" takes symmetric memory on a CUDA device where this torch has it
    and torch.distributed's point-to-point (NCCL, gloo) otherwise; "nccl" always the latter (the
    benchmark compares the two); "symm_mem" insists on the former."""
    if transport != "nccl" and device.type == "cuda" and _symmetric_memory() is not None:
        return SymmetricExchanges(device, group)
    if transport == "symm_mem":
        raise ValueError(
            f"transport 'symm_mem' needs CUDA tensors and torch.distributed._symmetric_memory; got {device.type} "
            f"tensors, torch {torch.__version__}"
        )
    return Exchanges(device, group)


@functools.cache
def _symmetric_memory():
    """torch's symmetric-memory module, or None where this torch lacks what is used here."""
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        return None
    return symm_mem if hasattr(symm_mem, "empty") and hasattr(symm_mem, "rendezvous") else None


class _Workspace:
    """A group's symmetric buffer on one device (`_workspace`): its rendezvous handle, and the
    views of every rank's buffer that the ops read and write, each made once. (The handle's
    `get_buffer` makes a tensor on each call: 4-5 us of host time on the H200 pair's host, and an
    op asked for three to seven.)"""

    # Distinct (rank, shape, dtype, offset) views kept, beyond which they are dropped and made
    # anew: an op's geometries are few, but a caller may run many.
    VIEWS_HELD = 256

    def __init__(self, buffer: torch.Tensor, handle):
        self.nbytes = buffer.numel()
        self._buffer, self.handle = buffer, handle  # the buffer lives as long as its views
        self._views: dict = {}

    def buffer(self, rank: int, shape, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
        """Rank `rank`'s buffer as a (shape) tensor of `dtype`, `offset` elements in."""
        key = (rank, tuple(shape), dtype, offset)
        view = self._views.get(key)
        if view is None:
            view = self.handle.get_buffer(rank, tuple(shape), dtype, storage_offset=offset)
            with _BUFFERS_LOCK:
                if len(self._views) >= self.VIEWS_HELD:
                    self._views.clear()
                self._views[key] = view
        return view

    def barrier(self) -> None:
        """Every rank's barrier on the current stream (channel 0), a kernel of one block."""
        self.handle.barrier(channel=0)


# Each group's symmetric buffer on each device, grown when a call needs more: one per (group,
# device), made by a collective rendezvous. Asking torch for its group workspace instead made a
# rendezvous on every call: 0.3-0.4 ms of host time each (H100 pair, eager).
_BUFFERS: dict[tuple[str, int], _Workspace] = {}
_BUFFERS_LOCK = threading.Lock()


def is_current(workspace: _Workspace, group, device: torch.device) -> bool:
    """Whether `workspace` is still `group`'s buffer on `device` (a call that needed more replaced
    it, every rank's in the same call): a plan that keeps views of it remakes them when not."""
    return _BUFFERS.get((group.group_name, device.index)) is workspace


def _enable_for(group) -> None:
    """Symmetric memory for `group` (torch releases before it was made automatic want this; later
    ones warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        _symmetric_memory().enable_symm_mem_for_group(group.group_name)


def _workspace(group, device: torch.device, nbytes: int) -> _Workspace:
    """`group`'s symmetric buffer on `device`, of at least `nbytes`. Growing it is a collective:
    every rank asks for the same size in the same call, as the ops' shapes agree."""
    key = (group.group_name, device.index)
    held = _BUFFERS.get(key)  # (a dict read is atomic; a stale miss takes the lock below)
    if held is not None and held.nbytes >= nbytes:
        return held
    symm_mem = _symmetric_memory()
    with _BUFFERS_LOCK:
        held = _BUFFERS.get(key)
        if held is not None and held.nbytes >= nbytes:
            return held
        if held is not None:  # peers may still be reading the old one for queued work: let it finish
            torch.cuda.synchronize(device)
        else:
            _enable_for(group)
        size = 1 << max(20, (nbytes - 1).bit_length())  # powers of two: few regrowths
        buffer = symm_mem.empty(size, dtype=torch.uint8, device=device)
        _BUFFERS[key] = _Workspace(buffer, symm_mem.rendezvous(buffer, group))
        return _BUFFERS[key]


# Each group's arrival words on each device, in symmetric memory (a peer that pushes a chunk sets
# its words here: pushed.py), made once and kept, as the buffers are (a kernel that
# waits on them has their address compiled in: primitives/tiling/gluon.py).
_ARRIVALS: dict[tuple[str, int], _Arrivals] = {}


# The most pieces a gathered shard may travel in (SymmetricExchanges.gather): arrival words a rank.
MAX_PIECES = 4


class _Arrivals:
    """A group's arrival words on one device and its rendezvous handle, through which `of` gives
    any rank's words as this device addresses them (each view made once)."""

    def __init__(self, words: torch.Tensor, handle):
        self.words, self.handle = words, handle
        self._views: dict[int, torch.Tensor] = {}

    def of(self, rank: int) -> torch.Tensor:
        view = self._views.get(rank)
        if view is None:  # (torch's symm_mem ops take uint32 words; its buffers are made as int32)
            view = self.handle.get_buffer(rank, (self.words.numel(),), torch.int32).view(torch.uint32)
            self._views[rank] = view
        return view


def _arrivals(group, device: torch.device) -> _Arrivals:
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (group.group_name, index)
    held = _ARRIVALS.get(key)  # (a dict read is atomic; a miss takes the lock below)
    if held is not None:
        return held
    with _BUFFERS_LOCK:
        if key not in _ARRIVALS:  # a collective: every rank asks in the same call
            symm_mem = _symmetric_memory()
            _enable_for(group)
            words = symm_mem.empty(dist.get_world_size(group) * MAX_PIECES, dtype=torch.int32, device=index).zero_()
            _ARRIVALS[key] = _Arrivals(words.view(torch.uint32), symm_mem.rendezvous(words, group))
        return _ARRIVALS[key]


def arrival_words(group, device: torch.device) -> torch.Tensor:
    """(world * MAX_PIECES,) uint32 words in `device`'s memory, word r * pieces + p set once piece p
    of rank r's shard has landed here (SymmetricExchanges.gather with `words`, or the peer's push,
    pushed.py; word r with one piece a shard), reset at each call's start (`reset_arrivals`). Made
    by a collective on a group's first call."""
    return _arrivals(group, device).words


def announces_arrivals() -> bool:
    """Whether this torch has the stream memory operations that set and reset arrival words."""
    ops = getattr(torch.ops, "symm_mem", None)
    return ops is not None and hasattr(ops, "stream_write_value32_") and hasattr(ops, "memset32_")


@functools.cache
def _wait_value32():
    """The driver's cuStreamWaitValue32 (a stream waits, with no SM, until a 32-bit word in device
    memory reaches a value; captured into CUDA graphs as a node), which torch does not wrap; None
    where the driver library or the function is missing."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        wait = getattr(driver, "cuStreamWaitValue32_v2", None) or driver.cuStreamWaitValue32
    except (OSError, AttributeError):
        return None
    wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    wait.restype = ctypes.c_int
    return wait


_WAIT_VALUE_GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ: until (int32)(*word - value) >= 0


def _wait_word(stream: torch.cuda.Stream, words: torch.Tensor, index: int) -> None:
    """`stream` waits until words[index] is 1 or more."""
    status = _wait_value32()(stream.cuda_stream, words.data_ptr() + 4 * index, 1, _WAIT_VALUE_GEQ)
    if status != 0:
        raise RuntimeError(f"cuStreamWaitValue32 on word {index} of the arrival words failed: CUresult {status}")


# torch 2.13 renamed the tensor collectives (the old names warn); this project's GPU machine has 2.11.
all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
