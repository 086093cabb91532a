"""`tritongemm bench`: the suites and --shapes, their options, the checks of the options taken
together, and the run; --markdown prints a results CSV instead."""

from __future__ import annotations

import argparse
import csv

import torch

from tritongemm import bench
from tritongemm.bench import decode, epilogue, fp8, grouped, mlp, model, overhead, report, tp, train
from tritongemm.bench.measure import TIMINGS
from tritongemm.bench.suites import LAYOUTS, SUITES
from tritongemm.cli.args import (
    comma_list,
    config_labels,
    dtypes,
    existing_file,
    kernel_names,
    names,
    positive_int,
    shapes,
)
from tritongemm.core import registry

# Suites with their own module, problems and columns, beside bench.suites.SUITES.
OWN_SUITES = ["overhead", "epilogue", "model", "decode", "train", "fp8", "grouped", "mlp", "tp"]
# Which of bench's options each of those takes (--out-dir and --no-plot: all).
OWN_SUITE_OPTIONS = {
    "overhead": ("kernels",),
    "epilogue": ("shapes", "dtypes", "timing", "name"),
    "model": ("layers", "models", "phases", "providers", "name"),
    "decode": ("models", "providers", "batches", "name"),
    "train": ("layers", "models", "providers", "name"),
    "fp8": ("shapes", "kernels", "timing", "name"),
    "grouped": ("timing", "name"),
    "mlp": ("timing", "name"),
    "tp": ("timing", "name", "profile"),
}
BENCH_OPTIONS = ("shapes", "dtypes", "kernels", "layout", "name", "timing", "profile", "layers", "models", "phases",
                 "providers", "batches")  # fmt: skip
MODEL_ONLY_OPTIONS = ("layers", "models", "phases", "providers")


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument(
        "suite", nargs="?", choices=sorted(SUITES) + OWN_SUITES,
        help="a named suite; overhead: host cost of one eager call on launch-bound problems (matmul, linear, "
        "nn.Linear), vs torch's counterpart of each; "
        "epilogue: tritongemm.linear's fused bias+activation/residual vs F.linear + torch and torch.compile; "
        "model: Llama-3-8B's, Qwen2-7B's and Pythia-1.4B's layers in prefill, generate and a training step, "
        "with tritongemm.patch vs torch, eager and compiled (CUDA GPU, transformers); "
        "decode: an 8-layer Llama-3-8B / Qwen2-7B decode step on a static KV cache, captured in a CUDA graph, "
        "at 1-256 sequences, torch vs tritongemm (plain, fused, fp8 row and block) (transformers); "
        "train: a 4-layer Llama-3-8B-shaped model's training step on 2 x 2048 tokens, bf16 vs "
        "patch(fp8_training=...) per recipe vs torchao.float8, eager and compiled (transformers); "
        "fp8: scaled_mm vs torch._scaled_mm per scaling recipe (tensor, row, block); "
        "grouped: grouped_mm vs torch._grouped_mm and a torch.mm loop on MoE layers' expert GEMMs; "
        "mlp: the gated MLP block as tritongemm.blocks.GatedMLP vs the unfused torch block and torch.compile of it; "
        "tp: tensor-parallel GEMMs on every GPU here, all_gather_matmul and matmul_reduce_scatter overlapped vs "
        "sequential vs torch's symm_mem ops (--profile: a timeline of one call instead)",
    )  # fmt: skip
    parser.add_argument(
        "--shapes", type=shapes,
        help=f"instead of a suite: 'M,N,K;M,N,K;...' (without a GPU: M*N*K <= {bench.CPU_MAX_VOLUME}, for the "
        "interpreter)",
    )  # fmt: skip
    parser.add_argument("--dtypes", type=dtypes, help="e.g. float16,bfloat16 (default: the suite's, or both)")
    parser.add_argument(
        "--kernels", type=kernel_names,
        help="e.g. grouped,persistent (default: all available); bench fp8: fp8 kernels to time by name beside "
        "scaled_mm's own choice, e.g. fp8_tma,fp8_ws, and auto:batch_invariant for its invariant mode",
    )  # fmt: skip
    parser.add_argument("--layout", choices=LAYOUTS, help="with --shapes: n = as is, t = transposed view (default nn)")
    parser.add_argument(
        "--out-dir",
        help="where the CSV, JSON and PNG go (default: results; without a GPU, bench epilogue writes only if given)",
    )
    parser.add_argument("--name", help="base name of the result files (default: the suite's, plus -eager if eager)")
    parser.add_argument(
        "--timing", choices=TIMINGS,
        help="graph: the kernel alone (default); eager: back-to-back calls without out=, host time included",
    )  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="run each kernel once, untimed, for ncu")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--configs", type=config_labels, help="'128x256x64 g8 w8 s3;...': run every kernel with each of these"
    )
    parser.add_argument("--layers", type=int, choices=model.LAYERS,
                        help=f"bench model: decoder layers (default 2); bench train: ({train.LAYERS})")  # fmt: skip
    both = "; bench decode: some of {} (its default)"
    parser.add_argument("--models", type=names(list(model.FAMILIES)),
                        help=f"bench model: some of {','.join(model.FAMILIES)} (default all)"
                        + both.format(",".join(decode.MODELS)))  # fmt: skip
    parser.add_argument("--phases", type=names(list(model.PHASES)),
                        help=f"bench model: some of {','.join(model.PHASES)} (default all)")  # fmt: skip
    parser.add_argument("--providers", type=names(list(dict.fromkeys([*model.PROVIDERS, *decode.PROVIDERS,
                                                                      *train.PROVIDERS]))),
                        help=f"bench model: some of {','.join(model.PROVIDERS)} (default all)"
                        + both.format(",".join(decode.PROVIDERS)))  # fmt: skip
    parser.add_argument("--batches", type=comma_list(positive_int, "comma-separated integers >= 1, e.g. 1,8,32"),
                        help="bench decode: the sequences in flight (default "
                        f"{','.join(map(str, decode.BATCHES))}); a few a run split a long suite")  # fmt: skip
    parser.add_argument(
        "--markdown", metavar="CSV", type=existing_file, help="print a results CSV as markdown, and stop"
    )


