"""tritongemm.distributed against the unsharded computation: 2 and 4 processes over gloo on the
CPU (the kernels under Triton's interpreter), NCCL on GPUs where the machine has enough.

Every rank builds the same whole tensors from one seed and takes its shard, so each checks its
own result against the float64 product of the whole ones. The processes run every case and
write what failed; the test reports it. One spawn per world size: starting a process that
imports torch and Triton costs seconds.
"""

from __future__ import annotations

import functools
import inspect
import json
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from cases import DEVICE

from tritongemm.core.reference import rel_error, tolerance

WORLDS = (1, 2, 4)  # 1: a group of one, where every step's loop is empty


@pytest.mark.parametrize("world", WORLDS)
def test_distributed(world, tmp_path):
    _spawn(world, tmp_path, [name for name in _CASES if name != "parallelize"])


@pytest.mark.parametrize("world", WORLDS)
def test_parallelize(world, tmp_path):
    pytest.importorskip("transformers", reason="parallelize shards transformers models: pip install transformers")
    _spawn(world, tmp_path, ["parallelize"])


def test_gathered_chunks_spread_over_streams_only_where_their_gemms_are_small(monkeypatch):
    """Up to two waves of 128 x 256 tiles a chunk, each gathered chunk's GEMM takes a stream of
    its own (measured on four H100s: docs/tensor-parallel.md); beyond, and on the CPU, one."""
    from tritongemm.core import device_info
    from tritongemm.distributed import paths

    monkeypatch.setattr(device_info, "sm_count", lambda device: 131)
    gpu = torch.device("cuda", 0)
    assert paths._spread_chunks(512, 2560, gpu)  # q,k,v at 2048 tokens over 4 GPUs: 40 tiles
    assert paths._spread_chunks(512, 14336, gpu)  # gate/up: 224
    assert paths._spread_chunks(2048, 2560, gpu)  # q,k,v at 8192 tokens: 160
    assert not paths._spread_chunks(4096, 2560, gpu)  # at 16384: 320
    assert not paths._spread_chunks(512, 2560, torch.device("cpu"))


def test_gathered_chunks_travel_in_pieces_of_half_a_wave_from_four_ranks_where_b_stays_in_l2():
    """gathered.pieces_for, as measured (its comment): Llama-3-70B's q,k,v over four GPUs on 131
    SMs (rows of 128 x 128 tiles to 4096 tokens, 128 x 256 from 8192), never gate,up (B past L2),
    never over two GPUs; the pieces divide the rows of tiles."""
    from tritongemm.distributed.gathered import pieces_for

    sms = 131
    assert pieces_for(4, 20, False, 4, sms) == 1  # 2048 tokens: two pieces would be 40 tiles each
    assert pieces_for(8, 20, False, 4, sms) == 2  # 4096
    assert pieces_for(16, 10, False, 4, sms) == 2  # 8192
    assert pieces_for(32, 10, False, 4, sms) == 4  # 16384 (no more than MAX_PIECES)
    assert pieces_for(64, 10, False, 4, sms) == 4
    assert pieces_for(32, 56, True, 4, sms) == 1  # gate,up at 16384 tokens
    assert pieces_for(64, 10, False, 2, sms) == 1  # q,k,v at 16384 tokens over two GPUs
    assert pieces_for(12, 20, False, 4, sms) == 2  # 12 rows of tiles: four pieces would be 60 tiles each
    assert pieces_for(7, 40, False, 4, sms) == 1  # an odd count divides into one


