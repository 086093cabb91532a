"""Probe: an eager MoE training step (bench model's 2-layer families, 2 x 1024 tokens) with
tritongemm's experts, the un-permute's backward as its one kernel against torch's ops
(`combine_grads_torch`, what ran before), transformers' grouped_mm experts beside them; one
process, interleaved rounds of eager_timer, medians. The step is host-bound, and host time moves
between machines and runs, so the A/B shares both.

    PYTHONPATH=. python3 scripts/probes/grouped/moe_train_ab.py [qwen3-30b-moe,mixtral-8x7b-moe]
"""

import statistics
import sys

import torch

from tritongemm.bench.measure import eager_timer
from tritongemm.bench.model import SETTINGS, build_models, make_inputs, model_config, timed_call
from tritongemm.grouped import moe

ROUNDS = 5


def main(families: str = "qwen3-30b-moe,mixtral-8x7b-moe") -> None:
    setting = next(s for s in SETTINGS if s.phase == "train")
    kernel_grads = moe.combine_grads
    for family in families.split(","):
        config = model_config(family)
        models = build_models(family, config, device="cuda", providers=("hf-grouped_mm", "tritongemm"))
        inputs = make_inputs(setting, config["vocab_size"], "cuda")
        steps = {name: timed_call(model.train(), setting, inputs) for name, model in models.items()}
        variants = {
            "hf-grouped_mm": (steps["hf-grouped_mm"], kernel_grads),
            "tritongemm, backward kernel": (steps["tritongemm"], kernel_grads),
            "tritongemm, torch ops": (steps["tritongemm"], moe.combine_grads_torch),
        }
        samples = {name: [] for name in variants}
        for _ in range(ROUNDS):
            for name, (step, grads) in variants.items():
                moe.combine_grads = grads
                samples[name].append(eager_timer(step))
        moe.combine_grads = kernel_grads
        ms = {name: statistics.median(s) for name, s in samples.items()}
        base = ms["hf-grouped_mm"]
        print(f"{family} train {setting.batch} x {setting.tokens}: " + ", ".join(
            f"{name} {t:.2f} ms ({base / t:.3f}x)" for name, t in ms.items()))  # fmt: skip
        del models, steps, variants
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(*sys.argv[1:2])
