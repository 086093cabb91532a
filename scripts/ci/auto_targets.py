"""Where kernel="auto" stands against issue 14's bars (geomean and worst ratio to cuBLAS per
timing, >= 1.0 kernel-only at M <= 128), from the auto suite's CSVs; a later CSV's rows replace
an earlier one's for the same problem and timing (a re-measure of part of the suite):

    python3 scripts/ci/auto_targets.py results/h100/auto.csv results/h100/probes/dense/auto-m128.csv

With --write, the first CSV (its JSON and plot too) is rewritten with the newer rows in place
(bench.report.write_remeasured), so that it holds the suite as it stands.
"""

import sys

from tritongemm.bench.report import auto_scorecard, newest_rows, write_remeasured

if __name__ == "__main__":
    paths = [a for a in sys.argv[1:] if a != "--write"]
    print(auto_scorecard(newest_rows(*paths)))
    if "--write" in sys.argv[1:]:
        print("wrote " + ", ".join(str(p) for p in write_remeasured(*paths)))
