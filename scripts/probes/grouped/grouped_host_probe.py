"""Where one eager `tritongemm.grouped_mm` call spends its host time at decode sizes, one layer
of checks at a time, beside torch._grouped_mm: `eager_timer`'s wall clock (medians of 5
interleaved rounds) of the public call, the call without the offsets check (moe.py's path), the
unchecked implementation (`direct`), and the check alone. Run on a GPU:

    PYTHONPATH=. python3 scripts/probes/grouped/grouped_host_probe.py
"""

import functools
import statistics

import torch

import tritongemm
from tritongemm.bench.grouped import SUITE, operands
from tritongemm.bench.measure import eager_timer
from tritongemm.grouped import api

ROUNDS = 5


def main() -> None:
    for problem in [p for p in SUITE if p.tokens == 1]:
        a, b, offs = operands(problem, "cuda")
        calls = {
            "torch._grouped_mm": functools.partial(torch._grouped_mm, a, b, offs),
            "grouped_mm": functools.partial(tritongemm.grouped_mm, a, b, offs),
            "without the offs check": functools.partial(
                api.grouped_mm_of_counts, a, b, offs, None, None, offs_from_counts=True
            ),  # fmt: skip
            "direct (no checks)": functools.partial(api.direct, a, b, offs, None, None),
            "the offs check alone": functools.partial(api._check_offsets, offs, a.shape[0]),
            "check_grouped alone": functools.partial(api.check_grouped, a, b, offs, None),
        }
        samples = {name: [] for name in calls}
        for _ in range(ROUNDS):
            for name, call in calls.items():
                samples[name].append(eager_timer(call) * 1e3)
        print(problem.label())
        for name, us in samples.items():
            print(f"  {name:24s} {statistics.median(us):7.1f} us a call")


if __name__ == "__main__":
    main()
