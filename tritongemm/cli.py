"""The `tritongemm` command: demo, bench, kernels, and the tools (schedule, l2, explain, predict).

A mistake in the arguments gets one line on stderr, naming the argument and the form it expects,
and exit status 2: argparse's checks and the `type=` functions below while parsing, then each
command's checks of its arguments taken together, before any work starts. An error during the
work is not a mistake in the arguments and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

# Suites with their own module, problems and columns, beside bench.suites.SUITES.
OWN_SUITES = ["overhead", "epilogue", "model", "fp8", "grouped", "mlp", "tp"]
# Which of bench's options each of those takes (--out-dir and --no-plot: all).
OWN_SUITE_OPTIONS = {
    "overhead": ("kernels",),
    "epilogue": ("shapes", "dtypes", "timing", "name"),
    "model": ("layers", "models", "phases", "providers", "name"),
    "fp8": ("shapes", "timing", "name"),
    "grouped": ("timing", "name"),
    "mlp": ("timing", "name"),
    "tp": ("timing", "name", "profile"),
}
BENCH_OPTIONS = ("shapes", "dtypes", "kernels", "layout", "name", "timing", "profile", "layers", "models", "phases",
                 "providers")  # fmt: skip
MODEL_ONLY_OPTIONS = ("layers", "models", "phases", "providers")
DTYPE_SPELLINGS = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32"}


def main(argv: list[str] | None = None) -> int:
    from tritongemm.bench import use_interpreter_without_gpu

    use_interpreter_without_gpu()  # before anything imports the kernels: --kernels' check does
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
        return _usage_error(str(exc))
    try:
        _check(args)
    except (ValueError, TypeError) as exc:  # from the checks alone: nothing has run yet
        return _usage_error(f"tritongemm: error: {exc}")
    return _run(args)


def _check_markdown_source(path) -> None:
    """--markdown pivots a GEMM suite's rows (kernels in columns): say so for another suite's CSV
    (tp, model, fp8 ...), whose rows have other columns, rather than fail on a missing one."""
    import csv

    from tritongemm.bench.report import MARKDOWN_COLUMNS

    with open(path, newline="") as f:
        columns = next(csv.reader(f), [])
    missing = [c for c in MARKDOWN_COLUMNS if c not in columns]
    if missing:
        raise ValueError(
            f"--markdown reads a GEMM suite's CSV (columns {', '.join(MARKDOWN_COLUMNS)}), but {path} lacks "
            f"{', '.join(missing)}: its columns are {', '.join(columns) or 'none'}"
        )


def _parser() -> argparse.ArgumentParser:
    from tritongemm import tools
    from tritongemm.bench import CPU_MAX_VOLUME
    from tritongemm.bench.measure import TIMINGS
    from tritongemm.bench.model import FAMILIES, LAYERS, PHASES, PROVIDERS
    from tritongemm.bench.suites import LAYOUTS, SUITES

    parser = _Parser(prog="tritongemm", description="GEMM kernels in Triton and Gluon.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo_help = "run every available kernel on a real problem, check it and time it vs torch.matmul (cuBLAS on a GPU)"
    commands.add_parser("demo", help=demo_help)
    listing = commands.add_parser("kernels", help="list the kernels of the ladder and where they run")
    listing.add_argument("--json", action="store_true", help="the list as JSON, for programs")

    bench = commands.add_parser("bench", help="benchmark kernels against cuBLAS (tables, CSV/JSON, plots)")
    bench.add_argument(
        "suite", nargs="?", choices=sorted(SUITES) + OWN_SUITES,
        help="a named suite; overhead: host cost of one eager call on launch-bound problems (matmul, linear, "
        "nn.Linear), vs torch's counterpart of each; "
        "epilogue: tritongemm.linear's fused bias+activation/residual vs F.linear + torch and torch.compile; "
        "model: Llama-3-8B's, Qwen2-7B's and Pythia-1.4B's layers in prefill, generate and a training step, "
        "with tritongemm.patch vs torch, eager and compiled (CUDA GPU, transformers); "
        "fp8: scaled_mm vs torch._scaled_mm per scaling recipe (tensor, row, block); "
        "grouped: grouped_mm vs torch._grouped_mm and a torch.mm loop on MoE layers' expert GEMMs; "
        "mlp: the gated MLP block as tritongemm.blocks.GatedMLP vs the unfused torch block and torch.compile of it; "
        "tp: tensor-parallel GEMMs on every GPU here, all_gather_matmul and matmul_reduce_scatter overlapped vs "
        "sequential vs torch's symm_mem ops (--profile: a timeline of one call instead)",
    )  # fmt: skip
    bench.add_argument(
        "--shapes", type=shapes,
        help=f"instead of a suite: 'M,N,K;M,N,K;...' (without a GPU: M*N*K <= {CPU_MAX_VOLUME}, for the interpreter)",
    )  # fmt: skip
    bench.add_argument("--dtypes", type=dtypes, help="e.g. float16,bfloat16 (default: the suite's, or both)")
    bench.add_argument("--kernels", type=kernel_names, help="e.g. grouped,persistent (default: all available)")
    bench.add_argument("--layout", choices=LAYOUTS, help="with --shapes: n = as is, t = transposed view (default nn)")
    bench.add_argument(
        "--out-dir",
        help="where the CSV, JSON and PNG go (default: results; without a GPU, bench epilogue writes only if given)",
    )
    bench.add_argument("--name", help="base name of the result files (default: the suite's, plus -eager if eager)")
    bench.add_argument(
        "--timing", choices=TIMINGS,
        help="graph: the kernel alone (default); eager: back-to-back calls without out=, host time included",
    )  # fmt: skip
    bench.add_argument("--profile", action="store_true", help="run each kernel once, untimed, for ncu")
    bench.add_argument("--no-plot", action="store_true")
    bench.add_argument(
        "--configs", type=config_labels, help="'128x256x64 g8 w8 s3;...': run every kernel with each of these"
    )
    bench.add_argument("--layers", type=int, choices=LAYERS, help="bench model: decoder layers (default 2)")
    for option, choices in (("--models", FAMILIES), ("--phases", PHASES), ("--providers", PROVIDERS)):
        model_help = f"bench model: some of {','.join(choices)} (default all)"
        bench.add_argument(option, type=names(list(choices)), help=model_help)
    bench.add_argument(
        "--markdown", metavar="CSV", type=existing_file, help="print a results CSV as markdown, and stop"
    )

    tools.add_commands(commands)
    from tritongemm.dispatch import tune

    tune.add_commands(commands)
    return parser


def _check(args: argparse.Namespace) -> None:
    """What argparse can't check alone: arguments that exclude or need each other, and values that
    depend on others. Raises ValueError or TypeError; runs nothing."""
    from tritongemm import tools

    if args.command in tools.COMMANDS:
        tools.check(args)
    if args.command == "bench" and args.markdown:
        _check_markdown_source(args.markdown)
    if args.command != "bench" or args.markdown:
        return
    from tritongemm.bench import check_arguments
    from tritongemm.bench.suites import SUITES

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
        if args.suite == "epilogue":
            from tritongemm.bench.epilogue import plan_problems

            plan_problems(args.shapes, args.dtypes, on_gpu=_on_gpu())
        if args.suite == "model":
            from tritongemm.bench import model

            model.check_arguments(**_model_arguments(args))
            problem = model.requirements_error()
            if problem:
                raise ValueError(problem)
        return
    given = [f"--{k}" for k in MODEL_ONLY_OPTIONS if getattr(args, k)]
    if given:
        raise ValueError(f"bench: {given[0]} applies to bench model only")
    if args.layout and args.shapes is None:
        raise ValueError(f"bench: --layout {args.layout} applies to --shapes only: a suite's problems have their own")
    check_arguments(args.suite, **_problem_arguments(args))


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
    from tritongemm.bench.model import FAMILIES, PHASES, PROVIDERS

    return dict(
        families=args.models or tuple(FAMILIES),
        phases=args.phases or PHASES,
        providers=args.providers or PROVIDERS,
        layers=args.layers or 2,
    )


def _run(args: argparse.Namespace) -> int:
    from tritongemm import tools

    if args.command == "demo":
        from tritongemm.demo import run_demo

        return run_demo()
    if args.command == "kernels":
        _print_kernels(args.json)
        return 0
    if args.command in tools.COMMANDS:
        return tools.run(args)
    if args.command in ("tune", "explain-choice"):
        from tritongemm.dispatch import tune

        return tune.run(args)
    if args.markdown:
        from tritongemm.bench.report import markdown_pivot, read_rows

        print(markdown_pivot(read_rows(args.markdown)))
        return 0
    if args.suite == "overhead":
        from tritongemm.bench.overhead import run_overhead

        run_overhead(kernels=args.kernels, out_dir=args.out_dir or "results", plot=not args.no_plot)
        return 0
    if args.suite == "epilogue":
        from tritongemm.bench.epilogue import run_epilogue
        from tritongemm.bench.measure import TIMINGS

        # Without a GPU a smoke run: its files only where asked for.
        out_dir = args.out_dir or ("results" if _on_gpu() else None)
        run_epilogue(
            shapes=args.shapes,
            dtypes=args.dtypes,
            timings=(args.timing,) if args.timing else TIMINGS,
            out_dir=out_dir,
            name=args.name,
            plot=not args.no_plot,
        )
        if out_dir is None:
            print("No files written (without a GPU, only where --out-dir is given).")
        return 0
    if args.suite == "fp8":
        from tritongemm.bench.fp8 import run_fp8
        from tritongemm.bench.measure import TIMINGS

        out_dir = args.out_dir or ("results" if _on_gpu() else None)  # without a GPU: files only where asked
        run_fp8(shapes=args.shapes, timings=(args.timing,) if args.timing else TIMINGS, out_dir=out_dir,
                name=args.name, plot=not args.no_plot)  # fmt: skip
        return 0
    if args.suite == "grouped":
        from tritongemm.bench.grouped import run_grouped
        from tritongemm.bench.measure import TIMINGS

        out_dir = args.out_dir or ("results" if _on_gpu() else None)  # without a GPU: files only where asked
        run_grouped(timings=(args.timing,) if args.timing else TIMINGS, out_dir=out_dir, name=args.name)
        return 0
    if args.suite == "mlp":
        from tritongemm.bench.measure import TIMINGS
        from tritongemm.bench.mlp import run_mlp

        out_dir = args.out_dir or ("results" if _on_gpu() else None)  # without a GPU: files only where asked
        run_mlp(timings=(args.timing,) if args.timing else TIMINGS, out_dir=out_dir, name=args.name)
        return 0
    if args.suite == "tp":
        from tritongemm.bench.tp import TIMINGS, run_tp

        out_dir = args.out_dir or ("results" if _gpus() >= 2 else None)  # with fewer GPUs: files only where asked
        run_tp(timings=(args.timing,) if args.timing else TIMINGS, out_dir=out_dir, name=args.name,
               profile=args.profile, plot=not args.no_plot)  # fmt: skip
        return 0
    if args.suite == "model":
        from tritongemm.bench.model import run_model

        run_model(**_model_arguments(args), out_dir=args.out_dir or "results", name=args.name or "model",
                  plot=not args.no_plot)  # fmt: skip
        return 0
    from tritongemm.bench import run_bench

    run_bench(
        args.suite,
        **_problem_arguments(args),
        configs=args.configs,
        out_dir=args.out_dir or "results",
        name=args.name,
        profile=args.profile,
        plot=not args.no_plot,
    )
    return 0


# ----------------------------------------------------------------------------------------------
# Mistakes: one line each
# ----------------------------------------------------------------------------------------------


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line without the usage block (bench's is 8 lines long) and
    `main` returns 2 instead of exiting."""

    def error(self, message: str):
        raise _UsageError(f"{self.prog}: error: {message}")


