"""Determinism and concurrency on a GPU: the same inputs give the same bits run after run, for
every kernel; calls from several Python threads and several CUDA streams at once are correct;
autotuning from several threads at once is safe; a matmul captured in a CUDA graph computes the
new inputs copied into its buffers on replay.
"""

import contextlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import tritongemm
from tritongemm.core.reference import reference_matmul, rel_error, tolerance

ON_GPU = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")]
AVAILABLE = [
    k for k in (tritongemm.kernels(family="matmul") if ON_GPU else []) if k["available"] and not k["experimental"]
]
KERNELS = [k["name"] for k in AVAILABLE]
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
PARAMS = [
    pytest.param(k["name"], dtype, id=f"{k['name']}-{str(dtype).removeprefix('torch.')}")
    for k in AVAILABLE
    for dtype in DTYPES
    if str(dtype).removeprefix("torch.") in k["dtypes"]
]


def operands(M, N, K, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(N, K, device="cuda", dtype=dtype, generator=gen).T  # nn.Linear's weight layout
    return a, b


def assert_correct(c, a, b, what=""):
    err = rel_error(c, reference_matmul(a, b))
    assert err <= tolerance(a.dtype, a.shape[1]), f"{what}: relative error {err:.3e}"


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("kernel, dtype", PARAMS)
def test_same_inputs_give_the_same_bits(kernel, dtype):
    """No atomics, no split-K: a run is a pure function of its inputs, bit for bit, whatever else
    is on the GPU and whichever out buffer it writes."""
    a, b = operands(1000, 1500, 700, dtype, seed=1)
    first = tritongemm.matmul(a, b, kernel=kernel)
    for i in range(5):
        noise = torch.randn(4096, 4096, device="cuda") @ torch.randn(4096, 4096, device="cuda")  # busy GPU
        again = tritongemm.matmul(a, b, kernel=kernel)
        assert torch.equal(bits(again), bits(first)), f"run {i + 1} differs from run 0"
        del noise
    out = torch.full_like(first.T, float("nan")).T
    tritongemm.matmul(a, b, out=out, kernel=kernel)
    assert torch.equal(bits(out), bits(first)), "a strided out differs"
    assert_correct(first, a, b, kernel)


def _run_many(kernel, dtype, worker_seed, calls=10, stream=None):
    """Matmuls of different shapes on the current (or given) stream; returns the errors. 8 threads
    x 10 shapes also overflow the Gluon rungs' descriptor cache (64 entries) while they run."""
    errors = []
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for i in range(calls):
            shape = (64 + 37 * ((worker_seed + i) % 7), 96 + 53 * ((worker_seed * 3 + i) % 5), 80 + 41 * (i % 4))
            a, b = operands(*shape, dtype, seed=1000 * worker_seed + i)
            c = tritongemm.matmul(a, b, kernel=kernel)
            torch.cuda.current_stream().synchronize()
            err = rel_error(c, reference_matmul(a, b))
            if not err <= tolerance(dtype, shape[2]):
                errors.append(f"worker {worker_seed} call {i} {shape}: relative error {err:.3e}")
    return errors


@pytest.mark.parametrize("kernel", KERNELS)
def test_threads_at_once(kernel):
    """8 threads, each its own inputs and shapes; the first calls compile concurrently (fresh
    shapes and a dtype the other tests of this worker may not have used)."""
    dtype = torch.bfloat16
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda w: _run_many(kernel, dtype, w), range(8)))
    errors = [e for r in results for e in r]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("kernel", KERNELS)
def test_threads_each_on_its_own_stream(kernel):
    streams = [torch.cuda.Stream() for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda w: _run_many(kernel, torch.float16, 100 + w, stream=streams[w]), range(4)))
    errors = [e for r in results for e in r]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("kernel", KERNELS)
def test_streams_in_flight_at_once(kernel):
    """One thread queues a matmul on each of 4 streams without waiting, then checks them all:
    each launch must use its own stream's order, not the default stream's."""
    streams = [torch.cuda.Stream() for _ in range(4)]
    jobs = []
    for i, stream in enumerate(streams):
        a, b = operands(700 + 64 * i, 900, 1100, torch.float16, seed=i)
        torch.cuda.synchronize()  # the inputs exist before another stream reads them
        with torch.cuda.stream(stream):
            # A long first step keeps the stream busy, so the matmul queues behind it.
            slow = torch.randn(2048, 2048, device="cuda") @ torch.randn(2048, 2048, device="cuda")
            a_late = a * 1  # made on this stream just before the matmul reads it
            c = tritongemm.matmul(a_late, b, kernel=kernel)
        jobs.append((c, a_late, b, stream, slow))
    for c, a, b, stream, _ in jobs:
        stream.synchronize()
        assert_correct(c, a, b, f"{kernel} on {stream}")


def test_autotune_from_threads_at_once():
    """kernel="grouped", config="autotune": 6 threads tune the same new shape at once (and 2 more
    shapes), so the tuner's cache and its benchmarking race."""
    shapes = [(777, 555, 333)] * 6 + [(513, 257, 129), (1025, 31, 65)]

    def tune(i):
        a, b = operands(*shapes[i], torch.float16, seed=i)
        c = tritongemm.matmul(a, b, kernel="grouped", config="autotune")
        torch.cuda.synchronize()
        return rel_error(c, reference_matmul(a, b)), shapes[i]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(tune, range(8)))
    bad = [(err, shape) for err, shape in results if not err <= tolerance(torch.float16, shape[2])]
    assert not bad, f"wrong results after concurrent autotuning: {bad}"


@pytest.mark.parametrize("with_out", [False, True], ids=["alloc", "out"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_cuda_graph_replays_on_new_inputs(kernel, with_out):
    M, N, K = 520, 264, 392
    a, b = operands(M, N, K, torch.float16, seed=7)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16) if with_out else None

    side = torch.cuda.Stream()  # warm up (compile) outside the capture, as torch's docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tritongemm.matmul(a, b, out=out, kernel=kernel)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = tritongemm.matmul(a, b, out=out, kernel=kernel)
    for seed in (8, 9, 10):
        new_a, new_b = operands(M, N, K, torch.float16, seed=seed)
        a.copy_(new_a)
        b.copy_(new_b)
        graph.replay()
        torch.cuda.synchronize()
        assert_correct(c, new_a, new_b, f"replay with seed {seed}")
        if with_out:
            assert c.data_ptr() == out.data_ptr()
