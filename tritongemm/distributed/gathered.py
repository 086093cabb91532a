"""One GEMM over an all-gather's rows, started before they have landed.

The chunked all-gather + GEMM (ops.py) runs one GEMM per gathered chunk as it lands. A chunk is a
fraction of the rows, and a persistent GEMM on a fraction loses its last wave: four H100s, q,k,v
of Llama-3-70B at 8192 tokens, each chunk 2048 x 2560 x 8192 ran 0.80x cuBLAS where the whole
8192 rows run 0.95-1.01x (docs/tensor-parallel.md). torch's fused op has the same choice and takes
one GEMM (`_async_input_mm`) whose programs wait inside the kernel for the rows they read.

So does this one: rung 6 (hopper/tma_persistent_pipelined.py) over every chunk but this rank's
own, with a scheduler that hands out the tiles in the order the chunks land and waits, before it
hands one out, for its chunk's arrival word (hopper/schedulers.arrival_scheduler). The side stream
sets each chunk's word after the copy that brings it (exchange.py, a stream memory operation: no
SM), and resets the words before the call's first transfer. This rank's own chunk is a GEMM of
its own, queued first on the compute stream, which waits on nothing; this one runs beside it, on
a stream of the gathered chunks', queued once the first gathered chunk has landed (ops.py), and
its programs take the SMs the own chunk's GEMM leaves. (Queued at once, its programs took SMs
from that GEMM and spun there: four H100s, q,k,v of Llama-3-70B at 8192 tokens, 1.20x the
sequential path against 1.49x, results/h100x4/probes/tp-whole-*.csv.)

No deadlock: the kernel is queued after the first chunk's copy, which the side stream runs after
its publishing barrier (the one kernel the transfers wait on), and what its programs then wait for
needs no SM: the other chunks' copies (copy engines) and the words' writes (stream memory
operations).

Where it can't run (not sm_90, not fp16/bf16, rows a chunk not a multiple of the tile's,
operands TMA can't read, transport NCCL), `plan` says None and the ops run a GEMM per chunk.
"""

from __future__ import annotations

import torch

from tritongemm import device_info
from tritongemm.distributed.exchange import announces_arrivals
from tritongemm.epilogue import Epilogue, Fused
from tritongemm.hopper import persistent_pipelined_config, tma_persistent_pipelined
from tritongemm.hopper.descriptors import tma_unsupported_reason
from tritongemm.hopper.schedulers import arrival_scheduler
from tritongemm.plan import PLANS, problem_key

KERNEL = "tma_persistent_pipelined"


def plan(gathered: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias, activation, rank: int, words: torch.Tensor):
    """`launch(gathered, b, c, bias)`: C's rows of every chunk but `rank`'s = activation(A @ B +
    bias), A `gathered` (world x m rows, K), each chunk read once `words` says it landed. None
    where this GEMM can't run (the module docstring): the caller runs a GEMM per chunk. Planned
    once per geometry, rank and words (in PLANS, under a key of its own; SMs spared included)."""
    plain = bias is None and activation is None
    fused = None if plain else Fused(Epilogue(activation, 1.0, bias is not None), bias, None, c.dtype)
    key = ("gathered", problem_key(gathered, b, c, KERNEL, None, fused), rank, words.data_ptr())
    launch = PLANS.find_key(key)
    if launch is None:
        launch = _build(gathered, b, c, fused, rank, words) or _UNPLANNED
        PLANS.remember(key, launch)
    return None if launch is _UNPLANNED else launch


def _UNPLANNED(*_):  # what the cache keeps for a geometry this GEMM can't run, so it is not retried
    raise AssertionError("gathered.plan returned no launch for this geometry")


def _build(gathered, b, c, fused, rank, words):
    device, world = gathered.device, words.numel()
    (M, K), N = gathered.shape, b.shape[1]
    runs = (
        device.type == "cuda"
        and device_info.capability(device) == (9, 0)
        and gathered.dtype in (torch.float16, torch.bfloat16)
        and world >= 2
        and M % world == 0
        and min(M, N, K) > 0
        and tma_unsupported_reason(gathered, b, c) is None
        and announces_arrivals()
    )
    if not runs:
        return None
    sms = device_info.sm_count(device)
    rows = M // world
    config = persistent_pipelined_config(M - rows, N, K, sms)
    if rows % config.BLOCK_M:  # a tile would span two chunks
        return None
    tiles = (world - 1) * (rows // config.BLOCK_M) * -(-N // config.BLOCK_N)
    scheduler = arrival_scheduler(config.GROUP_SIZE_M, world, rank, words.data_ptr())
    epilogue = {} if fused is None else dict(epilogue=fused.spec, bias=fused.bias)
    launch = tma_persistent_pipelined.plan(
        gathered, b, c, config, num_programs=min(sms, tiles), scheduler=scheduler, **epilogue
    )
    if fused is None:
        return lambda gathered, b, c, bias: launch(gathered, b, c)
    return lambda gathered, b, c, bias: launch(gathered, b, c, bias)
