"""Probe: where a MoE model's training step spends its GPU time, bf16 (transformers' grouped_mm
experts), tritongemm's bf16 patch and patch(fp8_training="row"), eager.

`bench train --models qwen3-30b-moe` gave the fp8 row-wise step 0.81x the bf16 grouped step
(H200, 2026-12-04); this says which kernels take the time: one profiled step per provider after
two warm-up steps, CUDA time per kernel name, the top rows and the total.

    PYTHONPATH=. python3 scripts/probes/fp8_training/moe_profile.py [--family qwen3-30b-moe] [--rows 30]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import tritongemm
from tritongemm.bench.model import build_base, family_config, make_inputs, sharing_copy
from tritongemm.bench.train import LAYERS, TRAIN_PHASE, step_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen3-30b-moe")
    parser.add_argument("--rows", type=int, default=30)
    args = parser.parse_args()
    config = family_config(args.family, LAYERS)
    torch.manual_seed(0)
    base = build_base(args.family, config, device="cuda", dtype=torch.bfloat16).train()
    base.set_experts_implementation("grouped_mm")
    models = {
        "torch": base,
        "tritongemm": tritongemm.patch(sharing_copy(base)),
        "tritongemm-fp8-row": tritongemm.patch(sharing_copy(base), fp8_training="row"),
    }
    inputs = make_inputs(TRAIN_PHASE, config["vocab_size"], "cuda")
    for name, model in models.items():
        step = step_of(model, inputs)
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(e.self_device_time_total for e in events)
        print(f"\n=== {name}: {total / 1e3:.2f} ms of kernels in one step", flush=True)
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[: args.rows]:
            share = e.self_device_time_total / total
            print(f"{e.self_device_time_total / 1e3:9.3f} ms {share:6.1%} x{e.count:<5d} {e.key[:110]}", flush=True)


if __name__ == "__main__":
    main()
