"""`tritongemm tune` writes kernel="auto"'s dispatch table for this GPU (dispatch/tune.py), and
`tritongemm explain-choice` says what kernel="auto" takes for a problem and why: matmul's,
scaled_mm's or grouped_mm's (--family), here, or with --gpu on a modelled GPU, from the shipped
tables and the rules, on any machine."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tritongemm import dispatch
from tritongemm.bench.measure import unfilled_operand
from tritongemm.bench.suites import Problem
from tritongemm.cli.args import dtypes, positive_int, shapes
from tritongemm.core import checks, device_info, registry
from tritongemm.dispatch import fp8 as fp8_dispatch
from tritongemm.dispatch import grouped as grouped_dispatch
from tritongemm.dispatch import table as dispatch_table
from tritongemm.dispatch import tune

LAYOUTS = ("nn", "nt", "tn", "tt")
# The families whose kernel="auto" explain-choice explains (core/registry.py's families).
FAMILIES = ("matmul", "scaled_mm", "grouped_mm")
# The GPUs explain-choice --gpu models, as torch describes them (modelled_gpu's arguments). Only
# sm_90 ones: the Gluon rungs' rules and the shipped table were measured on an H100.
GPUS = {
    "h100": dict(name="NVIDIA H100 80GB HBM3", capability=(9, 0), sms=132, l2_bytes=50 * 2**20),
    "h200": dict(name="NVIDIA H200", capability=(9, 0), sms=132, l2_bytes=60 * 2**20),
}


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    if command == "tune":
        parser.add_argument("--shapes", type=shapes, help="'M,N,K;...' (default: LLM, square and odd shapes)")
        parser.add_argument("--dtypes", type=dtypes, help="e.g. float16,bfloat16 (default: both)")
        parser.add_argument("--layout", choices=LAYOUTS, default="nn", help="with --shapes")
        parser.add_argument("--out", type=Path, help="the table's file (default: this GPU's user table)")
        parser.add_argument("--restart", action="store_true", help="measure every bucket again")
        parser.add_argument("--minutes", type=float, help="start no problem after this long; run again to go on")
        parser.add_argument("--rows", type=Path, help="append every timed candidate to this CSV")
        parser.add_argument("--max-m", type=int, help="only the problems with M up to this (default: all)")
        return
    parser.add_argument("M", type=positive_int)
    parser.add_argument("N", type=positive_int)
    parser.add_argument("K", type=positive_int)
    parser.add_argument("--dtype", type=dtypes, default=("float16",), help="default float16")
    parser.add_argument("--layout", choices=LAYOUTS, default="nn")
    parser.add_argument(
        "--gpu", choices=sorted(GPUS),
        help="instead of this machine's device: that GPU's choice, from the shipped tables and the rules (any "
        "machine, a CPU too)",
    )  # fmt: skip
    parser.add_argument("--family", choices=FAMILIES, default="matmul",
                        help="whose choice: matmul's (default), scaled_mm's (fp8) or grouped_mm's")  # fmt: skip
    parser.add_argument("--recipe", choices=("tensor", "row", "block"), default="row", help="scaled_mm's scales")
    parser.add_argument("--groups", type=positive_int, default=8,
                        help="grouped_mm: M rows in this many groups (experts), each of an N x K weight")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.command == "tune":
        return _tune(args)
    dtype = getattr(torch, args.dtype[0])
    family = getattr(args, "family", "matmul")
    try:
        if family != "matmul":
            print(_explain_family(args, dtype))
        elif args.gpu:
            print(explain_on(GPUS[args.gpu], args.M, args.N, args.K, dtype, args.layout))
        else:
            device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: what the interpreter would run
            print(_explain(*_operands(args.M, args.N, args.K, dtype, args.layout, device)))
    except (ValueError, TypeError) as exc:  # no kernel computes this here: say why, in one line
        print(f"tritongemm: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _tune(args: argparse.Namespace) -> int:
    chosen_dtypes = args.dtypes or tune.DTYPES
    problems = None
    if args.shapes:
        problems = tuple(Problem(m, n, k, dtype, args.layout) for m, n, k in args.shapes for dtype in chosen_dtypes)
    elif args.dtypes:
        problems = tune.default_problems(chosen_dtypes) if torch.cuda.is_available() else None
    if args.max_m is not None and (problems or torch.cuda.is_available()):
        problems = tuple(p for p in problems or tune.default_problems(chosen_dtypes) if p.M <= args.max_m)
    tune.tune(problems, path=args.out, resume=not args.restart, minutes=args.minutes, rows_path=args.rows)
    return 0


def explain_on(gpu: dict, M: int, N: int, K: int, dtype: torch.dtype, layout: str = "nn") -> str:
    """dispatch.explain for a problem on `gpu` (GPUS' form), asked on any machine: device_info
    answers with its facts, and the operands are fake CUDA tensors (shapes, strides and a data
    pointer of 0, aligned as a fresh allocation is), so no GPU and no data are needed."""
    with device_info.modelled_gpu(**gpu):
        with FakeTensorMode():
            a, b = _operands(M, N, K, dtype, layout, "cuda")
        with warnings.catch_warnings():  # TMA's alignment check reads the fake data pointer: 0
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            text = _explain(a, b)
    facts = f"modelled: {registry.sm_name(gpu['capability'])}, {gpu['sms']} SMs, {gpu['l2_bytes'] >> 20} MiB L2"
    return text.replace(f" on {a.device}:", f" on {gpu['name']} ({facts}):", 1)


def _explain_family(args: argparse.Namespace, dtype: torch.dtype) -> str:
    """scaled_mm's or grouped_mm's choice for an M x N x K problem, here or on the --gpu modelled."""
    M, N, K = args.M, args.N, args.K
    device = "cuda" if args.gpu or torch.cuda.is_available() else "cpu"
    modelled = device_info.modelled_gpu(**GPUS[args.gpu]) if args.gpu else contextlib.nullcontext()
    with modelled:
        with FakeTensorMode() if args.gpu else contextlib.nullcontext():
            if args.family == "scaled_mm":  # a (M, K) row-major, b the transpose of an (N, K) weight: torch's form
                a = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=device)
                b = torch.empty(N, K, dtype=torch.float8_e4m3fn, device=device).T
                c = torch.empty(M, N, dtype=torch.bfloat16, device=device)
            else:  # the experts' weights (G, N, K) read transposed, as MoE layers store them
                a = torch.empty(M, K, dtype=dtype, device=device)
                b = torch.empty(args.groups, N, K, dtype=dtype, device=device).transpose(1, 2)
        with warnings.catch_warnings():  # TMA's alignment check reads a fake data pointer: 0
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            if args.family == "scaled_mm":
                text = fp8_dispatch.explain(a, b, c, args.recipe)
            else:
                text = grouped_dispatch.explain(a, b)
    if args.gpu:
        text = text.replace(f" on {a.device}:", f" on {GPUS[args.gpu]['name']} (modelled):", 1)
    return text


def _explain(a: torch.Tensor, b: torch.Tensor) -> str:
    checks.gemm(a, b, None, "auto", None)  # dispatch.choose takes problems checked as matmul checks them
    return dispatch.explain(a, b) + _rules_note(a, b)


def _operands(M: int, N: int, K: int, dtype: torch.dtype, layout: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    """a (M, K) and b (K, N) laid out as `layout` says, their data unset: the choice reads none."""
    a = unfilled_operand(M, K, layout[0] == "t", dtype, device)
    b = unfilled_operand(K, N, layout[1] == "t", dtype, device)
    return a, b


def _rules_note(a: torch.Tensor, b: torch.Tensor) -> str:
    """On a CUDA device where the rules chose: why no measured table did (none for this GPU, or
    none of its buckets is this problem's). Tables are for CUDA devices only: nothing otherwise."""
    if a.device.type != "cuda" or dispatch.choose("auto", None, a, b, a.dtype)[2].startswith(dispatch.TABLE):
        return ""
    name = device_info.name(a.device)
    table = dispatch_table.table_for(name)
    if table is None:
        return f"\n  no measured table applies (none shipped for the {name}, none tuned here): the rules chose"
    bucket = dispatch_table.bucket_of(a, b)
    if bucket not in table.entries:
        return f"\n  the table {table.path} has no entry for bucket {bucket.describe()}: the rules chose"
    return f"\n  the table {table.path}'s kernel for bucket {bucket.describe()} can't take the problem: the rules chose"
