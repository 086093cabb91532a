"""Where a model phase spends its GPU and host time, torch against tritongemm, by kernel: the
bench model families (random weights, no download) under torch.profiler. bf16, on a GPU:

    PYTHONPATH=. python3 scripts/probes/model/model_profile.py pythia-1.4b train
    PYTHONPATH=. python3 scripts/probes/model/model_profile.py llama-3-8b generate
    PYTHONPATH=. python3 scripts/probes/model/model_profile.py mixtral-8x7b-moe train hf-grouped_mm,tritongemm

The third argument names bench model's providers to profile (default torch,tritongemm); the
fourth picks the phase's setting by its shape, e.g. 4x1024 (default: the phase's first).
PROFILE_ROWS sets the table's length, PROFILE_SORT its order (self_cpu_time_total for host time).
"""

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from tritongemm.bench import model as bench_model
from tritongemm.bench.model import SETTINGS, build_models, generator, make_inputs, model_config, timed_call

ROWS = int(os.environ.get("PROFILE_ROWS", "14"))  # the table's kernels, the slowest first
SORT = os.environ.get("PROFILE_SORT", "self_device_time_total")  # or self_cpu_time_total: the host's view


def main(family: str, phase: str, providers: str = "torch,tritongemm", shape: str | None = None) -> None:
    setting = next(s for s in SETTINGS if s.phase == phase and shape in (None, f"{s.batch}x{s.tokens}"))
    config = model_config(family)
    names = providers.split(",")
    models = build_models(family, config, device="cuda", providers=tuple(names))
    inputs = make_inputs(setting, config["vocab_size"], "cuda")
    for name in names:
        models[name].train(phase == "train")
        # generate calls a compiled model's own generate, which runs the uncompiled forward: profile
        # what bench model times, a copy with its forward compiled.
        model = generator(models[name]) if phase == "generate" else models[name]
        call = timed_call(model, setting, inputs)
        # Room for generate's recompiles (bench model's _recompile_limits), an error past it.
        with torch.set_grad_enabled(phase == "train"), bench_model._recompile_limits():
            for _ in range(2):
                call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
        events = prof.key_averages()
        gpu = sum(e.self_device_time_total for e in events) / 1e3
        print(f"=== {family} {phase} {name}: GPU kernels {gpu:.2f} ms")
        print(events.table(sort_by=SORT, row_limit=ROWS, max_name_column_width=70))


if __name__ == "__main__":
    main(*sys.argv[1:5])