def check(args: argparse.Namespace) -> None:
    """What argparse can't check alone: arguments that exclude or need each other, and values that
    depend on others. Raises ValueError or TypeError; runs nothing."""
    if args.markdown:
        _check_markdown_source(args.markdown)
        return
    if args.suite is None and args.shapes is None:
        raise ValueError(f"bench: expected a suite ({', '.join(sorted(SUITES) + OWN_SUITES)}) or --shapes 'M,N,K;...'")
    if args.suite in OWN_SUITES:
        takes = OWN_SUITE_OPTIONS[args.suite]
        given = [f"--{k}" for k in BENCH_OPTIONS if getattr(args, k) and k not in takes]
        if given:
            raise ValueError(
                f"bench {args.suite}: {', '.join(given)} does not apply: this suite takes "
                f"{', '.join('--' + k for k in takes)}, --out-dir and --no-plot"
            )
        _check_kernel_family(args.suite, args.kernels or ())
        if args.suite == "epilogue":
            epilogue.plan_problems(args.shapes, args.dtypes, on_gpu=torch.cuda.is_available())
        if args.suite == "model":
            model.check_arguments(**_model_arguments(args))
            problem = model.requirements_error()
            if problem:
                raise ValueError(problem)
        if args.suite == "train":
            train.check_arguments(**_train_arguments(args))
            problem = train.requirements_error()
            if problem:
                raise ValueError(problem)
        if args.suite == "decode":
            decode.check_arguments(**_decode_arguments(args))
            problem = decode.requirements_error()
            if problem:
                raise ValueError(problem)
        return
    given = [f"--{k}" for k in MODEL_ONLY_OPTIONS if getattr(args, k)]
    if given:
        raise ValueError(f"bench: {given[0]} applies to bench model (and --models, --providers to bench decode) only")
    if args.layout and args.shapes is None:
        raise ValueError(f"bench: --layout {args.layout} applies to --shapes only: a suite's problems have their own")
    _check_kernel_family(args.suite, args.kernels or ())
    bench.check_arguments(args.suite, **_problem_arguments(args))


def _check_kernel_family(suite: str | None, kernels: tuple[str, ...]) -> None:
    """bench fp8 times scaled_mm's kernels, the others matmul's: a name of the other family is a mistake."""
    family = "scaled_mm" if suite == "fp8" else "matmul"
    theirs = [k.name for k in registry.all_kernels(family)]
    wrong = [k for k in kernels if k not in registry.POLICIES and k not in theirs]
    if wrong:
        raise ValueError(
            f"bench {suite or '--shapes'}: --kernels {wrong[0]} is not a {family} kernel: expected names from "
            f"{', '.join(theirs)}"
        )