def _usage_error(message: str) -> int:
    print(" ".join(message.split()), file=sys.stderr)
    return 2


# ----------------------------------------------------------------------------------------------
# Argument types: each returns the parsed value or says what it expected
# ----------------------------------------------------------------------------------------------


def _int(text: str, minimum: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or (minimum is not None and value < minimum):
        expected = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise argparse.ArgumentTypeError(f"expected {expected}, but got {text!r}")
    return value


def integer(text: str) -> int:
    return _int(text)


def positive_int(text: str) -> int:
    return _int(text, 1)


def nonnegative_int(text: str) -> int:
    return _int(text, 0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, but got {text!r}")
    return value


def tile_size(text: str) -> int:
    value = _int(text, 16)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"expected a power of two >= 16 (tl.dot's least tile), but got {text!r}")
    return value


def tile_width(text: str) -> int:
    """A tile's BLOCK_N: a power of two >= 16, or an odd width (two powers of two side by side,
    ladder/odd_width.py: 96, 160, 192, ...), as MatmulConfig takes them."""
    from tritongemm.core.config import MatmulConfig

    value = _int(text, 16)
    try:
        MatmulConfig(BLOCK_N=value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a power of two >= 16, or the sum of two (96, 160, 192, ...), but got {text!r}"
        ) from None
    return value


def comma_list(item: Callable[[str], object], form: str, count: int | None = None) -> Callable[[str], tuple]:
    """A type: comma-separated values, each parsed by `item` (`count` of them when given)."""

    def parse(text: str) -> tuple:
        parts = [p.strip() for p in text.split(",")]
        if not all(parts) or (count is not None and len(parts) != count):
            raise argparse.ArgumentTypeError(f"expected {form}, but got {text!r}")
        return tuple(item(p) for p in parts)

    return parse


def names(choices, spellings: dict[str, str] | None = None) -> Callable[[str], tuple[str, ...]]:
    """A type: comma-separated names from `choices`; `spellings` maps common other names to theirs."""

    def parse(text: str) -> tuple[str, ...]:
        given = tuple(t.strip() for t in text.split(",") if t.strip())
        for name in given or (text,):
            if name not in choices:
                hint = f" ({name} is spelled {spellings[name]})" if spellings and name in spellings else ""
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated names from {', '.join(choices)}, but got {name!r}{hint}"
                )
        return given

    return parse


