"""Probe: which kernel and tile serve `scaled_mm` best, per recipe and size, on this GPU, beside
torch._scaled_mm with and without fast accumulation, kernel-only (measure.check_then_time's "graph").
Each candidate is checked against the fp64 reference first. Feeds dispatch/fp8.py's tile table.

    PYTHONPATH=. python3 scripts/probes/fp8/fp8_configs.py --out fp8-configs.csv [--recipes tensor,row,block] \
        [--min-m 2048] [--max-m 128] [--split] [--partitions] [--odd] [--swap]

--split times rung 7's split-K on fp8 beside the ws tiles (tensor-wise only). On the H100 at M = 128
(results/h100/probes/fp8/fp8-split-k-m128.csv) it ran 0.61-0.86x torch's, below the ws tiles' 0.85-0.98x
on every weight: the fp32 workspace's round trip and the second launch cost more than the idle SMs.
"""

from __future__ import annotations

import argparse
import csv
import functools
import time

import torch

from tritongemm.core.config import MatmulConfig


def cfg(bm, bn, bk, warps, stages, group=8):
    return MatmulConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=group, num_warps=warps, num_stages=stages)


SMALL = {  # decode-sized M: enough programs along N to stream the weight from every SM
    "tl 64x32x256 w4 s3": ("fp8_grouped", cfg(64, 32, 256, 4, 3)),
    "tl 64x32x128 w4 s6": ("fp8_grouped", cfg(64, 32, 128, 4, 6)),
    "tl 64x64x128 w4 s4": ("fp8_grouped", cfg(64, 64, 128, 4, 4)),
    "tl 64x64x256 w4 s3": ("fp8_grouped", cfg(64, 64, 256, 4, 3)),
    "tl 64x128x128 w4 s4": ("fp8_grouped", cfg(64, 128, 128, 4, 4)),
    "tma 64x64x128 w4 s4": ("fp8_tma", cfg(64, 64, 128, 4, 4)),
    "ws 64x64x128 w4 s12": ("fp8_ws", cfg(64, 64, 128, 4, 12)),
    "ws 64x128x128 w4 s8": ("fp8_ws", cfg(64, 128, 128, 4, 8)),
    "ws 128x64x128 w8 s8": ("fp8_ws", cfg(128, 64, 128, 8, 8)),
    # 256 deep: half the K-steps (ring waits, MMA issues) for the same bytes in flight
    "ws 64x64x256 w4 s6": ("fp8_ws", cfg(64, 64, 256, 4, 6)),
    "ws 64x128x256 w4 s4": ("fp8_ws", cfg(64, 128, 256, 4, 4)),
    "ws 64x32x256 w4 s8": ("fp8_ws", cfg(64, 32, 256, 4, 8)),
    "ws 64x32x128 w4 s12": ("fp8_ws", cfg(64, 32, 128, 4, 12)),
    # fp8_swap_ab: BLOCK_M tokens x BLOCK_N weight rows (the dot's tall side)
    "swap 16x64x256 w4 s3": ("fp8_swap_ab", cfg(16, 64, 256, 4, 3)),
    "swap 16x32x256 w4 s4": ("fp8_swap_ab", cfg(16, 32, 256, 4, 4)),
    "swap 16x128x256 w4 s3": ("fp8_swap_ab", cfg(16, 128, 256, 4, 3)),
    "swap 16x64x512 w4 s3": ("fp8_swap_ab", cfg(16, 64, 512, 4, 3)),
    "swap 64x64x256 w4 s3": ("fp8_swap_ab", cfg(64, 64, 256, 4, 3)),
}
BLOCK_SMALL = {  # the block rung on one warpgroup, tiles narrow enough to give more SMs a tile
    "block-ws 64x64 w4 s10": ("fp8_block", cfg(64, 64, 128, 4, 10)),
    "block-ws 64x128 w4 s8": ("fp8_block", cfg(64, 128, 128, 4, 8)),
    "block-ws 128x64 w8 s8": ("fp8_block", cfg(128, 64, 128, 8, 8)),
}
LARGE = {
    "tl 128x256x128 w8 s3": ("fp8_grouped", cfg(128, 256, 128, 8, 3)),
    "tl 256x128x128 w8 s3": ("fp8_grouped", cfg(256, 128, 128, 8, 3)),
    "tl 128x256x64 w8 s4": ("fp8_grouped", cfg(128, 256, 64, 8, 4)),
    "tl 128x128x128 w4 s4": ("fp8_grouped", cfg(128, 128, 128, 4, 4)),
    "tma default": ("fp8_tma", None),
    "tma 128x256x128 w8 s3": ("fp8_tma", cfg(128, 256, 128, 8, 3)),
    "ws 128x256x128 w8 s4": ("fp8_ws", cfg(128, 256, 128, 8, 4)),
    "ws 128x256x128 w8 s4 g16": ("fp8_ws", cfg(128, 256, 128, 8, 4, group=16)),
    "ws 128x128x128 w8 s6": ("fp8_ws", cfg(128, 128, 128, 8, 6)),
    "pp 128x128x128 w4 s6": ("fp8_ws ping-pong", cfg(128, 128, 128, 4, 6)),
}
BLOCK = {  # fp8/block.py: block scales only; each half of BLOCK_N within a 128-wide scale block
    "block-ws 128x128 s5": ("fp8_block", cfg(128, 128, 128, 8, 5)),
    "block-ws 128x256 s4": ("fp8_block", cfg(128, 256, 128, 8, 4)),
    "block-ws 128x256 s3": ("fp8_block", cfg(128, 256, 128, 8, 3)),
    "block-ws 128x256 s4 g16": ("fp8_block", cfg(128, 256, 128, 8, 4, group=16)),
    "block-ws 128x256 s4 g4": ("fp8_block", cfg(128, 256, 128, 8, 4, group=4)),
}
# Rung 7's split-K (ladder/split_k.py) on fp8 operands, tensor-wise scales folded into its
# reduction's alpha (a probe only: the scales are read on the host): does splitting K beat the
# ws tiles at decode sizes? "S0" is split_plan's count, enough programs to fill the SMs.
SPLIT = {
    f"split {bm}x{bn}x128 w{w} s{st} S{s}": ("split_k", cfg(bm, bn, 128, w, st).with_(split_k=s))
    for bm, bn, w, st in ((128, 128, 8, 4), (64, 128, 4, 6), (128, 64, 8, 6), (64, 256, 4, 4))
    for s in (0, 2, 4, 8)
}
# fp8_block's two-warpgroup tiles with the warpgroups in one partition (as before 2026-11-26; the
# partition's barriers then make both promote at once) or in two (the default). scale_a laid out
# M-major (each K-step's column contiguous, as cuBLAS reads it) ran 0.94x torch's against 0.95x
# row-major (results/h100/probes/fp8/fp8-block-partitions.csv): not kept.
PARTITIONS = {
    f"block-ws 128x{n} s{stages} c{consumers}": ("fp8_block partitions", (cfg(128, n, 128, 8, stages), consumers))
    for n, stages in ((256, 4), (128, 5), (128, 6))
    for consumers in (1, 2)
}
# fp8/odd_width.py: one warpgroup's 64 rows by a power of two and a smaller one, so that a
# decode step's tiles fill a wave (64 x 96 cuts a 6144-row weight into 128 tiles at M = 128).
ODD = {
    f"odd 64x{n}x{k} w4 s{stages}": ("fp8_odd_width", cfg(64, n, k, 4, stages))
    for n, k, stages in ((96, 256, 5), (96, 256, 4), (96, 128, 8), (160, 256, 3), (160, 128, 6), (192, 128, 5))
}
# fp8_swap_ab's tiles at M = 16 with fewer weight rows a program (more programs pulling the weight
# at 4096 rows: 16 x 64 gives 64 programs for 132 SMs) or deeper K-steps.
SWAP = {
    f"swap 16x{n}x{k} w{w} s{stages}": ("fp8_swap_ab", cfg(16, n, k, w, stages))
    for n, k, w, stages in (
        (64, 512, 4, 3),
        (32, 512, 4, 3),
        (32, 512, 4, 4),
        (32, 1024, 4, 2),
        (32, 256, 4, 6),
        (32, 512, 2, 4),
        (64, 256, 4, 4),
        (64, 1024, 4, 2),
    )
}
# fp8_swap_ab under block scales: one 128-wide K block a step, so the ring's depth is its slots;
# beside the `tl` rung's and fp8_block's tiles (results/h100/probes/fp8/fp8-swap-block-m16.csv: auto
# takes 16 x 64 x 128 s8 at M <= 16, K <= 4096).
SWAP_BLOCK = {
    f"swap-block 16x{n}x128 w4 s{stages}": ("fp8_swap_ab", cfg(16, n, 128, 4, stages))
    for n, stages in ((64, 8), (64, 6), (64, 12), (32, 8), (32, 12), (128, 6))
}
BOTH = {"auto": ("auto", None)}
LLM = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
SHAPES = [(m, n, k) for (n, k) in LLM for m in (16, 128, 2048, 8192)] + [(8192, 8192, 8192)]


