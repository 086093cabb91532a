"""Where the symmetric transport's barriers run, A/B in one run on every GPU of this machine.

    python3 scripts/tp_probe.py [--out results/h200x2/probes/tp-barriers.csv] [--rounds 3]

Variants of `distributed.exchange.SymmetricExchanges`, swapped in one after the other, each timed
as `bench tp` times (graph and eager, the slowest rank's median), in interleaved rounds so that
drift hits them alike:
- side: the library's (barriers on the side stream, the GEMMs on all SMs but one);
- side-all-sms: the same barriers, GEMMs on every SM (a barrier then waits for a GEMM's end);
- peer-gemms-on-compute: the gathered chunks' GEMMs on the compute stream, one after another,
  instead of on a stream of their own beside it (an all-gather's only).
"sequential" (NCCL's collective + one GEMM) is the reference of every ratio.

The run at tree a661c13 (probes/tp-barriers-a661c13.csv) had a third variant, "compute": tree
4b6e9e8's placement, the publishing copy and the barriers on the compute stream, queued before
the first GEMM. Since the ops queue the first GEMM before the publishing copy (ops.py), that
variant would measure something else, so it is gone.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tritongemm.bench import tp  # noqa: E402
from tritongemm.distributed import exchange  # noqa: E402

SHAPES = [(layer, m) for layer in tp.LAYERS for m in (2048, 4096, 8192) if layer[0] != "gate_up" or m < 8192]


class SideAllSms(exchange.SymmetricExchanges):
    spare_sms = 0


class PeerGemmsOnCompute(exchange.SymmetricExchanges):
    landed = exchange.Exchanges.landed


VARIANTS = {
    "side": exchange.SymmetricExchanges,
    "side-all-sms": SideAllSms,
    "peer-gemms-on-compute": PeerGemmsOnCompute,
}


def _worker(rank: int, world: int, tmp: str, rounds: int, out: str) -> None:
    device = tp.join_gpu_group(rank, world, tmp)
    original = exchange.SymmetricExchanges
    rows = []
    for layer, m in SHAPES:
        _, reference, calls = tp._problem(layer, m, rank, world, device)
        times = {}
        for _ in range(rounds):
            for timing in tp.TIMINGS:
                times.setdefault(("sequential", timing), []).append(tp._time(calls["sequential"], timing, device)[0])
                for name, cls in VARIANTS.items():
                    exchange.SymmetricExchanges = cls
                    try:
                        out = calls["tritongemm"]()
                        ok = torch.equal(out, calls["sequential"]())
                        ms = tp._time(calls["tritongemm"], timing, device)[0]
                    finally:
                        exchange.SymmetricExchanges = original
                    assert ok, f"{name} differs from the sequential path"
                    times.setdefault((name, timing), []).append(ms)
        for (name, timing), ms in times.items():
            base = statistics.median(times[("sequential", timing)])
            med = statistics.median(ms)
            rows.append(dict(layer=layer[0], m=m, variant=name, timing=timing, ms=med, speedup_vs_sequential=base / med,
                             spread=(max(ms) - min(ms)) / med))  # fmt: skip
        if rank == 0:
            mine = [r for r in rows if (r["layer"], r["m"]) == (layer[0], m)]
            ratios = [f"{r['variant']}/{r['timing']} {r['speedup_vs_sequential']:.3f}" for r in mine]
            print(f"{layer[0]} {m}: " + ", ".join(ratios), flush=True)
    if rank == 0:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/h200x2/probes/tp-barriers.csv")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    world = tp.spawn_on_gpus(_worker, args.rounds, args.out)
    print(f"Wrote {args.out} ({torch.cuda.get_device_name(0)} x {world}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
