"""`tritongemm bench decode`: a decode step as serving engines run it, each provider's model with a
static KV cache and the step captured in one CUDA graph, replayed token after token.

Eager `generate` spends milliseconds of Python a token, so it measures the host. Here the host is
gone: the step (the model's forward on one token a sequence, the greedy choice of the next token,
the position moved on) is captured once with `torch.cuda.graph` on transformers' `StaticCache`,
and replayed. The captured step is the model's own eager forward, so every provider is captured
the same way and the GEMMs are what differ between them (torch.compile's reduce-overhead mode, the
other way to get there, would also fuse the rest, differently per provider).

A row is one provider at one batch (sequences in flight): a PROMPT-token prompt, prefilled once,
then NEW_TOKENS - 1 replayed steps (the first new token comes from the prefill). Before timing:
- the first step's logits, every provider fed torch's first token: against eager torch's
  (`logits_rel_err`, a quantization's error included), and `kernel_rel_err`, a kernel's error
  told from the quantization's, on the first REFERENCE_SEQUENCES sequences: a bf16 provider's
  logits against the fp64 model's; an fp8 provider's worst Fp8Linear against the fp64 product of
  the input that layer was given, quantized by its recipe, and its own fp8 weight and scales (a
  whole fp8 model in fp64 would quantize fp64 activations, a rounding boundary away from the
  kernels' at a few elements, each an fp8 step off). Past its bound (fp8_tolerance for an fp8
  layer; for the logits against the fp64 model's, bench model's MAX_REL_ERR or FP8_MAX_REL_ERR
  grown with depth, see BOUND_LAYERS, and for bf16 at least TORCH_SLACK times torch's own) the
  provider is reported wrong and not timed (torch, the baseline, is reported, not gated);
- the greedy tokens of a free run against torch's: `matching_tokens` is the mean number of
  leading new tokens equal to torch's, over the sequences.
Then rounds of replays (CUDA events; the best round) give `ms_per_token`, and a profile of one
step gives `gemm_share` (the device time of the kernels the GEMM modules launch, over the step's)
and `weight_GBps` (the bytes of the GEMMs' weights, read once a step, over that time).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from pathlib import Path

import torch

import tritongemm
from tritongemm.bench.environment import describe_environment
from tritongemm.bench.measure import describe_error
from tritongemm.bench.model import (
    FAMILIES,
    FP8_MAX_REL_ERR,
    INSTALL_HINT,
    MAX_REL_ERR,
    VOCAB_SIZE,
    build_base,
    family_config,
    sharing_copy,
)
from tritongemm.bench.plots import plot_decode
from tritongemm.bench.report import write_results
from tritongemm.blocks import GatedMLP
from tritongemm.blocks.qkv import QKVProjection
from tritongemm.core.reference import fp8_tolerance, rel_error
from tritongemm.fp8.linear import Fp8Linear
from tritongemm.fp8.recipes import reference_quantize, reference_scaled_mm

MODELS = ("llama-3-8b", "qwen2-7b")
LAYERS = 8  # enough that the decoder layers' GEMMs, not the lm_head and the embedding, are the step
BATCHES = (1, 8, 32, 64, 128, 256)
PROMPT = 512
NEW_TOKENS = 128
# provider -> tritongemm.patch's arguments (None: the model as transformers builds it). The fp8
# providers quantize each decoder layer's norm output in the norm's kernel (fuse=True with fp8).
PROVIDERS = {
    "torch": None,
    "tritongemm": {},
    "tritongemm-fused": dict(fuse=True),
    "fp8-row": dict(fp8="row", fuse=True),
    "fp8-block": dict(fp8="block", fuse=True),
}
REFERENCE_SEQUENCES = 2  # the fp64 product runs on this many sequences of each batch
# bench model's logits bounds hold two layers deep. Independent roundings add through the residual
# stream in quadrature, so deeper they grow as sqrt(depth): on the H200 (2026-12-02) eager torch's
# own bf16 logits were 3.2e-2 to 3.6e-2 from the fp64 model's at 8 layers (MAX_REL_ERR 2e-2 at
# two), the fp8 providers' 0.33 to 0.37 (FP8_MAX_REL_ERR 0.25). A broken kernel is off by O(1).
BOUND_LAYERS = 2
# torch is the baseline, not under test: its error is reported, and a bf16 provider may be this
# much further from the fp64 model than torch is in the same run (its GEMMs round otherwise).
TORCH_SLACK = 1.25
ROUNDS = 5
COLUMNS = ["device", "model", "batch", "provider", "ms_per_token", "tokens_per_s", "ratio_to_torch", "gemm_share",
           "weight_GBps", "matching_tokens", "logits_rel_err", "kernel_rel_err", "status"]  # fmt: skip
GEMM_RANGE = "tritongemm.bench.decode: gemm"  # the profiler range around each GEMM module's call
# A tiny model for the CPU (the Triton interpreter, fp32): the plumbing, not the speed.
CPU_SMOKE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What one run decodes: its batches, the prompt's tokens and the new tokens a sequence."""

    batches: tuple[int, ...] = BATCHES
    prompt: int = PROMPT
    new_tokens: int = NEW_TOKENS


