"""What moving the decoder layers' residual adds into the GEMMs' stores is worth (blocks/residual.py):
one bench-model family (random weights, nothing downloaded) as `torch`, `tritongemm-fused`, and
the fused model with its layers' own forwards back (`fused-adds`: the adds as torch kernels), each
setting of `bench model` timed in interleaved rounds; then one decoder layer at a decode-sized
input, host time and GPU time, fused against not. bf16, on a GPU:

    PYTHONPATH=. python3 scripts/probes/blocks/residual_probe.py llama-3-8b [--profile] [--layers-only] [--modules]
"""

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from tritongemm.bench.model import (
    SETTINGS,
    _recompile_limits,
    build_models,
    generator,
    make_inputs,
    model_config,
    sharing_copy,
    timed_call,
)
from tritongemm.blocks import residual as residual_module

ROUNDS = 7


def wall_ms(call) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def with_layer_adds(fused: torch.nn.Module) -> torch.nn.Module:
    """A copy of the fused model whose decoder layers run their class's forward again."""
    copy = sharing_copy(fused)
    for layer in copy.model.layers:
        layer.__dict__.pop("forward", None)
    return copy


def main(family: str) -> None:
    config = model_config(family)
    models = build_models(family, config, device="cuda", providers=("torch", "tritongemm-fused"))
    models["fused-adds"] = with_layer_adds(models["tritongemm-fused"])
    for setting in [] if "--layers-only" in sys.argv else SETTINGS:
        inputs = make_inputs(setting, config["vocab_size"], "cuda")
        grad = setting.phase == "train"
        with torch.set_grad_enabled(grad), _recompile_limits():
            for model in models.values():
                model.train(grad)
            calls = {p: timed_call(generator(m), setting, inputs) for p, m in models.items()}
            for call in calls.values():
                call(), call()
            times = {p: [] for p in calls}
            for _ in range(ROUNDS):
                for p, call in calls.items():
                    times[p].append(wall_ms(call))
        medians = {p: statistics.median(t) for p, t in times.items()}
        line = ", ".join(f"{p} {m:.2f} ms ({medians['torch'] / m:.3f}x torch)" for p, m in medians.items())
        print(f"{setting.phase} {setting.batch} x {setting.tokens}: {line}")

    hidden = config["hidden_size"]
    if "--modules" in sys.argv:
        module_host_times(models, hidden)
    rotary = models["torch"].model.rotary_emb
    variants = ("tritongemm-fused", "fused-adds", "torch")
    for tokens in (1, 16, 2048):
        x = torch.randn(1, tokens, hidden, device="cuda", dtype=torch.bfloat16)
        position = rotary(x, torch.arange(tokens, device="cuda")[None])
        calls = {}
        for p in variants:
            layer = models[p].model.layers[0].eval()
            calls[p] = lambda layer=layer, x=x, position=position: layer(x, position_embeddings=position)  # noqa: E731
        gpu, host = {p: [] for p in variants}, {p: [] for p in variants}
        with torch.no_grad():
            for call in calls.values():
                do_bench(call)  # warm-up: kernels compiled, clocks up
            for _ in range(5):  # interleaved rounds: the shared machine drifts
                for p, call in calls.items():
                    gpu[p].append(do_bench(call) * 1e3)
                    host[p].append(host_us(call))
        parts = [f"{p} GPU {statistics.median(gpu[p]):.1f} us, host {statistics.median(host[p]):.1f} us"
                 for p in variants]  # fmt: skip
        print(f"one decoder layer, 1 x {tokens} tokens: " + "; ".join(parts))
        if "--profile" in sys.argv and tokens == 1:  # where a call's host time goes, by Python function
            for p in variants:
                profiler = cProfile.Profile()
                with torch.no_grad():
                    for _ in range(100):
                        torch.cuda.synchronize()
                        profiler.runcall(calls[p])
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                print(f"=== cProfile {p}, 1 x {tokens} tokens, 100 calls\n{text.getvalue()}")


def module_host_times(models: dict, hidden: int) -> None:
    """Host time of each of the first layer's GEMM-bearing calls at one token, fused against torch's."""
    x = torch.randn(1, 1, hidden, device="cuda", dtype=torch.bfloat16)
    fused, plain = models["tritongemm-fused"].model.layers[0], models["torch"].model.layers[0]
    attn_in = torch.randn(1, 1, fused.self_attn.o_proj.in_features, device="cuda", dtype=torch.bfloat16)

    def qkv(attention):
        return attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)

    cases = {
        "q, k, v projections": (lambda: qkv(fused.self_attn), lambda: qkv(plain.self_attn)),
        "o_proj": (lambda: fused.self_attn.o_proj(attn_in), lambda: plain.self_attn.o_proj(attn_in)),
        "o_proj + residual": (
            lambda: (residual_module.give(fused.self_attn.o_proj, x), fused.self_attn.o_proj(attn_in),
                     residual_module.take_back()),
            lambda: x + plain.self_attn.o_proj(attn_in),
        ),
        "mlp": (lambda: fused.mlp(x), lambda: plain.mlp(x)),
        "mlp + residual": (lambda: fused.mlp(x, residual=x), lambda: x + plain.mlp(x)),
        "input_layernorm": (lambda: fused.input_layernorm(x), lambda: plain.input_layernorm(x)),
    }  # fmt: skip
    with torch.no_grad():
        for name, (ours, theirs) in cases.items():
            for call in (ours, theirs):
                for _ in range(20):
                    call()
            times = {"fused": [], "torch": []}
            for _ in range(5):
                times["fused"].append(host_us(ours, 100))
                times["torch"].append(host_us(theirs, 100))
            print(f"host at 1 token, {name}: fused {statistics.median(times['fused']):.1f} us, "
                  f"torch {statistics.median(times['torch']):.1f} us")  # fmt: skip


def host_us(call, n: int = 50) -> float:
    """Median host time of a call, from its start until its last launch returns, the GPU idle at its
    start (each call waits for the one before), so no launch queue fills up."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "llama-3-8b")
