"""Block-scaled fp8 at decode sizes: `auto` with its rule for M <= 64 on large weights (fp8_block's
64-row Gluon tiles), `auto` without it (the `tl` rung), and torch's block-wise `_scaled_mm`, on
Llama-3-8B's MLP weights, kernel-only (CUDA graph) and eager, in one run. The fp8-block model's
decode ran slower with the rule (results/h100/probes/model/model-fp8-block-generate-*.csv); this asks
at which M. CSV on stdout.

    PYTHONPATH=. python3 scripts/probes/fp8/fp8_block_decode_probe.py
"""

import functools

import torch

from tritongemm.bench.fp8 import Fp8Problem, _torch_scaled_mm, operands, torch_block_scales
from tritongemm.bench.measure import eager_timer, gpu_timer
from tritongemm.core.reference import fp8_tolerance, rel_error
from tritongemm.fp8 import api, reference_scaled_mm

WEIGHTS = ((14336, 4096), (28672, 4096), (4096, 14336))  # (N, K): gate or up, both, down
TOKENS = (1, 4, 16, 64)


def plan(a, b, sa, sb):
    return api.plan_scaled_mm(a, b, sa, sb, None, None, None, 1.0, torch.bfloat16, "auto", None)


def main() -> None:
    print("m,n,k,provider,timing,ms,ratio_to_torch,rel_err")
    for (N, K), M in ((w, m) for w in WEIGHTS for m in TOKENS):
        a, b, sa, sb = operands(Fp8Problem("block", M, N, K), "cuda")
        reference = reference_scaled_mm(a, b, sa, sb, out_dtype=torch.float64)
        bound = fp8_tolerance(torch.bfloat16, K)
        calls = {}
        try:
            calls["torch"] = functools.partial(_torch_scaled_mm, *torch_block_scales(a, b, sa, sb, reference, bound))
        except Exception as exc:  # noqa: BLE001 (torch's refusal is a result too)
            print(f"{M},{N},{K},torch,refused,,,{type(exc).__name__}")
        # Both as planned calls (what Fp8Linear runs), one planned with the rule and one without.
        calls["auto (rule)"] = functools.partial(plan(a, b, sa, sb), a, b, sa, sb, None, None)
        api._BLOCK_GLUON_FROM_WEIGHT, saved = 1 << 62, api._BLOCK_GLUON_FROM_WEIGHT
        try:
            calls["auto (no rule)"] = functools.partial(plan(a, b, sa, sb), a, b, sa, sb, None, None)
        finally:
            api._BLOCK_GLUON_FROM_WEIGHT = saved
        base = {}
        for name, call in calls.items():
            err = rel_error(call(), reference) if name != "torch" else 0.0
            for timing in ("graph", "eager"):
                ms = gpu_timer(call, True) if timing == "graph" else eager_timer(call)
                base.setdefault(timing, ms)
                print(f"{M},{N},{K},{name},{timing},{ms:.5f},{base[timing] / ms:.3f},{err:.2e}", flush=True)


if __name__ == "__main__":
    main()
