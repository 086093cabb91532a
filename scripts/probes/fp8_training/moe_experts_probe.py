"""Probe: one MoE projection's forward and both gradients, fp8 (`fp8_grouped_linear`) against
bf16 (`tritongemm.grouped_mm` with autograd), at Mixtral-8x7B's and Qwen3-30B-A3B's expert shapes
and 4096 tokens: each against an fp64 product of the bf16 operands, then timed (eager, a step's
forward + backward, do_bench median, same run).

Tells a kernel's error from a model's route flips (bench train compares whole models, where a
token near a tie between experts may take another route), and where fp8 experts repay quantizing
their weights every step (fp8/grouped_training.py: on this probe's numbers they are opt-in).

    PYTHONPATH=. python3 scripts/probes/fp8_training/moe_experts_probe.py
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

import tritongemm
from tritongemm.core.reference import rel_error
from tritongemm.fp8.grouped_training import fp8_grouped_linear

# (name, experts, top-k, in, out): the up projection (gate and up stacked) and the down one.
LAYERS = (
    ("mixtral up", 8, 2, 4096, 2 * 14336),
    ("mixtral down", 8, 2, 14336, 4096),
    ("qwen3-moe up", 128, 8, 2048, 2 * 768),
    ("qwen3-moe down", 128, 8, 768, 2048),
)
TOKENS = 4096


def main() -> None:
    torch.manual_seed(0)
    print("layer,rows_an_expert,path,out_err,dx_err,dw_err,ms_fwd_bwd,ratio_to_bf16", flush=True)
    for name, experts, top_k, k, n in LAYERS:
        rows = TOKENS * top_k
        counts = torch.full((experts,), rows // experts)
        offs = torch.cumsum(counts, 0).to(torch.int32).cuda()
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(experts, n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        dy = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        bounds = [0, *offs.tolist()]
        ref_y = torch.empty(rows, n, dtype=torch.float64, device="cuda")  # fp64 on the GPU: minutes on the CPU
        ref_dx, ref_dw = torch.empty(rows, k, dtype=torch.float64, device="cuda"), []
        for g in range(experts):
            lo, hi = bounds[g], bounds[g + 1]
            xg, wg, dyg = x[lo:hi].double(), w[g].double(), dy[lo:hi].double()
            ref_y[lo:hi], ref_dx[lo:hi] = xg @ wg.T, dyg @ wg
            ref_dw.append(dyg.T @ xg)
        ref_dw = torch.stack(ref_dw)
        del xg, wg, dyg
        paths = {
            "bf16": lambda xx, ww, offs=offs: tritongemm.grouped_mm(xx, ww.transpose(1, 2), offs),
            "fp8-row": lambda xx, ww, offs=offs: fp8_grouped_linear(xx, ww, offs),
        }
        times = {}
        for path, fn in paths.items():
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = fn(xx, ww)
            y.backward(dy)
            errs = [rel_error(y, ref_y), rel_error(xx.grad, ref_dx), rel_error(ww.grad, ref_dw)]

            def step(fn=fn, xx=xx, ww=ww, dy=dy):
                fn(xx, ww).backward(dy)

            times[path] = do_bench(step, return_mode="median")
            ratio = times["bf16"] / times[path]
            print(f"{name},{rows // experts},{path},{errs[0]:.3e},{errs[1]:.3e},{errs[2]:.3e},{times[path]:.4f},"
                  f"{ratio:.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
