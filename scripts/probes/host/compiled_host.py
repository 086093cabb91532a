"""Host time of a decode-sized linear, torch's against tritongemm's, compiled and eager: 16
linears chained at M = 1 (K x K weights, the last K x N), whose GPU work is a few microseconds
each, so the loop measures the host; then, per shape, the parts of tritongemm's eager hit one at
a time beside F.linear and `torch.mm(..., out=)` (what Inductor's generated code calls for
cuBLAS). Medians of 5 rounds of `eager_timer`; bf16, on a GPU:

    PYTHONPATH=. python3 scripts/probes/host/compiled_host.py
"""

import functools
import statistics

import torch
import torch.nn.functional as F

import tritongemm
from tritongemm import inductor
from tritongemm.bench.measure import eager_timer
from tritongemm.core.plans import PLANS
from tritongemm.dense.linear import call_key, planned_call

SHAPES = [(512, 512), (2048, 512), (2048, 4096), (4096, 2048)]  # (K, N)
CHAINED = ((512, 512), (2048, 512))  # a chain of K x K weights stays host-bound for these K
CHAIN = 16
ROUNDS = 5


def median_us(fn, per=1) -> float:
    return statistics.median(eager_timer(fn) * 1e3 / per for _ in range(ROUNDS))


def chains(K: int, N: int) -> None:
    weights = [torch.randn(K, K, device="cuda", dtype=torch.bfloat16) / K**0.5 for _ in range(CHAIN - 1)]
    weights.append(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5)
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)

    def chain(linear, x):
        for w in weights:
            x = linear(x, w)
        return x

    torch._dynamo.reset()
    for name, linear in (("torch", F.linear), ("tritongemm", tritongemm.linear)):
        compiled = torch.compile(functools.partial(chain, linear), dynamic=False)
        compiled(x)
        compiled_us = median_us(functools.partial(compiled, x), CHAIN)
        eager_us = median_us(functools.partial(chain, linear, x), CHAIN)
        print(f"{K}x{N} chain compiled {name:10s} {compiled_us:7.2f} us a linear")
        print(f"{K}x{N} chain eager    {name:10s} {eager_us:7.2f} us a linear")


def parts(K: int, N: int) -> None:
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    out = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
    arguments = (x, w, None, None, None, 1.0, None, "auto", None, False)
    call = planned_call(*arguments)
    key = call_key(*arguments)
    site = inductor.Site("linear", (0, 1))
    timed = {
        "F.linear": functools.partial(F.linear, x, w),
        "torch.mm(out=)": functools.partial(torch.mm, x, w.T, out=out),
        "direct_linear": functools.partial(inductor.direct_linear, x, w),
        "Site(out=)": functools.partial(site, x, w, None, None, None, 1.0, None, "auto", None, out=out),
        "call_key": functools.partial(call_key, *arguments),
        "find": functools.partial(PLANS.find, key),
        "new_empty": functools.partial(x.new_empty, (1, N)),
        "plan.launch": functools.partial(call.plan.launch, x, w, out, None, None, None),
    }
    print(f"{K}x{N}: {call.plan.kernel} {call.plan.config.short()}")
    for name, fn in timed.items():
        print(f"  {name:16s} {median_us(fn):7.2f} us")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    for K, N in SHAPES:
        parts(K, N)
    for K, N in CHAINED:
        chains(K, N)
