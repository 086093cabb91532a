"""Probe: fp8_block on one CTA against the two-CTA cluster that multicasts the weight's tile
(fp8/block.py, CLUSTER = 2; triton >= 3.8), beside torch's block-wise _scaled_mm, kernel-only.

First the cluster's correctness: against the fp64 reference, and bitwise against the one-CTA
kernel (the same MMAs and promotions in the same order, so the same bits), on odd shapes, with
few persistent programs and with a fused epilogue. Then timings: CUDA-graph replays
(triton.testing.do_bench_cudagraph, median), ROUNDS interleaved rounds, the best of each.

    PYTHONPATH=. python3 scripts/probes/fp8/fp8_block_cluster.py --out fp8-block-cluster.csv [--rounds 3] \
        [--sweep | --small] [--no-bench]

--sweep times the cluster's tile order (GROUP_SIZE_M 4, 8, 16; the chunked scheduler) at M = 4096
and 8192; --small one CTA against the cluster at M = 256 to 1024, where cluster_for starts.
"""

from __future__ import annotations

import argparse
import csv
import functools

import torch
import triton
from triton.testing import do_bench_cudagraph

from tritongemm.bench.fp8 import Fp8Problem, operands, torch_block_scales
from tritongemm.core.epilogue import PLAIN, Epilogue
from tritongemm.core.reference import fp8_tolerance, rel_error
from tritongemm.fp8 import block as fp8_block
from tritongemm.fp8 import reference_scaled_mm

WEIGHTS = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (7168, 16384))
TOKENS = (2048, 4096, 8192)
CHECKS = ((256, 256, 128, None), (300, 520, 1280, None), (1000, 1504, 768, None), (900, 760, 1152, 1),
          (900, 760, 1152, 3), (900, 760, 1152, 7), (4096, 4096, 4096, None), (520, 4096, 2048, None))  # fmt: skip


DEFAULT = fp8_block.DEFAULT_CONFIG
VARIANTS = {"cluster1": (DEFAULT, 1), "cluster2": (DEFAULT, 2)}
SWEEP = {"cluster2": (DEFAULT, 2), "cluster2 g4": (DEFAULT.with_(GROUP_SIZE_M=4), 2),
         "cluster2 g16": (DEFAULT.with_(GROUP_SIZE_M=16), 2),
         "cluster2 chunked": (DEFAULT.with_(scheduler="chunked"), 2)}  # fmt: skip


def plan(a, b, c, sa, sb, cluster, spec=PLAIN, bias=None, num_programs=None, config=DEFAULT):
    return fp8_block.plan(a, b, c, sa, sb, config, spec, bias, num_programs=num_programs, cluster=cluster)


def check(device) -> list[str]:
    lines = []
    for M, N, K, programs in CHECKS:
        a, b, sa, sb = operands(Fp8Problem("block", M, N, K), device)
        fused = M == 1000
        bias = torch.randn(N, device=device, dtype=torch.bfloat16) if fused else None
        spec = Epilogue(activation="gelu", bias=True) if fused else PLAIN
        outs = {}
        for cluster in (1, 2):
            c = torch.full((M, N), float("nan"), device=device, dtype=torch.bfloat16)
            plan(a, b, c, sa, sb, cluster, spec, bias, programs)(a, b, c, sa, sb, bias)
            outs[cluster] = c
        torch.cuda.synchronize()
        expected = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64, bias=bias,
                                       activation="gelu" if fused else None)  # fmt: skip
        err = rel_error(outs[2], expected)
        same = torch.equal(outs[1], outs[2])
        ok = err <= fp8_tolerance(torch.bfloat16, K) and same
        nans = int(outs[2].isnan().sum())
        lines.append(f"{'ok  ' if ok else 'FAIL'} {M}x{N}x{K} programs={programs} fused={fused}: cluster rel err "
                     f"{err:.2e}, bitwise equal to one CTA: {same}, NaNs left: {nans}")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def bench(device, rounds: int, out: str, tokens=TOKENS, weights=WEIGHTS, variants=VARIANTS) -> None:
    rows = []
    for M in tokens:
        for N, K in weights:
            problem = Fp8Problem("block", M, N, K)
            a, b, sa, sb = operands(problem, device)
            reference = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64)
            bound = fp8_tolerance(torch.bfloat16, K)
            c = torch.empty(M, N, device=device, dtype=torch.bfloat16)
            calls = {name: functools.partial(plan(a, b, c, sa, sb, n, config=config), a, b, c, sa, sb)
                     for name, (config, n) in variants.items()}  # fmt: skip
            try:
                ta, tb, tsa, tsb = torch_block_scales(a, b, sa, sb, reference, bound)
                calls["torch"] = functools.partial(torch._scaled_mm, ta, tb, scale_a=tsa, scale_b=tsb,
                                                   out_dtype=torch.bfloat16)  # fmt: skip
            except Exception as exc:  # torch refuses block scales here: say so
                print(f"torch refuses block-wise {M}x{N}x{K}: {str(exc).splitlines()[0][:200]}")
            best = {}
            for _ in range(rounds):
                for name, fn in calls.items():
                    ms = do_bench_cudagraph(fn, rep=60)
                    best[name] = min(best.get(name, ms), ms)
            for name, ms in best.items():
                tflops = problem.flops / ms / 1e9
                ratio = best["torch"] / ms if "torch" in best else None
                rows.append(dict(m=M, n=N, k=K, provider=name, ms=ms, tflops=tflops, ratio_to_torch=ratio))
                print(f"{M:5d}x{N:5d}x{K:5d} {name:16s} {ms:8.4f} ms {tflops:7.1f} TFLOP/s "
                      f"{'' if ratio is None else f'{ratio:.3f}x torch'}", flush=True)  # fmt: skip
    name = torch.cuda.get_device_name(device)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, ["device", "triton", *rows[0]])
        writer.writeheader()
        for row in rows:
            writer.writerow(dict(device=name, triton=triton.__version__, **row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="fp8-block-cluster.csv")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda")
    print("triton", triton.__version__, "torch", torch.__version__, torch.cuda.get_device_name(device))
    lines = [] if args.no_check else check(device)
    if args.no_bench or not all(line.startswith("ok") for line in lines):
        return
    if args.sweep:
        bench(device, args.rounds, args.out, (4096, 8192), WEIGHTS, SWEEP)
    elif args.small:
        bench(device, args.rounds, args.out, (256, 512, 1024), ((4096, 4096), (28672, 4096), (4096, 14336)))
    else:
        bench(device, args.rounds, args.out)


if __name__ == "__main__":
    main()
