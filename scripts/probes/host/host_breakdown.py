"""Where one eager `tritongemm.matmul` hit spends its host time, one part at a time: the plan
look-up, the operand preparation (the output's allocation), the launch, the same launch through
Triton's own Python launcher (what a Triton whose launcher layout primitives/launch.py does not
speak gets), and the compiled kernel's C launcher alone with pre-built arguments, beside
torch.matmul; medians of 5 interleaved rounds of `eager_timer`. BENCHMARKS.md ("Host time per
call") quotes it. Run on a GPU: PYTHONPATH=. python3 scripts/probes/host/host_breakdown.py
"""

import functools
import statistics

import torch

import tritongemm
from tritongemm.bench.measure import eager_timer
from tritongemm.dense.matmul import lookup
from tritongemm.primitives.launch import compiled_launches

CASES = [
    (64, 64, 64, torch.float16, "naive"),
    (64, 64, 64, torch.float16, "tma_persistent_pipelined"),
    (64, 64, 64, torch.float32, "grouped"),
    (1, 4096, 4096, torch.bfloat16, "auto"),
]


for m, n, k, dtype, kernel in CASES:
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype).T  # an nn.Linear weight's view
    tritongemm.matmul(a, b, kernel=kernel)
    plan = lookup(a, b, None, kernel, None)
    pa, pb, c = plan.prepare(a, b, None)
    parts = {
        "torch.matmul": functools.partial(torch.matmul, a, b),
        "matmul": functools.partial(tritongemm.matmul, a, b, kernel=kernel),
        "look-up": functools.partial(lookup, a, b, None, kernel, None),
        "prepare": functools.partial(plan.prepare, a, b, None),
        "launch": functools.partial(plan.launch, pa, pb, c),
    }
    raw = [launch for launch in compiled_launches(plan.launch) if launch.raw]
    if raw:  # a ladder kernel: its C launcher, with the arguments one launch of the plan passed it
        (launch,) = raw
        c_entry, passed = launch._raw_plain, []
        launch._raw_plain = lambda *args, record=passed.append: record(args)  # the instance's: one launch records
        plan.launch(pa, pb, c)
        launch._raw_plain = c_entry
        parts["C launcher"] = functools.partial(c_entry, *passed[0])
    launches = compiled_launches(plan.launch)
    direct = [(cl, cl._raw_plain, cl.encodes_descriptors) for cl in launches]

    def through_triton(on: bool, direct=direct) -> None:
        """Each of the plan's launches through Triton's CudaLauncher.__call__ (on) or back as built."""
        for cl, raw_plain, encodes in direct:
            cl._raw_plain, cl.encodes_descriptors = (None, False) if on else (raw_plain, encodes)

    if any(raw_plain is not None or encodes for _, raw_plain, encodes in direct):
        parts["Triton's launcher"] = functools.partial(plan.launch, pa, pb, c)
    samples = {name: [] for name in parts}
    for _ in range(5):
        for name, fn in parts.items():
            through_triton(name == "Triton's launcher")
            samples[name].append(eager_timer(fn) * 1e3)
        through_triton(False)
    times = ", ".join(f"{name} {statistics.median(v):.1f}" for name, v in samples.items())
    print(f"{m}x{n}x{k} {str(dtype)[6:]} {plan.kernel}: {times} us", flush=True)
