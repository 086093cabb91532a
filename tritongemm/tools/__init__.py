"""See inside the kernels: one module per tool, each a `tritongemm` subcommand.

  schedule   which program (SM, step) computes each output tile, as a picture   (schedule.py)
  l2         how many bytes of A and B each tile ordering fetches from DRAM       (l2.py)
  explain    the numpy rewrite of one program's offsets and masks               (explain.py)
  predict    a calibrated performance model that says which term bounds a GEMM  (predict.py)

`launch.py` holds what they share (kernel -> tile ordering, programs per SM, waves; the H100's
numbers) and `ncu.py` reads the Nsight Compute logs of scripts/ci/ncu-l2.sh.
Everything here runs on a CPU: no kernel is launched.
"""

from __future__ import annotations

import argparse
import importlib

COMMANDS = ("schedule", "l2", "explain", "predict")


def _module(command: str):
    return importlib.import_module(f"tritongemm.tools.{command}")


def add_commands(commands) -> None:
    """Register every tool's subcommand on the `tritongemm` parser's subparsers."""
    for command in COMMANDS:
        _module(command).add_parser(commands)


def check(args: argparse.Namespace) -> None:
    """Raise ValueError for arguments that argparse's types accept one by one but not together
    (a tool without a `check` has none such); runs nothing."""
    check_args = getattr(_module(args.command), "check", None)
    if check_args is not None:
        check_args(args)


def run(args: argparse.Namespace) -> int:
    return _module(args.command).main(args)
