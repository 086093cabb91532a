"""Probe: `tritongemm tune` on this GPU with its weakest rows first (the M = 128 rows, 1000^3 and
5000 x 3000 x 7000 on the H200, BENCHMARKS.md), then the rest, writing the table at OUT and every
timed candidate beside it (OUT with -rows.csv). A run stops after MINUTES and the next one resumes
where it stopped, as `tritongemm tune` does: the H200's shipped table was started this way.

    PYTHONPATH=. python3 scripts/probes/dense/tune_weak_rows_first.py OUT.json MINUTES
"""

import sys

from tritongemm.dispatch import tune


def main() -> None:
    out, minutes = sys.argv[1], float(sys.argv[2])
    everything = tune.default_problems()
    weak = [p for p in everything if p.M == 128 or (p.M, p.N, p.K) in ((1000, 1000, 1000), (5000, 3000, 7000))]
    rest = [p for p in everything if p not in weak]
    rows = out.removesuffix(".json") + "-rows.csv"
    tune.tune(tuple(weak + rest), path=out, minutes=minutes, rows_path=rows, progress=False)


if __name__ == "__main__":
    main()
