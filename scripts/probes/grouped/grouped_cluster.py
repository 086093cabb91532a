"""Probe: grouped/ws.py on one CTA against the two-CTA cluster that multicasts each group's weight
tile (CLUSTER = 2; triton >= 3.8), beside torch._grouped_mm, kernel-only, on `bench grouped`'s
MoE layers at prefill sizes.

Each problem is checked first: the cluster against the fp64 reference and bitwise against one
CTA. Then CUDA-graph replays (triton.testing.do_bench_cudagraph, median), ROUNDS interleaved
rounds, the best of each.

    PYTHONPATH=. python3 scripts/probes/grouped/grouped_cluster.py --out grouped-cluster.csv [--rounds 3]
"""

from __future__ import annotations

import argparse
import csv
import functools

import torch
import triton
from triton.testing import do_bench_cudagraph

from tritongemm.bench.grouped import SUITE, operands
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.grouped import reference_grouped_mm
from tritongemm.grouped import ws as grouped_ws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="grouped-cluster.csv")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-tokens", type=int, default=2048)
    args = parser.parse_args()
    device = torch.device("cuda")
    print("triton", triton.__version__, "torch", torch.__version__, torch.cuda.get_device_name(device), flush=True)
    rows = []
    for problem in (p for p in SUITE if p.tokens >= args.min_tokens):
        a, b, offs = operands(problem, device)
        outs, calls = {}, {}
        for cluster in (1, 2):
            c = torch.empty(a.shape[0], b.shape[2], device=device, dtype=a.dtype)
            run = grouped_ws.plan(a, b, offs, c, cluster=cluster)
            run(a, b, offs, c)
            outs[cluster], calls[f"cluster{cluster}"] = c.clone(), functools.partial(run, a, b, offs, c)
        calls["torch"] = functools.partial(torch._grouped_mm, a, b, offs=offs)
        expected = reference_grouped_mm(a, b, offs).double()
        err = rel_error(outs[2], expected)
        same = torch.equal(outs[1], outs[2])
        ok = err <= tolerance(a.dtype, problem.k) and same
        print(f"{'ok  ' if ok else 'FAIL'} {problem.label()}: cluster rel err {err:.2e}, bitwise equal to one CTA: "
              f"{same}", flush=True)  # fmt: skip
        if not ok:
            continue
        best = {}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                ms = do_bench_cudagraph(fn, rep=60)
                best[name] = min(best.get(name, ms), ms)
        for name, ms in best.items():
            tflops = problem.flops / ms / 1e9
            ratio = best["torch"] / ms
            rows.append(dict(experts=problem.experts, tokens=problem.tokens, topk=problem.topk, n=problem.n,
                             k=problem.k, provider=name, ms=ms, tflops=tflops, ratio_to_torch=ratio))  # fmt: skip
            print(f"  {name:9s} {ms:8.4f} ms {tflops:7.1f} TFLOP/s {ratio:.3f}x torch", flush=True)
    if rows:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, ["device", "triton", *rows[0]])
            writer.writeheader()
            for row in rows:
                writer.writerow(dict(device=torch.cuda.get_device_name(device), triton=triton.__version__, **row))


if __name__ == "__main__":
    main()
