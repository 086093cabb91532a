"""The tools' commands: `tritongemm schedule`, `l2`, `explain` and `predict` (tritongemm/tools/),
each its options, the checks of them taken together, and its run.

Each tool models some rungs of the ladder (its KERNELS) and refuses the others by name, saying
why (its REFUSED): argparse's choices list the first, and the `kernel` type below says the second.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from tritongemm.cli.args import (
    comma_list,
    existing_dir,
    existing_file,
    integer,
    names,
    nonnegative_int,
    positive_float,
    positive_int,
    tile_size,
    tile_width,
)
from tritongemm.core.config import MatmulConfig
from tritongemm.ladder import odd_width
from tritongemm.primitives import tiling as tile_order
from tritongemm.tools import explain, l2, launch, ncu, predict, schedule


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    _ARGUMENTS[command](parser)


def check(args: argparse.Namespace) -> None:
    """Raise ValueError for arguments that argparse's types accept one by one but not together."""
    if args.command in _CHECKS:
        _CHECKS[args.command](args)


def run(args: argparse.Namespace) -> int:
    return _RUNS[args.command](args)


def kernel(refused: dict[str, str]):
    """A type: a kernel's name, but for a rung the tool refuses, the reason (choices= lists the rest)."""

    def parse(text: str) -> str:
        if text in refused:
            raise argparse.ArgumentTypeError(f"kernel {text!r} {refused[text]}")
        return text

    return parse


def kernel_list(kernels: tuple[str, ...], refused: dict[str, str]):
    """A type: comma-separated kernels of `kernels`; for a rung the tool refuses, the reason."""
    parse_names = names(kernels)

    def parse(text: str) -> tuple[str, ...]:
        for name in (t.strip() for t in text.split(",")):
            kernel(refused)(name)
        return parse_names(text)

    return parse


def _refused_help(refused: dict[str, str]) -> str:
    return f"not {', '.join(refused)}: a tile's K split across programs"


# ----------------------------------------------------------------------------------------------
# schedule
# ----------------------------------------------------------------------------------------------


def _schedule_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("M", type=positive_int)
    p.add_argument("N", type=positive_int)
    p.add_argument(
        "--kernel", default="grouped", type=kernel(schedule.REFUSED), choices=schedule.KERNELS,
        help=f"{_refused_help(schedule.REFUSED)}; swap_ab is drawn with K whole (split_k=1)",
    )  # fmt: skip
    p.add_argument(
        "--scheduler", default="grouped", choices=("grouped", "chunked"), help="the persistent Gluon rungs' tiles"
    )
    p.add_argument("--block-m", type=tile_size, help=f"default 128; odd_width: {odd_width.TILES[0].BLOCK_M}")
    p.add_argument(
        "--block-n", type=tile_width, help=f"default 128; 160 or 192: rung 13's odd widths (odd_width: "
        f"{odd_width.TILES[0].BLOCK_N})",
    )  # fmt: skip
    p.add_argument("--group-size-m", type=positive_int, default=8)
    p.add_argument("--sms", type=positive_int, default=launch.H100.num_sms, help="number of SMs (default: H100, 132)")
    p.add_argument("--programs-per-sm", type=positive_int, help="resident programs per SM (default: 1)")
    p.add_argument("--out", help="PNG path (default: schedule-KERNEL-MxN.png)")


def _schedule_config(args: argparse.Namespace) -> MatmulConfig:
    """The given tile, else 128 x 128, or rung 13's first tile for it; swap_ab's K whole."""
    default = odd_width.TILES[0] if args.kernel == "odd_width" else MatmulConfig()
    return MatmulConfig(
        BLOCK_M=args.block_m or default.BLOCK_M, BLOCK_N=args.block_n or default.BLOCK_N,
        GROUP_SIZE_M=args.group_size_m, scheduler=args.scheduler, split_k=1 if args.kernel == "swap_ab" else 0,
    )  # fmt: skip


def _check_schedule(args: argparse.Namespace) -> None:
    launch.check_config(args.kernel, _schedule_config(args))


def _run_schedule(args: argparse.Namespace) -> int:
    config = _schedule_config(args)
    planned = launch.plan(args.kernel, args.M, args.N, config, num_sms=args.sms, resident=args.programs_per_sm or 1)
    out = args.out or f"schedule-{args.kernel}-{args.M}x{args.N}.png"
    print(planned.describe())
    print(f"wrote {schedule.draw(planned, out)}")
    return 0


