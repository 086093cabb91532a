"""The `tritongemm` command's argument types, and its parser: a mistake is one line.

Each type returns the parsed value or raises argparse.ArgumentTypeError saying what it expected,
which argparse prefixes with the argument's name ("argument --shapes: expected ...").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from tritongemm.bench import DTYPES
from tritongemm.bench.suites import parse_shapes
from tritongemm.core import registry
from tritongemm.core.config import MatmulConfig

DTYPE_SPELLINGS = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32"}


# ----------------------------------------------------------------------------------------------
# Mistakes: one line each
# ----------------------------------------------------------------------------------------------


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line without the usage block (bench's is 8 lines long) and
    `main` returns 2 instead of exiting."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: error: {message}")


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
    try:
        parsed = parse_shapes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shapes: ")) from None
    empty = next((s for s in parsed if 0 in s), None)
    if empty:
        raise argparse.ArgumentTypeError(f"expected sizes >= 1 in each 'M,N,K', but got {','.join(map(str, empty))!r}")
    return parsed


def dtypes(text: str) -> tuple[str, ...]:
    return names(DTYPES, DTYPE_SPELLINGS)(text)


# The families whose kernels `bench` times by name: the GEMM suites and overhead take matmul's,
# bench fp8 scaled_mm's (cli/bench.py checks which suite takes which).
BENCHED_FAMILIES = ("matmul", "scaled_mm")


def kernel_names(text: str) -> tuple[str, ...]:
    """Kernels of the benched families; "auto" too, which the overhead suite times, and
    "auto:batch_invariant", which bench fp8 times beside scaled_mm's default."""
    rows = [k.name for family in BENCHED_FAMILIES for k in registry.all_kernels(family)]
    return names([*dict.fromkeys(rows), *registry.POLICIES])(text)


def config_labels(text: str) -> tuple:
    """MatmulConfig labels (MatmulConfig.short()) separated by ';'."""
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
