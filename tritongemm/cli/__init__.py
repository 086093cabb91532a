"""The `tritongemm` command: demo, kernels, bench, the tools (schedule, l2, explain, predict), tune
and explain-choice, one module of tritongemm.cli per group of commands (COMMANDS).

A mistake in the arguments gets one line on stderr, naming the argument and the form it expects,
and exit status 2: argparse's checks and the `type=` functions of args.py while parsing, then each
command's checks of its arguments taken together, before any work starts. An error during the
work is not a mistake in the arguments and keeps its traceback.

Each command's module has `add_arguments(parser, command)`, `run(args) -> int` and, where
arguments must be checked together, `check(args)`, which raises ValueError or TypeError and runs
nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

from tritongemm.bench import use_interpreter_without_gpu
from tritongemm.cli.args import Parser, UsageError


@dataclass(frozen=True)
class Command:
    module: str  # of tritongemm.cli: its arguments, checks and run
    help: str  # one line, in the list of commands and atop the command's own --help


COMMANDS = {
    "demo": Command(
        "demo", "run every available kernel on a real problem, check it and time it vs torch.matmul (cuBLAS on a GPU)"
    ),
    "kernels": Command("kernels", "list every family's kernels (the registry) and where they run"),
    "bench": Command("bench", "benchmark kernels against cuBLAS (tables, CSV/JSON, plots)"),
    "schedule": Command("tools", "draw which program (SM, step) computes each output tile (PNG)"),
    "l2": Command("tools", "L2 reuse model: DRAM bytes per wave and in all, per ordering and GROUP_SIZE_M"),
    "explain": Command("tools", "print the numpy rewrite of one program's offsets and masks"),
    "predict": Command("tools", "predicted time and TFLOP/s per kernel and for cuBLAS, with the terms"),
    "tune": Command(
        "tune", "measure the fastest kernel and config per shape bucket on this GPU: kernel='auto''s table"
    ),
    "explain-choice": Command("tune", "which kernel and config kernel='auto' takes, and why (--gpu: on that GPU)"),
}


def main(argv: list[str] | None = None) -> int:
    use_interpreter_without_gpu()  # before anything imports the kernels: --kernels' check does
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    module = _module(command) if command in COMMANDS else None
    try:
        args = _parser(command, module).parse_args(argv)
    except UsageError as exc:
        return _usage_error(str(exc))
    check = getattr(module, "check", None)
    try:
        if check is not None:
            check(args)
    except (ValueError, TypeError) as exc:  # from the checks alone: nothing has run yet
        return _usage_error(f"tritongemm: error: {exc}")
    return module.run(args)


def _module(command: str):
    # A command's module loads when it runs: tritongemm --help imports none (the tools and tune
    # load Triton and the ladder, 0.3 s).
    return importlib.import_module(f"tritongemm.cli.{COMMANDS[command].module}")


def _parser(command: str | None, module) -> argparse.ArgumentParser:
    """The command line's parser: every command, with `command`'s arguments (from `module`)."""
    parser = Parser(prog="tritongemm", description="GEMM kernels in Triton and Gluon.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, spec in COMMANDS.items():
        sub = commands.add_parser(name, help=spec.help, description=spec.help[0].upper() + spec.help[1:] + ".")
        if name == command:
            module.add_arguments(sub, name)
    return parser


def _usage_error(message: str) -> int:
    print(" ".join(message.split()), file=sys.stderr)
    return 2