def _model_problem_arguments(p: argparse.ArgumentParser) -> None:
    """l2's and predict's problem and dtype; M N K are optional, as each can read its problems from
    files instead (l2 --ncu DIR, predict --calibrate/--compare CSV)."""
    for axis in "MNK":
        p.add_argument(axis, type=positive_int, nargs="?")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(launch.ITEMSIZE))


# ----------------------------------------------------------------------------------------------
# l2
# ----------------------------------------------------------------------------------------------


def _l2_arguments(p: argparse.ArgumentParser) -> None:
    _model_problem_arguments(p)
    p.add_argument(
        "--kernels", type=kernel_list(l2.KERNELS, l2.REFUSED),
        help=f"comma-separated, of {','.join(l2.KERNELS)} (default: all; with --block, all but odd_width); "
        f"{_refused_help(l2.REFUSED)}",
    )  # fmt: skip
    groups = comma_list(positive_int, "comma-separated integers >= 1, e.g. 1,4,8")
    p.add_argument("--group-sizes", type=groups, default=",".join(map(str, l2.GROUP_SIZES)))
    block = comma_list(tile_size, "BLOCK_M,BLOCK_N,BLOCK_K, e.g. 128,256,64", count=3)
    p.add_argument(
        "--block", type=block, help="BLOCK_M,BLOCK_N,BLOCK_K for every kernel (default: each kernel's H100's)"
    )
    p.add_argument("--sms", type=positive_int, default=launch.H100.num_sms)
    p.add_argument("--l2-mb", type=positive_float, default=launch.H100.l2_bytes / 2**20)
    p.add_argument("--plot", help="write the GROUP_SIZE_M plot here (PNG)")
    ncu_help = "instead: predicted vs measured table from scripts/ci/ncu-l2.sh logs"
    p.add_argument("--ncu", metavar="DIR", type=existing_dir, help=ncu_help)


def _l2_config(args: argparse.Namespace) -> MatmulConfig | None:
    if not args.block:
        return None
    bm, bn, bk = args.block
    return MatmulConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)


def _l2_kernels(args: argparse.Namespace) -> tuple[str, ...]:
    # --block's BLOCK_N is a power of two, which no tile of odd_width's is
    return args.kernels or tuple(k for k in l2.KERNELS if not (args.block and k == "odd_width"))


def _check_l2(args: argparse.Namespace) -> None:
    """Either M N K or --ncu DIR; --block a tile every kernel asked for computes."""
    sizes = [v for v in (args.M, args.N, args.K) if v is not None]
    if args.ncu and sizes:
        raise ValueError("l2: M N K do not apply with --ncu DIR, which reads the problems from the logs")
    if not args.ncu and len(sizes) < 3:
        raise ValueError(
            f"l2: expected M N K (three sizes, e.g. 4096 4096 4096) or --ncu DIR, but got {len(sizes)} size(s)"
        )
    if args.block:
        for name in _l2_kernels(args):
            launch.check_config(name, _l2_config(args))


def _run_l2(args: argparse.Namespace) -> int:
    l2_bytes = int(args.l2_mb * 2**20)
    if args.ncu:
        print(ncu.format_l2_table(ncu.compare(args.ncu, l2_bytes=l2_bytes)))
        return 0
    estimates = l2.sweep(
        _l2_kernels(args), args.M, args.N, args.K, args.group_sizes,
        dtype=args.dtype, config=_l2_config(args), num_sms=args.sms, l2_bytes=l2_bytes,
    )  # fmt: skip
    print(l2.format_table(estimates))
    if args.plot:
        print(f"wrote {l2.plot(estimates, args.plot)}")
    return 0


# ----------------------------------------------------------------------------------------------
# explain
# ----------------------------------------------------------------------------------------------


def _block(text: str) -> tuple[int, int, int]:
    """BLOCK_M,BLOCK_N,BLOCK_K: powers of two >= 16, BLOCK_N perhaps an odd width (rung 13's)."""
    m, n, k = comma_list(str, "BLOCK_M,BLOCK_N,BLOCK_K, e.g. 16,16,16", count=3)(text)
    return tile_size(m), tile_width(n), tile_size(k)


