"""Merge a suite's kernel-only and eager results into one CSV with a timing column, and plot the
ratio to cuBLAS against M: python3 scripts/ci/combine_timings.py results/h100 auto
(reads auto.csv and auto-eager.csv from `bench auto` and `bench auto --timing eager`)."""

import sys

from tritongemm.bench.report import combine_timings

if __name__ == "__main__":
    out_dir, name = sys.argv[1:3]
    print("wrote " + ", ".join(str(p) for p in combine_timings(out_dir, name)))
