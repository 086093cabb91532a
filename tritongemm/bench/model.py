"""`tritongemm bench model`: a Hugging Face Llama (Llama-3-8B's layer dimensions, random weights,
no download) with its nn.Linear modules computed by tritongemm (`tritongemm.patch`), against the
same model in eager torch, and both under `torch.compile`, at prefill and decode sizes.

What a user's forward costs, host included: `eager_timer`'s wall clock around back-to-back
forwards. Each provider's logits are checked against eager torch's first (relative Frobenius
error, bf16 bound MAX_REL_ERR); a wrong one is reported and not timed. Decode is one new token
per sequence on a KV cache of a CONTEXT-token prompt, prepared once: each timed call appends
its token and crops it off again (`DynamicCache.crop`), so every call sees the same cache.

Needs a CUDA GPU and `transformers` (optional: pip install transformers).
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tritongemm.bench.measure import ROUNDS, describe_error, eager_timer

PROVIDERS = ("torch", "tritongemm", "torch.compile", "tritongemm+compile")
MAX_REL_ERR = 2e-2  # logits of a bf16 model whose GEMMs round differently, two to four layers deep
LAYERS = (2, 3, 4)
VOCAB_SIZE = 32000  # Llama 2's: Llama 3's 128256 would make the logits, not the layers, the story
CONTEXT = 512  # decode: tokens already in the KV cache
COLUMNS = ["device", "dtype", "layers", "phase", "batch", "tokens", "provider", "ms", "tokens_per_s",
           "ratio_to_torch", "max_rel_err", "status"]  # fmt: skip
INSTALL_HINT = "bench model: needs Hugging Face transformers: pip install transformers"
GPU_HINT = "bench model: needs a CUDA GPU (a Llama layer's GEMMs are pointless in the Triton interpreter)"


@dataclass(frozen=True)
class Setting:
    phase: str  # "prefill" (a prompt, no cache) or "decode" (one token per sequence, with a cache)
    batch: int
    tokens: int  # per sequence: the prompt's length, or 1 new token
    context: int = 0  # decode: the cached prompt's length

    @property
    def label(self) -> str:
        extra = f" on {self.context} cached" if self.phase == "decode" else ""
        return f"{self.phase} batch {self.batch} x {self.tokens}{extra}"


SETTINGS = tuple(Setting("prefill", b, t) for b in (1, 8) for t in (512, 2048)) + tuple(
    Setting("decode", b, 1, CONTEXT) for b in (1, 8, 64)
)


@dataclass
class ModelRow:
    device: str
    dtype: str
    layers: int
    phase: str
    batch: int
    tokens: int
    provider: str  # one of PROVIDERS
    ms: float | None  # wall clock per forward
    tokens_per_s: float | None  # batch * tokens / s
    ratio_to_torch: float | None  # eager torch's ms / this ms
    max_rel_err: float | None  # logits against eager torch's
    status: str  # "ok", "wrong" (failed the check, not timed) or "error: ..." (raised)
    context: int = 0  # decode: the cached prompt's length (JSON only)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    """What one provider gave for one setting, before the derived columns."""

    ms: float | None
    max_rel_err: float | None
    status: str


# ----------------------------------------------------------------------------------------------
# Pure parts: the model's configuration, the rows
# ----------------------------------------------------------------------------------------------


def llama_config(layers: int = 2, vocab_size: int = VOCAB_SIZE) -> dict:
    """transformers.LlamaConfig's arguments: Llama-3-8B's layer (hidden 4096, MLP 14336, 32 query
    heads sharing 8 key/value heads) `layers` times, SDPA attention."""
    if layers not in LAYERS:
        raise ValueError(f"bench model: --layers: expected one of {', '.join(map(str, LAYERS))}, but got {layers!r}")
    return dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=layers,
        vocab_size=vocab_size,
        max_position_embeddings=8192,
        attn_implementation="sdpa",
    )


def make_rows(device: str, dtype: str, layers: int, setting: Setting, outcomes: dict[str, Outcome]) -> list[ModelRow]:
    """One row per provider, in `outcomes`' order, with tokens/s and the ratio to eager torch."""
    torch_ms = outcomes["torch"].ms if "torch" in outcomes else None
    rows = []
    for provider, o in outcomes.items():
        tokens_per_s = setting.batch * setting.tokens / (o.ms * 1e-3) if o.ms else None
        ratio = torch_ms / o.ms if o.ms and torch_ms else None
        rows.append(
            ModelRow(device, dtype, layers, setting.phase, setting.batch, setting.tokens, provider, o.ms,
                     tokens_per_s, ratio, o.max_rel_err, o.status, setting.context)
        )  # fmt: skip
    return rows