@pytest.mark.parametrize("op", ["all_gather_matmul", "matmul_reduce_scatter"])
def test_the_pushed_paths_are_planned_once_per_geometry_and_refused_off_cuda(monkeypatch, op):
    """pushed.plan_for and pushed_scatter.plan_for keep what they decided for a geometry, a refusal
    too: CPU tensors (here) take the general path, and the second call of their geometry does not
    plan again."""
    from types import SimpleNamespace

    from tritongemm.core.plans import PLANS
    from tritongemm.distributed import exchange, pushed, pushed_scatter

    group = SimpleNamespace(group_name="test-group")
    monkeypatch.setattr(exchange, "rank_and_world", lambda group: (0, 2))
    if op == "all_gather_matmul":
        plan_for, planner = (lambda a2, b: pushed.plan_for(a2, b, None, None, group)), pushed.PushedGather
    else:
        plan_for = lambda a2, b: pushed_scatter.plan_for(a2, b, 1.0, None, None, None, group)  # noqa: E731
        planner = pushed_scatter.PushedScatter
    a2, b = torch.randn(4, 8), torch.randn(8, 6)
    PLANS.clear()
    try:
        assert plan_for(a2, b) is None

        def planned_again(*args):
            raise RuntimeError("planned again")

        monkeypatch.setattr(planner, "build", staticmethod(planned_again))
        assert plan_for(torch.randn(4, 8), b) is None
        with pytest.raises(RuntimeError, match="planned again"):  # another geometry plans anew
            plan_for(torch.randn(4, 16), torch.randn(16, 6))
    finally:
        PLANS.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_planned_sum_of_partials_is_reduce_partials(dtype):
    """reduce.planned_reduce, compiled once for a geometry (pushed_scatter.py's sum), computes what
    reduce_partials does, epilogue and all, for new tensors of that geometry."""
    from tritongemm.distributed.reduce import planned_reduce, reduce_partials

    world, m, N = 3, 5, 40

    def fresh(seed):  # partials, a bias and a strided residual (every second row)
        generator = torch.Generator().manual_seed(seed)
        parts, bias, rows = (
            torch.randn(*shape, generator=generator).to(device=DEVICE, dtype=dtype)
            for shape in ((world, m, N), (N,), (2 * m, N))
        )
        return parts, bias, rows[::2]

    for with_epilogue in (False, True):
        parts, bias, residual = fresh(0)
        epilogue = dict(alpha=0.5, bias=bias, activation="silu", residual=residual) if with_epilogue else {}
        reduce = planned_reduce(parts, **epilogue)
        for seed in (1, 2):
            parts, bias, residual = fresh(seed)
            if with_epilogue:
                epilogue.update(bias=bias, residual=residual)
            want = reduce_partials(parts, **epilogue)
            got = reduce(parts, epilogue.get("bias"), epilogue.get("residual"))
            assert torch.equal(got, want), f"{list(epilogue)} seed {seed}"


def test_the_own_chunks_planned_launch_takes_only_the_shards_it_was_planned_for():
    """gathered.py's `own` launch was planned on a contiguous, aligned view of the gathered A; any
    other shard (a compiled graph's strides, an offset view, a negated view) goes to `auto`."""
    from tritongemm.distributed import gathered

    buffer = torch.randn(8 * 64 + 8)
    assert gathered.own_fits(buffer[: 8 * 64].view(8, 64))
    assert not gathered.own_fits(buffer[1 : 1 + 8 * 64].view(8, 64))  # 4 bytes past an aligned start
    assert not gathered.own_fits(buffer[: 8 * 64].view(64, 8).T)
    assert not gathered.own_fits(torch._neg_view(buffer[: 8 * 64].view(8, 64)))


def test_the_workspace_keeps_one_view_per_rank_shape_dtype_and_offset_and_at_most_views_held(monkeypatch):
    """exchange._Workspace.buffer asks the symmetric-memory handle for a view once per (rank,
    shape, dtype, offset) and hands the same tensor back after; past VIEWS_HELD distinct views it
    starts afresh, so a caller cycling through geometries can't grow it without bound."""
    from tritongemm.distributed import exchange

    class Handle:  # torch's handle: get_buffer(rank, sizes, dtype, storage_offset) makes a tensor
        def __init__(self):
            self.made = []

        def get_buffer(self, rank, sizes, dtype, storage_offset=0):
            self.made.append((rank, sizes, dtype, storage_offset))
            return torch.empty(sizes, dtype=dtype)

    handle = Handle()
    workspace = exchange._Workspace(torch.empty(1 << 20, dtype=torch.uint8), handle)
    view = workspace.buffer(1, torch.Size([4, 8]), torch.bfloat16)
    assert workspace.buffer(1, (4, 8), torch.bfloat16) is view  # a torch.Size and a tuple alike
    assert len(handle.made) == 1
    for other in [(0, (4, 8), torch.bfloat16, 0), (1, (8, 4), torch.bfloat16, 0), (1, (4, 8), torch.float16, 0),
                  (1, (4, 8), torch.bfloat16, 32)]:  # fmt: skip
        assert workspace.buffer(*other) is not view
    assert len(handle.made) == 5
    monkeypatch.setattr(exchange._Workspace, "VIEWS_HELD", 8)
    for offset in range(20):
        workspace.buffer(0, (2, 2), torch.float32, offset)
    assert len(workspace._views) <= 8


def test_the_kept_events_are_one_per_key_and_thread_and_at_most_events_held(monkeypatch):
    """exchange._event gives the same event for a key within a thread (a wait queued on it takes
    its last record, so the next call may record it again), another thread its own, and drops
    them all past _EVENTS_HELD keys rather than grow with a caller's streams."""
    import threading

    from tritongemm.distributed import exchange

    monkeypatch.setattr(exchange.torch.cuda, "Event", lambda: object())  # no CUDA needed to count
    monkeypatch.setattr(exchange, "_EVENTS", threading.local())
    monkeypatch.setattr(exchange, "_EVENTS_HELD", 4)
    first = exchange._event(("arrival", 0, 0))
    assert exchange._event(("arrival", 0, 0)) is first
    assert exchange._event(("arrival", 0, 1)) is not first
    other = []
    thread = threading.Thread(target=lambda: other.append(exchange._event(("arrival", 0, 0))))
    thread.start()
    thread.join()
    assert other[0] is not first
    for index in range(10):
        exchange._event(("arrival", 1, index))
    assert len(exchange._EVENTS.held) <= 4