# The explained tiles without --block: small enough to print; rung 13's smallest odd width.
EXPLAIN_BLOCK = (16, 16, 16)
EXPLAIN_ODD_WIDTH_BLOCK = (16, 96, 16)


def _explain_arguments(p: argparse.ArgumentParser) -> None:
    strides_form = "stride_am,stride_ak,stride_bk,stride_bn,stride_cm,stride_cn"
    p.add_argument("M", type=positive_int)
    p.add_argument("N", type=positive_int)
    p.add_argument("K", type=positive_int)
    p.add_argument(
        "--kernel", default="naive", type=kernel(explain.REFUSED), choices=explain.KERNELS,
        help=f"{_refused_help(explain.REFUSED)}; swap_ab is explained with K whole (split_k=1)",
    )  # fmt: skip
    p.add_argument("--program", type=nonnegative_int, default=0, help="launch-order program id")
    p.add_argument("--step", type=nonnegative_int, help="persistent kernels: which of the program's tiles (default: 0)")
    p.add_argument(
        "--block", type=_block,
        help=f"BLOCK_M,BLOCK_N,BLOCK_K (default {','.join(map(str, EXPLAIN_BLOCK))}; odd_width: "
        f"{','.join(map(str, EXPLAIN_ODD_WIDTH_BLOCK))})",
    )  # fmt: skip
    p.add_argument("--group-size-m", type=positive_int, default=8)
    p.add_argument("--scheduler", default="grouped", choices=("grouped", "chunked"))
    p.add_argument("--layout", default="nn", choices=("nn", "tn", "nt", "tt"), help="contiguous operands' layout")
    strides = comma_list(integer, f"6 integers {strides_form}", count=6)
    p.add_argument("--strides", type=strides, help=f"instead of --layout: {strides_form}")
    p.add_argument("--sms", type=positive_int, default=launch.H100.num_sms, help="programs of a persistent kernel")
    p.add_argument("--all-steps", action="store_true", help="print the offsets of every K step, not first and last")


def _explain_config(args: argparse.Namespace) -> MatmulConfig:
    bm, bn, bk = args.block or (EXPLAIN_ODD_WIDTH_BLOCK if args.kernel == "odd_width" else EXPLAIN_BLOCK)
    return MatmulConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=args.group_size_m, scheduler=args.scheduler,
                        split_k=1 if args.kernel == "swap_ab" else 0)  # fmt: skip


def _check_explain(args: argparse.Namespace) -> None:
    """--block is a tile of the kernel's; --program and --step name a program of this launch and one of its tiles."""
    config = _explain_config(args)
    launch.check_config(args.kernel, config)
    ordering = launch.ordering_of(args.kernel, config.scheduler)
    num_pid_m, num_pid_n = tile_order.cdiv(args.M, config.BLOCK_M), tile_order.cdiv(args.N, config.BLOCK_N)
    s = tile_order.schedule(ordering, num_pid_m, num_pid_n, config.GROUP_SIZE_M, num_programs=args.sms)
    if args.program >= s.num_programs:
        raise ValueError(
            f"explain: --program: {args.kernel} launches programs 0..{s.num_programs - 1} for "
            f"{args.M}x{args.N} in {config.BLOCK_M}x{config.BLOCK_N} tiles, but got {args.program}"
        )
    tiles = int((s.program == args.program).sum())
    if args.step is not None and args.step >= tiles:
        steps = f", steps 0..{tiles - 1}" if tiles else ""
        raise ValueError(
            f"explain: --step: program {args.program} computes {tiles} tile(s){steps}, but got {args.step}"
        )


def _run_explain(args: argparse.Namespace) -> int:
    config = _explain_config(args)
    if args.strides:
        ops = explain.Operands(args.M, args.N, args.K, *args.strides)
    else:
        ops = explain.Operands.contiguous(args.M, args.N, args.K, args.layout)
    print(explain.format_explanation(args.kernel, ops, config, args.program, args.sms, args.step, args.all_steps))
    return 0


# ----------------------------------------------------------------------------------------------
# predict
# ----------------------------------------------------------------------------------------------


