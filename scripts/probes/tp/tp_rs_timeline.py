"""One reduce-scatter's timeline on every GPU of this machine, its partials pushed, pulled and
sequential (NCCL), each one call replayed from a CUDA graph: bench tp's profile with the pulled
path beside the library's.

    python3 scripts/probes/tp/tp_rs_timeline.py OUT_DIR [TOKENS=2048] [LAYER=o_proj]

Writes OUT_DIR/rank{r}.csv (bench tp's timeline columns) and prints, per path and rank, each
kernel and copy as short[stream]@start+duration in us from the GPUs' line-up: set (the words'
reset), bar (a barrier), cpy (a push or pull), red (the sum), gemm, nccl.
"""

import csv
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, ".")
from tritongemm.bench import tp  # noqa: E402

M = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
LAYER = sys.argv[3] if len(sys.argv) > 3 else "o_proj"


def worker(rank, world, tmp, out):
    device = tp.join_gpu_group(rank, world, tmp)
    original = tp._problem

    def problem(layer, m, rank, world, device):
        shape, ref, calls = original(layer, M, rank, world, device)
        push = calls["tritongemm"]

        def pulled():
            with tp.pulled():
                return push()

        return shape, ref, {"tritongemm": push, "pulled": pulled, "sequential": calls["sequential"]}

    tp._problem = problem
    tp._PATH_NAMES = {"tritongemm": "pushed", "pulled": "pulled", "sequential": "seq"}
    tp.TIMINGS = ("graph",)  # (the all-gather bench tp's profile also takes is dropped below)
    layers = [x for x in tp.LAYERS if x[0] in ("qkv", LAYER)]
    events = tp._timeline(rank, world, device, layers)
    events = [e for e in events if e["op"] == "matmul_reduce_scatter"]
    with open(f"{out}/rank{rank}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(events[0]))
        w.writeheader()
        w.writerows(events)
    import torch.distributed as dist

    dist.destroy_process_group()


def _short(name: str) -> str:
    n = name.lower()
    for word, short in (("barrier", "bar"), ("memcpy", "cpy"), ("memset", "set"), ("reduce_partials", "red"),
                        ("nccl", "nccl")):  # fmt: skip
        if word in n:
            return short
    return "gemm" if any(w in n for w in ("gemm", "matmul", "persistent", "sm90", "pipelined", "kernel")) else n[:14]


def summary(out):
    rows = []
    for p in sorted(Path(out).glob("rank*.csv")):
        rows += list(csv.DictReader(open(p)))
    panels = defaultdict(list)
    for e in rows:
        panels[e["path"]].append(e)
    for path, evs in panels.items():
        print("==", path)
        t0 = {e["rank"]: float(e["t0_us"]) for e in evs}
        base = min(t0.values())
        for rank in sorted(t0):
            mine = [e for e in evs if e["rank"] == rank and e["stream"] != "host"]
            parts = [f"{_short(e['name'])}[{e['stream']}]@{float(e['start_us']):.0f}+{float(e['dur_us']):.0f}"
                     for e in sorted(mine, key=lambda e: float(e["start_us"]))]  # fmt: skip
            print(f" rank {rank} t0 +{t0[rank] - base:.1f}: " + " ".join(parts))


if __name__ == "__main__":
    out = sys.argv[1]
    Path(out).mkdir(parents=True, exist_ok=True)
    tp.spawn_on_gpus(worker, out)
    summary(out)
