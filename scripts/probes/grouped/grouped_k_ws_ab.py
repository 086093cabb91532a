"""Probe: grouped_k_ws (the MoE weight gradient's K-group kernel) against another version of its
module, on the weight gradients of bench grouped's three MoE layers, beside torch._grouped_mm,
kernel-only, each checked against the fp64 reference first. Two sets of group ends per problem:
the router's (random sizes: a group's last K-step ends anywhere) and the same rounded to 16 rows
(a WGMMA's K on 16-bit operands).

    PYTHONPATH=. python3 scripts/probes/grouped/grouped_k_ws_ab.py --base old/grouped_k_ws.py --out ab.csv

`--base` is a copy of grouped/k_ws.py from another tree (`git show REV:tritongemm/hopper/
grouped_k_ws.py > old.py`), loaded beside this tree's. Its run at e02d9b0 against 6fb8530's
(results/h100/probes/grouped/grouped-k-ws-stop-at-16.csv) is behind docs/grouped.md's "The group's end".
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib.util
import sys
import time
from pathlib import Path

import torch

from tritongemm.bench.grouped import GroupedProblem, operands
from tritongemm.bench.measure import check_then_time
from tritongemm.core.reference import tolerance
from tritongemm.grouped import k_ws as grouped_k_ws
from tritongemm.grouped import reference_grouped_mm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grouped_configs import k_ws_call  # noqa: E402

# (experts, top-k, tokens, n, k): Mixtral's gate/up and down, the 64- and 128-expert layers.
PROBLEMS = ((8, 2, 2048, 28672, 4096), (8, 2, 2048, 4096, 14336), (8, 2, 8192, 28672, 4096),
            (64, 6, 2048, 2816, 2048), (128, 8, 2048, 1536, 2048), (128, 8, 8192, 1536, 2048))  # fmt: skip
TILES = ((128, 256, 3), (256, 128, 4))  # (BLOCK_M, BLOCK_N, slots): the default first


def on_16(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """The group ends with each group's size rounded to 16 rows, the last taking the difference."""
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).double()
    rounded = ((counts / 16).round() * 16).long()
    rounded[-1] += rows - rounded.sum()
    return rounded.cumsum(0).to(torch.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="another tree's grouped/k_ws.py")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("grouped_k_ws_base", args.base)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    t0 = time.time()
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["experts", "tokens", "n", "k", "offs", "candidate", "ms", "tflops", "ratio_to_torch",
                         "rel_err", "status"])  # fmt: skip
        for experts, topk, tokens, n, k in PROBLEMS:
            p = GroupedProblem(experts, tokens, topk, n, k)
            a, _, offs = operands(p, "cuda")
            a, b = a.t(), torch.randn(p.rows, p.n, device="cuda").to(a.dtype)  # the weight gradient's operands
            for label, ends in (("random", offs), ("on 16", on_16(offs, p.rows))):
                ref = reference_grouped_mm(a, b, ends).double()
                bound = tolerance(a.dtype, max(p.rows // p.experts, 1))
                calls = {"torch._grouped_mm": functools.partial(torch._grouped_mm, a, b, ends)}
                for bm, bn, stages in TILES:
                    sizes = (bm, bn, 64, 8, stages)
                    calls[f"new {bm}x{bn}x64 s{stages}"] = k_ws_call(a, b, ends, sizes, grouped_k_ws)
                    calls[f"base {bm}x{bn}x64 s{stages}"] = k_ws_call(a, b, ends, sizes, base)
                errors, results = check_then_time(calls, ref, bound, p, timings=("graph",), rounds=3)
                torch_ms = results["graph"]["torch._grouped_mm"][0]
                for name, (ms, status) in results["graph"].items():
                    tflops = p.flops / ms / 1e9 if ms else None
                    ratio = torch_ms / ms if torch_ms and ms else None
                    writer.writerow([experts, tokens, n, k, label, name, ms, tflops, ratio, errors[name], status])
                    f.flush()
                    print(f"[{time.time() - t0:4.0f}s] {experts}e {tokens} {n}x{k} {label:6s} {name:22s} "
                          f"{(ms or 0):.4f} ms {(ratio or 0):.3f} {status}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
