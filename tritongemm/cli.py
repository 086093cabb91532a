"""The `tritongemm` command: demo, bench, kernels, and the tools (schedule, l2, explain, predict)."""

from __future__ import annotations

import argparse
import json
import sys


def _csv(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tritongemm", description="GEMM kernels in Triton and Gluon.")
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("demo", help="run every available kernel on a real problem, check it and time it vs cuBLAS")
    commands.add_parser("kernels", help="list the kernels of the ladder and where they run")

    from tritongemm.bench.measure import TIMINGS
    from tritongemm.bench.suites import LAYOUTS, SUITES

    bench = commands.add_parser("bench", help="benchmark kernels against cuBLAS (tables, CSV/JSON, plots)")
    bench.add_argument(
        "suite", nargs="?", choices=sorted(SUITES) + ["overhead"],
        help="a named suite; overhead: host cost of one eager call on launch-bound problems, vs torch.matmul",
    )  # fmt: skip
    bench.add_argument("--shapes", help="instead of a suite: 'M,N,K;M,N,K;...'")
    bench.add_argument("--dtypes", type=_csv, help="e.g. float16,bfloat16 (default: the suite's, or both)")
    bench.add_argument("--kernels", type=_csv, help="e.g. grouped,persistent (default: all available)")
    bench.add_argument("--layout", choices=LAYOUTS, default="nn", help="with --shapes: n = as is, t = transposed view")
    bench.add_argument("--out-dir", default="results", help="where the CSV, JSON and PNG go (default: results)")
    bench.add_argument("--name", help="base name of the result files (default: the suite's, plus -eager if eager)")
    bench.add_argument(
        "--timing", choices=TIMINGS, default="graph",
        help="graph: the kernel alone (default); eager: back-to-back calls without out=, host time included",
    )  # fmt: skip
    bench.add_argument("--profile", action="store_true", help="run each kernel once, untimed, for ncu")
    bench.add_argument("--no-plot", action="store_true")
    bench.add_argument("--markdown", metavar="CSV", help="print a results CSV as a markdown table, and stop")

    from tritongemm import tools

    tools.add_commands(commands)

    args = parser.parse_args(argv)
    if args.command == "demo":
        from tritongemm.demo import run_demo

        return run_demo()
    if args.command == "kernels":
        import tritongemm

        print(json.dumps(tritongemm.kernels(), indent=1))
        return 0
    if args.command in tools.COMMANDS:
        return tools.run(args)
    if args.markdown:
        from tritongemm.bench.report import markdown_pivot, read_rows

        print(markdown_pivot(read_rows(args.markdown)))
        return 0
    if args.suite is None and args.shapes is None:
        parser.error(f"bench: give a suite ({', '.join(sorted(SUITES))}, overhead) or --shapes")
    if args.suite == "overhead":
        given = [f"--{k}" for k in ("shapes", "dtypes", "name", "profile") if getattr(args, k)]
        if given:
            parser.error(f"bench overhead: has its own problems and file names, so {', '.join(given)} do not apply")
        from tritongemm.bench.overhead import run_overhead

        run_overhead(kernels=args.kernels, out_dir=args.out_dir, plot=not args.no_plot)
        return 0
    from tritongemm.bench import run_bench

    run_bench(
        args.suite,
        shapes=args.shapes,
        dtypes=args.dtypes,
        kernels=args.kernels,
        layout=args.layout,
        timing=args.timing,
        out_dir=args.out_dir,
        name=args.name,
        profile=args.profile,
        plot=not args.no_plot,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