def requirements_error() -> str | None:
    """Why `bench model` cannot run here (None: it can). Checked before anything is built."""
    import importlib.util

    if not torch.cuda.is_available():
        return GPU_HINT
    if importlib.util.find_spec("transformers") is None:
        return INSTALL_HINT
    return None


def logits_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in fp32 (the logits of a large batch are GBs: no fp64 copy);
    inf where out holds NaN/Inf."""
    diff = out.float() - ref.float()
    if not torch.isfinite(diff).all():
        return math.inf
    return (torch.linalg.norm(diff) / torch.linalg.norm(ref.float())).item()


# ----------------------------------------------------------------------------------------------
# The models and the calls
# ----------------------------------------------------------------------------------------------


def build_models(
    config_kwargs: dict, *, device, dtype: torch.dtype = torch.bfloat16, providers=PROVIDERS
) -> dict[str, torch.nn.Module]:
    """provider -> the module it calls: the random-weight Llama, a copy of its module tree sharing
    every parameter and buffer with tritongemm.patch applied, and torch.compile of each."""
    import transformers

    import tritongemm

    config = transformers.LlamaConfig(**config_kwargs)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters made in bf16 where they are: no fp32 copy first
    try:
        with torch.device(device):
            base = transformers.LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(saved)
    models = {"torch": base}
    if any(p.startswith("tritongemm") for p in providers):
        shared = {id(t): t for t in (*base.parameters(), *base.buffers())}  # deepcopy's memo: reuse these
        patch = getattr(tritongemm, "patch", None)
        if patch is None:  # the same function, where the package does not export it
            from tritongemm.nn import patch
        models["tritongemm"] = patch(copy.deepcopy(base, shared))
        report = getattr(models["tritongemm"], "tritongemm_patch_report", None)
        if report is not None:
            print(f"tritongemm.patch: {report}")
    # Default mode; static, as each setting is compiled anew (measure_setting).
    if "torch.compile" in providers:
        models["torch.compile"] = torch.compile(models["torch"], dynamic=False)
    if "tritongemm+compile" in providers:
        models["tritongemm+compile"] = torch.compile(models["tritongemm"], dynamic=False)
    return {p: models[p] for p in providers}


def _inputs(setting: Setting, vocab_size: int, device) -> dict:
    shape = (setting.batch, setting.tokens)
    return {"input_ids": torch.randint(0, vocab_size, shape, device=device)}


def forward_call(model, setting: Setting, inputs: dict, cache=None):
    """A function of no arguments running one forward as timed: prefill without a cache; decode
    on `cache`, cropped back after each token so that every call sees the same context."""
    if setting.phase == "prefill":
        return functools.partial(model, **inputs, use_cache=False)

    def decode():
        out = model(**inputs, past_key_values=cache, use_cache=True)
        cache.crop(-setting.tokens)  # negative: tokens to remove (transformers 4.x and 5.x alike)
        return out

    return decode


def prefill_cache(model, setting: Setting, vocab_size: int, device):
    """The DynamicCache of a random `setting.context`-token prompt, from an uncompiled forward,
    already in the layout the timed calls leave it in: views of `context` tokens into tensors
    one step longer (a decode step, cropped). Then a compiled model's first call, the check, is
    compiled for the strides it is timed with (Dynamo guards on strides)."""
    from transformers import DynamicCache

    prompt = torch.randint(0, vocab_size, (setting.batch, setting.context), device=device)
    cache = DynamicCache()  # given, not left to the model: some releases return a legacy tuple then
    model(input_ids=prompt, past_key_values=cache, use_cache=True)
    step = torch.randint(0, vocab_size, (setting.batch, setting.tokens), device=device)
    forward_call(model, setting, {"input_ids": step}, cache)()
    return cache


@torch.no_grad()
def measure_setting(
    models: dict[str, torch.nn.Module],
    setting: Setting,
    *,
    vocab_size: int,
    device,
    rounds: int = ROUNDS,
    timer=eager_timer,
) -> dict[str, Outcome]:
    """Check every provider's logits against eager torch's, then time the correct ones in `rounds`
    interleaved rounds (torch, tritongemm, ...), each keeping its median."""
    torch._dynamo.reset()  # each setting compiles anew, static: no recompile limit reached, no dynamic shapes
    inputs = _inputs(setting, vocab_size, device)
    cache = prefill_cache(models["torch"], setting, vocab_size, device) if setting.phase == "decode" else None
    calls = {p: forward_call(m, setting, inputs, copy.deepcopy(cache)) for p, m in models.items()}
    reference = calls["torch"]().logits
    checked: dict[str, tuple[float | None, str]] = {}
    for provider, call in calls.items():
        try:
            err = logits_error(call().logits, reference)  # the first call compiles, untimed
            checked[provider] = (err, "ok" if err <= MAX_REL_ERR else "wrong")
            call()  # once more, untimed: whatever the first call left to do lazily is not timed
        except Exception as exc:  # a compilation that fails is a result too
            checked[provider] = (None, describe_error(exc))
    del reference

    status = {p: s for p, (_, s) in checked.items()}
    samples: dict[str, list[float]] = {p: [] for p in calls}
    for _ in range(rounds):
        for provider, call in calls.items():
            if status[provider] != "ok":
                continue
            try:
                samples[provider].append(timer(call))
            except Exception as exc:
                status[provider] = describe_error(exc)
    return {
        p: Outcome(
            statistics.median(samples[p]) if status[p] == "ok" and samples[p] else None, checked[p][0], status[p]
        )
        for p in calls
    }


# ----------------------------------------------------------------------------------------------
# The suite
# ----------------------------------------------------------------------------------------------


def run_model(
    *,
    layers: int = 2,
    settings: tuple[Setting, ...] = SETTINGS,
    providers: tuple[str, ...] = PROVIDERS,
    out_dir: str | Path | None = "results",
    name: str = "model",
    plot: bool = True,
    rounds: int = ROUNDS,
) -> list[ModelRow]:
    """Every setting for every provider on a `layers`-layer bf16 Llama on the GPU. Prints the
    table and returns the rows; writes `out_dir`/`name`.csv (COLUMNS, every row), .json (the
    environment, the model's configuration and every row) and .png, unless out_dir is None."""
    problem = requirements_error()
    if problem:
        raise RuntimeError(problem)
    config = llama_config(layers)
    if "torch" not in providers:
        raise ValueError(f"bench model: providers must include 'torch', the reference, but got {providers!r}")
    from tritongemm.bench.environment import describe_environment
    from tritongemm.bench.report import format_model_table, write_results

    env = describe_environment()
    device, dtype = torch.device("cuda"), torch.bfloat16
    start = time.perf_counter()
    rows: list[ModelRow] = []
    with torch.no_grad():
        models = build_models(config, device=device, dtype=dtype, providers=providers)
        if out_dir is not None:
            out_dir = Path(out_dir)
            env = _model_environment(env, config, models["torch"])
        for setting in settings:
            outcomes = measure_setting(models, setting, vocab_size=config["vocab_size"], device=device, rounds=rounds)
            rows += make_rows(env["device"], "bfloat16", layers, setting, outcomes)
            done = ", ".join(f"{p} {o.status}" for p, o in outcomes.items())
            print(f"[{time.perf_counter() - start:.0f} s] {setting.label}: {done}", flush=True)
            if out_dir is not None:  # after every setting: a run cut short still leaves its rows
                paths = write_results(rows, env, out_dir, name, columns=COLUMNS)
    print(format_model_table(rows))
    print(f"{len(settings)} settings in {time.perf_counter() - start:.0f} s")
    if out_dir is None or not rows:
        return rows
    if plot and any(r.ms for r in rows):
        from tritongemm.bench.plots import plot_model

        title = f"Llama-3-8B layers x {layers} (bf16): forward speed / eager torch's, on {env['device']}"
        paths += (plot_model(rows, out_dir / f"{name}.png", title),)
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows


def _model_environment(env: dict, config: dict, model) -> dict:
    """The run's environment with transformers' version and the model's configuration."""
    import transformers

    attention = model.config._attn_implementation
    return env | {
        "transformers": transformers.__version__,
        "model": {"architecture": "LlamaForCausalLM", "dtype": "bfloat16", **config, "attn_implementation": attention},
    }
