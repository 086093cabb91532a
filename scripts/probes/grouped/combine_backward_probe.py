"""Probe: the MoE un-permute's backward (grouped/moe.py `combine_grads`), its one kernel against
the same arithmetic in torch's ops (`combine_grads_torch`, what it ran before and what
torch.compile traces), on the training shapes of the MoE layers in `bench model`: kernel-only
(do_bench, median) and eager (back-to-back calls, host included), checked against each other first.

    PYTHONPATH=. python3 scripts/probes/grouped/combine_backward_probe.py
"""

import functools

import torch
from triton.testing import do_bench

from tritongemm.bench.measure import eager_timer
from tritongemm.core.reference import rel_error
from tritongemm.grouped import moe

SHAPES = ((2048, 2, 4096, "Mixtral"), (2048, 8, 2048, "Qwen3-MoE"), (8192, 8, 2048, "Qwen3-MoE"))  # tokens, top_k, H
NEEDS = (True, False, True)


def main() -> None:
    torch.manual_seed(0)
    for tokens, top_k, hidden, name in SHAPES:
        pairs = tokens * top_k
        rows = torch.randn(pairs, hidden, device="cuda", dtype=torch.bfloat16)
        grad = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        order = torch.sort(torch.randint(0, 64, (pairs,), device="cuda")).indices
        weights = torch.rand(tokens, top_k, device="cuda").softmax(-1).to(torch.bfloat16)
        calls = {name_: functools.partial(fn, grad, rows, order, weights, NEEDS)
                 for name_, fn in (("kernel", moe.combine_grads), ("torch ops", moe.combine_grads_torch))}  # fmt: skip
        (kr, _, kw), (tr, _, tw) = calls["kernel"](), calls["torch ops"]()
        errors = rel_error(kr, tr.double()), rel_error(kw, tw.double())
        graph = {n: do_bench(c, warmup=50, rep=300) * 1e3 for n, c in calls.items()}
        eager = {n: eager_timer(c) * 1e3 for n, c in calls.items()}
        print(f"{name} {tokens} tokens top-{top_k} hidden {hidden}: kernel-only {graph['kernel']:.1f} us against "
              f"torch ops {graph['torch ops']:.1f} ({graph['torch ops'] / graph['kernel']:.2f}x); eager "
              f"{eager['kernel']:.1f} against {eager['torch ops']:.1f} us "
              f"({eager['torch ops'] / eager['kernel']:.2f}x); "
              f"differences {errors[0]:.1e} (rows) {errors[1]:.1e} (weights)")  # fmt: skip


if __name__ == "__main__":
    main()