def main() -> None:
    from tritongemm import scaled_mm
    from tritongemm.bench.fp8 import Fp8Problem, _torch_scaled_mm, operands, torch_block_scales
    from tritongemm.bench.measure import check_then_time
    from tritongemm.core.reference import fp8_tolerance
    from tritongemm.fp8 import reference_scaled_mm

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--recipes", default="tensor,row,block")
    parser.add_argument("--min-m", type=int, default=0, help="only the shapes with M at least this")
    parser.add_argument("--max-m", type=int, default=1 << 30, help="only the shapes with M at most this")
    parser.add_argument("--split", action="store_true", help="auto, the ws tiles and rung 7's split-K only")
    parser.add_argument("--partitions", action="store_true", help="block scales: auto and fp8_block's partitions")
    parser.add_argument("--odd", action="store_true", help="auto, the ws tiles and the odd widths only")
    parser.add_argument("--swap", action="store_true", help="auto and fp8_swap_ab's tiles only (block: beside auto's)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved timing rounds (median of each's)")
    args = parser.parse_args()
    t0 = time.time()
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["recipe", "m", "n", "k", "candidate", "ms", "tflops", "ratio_to_torch", "rel_err", "status"])
        for recipe in args.recipes.split(","):
            for M, N, K in [shape for shape in SHAPES if args.min_m <= shape[0] <= args.max_m]:
                problem = Fp8Problem(recipe, M, N, K)
                a, b, sa, sb = operands(problem, "cuda")
                ref = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64)
                bound = fp8_tolerance(torch.bfloat16, K)
                calls = {}
                if recipe != "block":
                    for fast in (False, True):
                        calls[f"torch fast_accum={fast}"] = functools.partial(
                            torch._scaled_mm, a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast
                        )
                else:  # the block scales laid out as this torch takes them (bench fp8's), where it takes them
                    try:
                        given = torch_block_scales(a, b, sa, sb, ref, bound)
                        calls["torch fast_accum=False"] = functools.partial(_torch_scaled_mm, *given)
                    except Exception as exc:
                        print(f"torch refuses block scales at {M}x{N}x{K}: {exc}", flush=True)
                table = dict(BOTH, **(SMALL if M <= 128 else {}), **(LARGE if M >= 128 else {}))
                if args.split:
                    table = dict(BOTH, **SPLIT, **{k: v for k, v in SMALL.items() if k.startswith("ws")})
                if recipe == "block":  # the `tl` tiles ran at 130-250 TFLOP/s past M = 128 (probes/fp8/fp8-configs.csv)
                    small = {name: c for name, c in SMALL.items() if c[0] == "fp8_grouped"} if M <= 128 else {}
                    large = dict(**{"tma default": LARGE["tma default"]}, **BLOCK) if M >= 128 else {}
                    table = dict(BOTH, **small, **(BLOCK_SMALL if M <= 128 else {}), **large)
                if args.partitions:
                    table = dict(BOTH, **PARTITIONS)
                if args.swap:
                    table = dict(BOTH, **SWAP) if recipe != "block" else dict(table, **SWAP_BLOCK)
                if args.odd and recipe != "block":
                    ws = {k: v for k, v in {**SMALL, **LARGE}.items() if k.startswith("ws")}
                    table = dict(BOTH, **ws, **ODD)
                for name, (kernel, config) in table.items():
                    if kernel == "fp8_block partitions":
                        calls[name] = block_partitions(a, b, sa, sb, *config)
                        continue
                    if recipe == "block" and config is not None and config.BLOCK_K != 128:
                        continue
                    if kernel == "split_k":
                        if recipe == "tensor":
                            calls[name] = split_k_tensorwise(a, b, sa, sb, config)
                        continue
                    if kernel == "fp8_ws ping-pong":  # two consumers: no scaled_mm kernel name takes it yet
                        calls[name] = ping_pong(a, b, sa, sb, recipe, config)
                        continue
                    calls[name] = functools.partial(
                        scaled_mm, a, b, sa, sb, out_dtype=torch.bfloat16, kernel=kernel, config=config
                    )
                errors, results = check_then_time(calls, ref, bound, problem, timings=("graph",), rounds=args.rounds)
                torch_ms = results["graph"].get("torch fast_accum=False", (None,))[0]
                for name, (ms, status) in results["graph"].items():
                    tflops = problem.flops / ms / 1e9 if ms else None
                    ratio = torch_ms / ms if torch_ms and ms else None
                    writer.writerow([recipe, M, N, K, name, ms, tflops, ratio, errors[name], status])
                    f.flush()
                    print(f"[{time.time() - t0:4.0f}s] {recipe:6s} {M:5d}x{N}x{K} {name:28s} {(ms or 0):.4f} ms "
                          f"{(tflops or 0):7.1f} TF/s ratio {ratio or 0:.3f} {status}", flush=True)  # fmt: skip