def _predict_arguments(p: argparse.ArgumentParser) -> None:
    _model_problem_arguments(p)
    p.add_argument(
        "--kernel", action="append", type=kernel(predict.REFUSED), choices=predict.PROVIDERS,
        help=f"repeatable (default: all and cuBLAS); {_refused_help(predict.REFUSED)}",
    )  # fmt: skip
    p.add_argument(
        "--constants",
        help=f"constants JSON, or 'defaults' for the uncalibrated ones (default: {predict.CONSTANTS_PATH.name} if "
        "present)",
    )
    csvs = dict(nargs="+", metavar="CSV", type=existing_file)
    p.add_argument("--calibrate", **csvs, help="fit the constants to benchmark CSVs and report")
    p.add_argument(
        "--write", help=f"with --calibrate: where to write the constants (default: {predict.CONSTANTS_PATH})"
    )
    p.add_argument("--dry-run", action="store_true", help="with --calibrate: report only, write nothing")
    p.add_argument("--compare", **csvs, help="predicted vs measured under the current constants")
    p.add_argument("--markdown", action="store_true", help="with --calibrate / --compare: tables in markdown")


def _check_predict(args: argparse.Namespace) -> None:
    """One of M N K, --calibrate CSV... and --compare CSV...; --write and --dry-run with --calibrate."""
    sizes = sum(v is not None for v in (args.M, args.N, args.K))
    modes = [
        m for m, given in (("M N K", sizes), ("--calibrate", args.calibrate), ("--compare", args.compare)) if given
    ]
    if len(modes) != 1 or 0 < sizes < 3:
        got = " and ".join(modes) if len(modes) > 1 else f"{sizes} size(s)" if modes == ["M N K"] else "none"
        raise ValueError(
            f"predict: expected one of M N K (three sizes, e.g. 4096 4096 4096), --calibrate CSV... or "
            f"--compare CSV..., but got {got}"
        )
    if args.calibrate is None and (args.write or args.dry_run):
        raise ValueError(f"predict: {'--write' if args.write else '--dry-run'} applies with --calibrate only")
    if args.constants and args.constants != "defaults" and not Path(args.constants).is_file():
        raise ValueError(
            f"predict: --constants {args.constants}: no such file; expected a constants JSON, or 'defaults' for "
            "the built-in uncalibrated constants"
        )
    csvs = args.calibrate or args.compare or []
    if csvs and not predict.read_measurements(csvs):
        raise ValueError(
            f"predict: {'--calibrate' if args.calibrate else '--compare'} found no timed rows (status ok, timing "
            f"graph, a known kernel) in {', '.join(map(str, csvs))}; give benchmark CSVs of `tritongemm bench`"
        )


def _run_predict(args: argparse.Namespace) -> int:
    if args.calibrate:
        rows = predict.read_measurements(args.calibrate)
        date = datetime.date.today().isoformat()
        csv_names = ", ".join(sorted({Path(p).name for p in args.calibrate}))
        constants = predict.calibrate(rows, source=f"calibrated {date} on {len(rows)} rows of {csv_names}")
        pairs = predict.compare(rows, constants)
        print(predict.format_comparison(pairs, args.markdown))
        print(f"\nlaunch {constants.launch_us} us; per kernel (efficiency, tile overhead us):")
        for key, value in sorted(constants.kernels.items()):
            print(f"  {key:<34} {value.efficiency:.3f}  {value.tile_overhead_us:.2f}")
        if not args.dry_run:
            out = Path(args.write) if args.write else predict.CONSTANTS_PATH
            out.write_text(constants.to_json())
            print(f"wrote {out}")
        return 0
    constants = predict.load_constants(args.constants)
    if args.compare:
        print(f"constants: {constants.source}\n")
        print(predict.format_comparison(predict.compare(predict.read_measurements(args.compare), constants),
                                        args.markdown))  # fmt: skip
        return 0
    kernels = args.kernel or list(predict.PROVIDERS)
    predictions = [predict.predict(k, args.M, args.N, args.K, args.dtype, constants=constants) for k in kernels]
    print(predict.format_predictions(predictions, constants))
    return 0


_ARGUMENTS = {
    "schedule": _schedule_arguments,
    "l2": _l2_arguments,
    "explain": _explain_arguments,
    "predict": _predict_arguments,
}
_CHECKS = {"schedule": _check_schedule, "l2": _check_l2, "explain": _check_explain, "predict": _check_predict}
_RUNS = {"schedule": _run_schedule, "l2": _run_l2, "explain": _run_explain, "predict": _run_predict}