@dataclasses.dataclass
class DecodeRow:
    device: str
    model: str
    batch: int
    provider: str
    ms_per_token: float | None  # one replayed step: a token for every sequence
    tokens_per_s: float | None  # batch / step time
    ratio_to_torch: float | None  # torch's ms_per_token / this one
    gemm_share: float | None  # the GEMM modules' kernels' device time / the step's time
    weight_GBps: float | None  # the GEMM weights' bytes / the GEMM modules' kernels' time
    matching_tokens: float | None  # mean leading new tokens equal to torch's, per sequence
    logits_rel_err: float | None  # the first step's logits against eager torch's
    kernel_rel_err: float | None  # ... against the fp64 product of this provider's own weights
    status: str  # "ok", "wrong: ..." (past a bound against an fp64 product, not timed) or "error: ..."

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_arguments(models: tuple[str, ...] = MODELS, providers: tuple[str, ...] = tuple(PROVIDERS),
                    batches: tuple[int, ...] | None = None) -> None:  # fmt: skip
    """Raise the ValueError that `run_decode` would raise for these arguments, running nothing."""
    for given, choices, option in ((models, FAMILIES, "--models"), (providers, PROVIDERS, "--providers")):
        unknown = [x for x in given if x not in choices]
        if unknown or not given:
            got = repr(unknown[0]) if unknown else "none"
            raise ValueError(f"bench decode: {option}: expected names from {', '.join(choices)}, but got {got}")
    moe = [m for m in models if FAMILIES[m].moe]
    if moe:
        raise ValueError(f"bench decode: --models: expected dense families, but got {moe[0]!r} (a MoE model)")
    if "torch" not in providers:
        raise ValueError(f"bench decode: --providers must include torch, the reference, but got {','.join(providers)}")
    if batches is not None and (not batches or not all(isinstance(b, int) and b >= 1 for b in batches)):
        raise ValueError(f"bench decode: --batches: expected integers >= 1, but got {batches!r}")


def requirements_error() -> str | None:
    """Why `bench decode` cannot run here (None: it can)."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return INSTALL_HINT.replace("bench model", "bench decode")
    return None


# ----------------------------------------------------------------------------------------------
# The models
# ----------------------------------------------------------------------------------------------


def provider_model(base: torch.nn.Module, provider: str) -> torch.nn.Module:
    """The module `provider` runs: the base model, or a copy of its tree (the parameters shared)
    with tritongemm.patch applied as PROVIDERS says."""
    options = PROVIDERS[provider]
    return base if options is None else tritongemm.patch(sharing_copy(base), **options)


def gemm_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that run a GEMM over a weight: nn.Linear (and tritongemm's Linear), Fp8Linear,
    a fused q/k/v projection and a fused MLP's gate/up pair (GatedMLP, whose down projection is a
    Linear of its own)."""
    return [m for m in model.modules() if isinstance(m, (torch.nn.Linear, Fp8Linear, QKVProjection, GatedMLP))]


