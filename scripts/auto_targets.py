"""Where kernel="auto" stands against issue 14's bars (geomean and worst ratio to cuBLAS per
timing, >= 1.0 kernel-only at M <= 128), from the auto suite's CSVs; a later CSV's rows replace
an earlier one's for the same problem and timing (a re-measure of part of the suite):

    python3 scripts/auto_targets.py results/h100/auto.csv results/h100/auto-m128.csv
"""

import sys

from tritongemm.bench.report import auto_scorecard, newest_rows

if __name__ == "__main__":
    print(auto_scorecard(newest_rows(*sys.argv[1:])))
