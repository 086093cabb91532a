"""The symmetric transport's stream placement, A/B in one run on every GPU of this machine.

    python3 scripts/probes/tp/tp_probe.py [--out results/h200x4/probes/tp/tp-streams.csv] [--rounds 3] \
        [--ops all_gather_matmul]

Variants of `distributed.exchange.SymmetricExchanges`, swapped in one after the other, each timed
as `bench tp` times (graph and eager, the slowest rank's median), in interleaved rounds so that
drift hits them alike:
- whole: the library's (barriers on the side stream, the GEMMs on all SMs but one, the gathered
  chunks as one GEMM that waits for each in the kernel where it can, this rank's own chunk's GEMM
  on its tiles: distributed/gathered.py);
- own-auto: the same with this rank's own chunk's GEMM on `auto`'s tiles for its shape rather than
  on the other chunks' GEMM's (`ops.OWN_CHUNK_ON_SHARED_TILES = False`);
- tile-of-others: the same with the shared tile chosen by rung 6's rule (its own weight of a BIG
  wave) on the other chunks' rows rather than on all of them (gathered.py's rule at 27bb547);
- tile-mid / tile-big: the same with the shared tile forced to 128 x 128 or 128 x 256 (the rule's
  two candidates) whatever their waves;
- pieces-1 / -2 / -4: the same with each gathered chunk sent in that many pieces, each announced
  apart, whatever `gathered.pieces_for` would choose;
- pull: the same with the chunks pulled (each rank publishes its shard in its own buffer, a copy
  on the SMs, and its peers copy from there) rather than pushed (`ops.PUSH_GATHER = False`); for
  a reduce-scatter, the partial products pulled a step at a time, each step behind a barrier of
  every rank, rather than pushed as each is computed (`ops.PUSH_SCATTER = False`);
- side: the same with a GEMM per gathered chunk instead (`ops.WHOLE_GATHERED_GEMM = False`), beside
  the compute stream, each on a stream of its own where a chunk is at most two waves of tiles
  (ops.py `_spread_chunks`): the library before gathered.py, and wherever that can't run;
- spread-always / one-peer-stream: the gathered chunks' GEMMs each on a stream of its own, or all
  on one, whatever their size (an all-gather's only);
- torch-schedule: torch's fused op's schedule on our GEMMs (`TorchSchedule`; an all-gather's only).
"sequential" (NCCL's collective + one GEMM) is the reference of every ratio; torch's fused symm_mem
op is timed beside them. Every variant's output is checked against the sequential path's: bitwise
for an all-gather and for a reduce-scatter on two GPUs, within bf16's bound of the float64
reference otherwise (NCCL's ring rounds after each add, ours once).

Earlier runs had variants since settled: "compute" (tree 4b6e9e8's placement, the publishing copy
and the barriers on the compute stream; probes/tp/tp-barriers-a661c13.csv), "side-all-sms" (no SM
spared) and "peer-gemms-on-compute" (results/h200x2/probes/tp/tp-peer-gemms-f4eb125.csv).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

from tritongemm.bench import tp  # noqa: E402
from tritongemm.bench.report import write_dicts  # noqa: E402
from tritongemm.core.plans import PLANS  # noqa: E402
from tritongemm.dispatch import tiles as hopper  # noqa: E402
from tritongemm.distributed import exchange, gathered  # noqa: E402

SHAPES = [(layer, m) for layer in tp.LAYERS for m in (2048, 4096, 8192, 16384) if layer[0] == "qkv" or m < 8192]


TILE_VARIANTS = ("tile-of-others", "tile-mid", "tile-big")
PIECE_VARIANTS = {"pieces-1": 1, "pieces-2": 2, "pieces-4": 4}


@contextlib.contextmanager
def _tile_rule(name: str, world: int):
    """gathered.py's shared tile chosen otherwise: "tile-of-others" as at 27bb547, by rung 6's rule
    on the rows of every chunk but the own one; "tile-mid" and "tile-big" the rule's two candidates
    forced (a BIG wave weighed as infinitely many MID waves, or as none). The plans made under it
    are forgotten after, and any made before forgotten first (their key does not hold the rule)."""
    original, weight, by_gpu = (
        gathered.persistent_pipelined_config,
        hopper.BIG_WAVE_COST,
        gathered.SHARED_TILE_BIG_WAVE_COST,
    )
    if name == "tile-of-others":
        gathered.persistent_pipelined_config = lambda M, N, K, sms, *rest: original(M - M // world, N, K, sms, *rest)
    else:
        hopper.BIG_WAVE_COST = float("inf") if name == "tile-mid" else 0.0
        gathered.SHARED_TILE_BIG_WAVE_COST = {}  # (else a GPU's own weight would stand)
    PLANS.clear()
    try:
        yield
    finally:
        gathered.persistent_pipelined_config, hopper.BIG_WAVE_COST = original, weight
        gathered.SHARED_TILE_BIG_WAVE_COST = by_gpu
        PLANS.clear()


@contextlib.contextmanager
def _pieces(name: str):
    """gathered.py's chunks sent in PIECE_VARIANTS[name] pieces each where their rows of tiles
    divide (one elsewhere), whatever `gathered.pieces_for` says; plans forgotten before and after,
    as `_tile_rule`'s (their key does not hold the rule)."""
    original, pieces = gathered.pieces_for, PIECE_VARIANTS[name]
    gathered.pieces_for = lambda row_tiles, *_: pieces if row_tiles % pieces == 0 else 1
    PLANS.clear()
    try:
        yield
    finally:
        gathered.pieces_for = original
        PLANS.clear()