def _spawn(world: int, tmp_path, cases: list[str]) -> None:
    if torch.cuda.is_available() and torch.cuda.device_count() < world:
        pytest.skip(f"NCCL needs {world} GPUs, this machine has {torch.cuda.device_count()}")
    mp.spawn(_worker, args=(world, str(tmp_path), cases), nprocs=world)
    failures = {}
    for rank in range(world):
        failures.update(json.loads((tmp_path / f"rank{rank}.json").read_text()))
    assert not failures, "\n".join(f"{case}:\n{why}" for case, why in sorted(failures.items()))


def _worker(rank: int, world: int, tmp: str, cases: list[str]) -> None:
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world)  # fmt: skip
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    # The interpreter refuses bfloat16 (it computes its tl.dot wrongly).
    dtypes = (torch.bfloat16, torch.float16) if on_gpu else (torch.float32, torch.float16)
    failures = {}
    for name in cases:
        case = _CASES[name]
        takes_dtype = "dtype" in inspect.signature(case).parameters
        for dtype in dtypes if takes_dtype else (None,):
            try:
                case(rank, world, device, dtype) if takes_dtype else case(rank, world, device)
            except (Exception, pytest.fail.Exception):  # noqa: BLE001 - every failure is reported, with its traceback
                failures[f"{name} {dtype or ''} world {world} rank {rank}"] = traceback.format_exc()
    with open(f"{tmp}/rank{rank}.json", "w") as f:
        json.dump(failures, f)
    dist.destroy_process_group()


# --- the cases: each builds the whole tensors, runs its shard, checks --------------------------


# Overlapped through each transport (on the CPU both are gloo's point-to-point), and sequential.
_PATHS = ({}, {"transport": "nccl"}, {"overlap": False})


