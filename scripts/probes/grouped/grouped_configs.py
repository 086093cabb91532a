"""Probe: which tile serves the row-group kernel (grouped_mm's MoE forward) best on this GPU, on
`bench grouped`'s problems, beside torch._grouped_mm, kernel-only (measure.check_then_time's
"graph" timing). Each candidate is checked against the fp64 reference first. Feeds dispatch/grouped.py's _GPU_TILES.
`--form k`: the K-group kernel instead, on the weight gradients of the same layers at training
sizes (dW[g] = A_g^T dC_g, A (rows, k), dC (rows, n), the groups along the rows), beside
torch._grouped_mm on the same operands: the backward an MoE training step spends most in.
`--form dx`: the input gradient of the same layers, dX = dC @ W[g] (dC (rows, n), the weights
(experts, n, k) as stored, read untransposed: an N-major b), grouped_mm as it chooses (grouped_ws
where K is whole K-steps) beside the `tl` kernel's tile it took before and torch._grouped_mm.

`--ws`: the warp-specialized Gluon kernel (grouped/ws.py) on WS_CANDIDATES instead, beside
grouped_mm as it chooses, on the problems of 2048 tokens and more (with `--form dx`, on the
input gradient's N-major weights). With `--form k`, the K-group
Gluon kernel (grouped/k_ws.py) on the same tiles, beside the `tl` kernel's tile.

`--glu`: the gated pair (glu="silu", b's columns [gate; up]) on grouped_mm's own tile, beside
torch._grouped_mm followed by torch's silu(gate) * up. (Its run of tree 3682407,
probes/grouped/grouped-pair-loop-3682407.csv, also timed the kernel's former two walks over K.)

    PYTHONPATH=. python3 scripts/probes/grouped/grouped_configs.py --out grouped-configs.csv \
        [--form k | dx] [--ws | --glu]
"""

from __future__ import annotations

import argparse
import csv
import functools
import time

import torch


def tile(bm, bn, bk, group, warps, stages):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=group, num_warps=warps, num_stages=stages)


CANDIDATES = {
    "128x128x64 g8 w8 s3": tile(128, 128, 64, 8, 8, 3),
    "128x128x64 g8 w8 s4": tile(128, 128, 64, 8, 8, 4),
    "128x256x64 g8 w8 s3": tile(128, 256, 64, 8, 8, 3),
    "128x128x64 g8 w4 s4": tile(128, 128, 64, 8, 4, 4),
    "64x128x64 g8 w4 s4": tile(64, 128, 64, 8, 4, 4),
    "64x64x128 g1 w4 s4": tile(64, 64, 128, 1, 4, 4),
    "64x128x128 g1 w4 s3": tile(64, 128, 128, 1, 4, 3),
    "16x64x128 g1 w4 s4": tile(16, 64, 128, 1, 4, 4),
    "32x128x128 g1 w4 s4": tile(32, 128, 128, 1, 4, 4),
    "16x128x256 g1 w4 s3": tile(16, 128, 256, 1, 4, 3),
    "64x64x32 g1 w4 s3 (first)": tile(64, 64, 32, 1, 4, 3),
}

WS_CANDIDATES = {  # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages); the first is grouped_ws's DEFAULT_CONFIG
    "ws 128x128x64 w8 s5": (128, 128, 64, 8, 5),
    "ws 128x128x64 w8 s6": (128, 128, 64, 8, 6),
    "ws 128x256x64 w8 s3": (128, 256, 64, 8, 3),
    "ws 128x256x64 w8 s4": (128, 256, 64, 8, 4),  # C staged in halves beside the ring
    "ws 256x128x64 w8 s4": (256, 128, 64, 8, 4),
    "ws 256x128x64 w8 s3": (256, 128, 64, 8, 3),
    "ws 128x128x128 w8 s3": (128, 128, 128, 8, 3),
    # One MMA warpgroup on 64 rows, half the rows a ragged group's last tile can waste: no better
    # than 128 x 256 on any of the six layers, forward or input gradient (H100, 2026-11-27,
    # probes/grouped/grouped-ws-64-row-tiles-*.csv). 64 x 256 doesn't compile (the masked store's row slices).
    "ws 64x128x64 w4 s6": (64, 128, 64, 4, 6),
    "ws 64x128x64 w4 s8": (64, 128, 64, 4, 8),
}


def torch_pair(a, b, offs):
    """torch's gated pair: the grouped product of [gate; up], then silu(gate) * up."""
    gate, up = torch._grouped_mm(a, b, offs).chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def ws_call(a, b, offs, sizes):
    """grouped_ws on one tile, as a call of no arguments."""
    from tritongemm.core.config import MatmulConfig
    from tritongemm.grouped import ws as grouped_ws

    bm, bn, bk, warps, stages = sizes
    config = MatmulConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=1, num_warps=warps, num_stages=stages)
    c = a.new_empty((a.shape[0], b.shape[2]))
    launch = grouped_ws.plan(a, b, offs, c, config)

    def call():
        out = a.new_empty((a.shape[0], b.shape[2]))
        launch(a, b, offs, out)
        return out

    return call


