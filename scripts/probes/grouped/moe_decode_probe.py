"""Probe: the experts of one MoE layer at decode sizes, three ways, kernel-only (CUDA graph) and
eager (back-to-back calls, host included): tritongemm's two launches (grouped/moe_decode.py),
tritongemm's grouped path (moe.py with the decode path off) and transformers' `grouped_mm`
experts. Mixtral's and Qwen3-MoE's layer dimensions, random bf16 weights, 1-16 tokens; each
checked against a float64 loop first. Feeds moe_decode.PAIRS_PER_EXPERT and moe_build.TILE.

    PYTHONPATH=. python3 scripts/probes/grouped/moe_decode_probe.py --out moe-decode.csv [--tiles]

--tiles: the decode kernel's tile settings (moe_build.TILE) instead, kernel-only, beside the
grouped path, at 1, 2 and 4 tokens.
"""

from __future__ import annotations

import argparse
import csv
import functools
import types

import torch

LAYERS = {  # family: transformers experts class, config class, its settings
    "mixtral-8x7b-moe": ("mixtral", "MixtralConfig", dict(hidden_size=4096, intermediate_size=14336,
                                                          num_local_experts=8, num_experts_per_tok=2)),
    "qwen3-30b-moe": ("qwen3_moe", "Qwen3MoeConfig", dict(hidden_size=2048, moe_intermediate_size=768,
                                                          num_experts=128, num_experts_per_tok=8)),
}  # fmt: skip
TOKENS = (1, 2, 4, 8, 16)
TILES = [dict(TILE_ELEMENTS=e, WAVES=w, num_warps=nw) for e in (4096, 8192) for w in (2, 4) for nw in (4, 8)]


def experts_module(family: str):
    import importlib

    import transformers

    package, config_name, settings = LAYERS[family]
    config = getattr(transformers, config_name)(**settings)
    config._experts_implementation = "grouped_mm"
    modeling = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    cls = next(getattr(modeling, n) for n in dir(modeling) if n.endswith("Experts"))
    module = cls(config).to("cuda", torch.bfloat16)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return module.requires_grad_(False), config


def main() -> None:
    from tritongemm.grouped import moe, moe_decode

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiles", action="store_true")
    args = parser.parse_args()
    moe.register()
    limit = moe_decode.PAIRS_PER_EXPERT
    with open(args.out, "w", newline="") as f, torch.no_grad():
        writer = csv.writer(f)
        writer.writerow(["family", "tokens", "provider", "timing", "us", "ratio_to_hf", "rel_err", "status"])
        try:
            for family in LAYERS:
                (probe_tiles if args.tiles else probe_family)(family, writer)
                torch.cuda.empty_cache()
        finally:
            moe_decode.PAIRS_PER_EXPERT = limit


def with_pair_limit(limit: float, fn):
    """fn, called with moe's decode path serving up to `limit` pairs an expert."""
    from tritongemm.grouped import moe_decode

    def call(*args):
        moe_decode.PAIRS_PER_EXPERT = limit
        return fn(*args)

    return call


def probe_family(family: str, writer) -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    from tritongemm.bench.measure import check_then_time
    from tritongemm.grouped import moe

    module, config = experts_module(family)
    top_k = config.num_experts_per_tok
    weights64 = module.gate_up_proj.double(), module.down_proj.double()
    providers = {
        "tritongemm-decode": with_pair_limit(1 << 30, moe.experts_forward),
        "tritongemm-grouped": with_pair_limit(0, moe.experts_forward),
        "hf-grouped_mm": ALL_EXPERTS_FUNCTIONS["grouped_mm"],
    }
    for tokens in TOKENS:
        x = torch.randn(tokens, config.hidden_size, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(tokens, module.num_experts, device="cuda")
        weights, ids = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
        ref = reference(*weights64, x, ids, weights)
        calls = {name: functools.partial(fn, module, x, ids, weights) for name, fn in providers.items()}
        # the weights of the experts a step reads, each once: what bounds its time
        weight_bytes = 3 * config.hidden_size * module.down_proj.shape[-1] * 2 * min(tokens * top_k, module.num_experts)
        problem = types.SimpleNamespace(flops=weight_bytes, bytes=weight_bytes)
        errors, results = check_then_time(calls, ref, 2e-2, problem, timings=("graph", "eager"))
        for timing, by_name in results.items():
            hf = by_name["hf-grouped_mm"][0]
            for name, (ms, status) in by_name.items():
                ratio = hf / ms if hf and ms else None
                writer.writerow([family, tokens, name, timing, ms and ms * 1e3, ratio, errors[name], status])
                print(f"{family:18s} {tokens:3d} tokens {name:20s} {timing:5s} {(ms or 0) * 1e3:8.1f} us "
                      f"x{ratio or 0:.3f} vs hf  err {errors[name] or 0:.1e} {status}", flush=True)  # fmt: skip


def probe_tiles(family: str, writer) -> None:
    from tritongemm.bench.measure import check_then_time
    from tritongemm.core.plans import PLANS
    from tritongemm.grouped import moe, moe_build

    module, config = experts_module(family)
    weights64 = module.gate_up_proj.double(), module.down_proj.double()
    chosen = dict(moe_build.TILE)
    problem = types.SimpleNamespace(flops=1, bytes=1)  # small: kernel-only timing in a CUDA graph
    for tokens in TOKENS[:3]:
        x = torch.randn(tokens, config.hidden_size, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(tokens, module.num_experts, device="cuda")
        weights, ids = torch.topk(torch.softmax(logits, -1), config.num_experts_per_tok, dim=-1)
        ref = reference(*weights64, x, ids, weights)
        runs = [("tritongemm-grouped", 0, chosen)] + [
            ("decode " + " ".join(f"{k}={v}" for k, v in tile.items()), 1 << 30, tile) for tile in TILES
        ]
        rows = []
        for name, limit, tile in runs:  # each alone: the plan its check builds under this tile is the one timed
            moe_build.TILE.update(tile)
            PLANS.clear()
            call = functools.partial(with_pair_limit(limit, moe.experts_forward), module, x, ids, weights)
            errors, results = check_then_time({name: call}, ref, 2e-2, problem, timings=("graph",))
            rows.append((name, *results["graph"][name], errors[name]))
        base = rows[0][1]
        for name, ms, status, error in rows:
            ratio = base / ms if base and ms else None
            writer.writerow([family, tokens, name, "graph", ms and ms * 1e3, ratio, error, status])
            print(f"{family:18s} {tokens:3d} tokens {name:50s} {(ms or 0) * 1e3:8.1f} us x{ratio or 0:.3f} vs grouped "
                  f"{status}", flush=True)  # fmt: skip
    moe_build.TILE.update(chosen)
    PLANS.clear()


def reference(gate_up, down, x, ids, weights) -> torch.Tensor:
    """The layer in float64, token by token and expert by expert; weights (experts, out, in)."""
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            gate, up = (gate_up[ids[t, j]] @ x[t].double()).chunk(2)
            out[t] += weights[t, j].double() * (down[ids[t, j]] @ (torch.nn.functional.silu(gate) * up))
    return out


if __name__ == "__main__":
    main()