def _variant_rule(name: str, world: int):
    if name in TILE_VARIANTS:
        return _tile_rule(name, world)
    if name == "pull":
        return tp.pulled()
    return _pieces(name) if name in PIECE_VARIANTS else contextlib.nullcontext()


class SpreadAlways(exchange.SymmetricExchanges):
    def landed(self, handles, spread=False):
        return super().landed(handles, True)


class OnePeerStream(exchange.SymmetricExchanges):
    def landed(self, handles, spread=False):
        return super().landed(handles, False)


class TorchSchedule(exchange.SymmetricExchanges):
    """torch's fused op's schedule (torch.distributed._symmetric_memory,
    `_pipelined_multi_all_gather_and_consume`): each pulled chunk's copy just before its GEMM, on
    the same stream, the steps alternating between a second stream and the compute stream, so a
    copy waits for the GEMM two steps back."""

    def gather(self, shard, shards, keep_own=True, words=None, pieces=1):
        assert words is None, "torch's schedule runs a GEMM per chunk: no arrival words"
        self._chunk, self._shards, self._keep_own = shard, shards, keep_own
        self._published = torch.cuda.Event()
        self._published.record(self.side)  # after publish's barrier: every peer's shard is in its buffer
        return [(source, source) for _, source in map(self.peers, range(1, self.world))]

    @contextlib.contextmanager
    def landed(self, source, spread=False):
        step = (source - self.rank) % self.world
        if step % 2:
            if not self.peer_gemms:
                self.peer_gemms.append(exchange._stream(self.compute.device, "peer_gemms.0"))
            stream = self.peer_gemms[0]
        else:
            stream = self.compute
        stream.wait_event(self._published)
        with exchange._on(stream, self.compute):
            chunk = self._chunk
            self._shards[source].copy_(self.workspace.buffer(source, chunk.shape, chunk.dtype))
            yield

    def finish(self):
        if self._keep_own:
            with exchange._on(self.side, self.compute):
                self._shards[self.rank].copy_(self._chunk)
        self.side.wait_stream(self.compute)  # the last barrier after every pull
        for stream in self.peer_gemms:
            self.side.wait_stream(stream)
        super().finish()