def k_ws_call(a, b, offs, sizes, module=None):
    """grouped_k_ws (or `module`, another tree's copy of it) on one tile, as a call of no arguments."""
    from tritongemm.core.config import MatmulConfig
    from tritongemm.grouped import k_ws as grouped_k_ws

    bm, bn, bk, warps, stages = sizes
    config = MatmulConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=8, num_warps=warps, num_stages=stages)
    shape = (offs.shape[0], a.shape[0], b.shape[1])
    launch = (module or grouped_k_ws).plan(a, b, offs, a.new_empty(shape), config)

    def call():
        out = a.new_empty(shape)
        launch(a, b, offs, out)
        return out

    return call


def main() -> None:
    from tritongemm.bench.grouped import SUITE, operands
    from tritongemm.bench.measure import check_then_time
    from tritongemm.core.reference import tolerance
    from tritongemm.dispatch.grouped import tile as _tile
    from tritongemm.grouped import reference_grouped_mm
    from tritongemm.grouped.api import _launch

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--form", choices=("m", "k", "dx"), default="m",
                        help="m: the MoE forward; k: its weight gradient; dx: its input gradient")  # fmt: skip
    parser.add_argument("--ws", action="store_true", help="the Gluon kernel's tiles (WS_CANDIDATES)")
    parser.add_argument("--glu", action="store_true", help="the gated pair: one walk over K or two")
    args = parser.parse_args()
    problems = SUITE if args.form == "m" and not args.ws else [p for p in SUITE if p.tokens >= 2048]
    if args.form == "dx" and args.glu:
        parser.error("--form dx: the input gradient has no gated pair (no --glu)")
    t0 = time.time()
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["experts", "tokens", "topk", "n", "k", "candidate", "ms", "tflops", "ratio_to_torch",
                         "rel_err", "status"])  # fmt: skip
        for p in problems:
            a, b, offs = operands(p, "cuda")
            if args.form == "k":  # A^T (k, rows) and a gradient dC (rows, n): the K groups are the rows
                a, b = a.t(), torch.randn(p.rows, p.n, device="cuda").to(a.dtype)
            elif args.form == "dx":  # dC (rows, n) times the weights (experts, n, k) as stored
                a, b = torch.randn(p.rows, p.n, device="cuda").to(a.dtype), b.transpose(1, 2)
            glu = "silu" if args.glu else None
            ref = reference_grouped_mm(a, b, offs, glu=glu).double()
            bound = tolerance(a.dtype, {"m": p.k, "dx": p.n}.get(args.form, max(p.rows // p.experts, 1)))
            calls = {"torch._grouped_mm": functools.partial(torch._grouped_mm, a, b, offs)}
            if args.glu:
                calls = {"torch._grouped_mm": functools.partial(torch_pair, a, b, offs)}
                tile = _tile(a.shape[0], b.shape[0], False, glu, a.element_size())
                calls["grouped_mm glu"] = functools.partial(_launch, a, b, offs, a.dtype, "m", glu, tile)
                if args.ws:  # the Gluon kernel's gated pair (GATED_CONFIG) beside it
                    from tritongemm.grouped.api import grouped_mm_ws

                    calls["ws glu"] = functools.partial(grouped_mm_ws, a, b, offs, glu=glu)
            if args.ws and not args.glu:
                import tritongemm

                calls["grouped_mm"] = functools.partial(tritongemm.grouped_mm, a, b, offs)
                if args.form == "k":  # the `tl` kernel's tile, which grouped_mm took before grouped_k_ws
                    calls["tl 128x256x64 g8 w8 s3"] = functools.partial(
                        _launch, a, b, offs, a.dtype, "k", tile=CANDIDATES["128x256x64 g8 w8 s3"]
                    )
                for name, sizes in WS_CANDIDATES.items():
                    try:
                        make = k_ws_call if args.form == "k" else ws_call
                        calls[name.replace("ws", "k-ws") if args.form == "k" else name] = make(a, b, offs, sizes)
                    except Exception as exc:  # a tile it refuses (ValueError) or that fails to compile
                        print(f"{name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            if args.form == "dx" and not args.ws:
                import tritongemm

                calls["grouped_mm"] = functools.partial(tritongemm.grouped_mm, a, b, offs)
                tl_tile = _tile(a.shape[0], b.shape[0], False, None, a.element_size())
                calls["tl (before)"] = functools.partial(_launch, a, b, offs, a.dtype, "m", tile=tl_tile)
            for name, t in {} if args.ws or args.glu or args.form == "dx" else CANDIDATES.items():
                calls[name] = functools.partial(_launch, a, b, offs, a.dtype, args.form, tile=t)
            errors, results = check_then_time(calls, ref, bound, p, timings=("graph",), rounds=1)
            torch_ms = results["graph"]["torch._grouped_mm"][0]
            for name, (ms, status) in results["graph"].items():
                tflops = p.flops / ms / 1e9 if ms else None
                ratio = torch_ms / ms if torch_ms and ms else None
                writer.writerow([p.experts, p.tokens, p.topk, p.n, p.k, name, ms, tflops, ratio, errors[name], status])
                f.flush()
                print(f"[{time.time() - t0:4.0f}s] {p.label():50s} {name:28s} {(ms or 0):.4f} ms "
                      f"{(tflops or 0):6.1f} TF/s ratio {ratio or 0:.3f} {status}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
