"""Host time per call of the tensor-parallel ops, on every GPU of this machine: where eager calls
of a few hundred microseconds go.

    python3 scripts/probes/tp/tp_host.py [--tokens 2048] [--calls 30]

For q,k,v's all-gather and o's reduce-scatter (bench tp's problems), each provider is called
`--calls` times back to back with no synchronization between, and the host's wall time per call
is printed (the GPU's queue is deep enough that the host never waits on it), and ours again with
the transfers pulled rather than pushed (`tp.pulled`). Then rank 0's
cProfile of the tritongemm calls, by each function's own time: what to cut. Last, the host time of
each symmetric-memory primitive the ops call, alone (cProfile can't see into them: their time
shows as their caller's own).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

from tritongemm.bench import tp  # noqa: E402


def _worker(rank: int, world: int, tmp: str, tokens: int, calls: int) -> None:
    device = tp.join_gpu_group(rank, world, tmp)
    for layer in (tp.LAYERS[0], tp.LAYERS[2]):
        _, _, providers = tp._problem(layer, tokens, rank, world, device)
        for name, call in providers.items():
            host_us = _host_us(call, calls)
            if rank == 0:
                print(f"{layer[0]:7s} {tokens:6d} {name:16s} host {host_us:7.1f} us/call", flush=True)
        with tp.pulled():
            host_us = _host_us(providers["tritongemm"], calls)
        if rank == 0:
            print(f"{layer[0]:7s} {tokens:6d} {'tritongemm-pulled':16s} host {host_us:7.1f} us/call", flush=True)
        dist.barrier()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            providers["tritongemm"]()
        profile.disable()
        torch.cuda.synchronize()
        if rank == 0:
            pstats.Stats(profile).sort_stats("tottime").print_stats(22)
    _primitives(rank, tokens, calls, device)
    dist.destroy_process_group()


def _host_us(call, calls: int) -> float:
    """The host's microseconds per call of `call`, `calls` back to back after three to warm up,
    every rank starting together."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host_us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host_us


def _primitives(rank: int, tokens: int, calls: int, device) -> None:
    """Host microseconds per call of what `SymmetricExchanges.publish`, `gather` and `scatter` do."""
    from tritongemm.distributed import exchange

    group = dist.group.WORLD
    world = dist.get_world_size(group)
    shard = torch.randn(tokens // world, tp.HIDDEN, device=device).to(torch.bfloat16)
    landing = torch.empty_like(shard)
    workspace = exchange._workspace(group, device, shard.numel() * shard.element_size())
    peer = (rank + 1) % world
    side, compute = exchange._stream(device, "side"), torch.cuda.default_stream(device)
    steps = {
        "_workspace (lookup)": lambda: exchange._workspace(group, device, shard.numel() * shard.element_size()),
        "handle.get_buffer": lambda: workspace.handle.get_buffer(peer, shard.shape, shard.dtype),
        "buffer (a kept view)": lambda: workspace.buffer(peer, shard.shape, shard.dtype),
        "barrier(channel=0)": lambda: workspace.barrier(),
        "copy_ from a peer's buffer": lambda: landing.copy_(workspace.buffer(peer, shard.shape, shard.dtype)),
        "Event() + record": lambda: torch.cuda.Event().record(side),
        "wait_stream": lambda: side.wait_stream(compute),
        "_follow (a kept event)": lambda: exchange._follow(side, compute),
        "set_stream there and back": lambda: (torch.cuda.set_stream(compute), torch.cuda.set_stream(side)),
    }  # fmt: skip
    for name, step in steps.items():
        with torch.cuda.stream(side):
            host_us = _host_us(step, calls)
        if rank == 0:
            print(f"primitive {name:28s} host {host_us:7.1f} us/call", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    tp.spawn_on_gpus(_worker, args.tokens, args.calls)


if __name__ == "__main__":
    main()