def weight_bytes(model: torch.nn.Module) -> int:
    """The bytes of the GEMM weights (and fp8 scales) a step reads once: every GEMM module's own
    weight tensors, each counted once."""
    seen, total = set(), 0
    for module in gemm_modules(model):
        if isinstance(module, Fp8Linear):
            tensors = (module.weight_fp8, module.weight_scale)
        elif isinstance(module, QKVProjection):
            tensors = (module.qkv_weight,)
        elif isinstance(module, GatedMLP):
            tensors = (module.gate_up_weight,)
        else:
            tensors = (module.weight,)
        for t in tensors:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


class _Fp8Reference(torch.nn.Module):
    """An Fp8Linear's product in fp64: the input quantized by the layer's recipe (in fp32, as the
    kernels do), times the layer's own fp8 weight and scales, plus its bias."""

    def __init__(self, layer: Fp8Linear) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer, (*lead, K) = self.layer, x.shape
        x_fp8, x_scale = reference_quantize(x.reshape(-1, K).float(), layer.recipe)
        bias = None if layer.bias is None else layer.bias.double()
        y = reference_scaled_mm(x_fp8, layer.weight_fp8.T, x_scale, layer.weight_scale, bias, out_dtype=torch.float64)
        return y.view(*lead, layer.out_features)


def fp8_layer_errors(loop: DecodeLoop, first: torch.Tensor, sequences: int) -> list[tuple[str, float, float]]:
    """(name, rel_error, bound) of every Fp8Linear of `loop`'s model in one eager first step fed
    `first`: its output on the first `sequences` sequences against _Fp8Reference's of the input
    it was given (the bound: fp8_tolerance for its output dtype and K). The loop is reset after."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(name):
        def hook(module, args, out):
            seen[name] = (args[0][:sequences].clone(), out[:sequences].clone())

        return hook

    layers = {name: m for name, m in loop.model.named_modules() if isinstance(m, Fp8Linear)}
    hooks = [m.register_forward_hook(keep(name)) for name, m in layers.items()]
    try:
        loop.reset(first)
        loop._step()
    finally:
        for h in hooks:
            h.remove()
        loop.reset(loop.first)
    found = []
    for name, (x, y) in seen.items():
        layer = layers[name]
        error = rel_error(y, _Fp8Reference(layer)(x))
        found.append((name, error, fp8_tolerance(y.dtype, layer.in_features)))
    return found


def fp64_reference(base: torch.nn.Module) -> torch.nn.Module:
    """The fp64 product of the bf16 providers' weights: a float64 copy of `base` (their fused
    modules hold copies of the same values). A deep copy: converting a sharing copy would convert
    the shared parameters, the base's too."""
    return copy.deepcopy(base).double()


# ----------------------------------------------------------------------------------------------
# The captured step
# ----------------------------------------------------------------------------------------------