def _whole(*shape, dtype, device, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(device=DEVICE, dtype=dtype)


def _close(out, ref, K, dtype, what):
    err = rel_error(out, ref)
    assert err <= tolerance(dtype, K, allow_tf32=False), f"{what}: rel error {err:.2e}"


def _rows(n, rank, world):
    per = n // world
    return slice(rank * per, (rank + 1) * per)


def case_all_gather_matmul(rank, world, device, dtype):
    from tritongemm.distributed import all_gather_matmul

    m, K, N = 3, 37, 20
    a = _whole(world * m, K, dtype=dtype, device=device, seed=1)
    b = _whole(K, N, dtype=dtype, device=device, seed=2)
    bias = _whole(N, dtype=dtype, device=device, seed=3)
    shard = a[_rows(world * m, rank, world)]
    for epilogue in ({}, {"bias": bias, "activation": "gelu"}):
        ref = a.double() @ b.double()
        if epilogue:
            ref = torch.nn.functional.gelu(ref + bias.double())
        for how in _PATHS:
            gathered, c = all_gather_matmul(shard, b, gather_dim=0, return_a=True, **how, **epilogue)
            assert torch.equal(gathered, a), "the gathered A is not the whole A"
            assert c.shape == (world * m, N) and c.dtype == dtype
            _close(c, ref, K, dtype, f"{how} {list(epilogue)}")


def case_whole_gathered_gemm(rank, world, device, dtype):
    """On an sm_90 GPU the gathered chunks run as one GEMM that waits for each in the kernel
    (distributed/gathered.py). Its programs must not read a chunk before it lands: the transfers
    are held back here (a sleep on the side stream, before the shard is published) while the
    kernel already runs, on fresh data each call, so rows of the call before would show. And under
    a CUDA graph the arrival words must be reset on each replay."""
    from tritongemm.core.plans import PLANS
    from tritongemm.distributed import exchange, gathered

    if device.type != "cuda" or world < 2 or torch.cuda.get_device_capability(device) != (9, 0):
        return
    m, K, N = 512, 320, 384  # rows a chunk: four 128-row tiles
    b = _whole(K, N, dtype=dtype, device=device, seed=31)
    bias = _whole(N, dtype=dtype, device=device, seed=32)
    words = exchange.arrival_words(dist.group.WORLD, device)
    rows_a, c = (torch.empty(world * m, width, dtype=dtype, device=device) for width in (K, N))
    # Each chunk in two pieces of two rows of tiles (too few tiles for pieces_for's rule): the GEMM
    # must wait for each piece, not the chunk's first.
    pieces_for, gathered.pieces_for = gathered.pieces_for, lambda *_: 2
    PLANS.clear()
    try:
        launches = gathered.plan(rows_a, b, c, None, None, rank, words)
        assert launches is not None, "the whole GEMM does not run here"
        assert launches.pieces == 2, launches.pieces
        _check_whole_gathered_gemm(rank, world, device, dtype, m, K, N, b, bias)
    finally:
        gathered.pieces_for = pieces_for
        PLANS.clear()


def _check_whole_gathered_gemm(rank, world, device, dtype, m, K, N, b, bias):
    from tritongemm.distributed import all_gather_matmul, exchange, gathered, paths, pushed

    publish, push_piece = exchange.SymmetricExchanges.publish, pushed._push_piece
    sent = []  # the words of the pieces pushed

    def late_publish(self, shard):  # the pulls start ~20 ms after the kernel
        with exchange._on(self.side, self.compute):
            torch.cuda._sleep(30_000_000)
        publish(self, shard)

    def late_push_piece(piece, slot, peer_words, word):  # each piece ~20 ms after the one before
        torch.cuda._sleep(30_000_000)  # (on the side stream, where the pushes run)
        push_piece(piece, slot, peer_words, word)
        sent.append(word)

    def counted_push_piece(*args):
        push_piece(*args)
        sent.append(args[-1])

    # Without return_a the chunks are pushed into each peer's memory; with it, pulled into the
    # gathered A. Each held back in one call, so that the kernel runs before they land.
    for seed, late, return_a in ((33, False, False), (34, True, False), (35, True, True), (39, False, True)):
        a = _whole(world * m, K, dtype=dtype, device=device, seed=seed)
        exchange.SymmetricExchanges.publish = late_publish if late else publish
        pushed._push_piece = late_push_piece if late else counted_push_piece
        sent.clear()
        try:
            out = all_gather_matmul(
                a[_rows(world * m, rank, world)], b, bias=bias, activation="gelu", return_a=return_a
            )
        finally:
            exchange.SymmetricExchanges.publish = publish
            pushed._push_piece = push_piece
        what = f"seed {seed}{' transfers held back' if late else ''}{', return_a' if return_a else ''}"
        assert bool(sent) == (not return_a), f"{what}: pushed {sent}"
        if return_a:
            assert torch.equal(out[0], a), f"{what}: the gathered A is not the whole A"
            out = out[1]
        ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
        _close(out, ref, K, dtype, what)
    # Shards the own chunk's planned launch does not take (gathered.own_fits): pushed, an aligned
    # copy of them; pulled, `auto` runs them. On some ranks only, too: every rank must still take
    # the same path (else each waits at a barrier the others never reach).
    a = _whole(world * m, K, dtype=dtype, device=device, seed=38)
    shard = a[_rows(world * m, rank, world)]
    offset = torch.empty(m * K + 1, dtype=dtype, device=device)[1:].view(m, K).copy_(shard)
    negated = torch._neg_view(-shard)
    odd_ranks = offset if rank % 2 else shard
    for odd, label in ((offset, "a shard 2 bytes past an aligned start"), (negated, "a negated view"),
                       (odd_ranks, "odd ranks' shards 2 bytes past an aligned start")):  # fmt: skip
        assert odd is odd_ranks or not gathered.own_fits(odd)
        for return_a in (False, True):
            out = all_gather_matmul(odd, b, return_a=return_a)
            _close(out[1] if return_a else out, a.double() @ b.double(), K, dtype, f"{label}, return_a={return_a}")
    # CUDA graphs of one call, pushed and pulled (after an eager call of its shape, which sized the
    # buffer), replayed on new data.
    shard = torch.empty(m, K, dtype=dtype, device=device)
    pushed_graph, pulled_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(pushed_graph):
        c = all_gather_matmul(shard, b)
    with torch.cuda.graph(pulled_graph):
        gathered_a, c_pulled = all_gather_matmul(shard, b, return_a=True)
    for seed in (36, 37):
        a = _whole(world * m, K, dtype=dtype, device=device, seed=seed)
        shard.copy_(a[_rows(world * m, rank, world)])
        pushed_graph.replay()
        pulled_graph.replay()
        _close(c, a.double() @ b.double(), K, dtype, f"CUDA graph, pushed, seed {seed}")
        _close(c_pulled, a.double() @ b.double(), K, dtype, f"CUDA graph, pulled, seed {seed}")
        assert torch.equal(gathered_a, a), f"CUDA graph, seed {seed}: the gathered A is not the whole A"
    assert paths.WHOLE_GATHERED_GEMM and paths.PUSH_GATHER


def case_all_gather_matmul_3d(rank, world, device, dtype):
    """(batch, seq, hidden) activations sharded along the sequence, gathered along dim 1."""
    from tritongemm.distributed import all_gather_matmul

    a = _whole(2, world * 3, 24, dtype=dtype, device=device, seed=4)
    b = _whole(24, 10, dtype=dtype, device=device, seed=5).T.contiguous().T  # a transposed view
    shard = a[:, _rows(world * 3, rank, world)]
    c = all_gather_matmul(shard, b, gather_dim=1)
    assert c.shape == (2, world * 3, 10)
    _close(c, a.double() @ b.double(), 24, dtype, "gather_dim=1")
    c = all_gather_matmul(shard, b, gather_dim=-3 + 1)  # the same dimension, counted from the end
    _close(c, a.double() @ b.double(), 24, dtype, "gather_dim=-2")


def case_matmul_reduce_scatter(rank, world, device, dtype):
    from tritongemm.distributed import matmul_reduce_scatter

    M, K, N = world * 3, world * 19, 21
    a = _whole(M, K, dtype=dtype, device=device, seed=6)
    b = _whole(K, N, dtype=dtype, device=device, seed=7)
    bias = _whole(N, dtype=dtype, device=device, seed=8)
    residual = _whole(M, N, dtype=dtype, device=device, seed=9)
    cols, rows = _rows(K, rank, world), _rows(M, rank, world)
    full = a.double() @ b.double()
    cases = [
        ({}, full[rows]),
        ({"reduce_op": "avg"}, full[rows] / world),
        ({"bias": bias, "activation": "silu", "residual": residual[rows]},
         torch.nn.functional.silu(full[rows] + bias.double()) + residual[rows].double()),
    ]  # fmt: skip
    # a[:, cols] starts 2 * K / world bytes into a row: off 16 bytes on rank 1, where the general
    # path runs; its contiguous copy is aligned, and on a GPU pushes (pushed_scatter.py), its rows of
    # each rank 3 * 19 elements apart (off 16 bytes again: those GEMMs run a `tl` kernel).
    for kwargs, ref in cases:
        for how in _PATHS:
            for a_shard in (a[:, cols], a[:, cols].contiguous()):
                c = matmul_reduce_scatter(a_shard, b[cols], scatter_dim=0, **how, **kwargs)
                assert c.shape == (3, N) and c.dtype == dtype
                _close(c, ref, K, dtype, f"{how} {list(kwargs)} {'contiguous' if a_shard.is_contiguous() else ''}")


def case_pushed_reduce_scatter(rank, world, device, dtype):
    """On a CUDA GPU with symmetric memory a reduce-scatter's partial products are pushed into
    their receivers' memory (distributed/pushed_scatter.py), and each receiver's sum waits for its
    peers' words. The pushes are held back here (a sleep on the side stream before each) on fresh
    data each call, so that a partial of the call before would show; a pushed all-gather runs
    between the calls, into the same buffer and words; and a CUDA graph of one call is replayed on
    new data."""
    from tritongemm.distributed import all_gather_matmul, exchange, matmul_reduce_scatter, paths, pushed

    if device.type != "cuda" or world < 2 or exchange._symmetric_memory() is None:
        return
    m, K, N = 256, world * 96, 384  # 192 bytes of K a rank: every shard 16-byte aligned
    cols, rows = _rows(K, rank, world), _rows(world * m, rank, world)
    b = _whole(K, N, dtype=dtype, device=device, seed=41)
    bias = _whole(N, dtype=dtype, device=device, seed=42)
    push_piece, sent = pushed._push_piece, []

    def late_push_piece(piece, slot, peer_words, word):  # each partial ~20 ms after the one before
        torch.cuda._sleep(30_000_000)  # (on the side stream, where the pushes run)
        counted_push_piece(piece, slot, peer_words, word)

    def counted_push_piece(*args):
        push_piece(*args)
        sent.append(args[-1])

    for seed, late in ((43, False), (44, True), (45, True)):
        a = _whole(world * m, K, dtype=dtype, device=device, seed=seed)
        residual = _whole(world * m, N, dtype=dtype, device=device, seed=seed + 10)
        pushed._push_piece = late_push_piece if late else counted_push_piece
        sent.clear()
        try:
            out = matmul_reduce_scatter(a[:, cols], b[cols], bias=bias, activation="silu", residual=residual[rows])
        finally:
            pushed._push_piece = push_piece
        what = f"seed {seed}{' pushes held back' if late else ''}"
        assert sent == [rank] * (world - 1), f"{what}: pushed the words {sent}"
        ref = torch.nn.functional.silu((a.double() @ b.double())[rows] + bias.double()) + residual[rows].double()
        _close(out, ref, K, dtype, what)
        gathered_out = all_gather_matmul(a[rows], b)  # pushed into the same buffer and words
        _close(gathered_out, a.double() @ b.double(), K, dtype, f"{what}: the all-gather between")
    # A CUDA graph of one call, after an eager call of its geometry (which planned it).
    a_shard = torch.zeros(world * m, K // world, dtype=dtype, device=device)
    matmul_reduce_scatter(a_shard, b[cols], reduce_op="avg")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = matmul_reduce_scatter(a_shard, b[cols], reduce_op="avg")
    for seed in (46, 47):
        a = _whole(world * m, K, dtype=dtype, device=device, seed=seed)
        a_shard.copy_(a[:, cols])
        graph.replay()
        _close(out, (a.double() @ b.double())[rows] / world, K, dtype, f"CUDA graph, seed {seed}")
    assert paths.PUSH_SCATTER


def case_matmul_reduce_scatter_3d(rank, world, device, dtype):
    from tritongemm.distributed import matmul_reduce_scatter

    a = _whole(2, world * 2, world * 8, dtype=dtype, device=device, seed=10)
    b = _whole(world * 8, 12, dtype=dtype, device=device, seed=11)
    cols, rows = _rows(world * 8, rank, world), _rows(world * 2, rank, world)
    c = matmul_reduce_scatter(a[..., cols], b[cols], scatter_dim=1)
    assert c.shape == (2, 2, 12)
    _close(c, (a.double() @ b.double())[:, rows], world * 8, dtype, "scatter_dim=1")


def case_autograd(rank, world, device):
    """Each op's gradients against torch autograd of the whole computation, in float64: the sum of
    every rank's loss is the whole loss."""
    from tritongemm.distributed import all_gather_matmul, matmul_reduce_scatter

    dtype = torch.float32
    M, K, N = world * 3, world * 5, world * 4
    a = _whole(M, K, dtype=dtype, device=device, seed=12)
    b = _whole(K, N, dtype=dtype, device=device, seed=13)
    bias = _whole(N, dtype=dtype, device=device, seed=14)
    g = _whole(M, N, dtype=dtype, device=device, seed=15)
    rows, cols_n, cols_k = _rows(M, rank, world), _rows(N, rank, world), _rows(K, rank, world)

    # all-gather: A's rows sharded, B's columns (a column-parallel layer)
    # (with the gathered A in the loss too: every rank's copy of a shard's rows brings its gradient back)
    g_a = _whole(M, K, dtype=dtype, device=device, seed=21)
    ref_a, ref_b, ref_bias = (t.double().requires_grad_() for t in (a, b, bias))
    ((ref_a @ ref_b + ref_bias) * g.double()).sum().add((ref_a * g_a.double()).sum() * world).backward()
    shard, b_cols, bias_cols = (t.detach().clone().requires_grad_() for t in (a[rows], b[:, cols_n], bias[cols_n]))
    gathered, c = all_gather_matmul(shard, b_cols, bias=bias_cols, return_a=True)
    ((c * g[:, cols_n]).sum() + (gathered * g_a).sum()).backward()
    _close(shard.grad, ref_a.grad[rows], N, dtype, "all_gather_matmul d/da")
    _close(b_cols.grad, ref_b.grad[:, cols_n], M, dtype, "all_gather_matmul d/db")
    _close(bias_cols.grad, ref_bias.grad[cols_n], M, dtype, "all_gather_matmul d/dbias")

    # reduce-scatter: A's columns sharded, B's rows (a row-parallel layer); bias and residual local
    ref_a, ref_b = (t.double().requires_grad_() for t in (a, b))
    ((ref_a @ ref_b) * g.double()).sum().backward()
    a_cols, b_rows = (t.detach().clone().requires_grad_() for t in (a[:, cols_k], b[cols_k]))
    local_bias = bias.detach().clone().requires_grad_()
    residual = torch.zeros(M // world, N, dtype=dtype, device=device, requires_grad=True)
    c = matmul_reduce_scatter(a_cols, b_rows, bias=local_bias, residual=residual, reduce_op="avg")
    (c * g[rows]).sum().backward()
    _close(a_cols.grad, ref_a.grad[:, cols_k] / world, N, dtype, "matmul_reduce_scatter d/da")
    _close(b_rows.grad, ref_b.grad[cols_k] / world, M, dtype, "matmul_reduce_scatter d/db")
    _close(local_bias.grad, g[rows].double().sum(0), M, dtype, "matmul_reduce_scatter d/dbias")
    _close(residual.grad, g[rows].double(), 1, dtype, "matmul_reduce_scatter d/dresidual")

    # Frozen weights (adapters, a frozen base): only the activations' gradients, and the gathered A
    # is neither kept nor copied whole by either op.
    ref_a = a.double().requires_grad_()
    ((ref_a @ b.double()) * g.double()).sum().backward()
    shard = a[rows].detach().clone().requires_grad_()
    c = all_gather_matmul(shard, b[:, cols_n])
    (c * g[:, cols_n]).sum().backward()
    _close(shard.grad, ref_a.grad[rows], N, dtype, "all_gather_matmul d/da, frozen b")
    a_cols = a[:, cols_k].detach().clone().requires_grad_()
    c = matmul_reduce_scatter(a_cols, b[cols_k])
    (c * g[rows]).sum().backward()
    _close(a_cols.grad, ref_a.grad[:, cols_k], N, dtype, "matmul_reduce_scatter d/da, frozen b")


def case_layers(rank, world, device):
    """An MLP column- then row-parallel, both ways of carrying activations, against the whole MLP:
    outputs, the input's gradient, each shard's weight and bias gradients."""
    from tritongemm.distributed import ColumnParallelLinear, RowParallelLinear

    torch.manual_seed(16)
    H, hidden, T = 16, world * 6, world * 3
    up = torch.nn.Linear(H, hidden).to(device)
    down = torch.nn.Linear(hidden, H).to(device)
    x = _whole(T, H, dtype=torch.float32, device=device, seed=17)
    g = _whole(T, H, dtype=torch.float32, device=device, seed=18)
    ref_x = x.clone().requires_grad_()
    ref_y = down(torch.nn.functional.gelu(up(ref_x)))
    (ref_y * g).sum().backward()
    rows, features = _rows(T, rank, world), _rows(hidden, rank, world)
    for sequence_parallel in (False, True):
        column = ColumnParallelLinear.from_linear(up, sequence_parallel=sequence_parallel)
        row = RowParallelLinear.from_linear(down, sequence_parallel=sequence_parallel)
        what = f"sequence_parallel={sequence_parallel}"
        x_in = (x[rows] if sequence_parallel else x).clone().requires_grad_()
        y = row(torch.nn.functional.gelu(column(x_in)))
        ref_out, g_out = (ref_y[rows], g[rows]) if sequence_parallel else (ref_y, g)
        _close(y, ref_out.detach(), hidden, torch.float32, f"{what} y")
        (y * g_out).sum().backward()
        _close(x_in.grad, ref_x.grad[rows] if sequence_parallel else ref_x.grad, hidden, torch.float32, f"{what} dx")
        _close(column.weight.grad, up.weight.grad[features], T, torch.float32, f"{what} column dW")
        _close(column.bias.grad, up.bias.grad[features], T, torch.float32, f"{what} column db")
        _close(row.weight.grad, down.weight.grad[:, features], T, torch.float32, f"{what} row dW")
        _close(row.bias.grad, down.bias.grad, T, torch.float32, f"{what} row db")


def case_compile(rank, world, device):
    """Under torch.compile with fullgraph=True: each op is one operator in the graph (Dynamo can't
    trace its streams and transfers), and the layers' outputs and gradients are eager's."""
    from tritongemm.distributed import ColumnParallelLinear, RowParallelLinear, all_gather_matmul, matmul_reduce_scatter

    torch._dynamo.reset()
    compile = functools.partial(torch.compile, fullgraph=True, backend="aot_eager")
    torch.manual_seed(19)
    H, hidden, T = 16, world * 6, world * 3
    up, down = torch.nn.Linear(H, hidden).to(device), torch.nn.Linear(hidden, H).to(device)
    x = _whole(T, H, dtype=torch.float32, device=device, seed=20)
    rows = _rows(T, rank, world)
    for sequence_parallel in (False, True):
        runs = []
        for compiled in (False, True):
            column = ColumnParallelLinear.from_linear(up, sequence_parallel=sequence_parallel)
            row = RowParallelLinear.from_linear(down, sequence_parallel=sequence_parallel)
            mlp = torch.nn.Sequential(column, torch.nn.GELU(), row)
            x_in = (x[rows] if sequence_parallel else x).clone().requires_grad_()
            y = (compile(mlp) if compiled else mlp)(x_in)
            y.square().sum().backward()
            runs.append([y, x_in.grad, *(p.grad for p in mlp.parameters())])
        for eager, traced in zip(*runs):
            torch.testing.assert_close(traced, eager, msg=f"sequence_parallel={sequence_parallel}")

    # The functions with their epilogues, an N-D gather and the gathered A, and an average.
    a = _whole(2, world * 3, 24, dtype=torch.float32, device=device, seed=21)
    b = _whole(24, 10, dtype=torch.float32, device=device, seed=22)
    bias = _whole(10, dtype=torch.float32, device=device, seed=23)
    shard = a[:, _rows(world * 3, rank, world)].contiguous()
    gather = functools.partial(all_gather_matmul, gather_dim=1, bias=bias, activation="relu", return_a=True)
    residual = _whole(6, 10, dtype=torch.float32, device=device, seed=24)  # a_rs's rows / world
    scatter = functools.partial(matmul_reduce_scatter, reduce_op="avg", bias=bias, residual=residual)
    a_rs = _whole(world * 6, 24, dtype=torch.float32, device=device, seed=25)
    with torch.no_grad():
        for fn, args in ((gather, (shard, b)), (scatter, (a_rs, b))):
            torch.testing.assert_close(compile(fn)(*args), fn(*args))

    # The backward's other paths: the gathered A's own gradient; b's alone (the all-gather without a GEMM).
    def gradients(fn, *args):
        leaves = [t.detach().clone().requires_grad_(needs) for t, needs in args]
        out = fn(*leaves)
        sum(o.square().sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
        return [t.grad for t in leaves if t.requires_grad]

    # (No activation: the ops have no backward through one yet.)
    gather_a = functools.partial(all_gather_matmul, gather_dim=1, bias=bias, return_a=True)
    frozen_a = functools.partial(matmul_reduce_scatter, reduce_op="avg")
    for fn, args in ((gather_a, ((shard, True), (b, True))), (frozen_a, ((a_rs, False), (b, True)))):
        torch.testing.assert_close(gradients(compile(fn), *args), gradients(fn, *args))


def case_group_facts(rank, world, device):
    """The ops' cached rank and size of a group: torch.distributed's answer, for a subgroup too, and
    held weakly (a group kept alive past its destruction aborted gloo's processes at exit)."""
    import gc
    import weakref

    from tritongemm.distributed.exchange import rank_and_world

    assert rank_and_world(dist.group.WORLD) == (rank, world)
    evens = dist.new_group(list(range(0, world, 2)))  # every rank takes part in making it
    if rank % 2:  # not a member: torch hands back a marker, no group
        return
    assert rank_and_world(evens) == (rank // 2, (world + 1) // 2)
    # Every member connected before any tears the group down: rank 0 destroying it while rank 2
    # still made its connections failed CI once ("Gloo connectFullMesh failed ... closed by peer").
    dist.barrier(group=evens)
    gone = weakref.ref(evens)
    dist.destroy_process_group(evens)
    del evens
    gc.collect()
    assert gone() is None, "rank_and_world keeps a destroyed group alive"


def case_parallelize(rank, world, device):
    """A tiny Llama sharded by `parallelize` gives the whole model's logits on every rank."""
    import transformers

    from tritongemm.distributed import parallelize

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=world * 16,
                                      num_hidden_layers=2, num_attention_heads=world * 2,
                                      num_key_value_heads=world, head_dim=8)  # fmt: skip
    torch.manual_seed(19)
    model = transformers.LlamaForCausalLM(config).to(device).eval()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(20)).to(device)
    with torch.no_grad():
        ref = model(ids).logits
        sharded = parallelize(model)
        logits = model(ids).logits
    assert len(sharded) == 4, sharded  # each layer's attention and MLP
    _close(logits, ref.double(), 32, torch.float32, "logits")


def case_errors(rank, world, device):
    from tritongemm.distributed import ColumnParallelLinear, RowParallelLinear, all_gather_matmul, matmul_reduce_scatter

    a, b = torch.ones(world * 2, 8, device=device), torch.ones(8, 4, device=device)
    expected = [
        (lambda: all_gather_matmul(a, b, gather_dim=1), ValueError, "gather_dim to be a dimension of a_shard"),
        (lambda: all_gather_matmul(a, b, gather_dim=-1), ValueError, "other than the last"),
        (lambda: all_gather_matmul(a, b[:5]), ValueError, "cannot be multiplied"),
        (lambda: all_gather_matmul(a, b, activation="tanh"), ValueError, "activation"),
        (lambda: all_gather_matmul(a, b, bias=torch.ones(5, device=device)), ValueError, "bias of shape"),
        (lambda: all_gather_matmul(a, b.half()), TypeError, "same dtype"),
        (lambda: matmul_reduce_scatter(a, b, reduce_op="max"), ValueError, "reduce_op"),
        (lambda: matmul_reduce_scatter(a, b, transport="nvshmem"), ValueError, "transport"),
        (lambda: matmul_reduce_scatter(a, b, residual=torch.ones(3, 4, device=device)), ValueError, "residual"),
        (lambda: matmul_reduce_scatter(a.requires_grad_(), b, activation="relu"), NotImplementedError, "backward"),
    ]
    if world > 1:  # everything divides by 1
        expected += [
            (lambda: matmul_reduce_scatter(a[:1], b), ValueError, "divisible by the group's size"),
            (lambda: ColumnParallelLinear(8, world + 1), ValueError, "out_features divisible"),
            (lambda: RowParallelLinear(world + 1, 8), ValueError, "in_features divisible"),
        ]
    for call, error, words in expected:
        with pytest.raises(error, match=words):
            call()


_CASES = {name[5:]: case for name, case in globals().items() if name.startswith("case_")}