def shapes(text: str) -> list[tuple[int, int, int]]:
    from tritongemm.bench.suites import parse_shapes

    try:
        parsed = parse_shapes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shapes: ")) from None
    empty = next((s for s in parsed if 0 in s), None)
    if empty:
        raise argparse.ArgumentTypeError(f"expected sizes >= 1 in each 'M,N,K', but got {','.join(map(str, empty))!r}")
    return parsed


def dtypes(text: str) -> tuple[str, ...]:
    from tritongemm.bench import DTYPES

    return names(DTYPES, DTYPE_SPELLINGS)(text)


def kernel_names(text: str) -> tuple[str, ...]:
    """Kernels of the ladder; "auto" too, which the overhead suite times."""
    from tritongemm.core import registry

    return names([k.name for k in registry.all_kernels("matmul")] + ["auto"])(text)


def config_labels(text: str) -> tuple:
    """MatmulConfig labels (MatmulConfig.short()) separated by ';'."""
    from tritongemm.core.config import MatmulConfig

    try:
        return tuple(MatmulConfig.parse(label) for label in text.split(";") if label.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def existing_file(text: str) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"expected an existing file, but got {text!r}")
    return text


def existing_dir(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"expected an existing directory, but got {text!r}")
    return text


# ----------------------------------------------------------------------------------------------
# `tritongemm kernels`
# ----------------------------------------------------------------------------------------------