class DecodeLoop:
    """One provider's decode at one batch: the prompt prefilled into a StaticCache, then `step`,
    the forward on one token a sequence and the greedy choice of the next, as a CUDA graph
    (`capture`) or eagerly (the CPU's run). All state is in tensors the graph reads: the tokens
    `ids` (batch, 1), the position `pos` (1,), the new tokens so far `tokens` (batch, new)."""

    def __init__(self, model, prompt_ids: torch.Tensor, new_tokens: int, capture: bool) -> None:
        from transformers import StaticCache

        self.model, self.prompt = model, prompt_ids.shape[1]
        batch, device = prompt_ids.shape[0], prompt_ids.device
        self.cache = StaticCache(config=model.config, max_cache_len=self.prompt + new_tokens)
        positions = torch.arange(self.prompt, device=device)
        logits = model(input_ids=prompt_ids, past_key_values=self.cache, cache_position=positions,
                       logits_to_keep=1).logits[:, -1]  # fmt: skip
        self.first = logits.argmax(-1, keepdim=True)  # the first new token of each sequence
        self.ids = self.first.clone()
        self.pos = torch.full((1,), self.prompt, device=device, dtype=torch.long)
        self.tokens = torch.zeros(batch, new_tokens, device=device, dtype=torch.long)
        self.new_tokens, self.graph, self.logits = new_tokens, None, None
        if capture:
            self._capture()

    def _step(self) -> torch.Tensor:
        logits = self.model(input_ids=self.ids, past_key_values=self.cache, cache_position=self.pos).logits[:, -1]
        self.ids.copy_(logits.argmax(-1, keepdim=True))
        self.tokens.index_copy_(1, self.pos - (self.prompt - 1), self.ids)  # new token k+1 at step k
        self.pos.add_(1)
        return logits

    def _capture(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # plans built and kernels compiled before the capture
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.reset(self.first)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._step()
        self.reset(self.first)

    def reset(self, first: torch.Tensor) -> None:
        """Back to the first step, fed `first` (batch, 1): the cache past the prompt is written
        again step by step, and masked until then (the mask follows `pos`)."""
        # transformers 5.x's StaticLayer writes where its own count of cached tokens says (a
        # tensor, so a captured step moves it), not at cache_position: set it back too.
        for layer in self.cache.layers:
            if not hasattr(layer, "cumulative_length"):
                raise RuntimeError(f"bench decode: this transformers' {type(layer).__name__} has no "
                                   "cumulative_length to rewind: not the StaticCache this benchmark knows")  # fmt: skip
            layer.cumulative_length.fill_(self.prompt)
        self.ids.copy_(first)
        self.pos.fill_(self.prompt)
        self.tokens.zero_()
        self.tokens[:, :1] = first

    def step(self) -> torch.Tensor:
        """One step: the logits it chose from (batch, vocab), in the graph's buffer if captured."""
        if self.graph is None:
            return self._step()
        self.graph.replay()
        return self.logits

    def run(self) -> torch.Tensor:
        """Every step from the first: the new tokens (batch, new)."""
        self.reset(self.first)
        for _ in range(self.new_tokens - 1):
            self.step()
        return self.tokens.clone()

    def time_steps(self, rounds: int = ROUNDS) -> float:
        """ms per step: the best of `rounds` runs of every step, timed by CUDA events (the wall
        clock on the CPU)."""
        steps = self.new_tokens - 1
        best = math.inf
        for _ in range(rounds):
            self.reset(self.first)
            if torch.cuda.is_available():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            began = time.perf_counter()
            for _ in range(steps):
                self.step()
            if torch.cuda.is_available():
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                ms = (time.perf_counter() - began) * 1e3
            best = min(best, ms / steps)
        return best


def gemm_time_ms(loop: DecodeLoop) -> float | None:
    """The device ms of the kernels the GEMM modules launch in one eager step,
    under torch.profiler, each GEMM module's call in a GEMM_RANGE range (the outermost only: a
    GatedMLP's down projection is a Linear of its own); None without a GPU."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile, record_function

    depth, ranges = [0], []

    def enter(module, args):
        depth[0] += 1
        if depth[0] == 1:
            ranges.append(record_function(GEMM_RANGE))
            ranges[-1].__enter__()

    def leave(module, args, out):
        depth[0] -= 1
        if depth[0] == 0:
            ranges.pop().__exit__(None, None, None)

    hooks = [h for m in gemm_modules(loop.model)
             for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]  # fmt: skip
    try:
        loop.reset(loop.first)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            loop._step()
            torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
        loop.reset(loop.first)
    # The CPU-side ranges: each one's device time is its kernels' (FunctionEvent.device_time_total).
    # The profiler also records each range on the GPU's timeline, whose device time is its span,
    # the gaps between an eager step's kernels included; key_averages sums both under one name,
    # which gave torch's GEMMs 1.13 of its graph-captured step at batch 1 on the H200.
    from torch.autograd import DeviceType

    ranges = [e for e in prof.events() if e.name == GEMM_RANGE and e.device_type == DeviceType.CPU]
    return sum(e.device_time_total for e in ranges) / 1e3


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------


def matching_tokens(tokens: torch.Tensor, ref: torch.Tensor) -> float:
    """The mean, over the sequences, of how many leading new tokens equal the reference's."""
    differs = tokens != ref
    whole = torch.full((tokens.shape[0],), tokens.shape[1], device=tokens.device)
    return torch.where(differs.any(1), differs.int().argmax(1), whole).double().mean().item()


def first_step_logits(model, prompt_ids: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """The logits (batch, vocab) of the first step after the prompt, fed `first`: eagerly, on a
    cache of its own (the fp64 reference's call)."""
    loop = DecodeLoop(model, prompt_ids, 2, capture=False)
    loop.reset(first)
    return loop.step()


def measure_batch(family: str, base, models: dict, batch: int, shape: Shape, *, device, device_name: str,
                  fp64: torch.nn.Module) -> list[DecodeRow]:  # fmt: skip
    """Every provider of `models` at one batch: checked, then timed and profiled (torch first)."""
    gen = torch.Generator(device="cpu").manual_seed(batch)
    prompt = torch.randint(0, base.config.vocab_size, (batch, shape.prompt), generator=gen).to(device)
    capture = torch.device(device).type == "cuda"
    depth = math.sqrt(base.config.num_hidden_layers / BOUND_LAYERS)  # the bounds' growth with depth
    seen: dict[str, dict] = {}
    for provider, model in models.items():
        loop = None
        try:
            with torch.inference_mode():
                loop = DecodeLoop(model, prompt, shape.new_tokens, capture)
                torch_first = seen.get("torch", {}).get("first", loop.first)
                loop.reset(torch_first)
                logits = loop.step().clone()
                few = slice(0, REFERENCE_SEQUENCES)
                reference = first_step_logits(fp64, prompt[few], torch_first[few])
                logits_err = rel_error(logits[few], reference.double())
                if "fp8" in (PROVIDERS[provider] or {}):
                    layers = fp8_layer_errors(loop, torch_first, REFERENCE_SEQUENCES)
                    if not layers:
                        raise RuntimeError(f"bench decode: {provider} converted no layer to Fp8Linear")
                    kernel_err = max(err for _, err, _ in layers)
                    checks = [(f"its {name}'s output is", err, bound, "the fp64 product of its input and weights")
                              for name, err, bound in layers]  # fmt: skip
                    checks.append(("the first step's logits are", logits_err, depth * FP8_MAX_REL_ERR,
                                   "the fp64 model's"))  # fmt: skip
                elif provider == "torch":
                    kernel_err, checks = logits_err, []
                else:
                    kernel_err = logits_err
                    bound = max(depth * MAX_REL_ERR, TORCH_SLACK * seen.get("torch", {}).get("kernel_err", 0.0))
                    checks = [("the first step's logits are", logits_err, bound, "the fp64 model's")]
                wrong = [f"{what} {err:.2e} from {whose}, past {bound:.2e}" for what, err, bound, whose in checks
                         if not err <= bound]  # fmt: skip
                if wrong:  # checked before it is timed: a wrong provider is not
                    seen[provider] = dict(error="wrong: " + wrong[0])
                    continue
                tokens = loop.run()
                ms = loop.time_steps()
                gemm_ms = gemm_time_ms(loop)
            seen[provider] = dict(first=loop.first, logits=logits, tokens=tokens, ms=ms, gemm_ms=gemm_ms,
                                  kernel_err=kernel_err, bytes=weight_bytes(model))  # fmt: skip
        except Exception as exc:  # noqa: BLE001  recorded in the row; the other providers go on
            seen[provider] = dict(error=describe_error(exc))
        finally:
            loop = None
            if capture:
                torch.cuda.empty_cache()
    return make_rows(device_name, family, batch, seen)


def make_rows(device_name: str, family: str, batch: int, seen: dict[str, dict]) -> list[DecodeRow]:
    """One row per provider measured, the ratios against torch's."""
    ref = seen.get("torch", {})
    rows = []
    for provider, s in seen.items():
        if "error" in s:
            rows.append(DecodeRow(device_name, family, batch, provider, *([None] * 8), s["error"]))
            continue
        gemm_ms = s["gemm_ms"]
        share = gemm_ms / s["ms"] if gemm_ms else None
        gbps = s["bytes"] / (gemm_ms * 1e-3) / 1e9 if gemm_ms else None
        ratio = ref["ms"] / s["ms"] if "ms" in ref else None
        against = "logits" in ref
        tokens = matching_tokens(s["tokens"], ref["tokens"]) if against else None
        logits_err = rel_error(s["logits"], ref["logits"].double()) if against else None
        rows.append(DecodeRow(device_name, family, batch, provider, s["ms"], batch / (s["ms"] * 1e-3), ratio, share,
                              gbps, tokens, logits_err, s["kernel_err"], "ok"))  # fmt: skip
    return rows


def run_decode(*, models: tuple[str, ...] = MODELS, providers: tuple[str, ...] = tuple(PROVIDERS),
               batches: tuple[int, ...] | None = None, out_dir: str | Path | None = "results", name: str | None = None,
               shape: Shape | None = None, plot: bool = True) -> list[DecodeRow]:  # fmt: skip
    """The decode suite: on a GPU every family at LAYERS layers in bf16 over `shape`'s batches
    (`batches` in their place where given); on the CPU a smoke run (CPU_SMOKE's tiny model in
    fp32, under the interpreter, eagerly, without graphs). Writes `out_dir`/`name`.csv and .json
    (and .png on a GPU)."""
    check_arguments(models, providers, batches)
    problem = requirements_error()
    if problem:
        raise ValueError(problem)
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    shape = shape or (Shape() if on_gpu else Shape(batches=(1, 3), prompt=8, new_tokens=4))
    if batches is not None:
        shape = dataclasses.replace(shape, batches=tuple(batches))
    env = describe_environment()
    base_name = name or ("decode" if on_gpu else "decode-cpu")
    rows: list[DecodeRow] = []
    for family in models:
        dims = None if on_gpu else CPU_SMOKE
        config = family_config(family, LAYERS if on_gpu else 2, VOCAB_SIZE if on_gpu else 96, dims=dims)
        base = build_base(family, config, device=device, dtype=torch.bfloat16 if on_gpu else torch.float32)
        built = {p: provider_model(base, p) for p in providers}
        fp64 = fp64_reference(base)
        for batch in shape.batches:
            rows += measure_batch(family, base, built, batch, shape, device=device, device_name=env["device"],
                                  fp64=fp64)  # fmt: skip
            for r in rows[-len(built) :]:
                print(format_row(r), flush=True)
        del built, fp64, base
    if out_dir is not None:
        timed = [r for r in rows if r.ms_per_token is not None]
        paths = write_results(timed, env, Path(out_dir), base_name, columns=COLUMNS, json_rows=rows)
        if plot and on_gpu and timed:
            paths += (plot_decode(timed, Path(out_dir) / f"{base_name}.png", f"decode step, {env['device']}"),)
        print("wrote " + ", ".join(str(p) for p in paths))
    return rows


def format_row(r: DecodeRow) -> str:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    return (f"{r.model} batch {r.batch:4d} {r.provider:17s} {fmt(r.ms_per_token, '8.4f')} ms/token "
            f"{fmt(r.ratio_to_torch, '6.3f')}x torch  GEMMs {fmt(r.gemm_share, '.2f')} of the step at "
            f"{fmt(r.weight_GBps, '7.0f')} GB/s  tokens {fmt(r.matching_tokens, '.1f')}  logits err "
            f"{fmt(r.logits_rel_err, '.1e')} (fp64 {fmt(r.kernel_rel_err, '.1e')})  {r.status}")  # fmt: skip
