"""Whether Pythia-1.4B's eager training step is host-bound, torch against tritongemm: per step,
the time to enqueue it (nothing inside a step synchronizes) beside the time until the GPU is
done, medians of 10 steps in 3 interleaved rounds, then cProfile of tritongemm's steps.
BENCHMARKS.md ("Models") quotes it (results/h100/probes/model/pythia-train-host-9041c5b.txt).

    PYTHONPATH=. python3 scripts/probes/model/pythia_train_host.py
"""

import cProfile
import pstats
import time

import torch

from tritongemm.bench.model import SETTINGS, build_models, make_inputs, model_config, timed_call

setting = next(s for s in SETTINGS if s.phase == "train")
config = model_config("pythia-1.4b")
models = build_models("pythia-1.4b", config, device="cuda", providers=("torch", "tritongemm"))
inputs = make_inputs(setting, config["vocab_size"], "cuda")
steps = {}
for name in ("torch", "tritongemm"):
    models[name].train(True)
    steps[name] = timed_call(models[name], setting, inputs)
    for _ in range(3):
        steps[name]()
    torch.cuda.synchronize()
for rnd in range(3):
    for name, step in steps.items():
        host, walls = [], []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host.append((t1 - t0) * 1e3)
            walls.append((t2 - t0) * 1e3)
        host.sort(), walls.sort()
        print(f"round {rnd} {name:11s} host enqueue {host[5]:.2f} ms, step {walls[5]:.2f} ms (medians of 10)")
prof = cProfile.Profile()
torch.cuda.synchronize()
prof.enable()
for _ in range(10):
    steps["tritongemm"]()
torch.cuda.synchronize()
prof.disable()
st = pstats.Stats(prof)
st.sort_stats("tottime").print_stats(35)
st.sort_stats("cumtime").print_stats(45)