def split_k_tensorwise(a, b, sa, sb, config):
    """Rung 7's split-K on fp8 operands with the tensor-wise scales as its reduction's alpha."""
    from tritongemm.core.epilogue import Epilogue
    from tritongemm.ladder import split_k
    from tritongemm.primitives.gluon.descriptors import Descriptors, descriptor

    def fp8_descriptors(a, b, c, BLOCK_M, BLOCK_N, BLOCK_K):  # make_descriptors' checks take 16-bit operands
        return Descriptors(descriptor(a, (BLOCK_M, BLOCK_K)), descriptor(b.T, (BLOCK_N, BLOCK_K)),
                           descriptor(c, (BLOCK_M, BLOCK_N)), a_m_major=False, b_k_major=True)  # fmt: skip

    split_k.make_descriptors = fp8_descriptors
    c = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device=a.device)
    run = split_k.plan(a, b, c, config, epilogue=Epilogue(alpha=float(sa.item() * sb.item())))

    def call():
        out = torch.empty_like(c)
        run(a, b, out)
        return out

    return call


def block_partitions(a, b, sa, sb, config, consumers):
    """scaled_mm on fp8_block's plan with `consumers` partitions."""
    from tritongemm.core.epilogue import PLAIN
    from tritongemm.fp8 import block as fp8_block

    sa, sb = sa.contiguous(), sb.contiguous()
    c = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device=a.device)
    run = fp8_block.plan(a, b, c, sa, sb, config, PLAIN, consumers=consumers)

    def call():
        out = torch.empty_like(c)
        run(a, b, out, sa, sb)
        return out

    return call


def ping_pong(a, b, sa, sb, recipe, config):
    """scaled_mm on fp8_ws's plan with two consumers (ping-pong), as a call like scaled_mm's."""
    from tritongemm.core.epilogue import PLAIN
    from tritongemm.fp8 import ws as fp8_ws

    c = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device=a.device)
    run = fp8_ws.plan(a, b, c, sa, sb.contiguous(), recipe, config, PLAIN, consumers=2)
    sb = sb.contiguous()

    def call():
        out = torch.empty_like(c)
        run(a, b, out, sa, sb)
        return out

    return call


if __name__ == "__main__":
    main()
