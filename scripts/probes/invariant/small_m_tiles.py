"""Probe: which of rung 6's tiles serve batch_invariant=True best at decode sizes (M <= 256).

The invariant policy (dispatch/invariant.py) may pick any rung-6 tile, since every tile sums K
in WGMMA's 16-deep steps in order; what it may not do is split K. At M <= 128 its rules' 64 x 64
tiles ran 0.50-0.96x cuBLAS on the H200 (results/h200/invariant.csv): too few programs for 132
SMs at N = 4096, a short second wave at N = 14336, few loads in flight per SM. This sweeps BLOCK_N,
BLOCK_K and ring depth at BLOCK_M = 64 (and 128 from M = 128 up) on Llama-3-8B's weights and
checks each candidate's rows bitwise against the invariant result of the full 8192-row batch,
so a tile that rounded otherwise would show here before the rules take it.

Timing: CUDA-graph replays (do_bench_cudagraph, median) of a loop over enough weight copies to
leave L2 (60 MB on the H200) cold for each, divided by the copies; cuBLAS (torch.matmul) in the
same loop shape, same run.

    PYTHONPATH=. python3 scripts/probes/invariant/small_m_tiles.py --out small-m-tiles.csv
"""

from __future__ import annotations

import argparse
import csv
import itertools

import torch
from triton.testing import do_bench_cudagraph

import tritongemm
from tritongemm.core.config import MatmulConfig
from tritongemm.dispatch import invariant
from tritongemm.primitives.gluon.pipeline import plan_ring

WEIGHTS = ((4096, 4096), (4096, 14336), (14336, 4096))
TOKENS = (1, 8, 16, 32, 64, 128, 192, 256)
FULL_BATCH = 8192
L2_BYTES = 60 * 2**20
KERNEL = "tma_persistent_pipelined"


def candidates(M: int) -> list[MatmulConfig]:
    """Every tile that fits shared memory, at its deepest ring (<= 16) and at 8 slots."""
    out = []
    for bm, bn, bk in itertools.product((64, 128), (32, 64, 128, 256), (64, 128)):
        if bm == 128 and M < 128:
            continue
        for stages in (16, 12, 8, 6, 4, 3):
            warps = 8 if bm * bn > 128 * 128 else 4  # one warpgroup's accumulator: <= 128 registers a thread
            config = MatmulConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=8, num_warps=warps,
                                  num_stages=stages)  # fmt: skip
            try:
                plan_ring(config, 2)
            except ValueError:
                continue
            out.append(config)
            if stages > 8:
                out.append(config.with_(num_stages=8))
            break
    return list(dict.fromkeys(out))


def timed(fn, copies: int) -> float:
    return do_bench_cudagraph(fn, rep=30, return_mode="median") / copies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="small-m-tiles.csv")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    tokens = [int(t) for t in args.tokens.split(",")]
    device = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for N, K in WEIGHTS:
        copies = max(2, -(-2 * L2_BYTES // (N * K * 2)))
        weights = [torch.randn(N, K, device=device, dtype=dtype) / K**0.5 for _ in range(copies)]
        x_full = torch.randn(FULL_BATCH, K, device=device, dtype=dtype)
        reference = tritongemm.matmul(x_full, weights[0].T, batch_invariant=True)
        for M in tokens:
            x = x_full[:M]
            cublas_ms = timed(lambda x=x, ws=weights: [torch.matmul(x, w.T) for w in ws], copies)
            chosen = invariant.choose(x, weights[0].T, dtype)[1]
            for config in [chosen, *candidates(M)]:
                out = tritongemm.matmul(x, weights[0].T, kernel=KERNEL, config=config)
                same = torch.equal(out.view(torch.int16), reference[:M].view(torch.int16))
                ms = timed(lambda c=config, x=x, ws=weights: [tritongemm.matmul(x, w.T, kernel=KERNEL, config=c)
                                                              for w in ws], copies)  # fmt: skip
                row = dict(dtype=args.dtype, m=M, n=N, k=K, config=config.short(), rules=config == chosen,
                           bitwise_equal=same, us=round(ms * 1e3, 2), cublas_us=round(cublas_ms * 1e3, 2),
                           ratio_to_cublas=round(cublas_ms / ms, 4),
                           weight_TBps=round(N * K * 2 / ms / 1e9, 3))  # fmt: skip
                rows.append(row)
                print(",".join(str(v) for v in row.values()), flush=True)
            best = max((r for r in rows if (r["m"], r["n"], r["k"]) == (M, N, K) and r["bitwise_equal"]),
                       key=lambda r: r["ratio_to_cublas"])  # fmt: skip
            print(f"# best {M}x{N}x{K}: {best['config']} {best['ratio_to_cublas']}x cuBLAS", flush=True)
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
