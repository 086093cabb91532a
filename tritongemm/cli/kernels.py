"""`tritongemm kernels`: every kernel, family by family, and whether it runs here."""

from __future__ import annotations

import argparse
import json
import textwrap

import torch

from tritongemm.core import registry

# `tritongemm kernels` fits a terminal of this many columns (and a log read in one).
KERNELS_WIDTH = 100


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("--json", action="store_true", help="the list as JSON, for programs")


def run(args: argparse.Namespace) -> int:
    print_kernels(args.json)
    return 0


def print_kernels(as_json: bool) -> None:
    """Every kernel, family by family, within KERNELS_WIDTH columns: its name (and rung), what it
    needs and whether it runs here; under it its idea, dtypes and why it does not run here.
    --json: tritongemm.kernels() as it is."""
    kernels = registry.kernels()
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


def _here() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} ({registry.sm_name(torch.cuda.get_device_capability())})"
    return "a CPU without a CUDA GPU, kernels run by the Triton interpreter"
