"""The workload scripts/ci/sanitize.sh runs under compute-sanitizer and Triton's ConSan: every kernel
(or the ones named) on boundary shapes and layouts, each result checked against an fp64
reference computed on the CPU (so that no cuBLAS kernel runs under the sanitizer). Prints one
line per kernel and exits 1 on a wrong result.

    PYTHONPATH=. python3 scripts/ci/sanitize_cases.py [--kernel NAME ...] [--consan]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import torch

import tritongemm
from tritongemm.core import registry
from tritongemm.core.config import MatmulConfig
from tritongemm.core.reference import fp8_tolerance, rel_error, tolerance

# Without a GPU (a check of this script, not of the kernels) it runs under the interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One under / at / over a 64-tile on each axis, a single row, a long thin K, primes.
SHAPES = ((1, 1, 1), (17, 33, 15), (64, 64, 64), (65, 129, 67), (127, 255, 129), (3, 5, 300), (1, 256, 200))
QUICK_SHAPES = ((17, 33, 15), (127, 255, 129), (3, 5, 300))
SMALL = MatmulConfig(32, 32, 32, GROUP_SIZE_M=2, num_warps=4, num_stages=3)
GLUON_SMALL = MatmulConfig(64, 64, 64, GROUP_SIZE_M=2, num_warps=4, num_stages=3)


def half_c_staging(kernel: str) -> tuple[MatmulConfig, ...]:
    """The warp-specialized rungs' short-K defaults, whose C goes out in halves through one buffer
    (tma_warp_specialized.c_pieces): a buffer reused between the halves and from tile to tile.
    (Imported here, not at the top: hopper decorates the ladder's kernels, which must wait for
    TRITON_INTERPRET, set above without a GPU.)"""
    from tritongemm.dispatch import tiles as hopper

    configs = {
        "tma_warp_specialized": hopper.WARP_SPECIALIZED_SHORT_K_TILE,
        "tma_ping_pong": hopper.MID_TILE.with_(num_stages=hopper.PING_PONG_SHORT_K_STAGES),
    }
    return (configs[kernel],) if kernel in configs else ()


def operand(rows: int, cols: int, dtype, layout: str, gen) -> torch.Tensor:
    """ "nt": b as the .T of an (N, K) tensor; "offset": rows padded by 5 and a 3-element offset
    (misaligned for TMA, so the Gluon rungs take their copy path)."""
    values = torch.randn(rows, cols, generator=gen).to(dtype)
    if layout == "offset":
        storage = torch.empty(3 + rows * (cols + 5), dtype=dtype, device=DEVICE)
        view = storage.as_strided((rows, cols), (cols + 5, 1), 3)
        return view.copy_(values)
    return values.to(DEVICE)


def check(kernel: str, a, b, config, launch=None) -> str | None:
    """None if right, else a description of what went wrong."""
    M, N = a.shape[0], b.shape[1]
    if launch is None:
        out = torch.full((M, N), float("nan"), dtype=a.dtype, device=DEVICE)
        tritongemm.matmul(a, b, out=out, kernel=kernel, config=config)
    else:
        out = launch()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    err = rel_error(out.cpu(), a.cpu().double() @ b.cpu().double())
    bound = tolerance(a.dtype, a.shape[1])
    if err <= bound:
        return None
    label = config.short() if config else "default"
    return f"{kernel} {M}x{N}x{a.shape[1]} {a.dtype} {label}: relative error {err:.3e} > {bound:.3e}"


def launch_on_few_programs(info: registry.KernelInfo, a, b, c, config) -> torch.Tensor:
    info.implementation().launch(a, b, c, config, num_programs=3, **dict(info.options))  # ping-pong: consumers=2
    return c


def cases(kernel: str, info: registry.KernelInfo, quick: bool):
    """(a, b, config, launch) tuples for one kernel; `quick`: fp16, 3 shapes, one layout."""
    gen = torch.Generator().manual_seed(0)
    gluon = not info.interpretable
    dtypes = (torch.float16, torch.bfloat16) if gluon else (torch.float16, torch.float32)
    small = GLUON_SMALL if gluon else SMALL
    if kernel == "odd_width":  # its tiles only: 64 rows, 160 or 192 columns
        from tritongemm.ladder import odd_width

        small = odd_width.TILES[-1]
    for dtype in dtypes[:1] if quick else dtypes:
        for M, N, K in QUICK_SHAPES if quick else SHAPES:
            for layout in ("nt",) if quick else ("nt", "offset"):
                a = operand(M, K, dtype, layout, gen)
                b = operand(N, K, dtype, "nn", gen).T if layout == "nt" else operand(K, N, dtype, layout, gen)
                for config in (None, small):
                    yield a, b, config, None
    if kernel == "swap_ab":  # K split: partials in the workspace, then the reduction
        for M, N, K in ((3, 100, 700), (17, 33, 1000)):
            a = operand(M, K, torch.float16, "nt", gen)
            b = operand(N, K, torch.float16, "nn", gen).T
            yield a, b, SMALL.with_(split_k=3), None
    if kernel == "split_k":  # three splits a tile: partials in the workspace, then the reduction
        for M, N in ((3, 100), (65, 129)):
            a = operand(M, 1000, torch.float16, "nt", gen)
            b = operand(N, 1000, torch.float16, "nn", gen).T
            yield a, b, GLUON_SMALL.with_(split_k=3), None
    if kernel in ("tma_pipelined", "tma_persistent", "tma_persistent_pipelined"):
        # Rung 6's rules' deeper rings (tune tries them on all three), over a K of two rings and more.
        from tritongemm.dispatch.tiles import DEEP_RING_STAGES

        a = operand(300, 1100, torch.float16, "nn", gen)
        b = operand(500, 1100, torch.float16, "nn", gen).T
        a_, b_, c = info.plan_operands(a, b, None, a.dtype)(a, b, None)
        for tile, stages in DEEP_RING_STAGES.items():
            config = tile.with_(num_stages=stages)
            yield a, b, config, None
            if kernel != "tma_pipelined":
                yield a, b, config, functools.partial(launch_on_few_programs, info, a_, b_, c, config)
    if kernel in ("tma_persistent", "tma_persistent_pipelined", "tma_warp_specialized", "tma_ping_pong", "odd_width"):
        # Several tiles per program: the cross-tile pipeline and barrier phases over many laps.
        configs = (GLUON_SMALL, GLUON_SMALL.with_(scheduler="chunked", GROUP_SIZE_M=1))
        if kernel == "odd_width":  # each tile; N = 500 cuts the last tile in its main part, its tail past N
            configs = odd_width.TILES
        for config in configs + half_c_staging(kernel):
            a = operand(300, 700, torch.float16, "nn", gen)
            b = operand(500, 700, torch.float16, "nn", gen).T
            a_, b_, c = info.plan_operands(a, b, None, a.dtype)(a, b, None)
            yield a, b, config, functools.partial(launch_on_few_programs, info, a_, b_, c, config)


# The fp8 kernels (tritongemm.fp8), run through scaled_mm after quantize_fp8 (whose kernels run too);
# the `tl` ones (the grouped rung; the swapped tile, decode's, block scales included) on every GPU,
# the Gluon ones on Hopper only: fp8_block with block scales only, fp8_ws and fp8_odd_width with
# tensor- and row-wise scales only.
PORTABLE_FP8 = ("fp8_grouped", "fp8_swap_ab")
FP8_KERNELS = (*PORTABLE_FP8, "fp8_tma", "fp8_block", "fp8_ws", "fp8_odd_width")
FP8_RECIPES = {"fp8_block": ("block",), "fp8_ws": ("tensor", "row"), "fp8_odd_width": ("tensor", "row")}
FP8_SHAPES = ((1, 8, 128), (17, 40, 256), (130, 136, 384))


def fp8_cases(kernel: str, quick: bool):
    """(label, run) pairs: run() -> None if right, else what went wrong; every recipe on boundary
    shapes, checked against the fp64 product of the dequantized operands (on the CPU)."""
    from tritongemm.fp8 import quantize_fp8, reference_scaled_mm, scaled_mm

    gen = torch.Generator().manual_seed(0)
    for M, N, K in FP8_SHAPES[1:2] if quick else FP8_SHAPES:
        for recipe in FP8_RECIPES.get(kernel, ("tensor", "row", "block")):
            x = torch.randn(M, K, generator=gen).to(DEVICE)
            w = (torch.randn(N, K, generator=gen) * K**-0.5).to(DEVICE)
            a, sa = quantize_fp8(x, recipe)
            if recipe == "block":
                wq, sb = quantize_fp8(w, "block", block=(128, 128))
            else:
                wq, sb = quantize_fp8(w, recipe)
                sb = sb.T if recipe == "row" else sb

            def run(a=a, b=wq.T, sa=sa, sb=sb, shape=(M, N, K), recipe=recipe):
                y = scaled_mm(a, b, sa, sb, kernel=kernel)
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                cpu = [t.cpu() for t in (a, b, sa, sb)]
                err = rel_error(y.cpu(), reference_scaled_mm(*cpu, out_dtype=torch.float64))
                bound = fp8_tolerance(torch.bfloat16, shape[2])
                return None if err <= bound else f"{kernel} {recipe} {shape}: relative error {err:.3e} > {bound:.3e}"

            yield run


# The grouped kernels (tritongemm.grouped): ragged row groups with an empty one, a one-row one, a
# tail past the last; the gated pair; K groups, on the `tl` kernel and, in the weight gradient's
# layout with 130 rows a group (on Hopper), on grouped_k_ws; a batched matmul. Checked on the CPU.
GROUPED = "grouped_mm"


def grouped_cases(quick: bool):
    """(run) callables as fp8_cases gives: each grouped_mm form on boundary sizes, fp16."""
    from tritongemm.grouped import reference_grouped_mm

    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(torch.float16)

    def ends(sizes):
        return torch.tensor(sizes).cumsum(0).to(torch.int32)

    row_sizes = [0, 17, 1, 64, 130]
    problems = [  # (a, b, offs, glu)
        (rand(sum(row_sizes) + 5, 72), rand(len(row_sizes), 72, 40), ends(row_sizes), None),
        (rand(sum(row_sizes), 72), rand(len(row_sizes), 72, 48), ends(row_sizes), "silu"),
        (rand(17, 40), rand(40, 24), ends([0, 33, 7]), None),
        (rand(390, 40).T, rand(390, 24), ends([200, 0, 190]), None),
        (rand(3, 9, 24), rand(3, 24, 20), None, None),
    ]
    for a, b, offs, glu in problems[1:2] if quick else problems:

        def run(a=a, b=b, offs=offs, glu=glu):
            moved = [None if t is None else t.to(DEVICE) for t in (a, b, offs)]
            y = tritongemm.grouped_mm(*moved, glu=glu) if a.dim() == 2 else tritongemm.bmm(*moved[:2])
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            err = rel_error(y.cpu(), reference_grouped_mm(a, b, offs, glu=glu).double())
            bound = tolerance(torch.float16, a.shape[-1])
            return None if err <= bound else f"{GROUPED} {tuple(a.shape)} x {tuple(b.shape)} glu={glu}: {err:.3e}"

        yield run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", help="run these kernels only (default: all available)")
    parser.add_argument("--consan", action="store_true", help="give Triton the scratch allocator ConSan needs")
    parser.add_argument("--quick", action="store_true", help="fp16, 3 shapes, one layout (for the slow tools)")
    args = parser.parse_args()
    if args.consan:
        import triton

        # ConSan keeps its race-tracking state in global scratch memory that Triton asks for.
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device=DEVICE, dtype=torch.int8))

    # An experimental kernel (not yet run on a GPU; it might hang) only when named.
    names = args.kernel or [
        k["name"] for k in tritongemm.kernels(family="matmul") if k["available"] and not k["experimental"]
    ]
    hopper = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    names += [] if args.kernel else [*(FP8_KERNELS if hopper else PORTABLE_FP8), GROUPED]
    failures = []
    for name in names:
        start, count, bad = time.perf_counter(), 0, []
        if name in FP8_KERNELS:
            runs = fp8_cases(name, args.quick)
        elif name == GROUPED:
            runs = grouped_cases(args.quick)
        else:
            runs = (functools.partial(check, name, *case) for case in cases(name, registry.get(name), args.quick))
        for run in runs:
            problem = run()
            count += 1
            if problem:
                bad.append(problem)
        print(f"{name}: {count} launches, {len(bad)} wrong, {time.perf_counter() - start:.1f} s", flush=True)
        for problem in bad:
            print("  " + problem)
        failures += bad
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