# name: (the transport's class, whether the gathered chunks may run as one GEMM, whether the own
# chunk's GEMM runs on its tiles: ops.WHOLE_GATHERED_GEMM, ops.OWN_CHUNK_ON_SHARED_TILES)
VARIANTS = {
    "whole": (exchange.SymmetricExchanges, True, True),
    "own-auto": (exchange.SymmetricExchanges, True, False),
    "tile-of-others": (exchange.SymmetricExchanges, True, True),
    "tile-mid": (exchange.SymmetricExchanges, True, True),
    "tile-big": (exchange.SymmetricExchanges, True, True),
    **{name: (exchange.SymmetricExchanges, True, True) for name in PIECE_VARIANTS},
    "pull": (exchange.SymmetricExchanges, True, True),
    "side": (exchange.SymmetricExchanges, False, False),
    "spread-always": (SpreadAlways, False, False),
    "one-peer-stream": (OnePeerStream, False, False),
    "torch-schedule": (TorchSchedule, False, False),
}
GATHER_ONLY = set(VARIANTS) - {"whole", "side", "pull"}


def _worker(rank: int, world: int, tmp: str, rounds: int, out_path: str, ops: tuple, names: tuple, tokens: set) -> None:
    from tritongemm.core.reference import rel_error, tolerance
    from tritongemm.distributed import paths as tp_ops

    device = tp.join_gpu_group(rank, world, tmp)
    original = exchange.SymmetricExchanges
    rows = []
    for layer, m in [(layer, m) for layer, m in SHAPES if layer[1] in ops and m in tokens]:
        _, reference, calls = tp._problem(layer, m, rank, world, device)
        bitwise = layer[1] == "all_gather_matmul" or world == 2
        variants = {n: VARIANTS[n] for n in names if layer[1] == "all_gather_matmul" or n not in GATHER_ONLY}
        times, same = {}, {}
        for _ in range(rounds):
            for timing in tp.TIMINGS:
                for reference_call in ("sequential", "torch-symm-mem"):
                    ms = tp._time(calls[reference_call], timing, device)[0]
                    times.setdefault((reference_call, timing), []).append(ms)
                for name, (cls, whole, shared_tiles) in variants.items():
                    exchange.SymmetricExchanges, tp_ops.WHOLE_GATHERED_GEMM = cls, whole
                    tp_ops.OWN_CHUNK_ON_SHARED_TILES = shared_tiles
                    rule = _variant_rule(name, world)
                    try:
                        with rule:
                            result = calls["tritongemm"]()
                            # Bitwise where the tiles sum K in the same order as the sequential path's GEMM;
                            # else (another tile, NCCL's ring) within bf16's bound of the float64 reference.
                            same[name] = bitwise and torch.equal(result, calls["sequential"]())
                            err, bound = rel_error(result, reference), tolerance(torch.bfloat16, layer[3])
                            assert err <= bound, f"{name}: rel error {err:.2e} > {bound:.2e}"
                            ms = tp._time(calls["tritongemm"], timing, device)[0]
                    finally:
                        exchange.SymmetricExchanges, tp_ops.WHOLE_GATHERED_GEMM = original, True
                        tp_ops.OWN_CHUNK_ON_SHARED_TILES = True
                    times.setdefault((name, timing), []).append(ms)
        for (name, timing), ms in times.items():
            base = statistics.median(times[("sequential", timing)])
            med = statistics.median(ms)
            rows.append(dict(layer=layer[0], m=m, variant=name, timing=timing, ms=med, speedup_vs_sequential=base / med,
                             spread=(max(ms) - min(ms)) / med, bitwise=same.get(name, "")))  # fmt: skip
        if rank == 0:
            mine = [r for r in rows if (r["layer"], r["m"]) == (layer[0], m)]
            ratios = [f"{r['variant']}/{r['timing']} {r['speedup_vs_sequential']:.3f}" for r in mine]
            print(f"{layer[0]} {m}: " + ", ".join(ratios), flush=True)
    if rank == 0:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        write_dicts(out_path, rows)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/h200x4/probes/tp/tp-streams.csv")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ops", default="all_gather_matmul,matmul_reduce_scatter", help="which ops' layers")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"which of {list(VARIANTS)}")
    parser.add_argument("--tokens", default="2048,4096,8192,16384", help="which token counts")
    args = parser.parse_args()
    tokens = {int(t) for t in args.tokens.split(",")}
    names = tuple(args.variants.split(","))
    world = tp.spawn_on_gpus(_worker, args.rounds, args.out, tuple(args.ops.split(",")), names, tokens)
    print(f"Wrote {args.out} ({torch.cuda.get_device_name(0)} x {world}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