def _check_markdown_source(path) -> None:
    """--markdown pivots a GEMM suite's rows (kernels in columns): say so for another suite's CSV
    (tp, model, fp8 ...), whose rows have other columns, rather than fail on a missing one."""
    with open(path, newline="") as f:
        columns = next(csv.reader(f), [])
    missing = [c for c in report.MARKDOWN_COLUMNS if c not in columns]
    if missing:
        raise ValueError(
            f"--markdown reads a GEMM suite's CSV (columns {', '.join(report.MARKDOWN_COLUMNS)}), but {path} lacks "
            f"{', '.join(missing)}: its columns are {', '.join(columns) or 'none'}"
        )


def _problem_arguments(args: argparse.Namespace) -> dict:
    """What `bench` measures, as run_bench and check_arguments take it."""
    return dict(
        shapes=args.shapes,
        dtypes=args.dtypes,
        kernels=args.kernels,
        layout=args.layout or "nn",
        timing=args.timing or "graph",
    )


def _model_arguments(args: argparse.Namespace) -> dict:
    """What `bench model` measures, as run_model and its check_arguments take it."""
    return dict(
        families=args.models or tuple(model.FAMILIES),
        phases=args.phases or model.PHASES,
        providers=args.providers or model.PROVIDERS,
        layers=args.layers or 2,
    )


def _train_arguments(args: argparse.Namespace) -> dict:
    """What `bench train` measures, as run_train and its check_arguments take it."""
    return dict(families=args.models or train.FAMILIES_DEFAULT, providers=args.providers or train.PROVIDERS,
                layers=args.layers or train.LAYERS)  # fmt: skip


def _decode_arguments(args: argparse.Namespace) -> dict:
    """What `bench decode` measures, as run_decode and its check_arguments take it."""
    return dict(models=args.models or decode.MODELS, providers=args.providers or tuple(decode.PROVIDERS),
                batches=args.batches)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        print(report.markdown_pivot(report.read_rows(args.markdown)))
        return 0
    timings = (args.timing,) if args.timing else TIMINGS
    # Without a GPU the own suites' runs are smoke runs: their files only where asked for.
    out_dir = args.out_dir or ("results" if torch.cuda.is_available() else None)
    if args.suite == "overhead":
        overhead.run_overhead(kernels=args.kernels, out_dir=args.out_dir or "results", plot=not args.no_plot)
    elif args.suite == "epilogue":
        epilogue.run_epilogue(shapes=args.shapes, dtypes=args.dtypes, timings=timings, out_dir=out_dir,
                              name=args.name, plot=not args.no_plot)  # fmt: skip
        if out_dir is None:
            print("No files written (without a GPU, only where --out-dir is given).")
    elif args.suite == "fp8":
        fp8.run_fp8(shapes=args.shapes, kernels=args.kernels or (), timings=timings, out_dir=out_dir, name=args.name,
                    plot=not args.no_plot)  # fmt: skip
    elif args.suite == "grouped":
        grouped.run_grouped(timings=timings, out_dir=out_dir, name=args.name)
    elif args.suite == "mlp":
        mlp.run_mlp(timings=timings, out_dir=out_dir, name=args.name)
    elif args.suite == "tp":
        # with fewer GPUs than two: files only where asked for
        out_dir = args.out_dir or ("results" if torch.cuda.device_count() >= 2 else None)
        tp_timings = (args.timing,) if args.timing else tp.TIMINGS
        tp.run_tp(timings=tp_timings, out_dir=out_dir, name=args.name, profile=args.profile,
                  plot=not args.no_plot)  # fmt: skip
    elif args.suite == "decode":
        decode.run_decode(**_decode_arguments(args), out_dir=out_dir, name=args.name, plot=not args.no_plot)
    elif args.suite == "train":
        train.run_train(**_train_arguments(args), out_dir=args.out_dir or "results", name=args.name or "train",
                        plot=not args.no_plot)  # fmt: skip
    elif args.suite == "model":
        model.run_model(**_model_arguments(args), out_dir=args.out_dir or "results", name=args.name or "model",
                        plot=not args.no_plot)  # fmt: skip
    else:
        bench.run_bench(args.suite, **_problem_arguments(args), configs=args.configs, out_dir=args.out_dir or "results",
                        name=args.name, profile=args.profile, plot=not args.no_plot)  # fmt: skip
    return 0