def _print_kernels(as_json: bool) -> None:
    """Every kernel, family by family, within KERNELS_WIDTH columns: its name (and rung), what it
    needs and whether it runs here; under it its idea, dtypes and why it does not run here.
    --json: tritongemm.kernels() as it is."""
    import textwrap

    import tritongemm

    kernels = tritongemm.kernels()
    if as_json:
        print(json.dumps(kernels, indent=1))
        return

    def block(text: str, indent: int) -> str:
        return textwrap.fill(text, KERNELS_WIDTH, initial_indent=" " * indent, subsequent_indent=" " * indent)

    print(block(f"tritongemm's kernels, family by family (matmul's ladder bottom to top). Here: {_here()}.", 0))
    for family in dict.fromkeys(k["family"] for k in kernels):
        print(f"\n{family}")
        for k in (k for k in kernels if k["family"] == family):
            name = k["name"] + (f" ({k['rung']})" if k["rung"] else "")
            needs = k["gpu"].split(" (")[0] + (", or the interpreter" if k["interpreter"] else "")
            print(f"  {name:<30} {needs:<40} here: {'yes' if k['available'] else 'no'}")
            experimental = "experimental (in auto only by a measured rule): " if k["experimental"] else ""
            print(block(f"{experimental}{k['idea']} [{', '.join(k['dtypes'])}]", 6))
            if not k["available"]:
                print(block(f"not here: {k['unavailable']}", 6))


# `tritongemm kernels` fits a terminal of this many columns (and a log read in one).
KERNELS_WIDTH = 100


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _here() -> str:
    import torch

    from tritongemm.core.registry import sm_name

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} ({sm_name(torch.cuda.get_device_capability())})"
    return "a CPU without a CUDA GPU, kernels run by the Triton interpreter"


def _print_table(title: str, head: list[str], rows: list[list[str]]) -> None:
    """With rich on a terminal, a table that wraps to its width; else one line per row, for logs and grep."""
    if sys.stdout.isatty():
        try:
            from rich.console import Console
            from rich.table import Table
            from rich.text import Text
        except ImportError:
            pass
        else:
            table = Table(title=title, title_justify="left")
            for i, name in enumerate(head):
                table.add_column(name, no_wrap=i == 0)
            for row in rows:
                table.add_row(*(Text(cell) for cell in row))  # Text: a reason's "[...]" is not markup
            Console().print(table)
            return
    widths = [max(len(cell) for cell in column) for column in zip(head, *rows)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *rows]]
    print("\n".join([title, lines[0], "-" * len(lines[0]), *lines[1:]]))


if __name__ == "__main__":  # python -m tritongemm.cli, as python -m tritongemm
    sys.exit(main())
