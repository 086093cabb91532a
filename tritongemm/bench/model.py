"""`tritongemm bench model`: Hugging Face model families (Llama-3-8B's, Qwen2-7B's and
Pythia-1.4B's layer dimensions, and two mixture-of-experts ones, Mixtral-8x7B's and
Qwen3-30B-A3B's; random weights, nothing downloaded) with their nn.Linear modules (and a MoE
model's experts) computed by tritongemm (`tritongemm.patch`), against the same model in eager
torch, and both under `torch.compile`, in three phases: prefill, greedy `generate` and a training
step. A MoE model's "torch" runs transformers' eager experts; `hf-grouped_mm` its grouped ones.

What a user's call costs, host included: `eager_timer`'s wall clock around back-to-back calls.
Each provider is checked against eager torch first (relative Frobenius errors, bf16 bounds below;
a MoE model's compiled providers against transformers' grouped experts compiled alike, which
routes as they do: COMPILED_MOE_REFERENCE); a wrong one is reported and not timed, one that raises
is reported and the run goes on.

- prefill: one forward over the prompt, no cache; checked on the logits.
- generate: `model.generate`, greedy, exactly NEW_TOKENS new tokens on a KV cache (DynamicCache,
  generate's default); checked on the first new token's logits, and the leading new tokens that
  equal eager torch's are counted (bf16 rounding may turn a near-tie later: reported, not failed).
- train: model.train(), a forward with labels (transformers computes the causal-LM loss), then
  loss.backward(); checked on the logits, the loss and every nn.Linear parameter's gradient.

The fp8 providers (`tritongemm-fp8-row`, `tritongemm-fp8-block`) are `tritongemm.patch(model,
fp8=recipe)` of the same model, and their `-fused` twins `patch(model, fp8=recipe, fuse=True)`
(the RMSNorms in one kernel each as well): inference only, so prefill and generate (their train
rows say so), checked against the bf16 model with fp8's looser bound, and held to 1.3x eager
torch in prefill (issue 26).

Needs a CUDA GPU and `transformers` (optional: pip install transformers).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import math
import statistics
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import tritongemm
from tritongemm.bench.environment import describe_environment
from tritongemm.bench.measure import describe_error, eager_timer
from tritongemm.bench.plots import _ratio_bars
from tritongemm.bench.report import _fmt, _grouped_table, write_results
from tritongemm.blocks import GatedMLP
from tritongemm.tools import figures

# The fp8 providers: tritongemm.patch(model, fp8=recipe, fuse=...), inference only (prefill and
# generate); -fused: the RMSNorms one kernel each too, the GEMMs as without it.
FP8_PROVIDERS = {"tritongemm-fp8-row": ("row", False), "tritongemm-fp8-block": ("block", False),
                 "tritongemm-fp8-row-fused": ("row", True), "tritongemm-fp8-block-fused": ("block", True)}  # fmt: skip
# MoE families only: transformers' own grouped experts (torch._grouped_mm), the bar of issue 27;
# "torch" runs their experts as transformers' eager loop.
HF_GROUPED = ("hf-grouped_mm", "hf-grouped_mm+compile")
# tritongemm.patch(model, fuse=True), each gated MLP a GatedMLP, each attention's q, k and v one
# GEMM and each RMSNorm one kernel (issue 28); on a MoE family the experts are tritongemm's, as the
# plain patch's, and there is no gated MLP to join. -rung6 runs the gated pairs on rung 6's gated
# epilogue (blocks/gated_pair.py; an sm_90 GPU's rows only), dense families only.
FUSED = ("tritongemm-fused", "tritongemm-fused+compile", "tritongemm-fused-rung6")
PROVIDERS = ("torch", "tritongemm", "torch.compile", "tritongemm+compile", *HF_GROUPED, *FP8_PROVIDERS, *FUSED)
PHASES = ("prefill", "generate", "train")
MAX_REL_ERR = 2e-2  # logits and loss of a bf16 model whose GEMMs round differently, two to four layers deep
# An fp8 model's logits: every GEMM's operands rounded to 3 mantissa bits (relative error up to
# 1/16 each), so a few percent against the bf16 model; a broken kernel is off by O(1). A first
# bound, to be measured on the H100 with the rows it checks.
FP8_MAX_REL_ERR = 0.25
FP8_INFERENCE_ONLY = "n/a: fp8 layers are inference only"
# A broken backward is off by O(1); two correct bf16 ones differ by their roundings, near the
# logits' 1e-2: on the H100 (2-layer Llama-3-8B shape, results/h100/model-fused*.csv) the fused
# patch's gradients differ from torch's by 1.1e-2, torch.compile's own by 3.6e-2.
MAX_GRAD_REL_ERR = 5e-2
# A MoE model's two correct bf16 runs differ more: a token whose top-k router scores nearly tie
# changes experts where those scores round differently. On the H100 (Mixtral-shaped, 2 layers),
# transformers' own grouped_mm experts differed from its eager loop by 3.3e-2..4.2e-2 in the
# logits and 6.4e-2 in the gradients, tritongemm's by 3.7e-2..4.9e-2 and 5.0e-2: every bound
# of a MoE row is this many times the dense one's, still far below a broken kernel's O(1).
MOE_BOUND_FACTOR = 4
# Compiled, a MoE model's routing moves further: Inductor rounds the router's input (the fused
# norm and residual) otherwise than eager torch, so more near-tied tokens change experts, in every
# layer. On the H100 (Mixtral-shaped, 2 layers, prefill) transformers' own grouped_mm experts
# compiled differed from eager torch by 0.11-0.14 in the logits, past the MoE bound above, and so
# did tritongemm's compiled. So a MoE model's compiled providers are checked against that one
# (COMPILED_MOE_REFERENCE, the same compiler on transformers' path) within the MoE bounds, and it
# against eager torch within COMPILED_MOE_REFERENCE_MAX_REL_ERR, still far below a broken run's O(1).
COMPILED_MOE_REFERENCE = "hf-grouped_mm+compile"
COMPILED_MOE_REFERENCE_MAX_REL_ERR = 0.25
# The fused patch does to a MoE model's router input what Inductor does: its norms and the
# residual adds in the GEMMs' stores round otherwise than eager torch (once, from fp32). On the H100
# (2026-11-26, results/h100/probes/model-moe-fused-*.csv) its Mixtral-shaped prefill logits differed
# from eager torch's by 7.9e-2 and 8.1e-2, past the MoE bound (8e-2), where the plain patch's by
# 4.5e-2..4.9e-2; Qwen3-MoE's by 7e-3; the same model in fp32 by 3e-7 (tests). So its logits are
# held to the compiled reference's bound against eager torch; its loss and gradients to the MoE ones.
ROUTER_INPUT_FUSED = ("tritongemm-fused",)
LAYERS = (2, 3, 4)
VOCAB_SIZE = 32000  # Llama 2's: Llama 3's 128256 or Qwen2's 152064 would make the logits, not the layers, the story
NEW_TOKENS = 64  # generate: new tokens per call, always all of them (min_new_tokens)
# Interleaved rounds per setting (each the median of eager_timer's batches): a 2-layer model's
# rows are host-bound, and a shared machine's host moved a generate row by 0.75-1.0 between runs
# of 3 rounds (BENCHMARKS.md). The calls are cheap next to the compiles, so more rounds cost little.
ROUNDS = 7
COLUMNS = ["device", "dtype", "model", "layers", "phase", "batch", "tokens", "new_tokens", "provider", "ms",
           "tokens_per_s", "ratio_to_torch", "max_rel_err", "loss_rel_err", "max_grad_rel_err", "matching_tokens",
           "status"]  # fmt: skip
INSTALL_HINT = "bench model: needs Hugging Face transformers: pip install transformers"
NO_REFERENCE = "no reference: eager torch failed"
GPU_HINT = "bench model: needs a CUDA GPU (a Llama layer's GEMMs are pointless in the Triton interpreter)"


@dataclass(frozen=True)
class Family:
    """A released model's layer, as transformers' `config` class builds it; the number of layers
    and the vocabulary are the bench's (`model_config`)."""

    name: str  # the `model` column
    architecture: str  # transformers' causal-LM class
    config: str  # its configuration class
    dims: dict  # the configuration's arguments that make the layer
    mlp: str  # what the MLP computes, for the reader and the tests
    moe: bool = False  # experts behind a router: transformers' experts interface picks how they run


FAMILIES = {
    f.name: f
    for f in (
        Family(
            "llama-3-8b", "LlamaForCausalLM", "LlamaConfig",
            dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 hidden_act="silu", attention_bias=False, mlp_bias=False, max_position_embeddings=8192,
                 attention_dropout=0.0),
            "down(silu(gate(x)) * up(x)), no bias",
        ),
        # Qwen2's q/k/v projections have a bias by construction (o_proj and the MLP have none).
        Family(
            "qwen2-7b", "Qwen2ForCausalLM", "Qwen2Config",
            dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                 hidden_act="silu", max_position_embeddings=32768, attention_dropout=0.0),
            "down(silu(gate(x)) * up(x)), no bias",
        ),
        # GPT-NeoX's MLP is Linear -> GELU -> Linear, all of its projections nn.Linear with a bias
        # (GPT-2's Conv1D is not an nn.Linear: patch would leave it). Pythia keeps NeoX's defaults:
        # parallel residual, rotary on a quarter of each head.
        Family(
            "pythia-1.4b", "GPTNeoXForCausalLM", "GPTNeoXConfig",
            dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=16, hidden_act="gelu",
                 max_position_embeddings=2048, attention_dropout=0.0, hidden_dropout=0.0),
            "dense_4h_to_h(gelu(dense_h_to_4h(x))), with bias",
        ),
        # Mixture-of-experts (issue 27): Mixtral-8x7B's layer (8 experts of 14336, top 2) and
        # Qwen3-30B-A3B's (128 experts of 768, top 8), their experts as transformers 5.x stores them.
        Family(
            "mixtral-8x7b-moe", "MixtralForCausalLM", "MixtralConfig",
            dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                 attention_dropout=0.0),
            "per token: the sum over its top-2 experts of down(silu(gate(x)) * up(x))", moe=True,
        ),
        Family(
            "qwen3-30b-moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
            dict(hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144, num_experts=128,
                 num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                 max_position_embeddings=8192, attention_dropout=0.0),
            "per token: the sum over its top-8 experts of down(silu(gate(x)) * up(x))", moe=True,
        ),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Setting:
    phase: str  # one of PHASES
    batch: int
    tokens: int  # per sequence: the prompt's length
    new_tokens: int = 0  # generate: tokens generated per sequence

    @property
    def label(self) -> str:
        return f"{self.phase} {self.shape}"

    @property
    def shape(self) -> str:
        return f"{self.batch} x {self.tokens}" + (f" + {self.new_tokens} new" if self.new_tokens else "")

    @property
    def tokens_per_call(self) -> int:
        """What tokens/s counts: the new tokens of a generate, the prompt's tokens otherwise."""
        return self.batch * (self.new_tokens if self.phase == "generate" else self.tokens)


SETTINGS = (
    Setting("prefill", 1, 2048),
    Setting("prefill", 4, 1024),
    Setting("generate", 1, 128, NEW_TOKENS),
    Setting("train", 2, 1024),
)


@dataclass(frozen=True)
class Agreement:
    """How one provider's results compare with eager torch's; None: not compared in this phase."""

    max_rel_err: float | None = None  # logits (generate: the first new token's)
    loss_rel_err: float | None = None  # train
    max_grad_rel_err: float | None = None  # train: the worst nn.Linear parameter's gradient
    matching_tokens: int | None = None  # generate: leading new tokens equal to eager torch's

    def ok(self, logits_bound: float = MAX_REL_ERR, factor: float = 1.0) -> bool:
        """Within the bounds, each times `factor` (MOE_BOUND_FACTOR for a MoE model)."""
        bounds = ((self.max_rel_err, logits_bound), (self.loss_rel_err, MAX_REL_ERR),
                  (self.max_grad_rel_err, MAX_GRAD_REL_ERR))  # fmt: skip
        return all(err is None or err <= bound * factor for err, bound in bounds)


@dataclass(frozen=True)
class Outcome:
    """What one provider gave for one setting, before the derived columns."""

    ms: float | None
    agreement: Agreement
    status: str  # "ok", "wrong" (failed the check, not timed) or "error: ..." (raised)


@dataclass
class ModelRow:
    device: str
    dtype: str
    model: str  # a FAMILIES name
    layers: int
    phase: str
    batch: int
    tokens: int
    new_tokens: int
    provider: str  # one of PROVIDERS
    ms: float | None  # wall clock per call: a forward, a whole generate, a forward + backward
    tokens_per_s: float | None  # Setting.tokens_per_call / s
    ratio_to_torch: float | None  # eager torch's ms / this ms
    max_rel_err: float | None
    loss_rel_err: float | None
    max_grad_rel_err: float | None
    matching_tokens: int | None
    status: str

    def as_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# Pure parts: the configurations, the arguments, the rows
# ----------------------------------------------------------------------------------------------


def model_config(family: str, layers: int = 2, vocab_size: int = VOCAB_SIZE) -> dict:
    """`family_config` for bench model, whose layers are one of LAYERS."""
    if family not in FAMILIES:
        raise ValueError(f"bench model: --models: expected names from {', '.join(FAMILIES)}, but got {family!r}")
    if layers not in LAYERS:
        raise ValueError(f"bench model: --layers: expected one of {', '.join(map(str, LAYERS))}, but got {layers!r}")
    return family_config(family, layers, vocab_size)


def family_config(family: str, layers: int, vocab_size: int = VOCAB_SIZE, dims: dict | None = None) -> dict:
    """The arguments of `family`'s transformers configuration class: its layer `layers` times
    (`dims` in place of the layer's own sizes where given: a tiny model for the CPU), `vocab_size`
    tokens, an lm_head of its own (not tied), SDPA attention, no dropout."""
    return (
        FAMILIES[family].dims
        | (dims or {})
        | dict(num_hidden_layers=layers, vocab_size=vocab_size, tie_word_embeddings=False, attn_implementation="sdpa")
    )


def check_arguments(
    families: tuple[str, ...] = tuple(FAMILIES),
    phases: tuple[str, ...] = PHASES,
    providers: tuple[str, ...] = PROVIDERS,
    layers: int = 2,
) -> None:
    """Raise the ValueError that `run_model` would raise for these arguments, running nothing."""
    for given, choices, option in ((families, FAMILIES, "--models"), (phases, PHASES, "--phases"),
                                   (providers, PROVIDERS, "--providers")):  # fmt: skip
        unknown = [x for x in given if x not in choices]
        if unknown or not given:
            got = repr(unknown[0]) if unknown else "none"
            raise ValueError(f"bench model: {option}: expected names from {', '.join(choices)}, but got {got}")
    if "torch" not in providers:
        raise ValueError(f"bench model: --providers must include torch, the reference, but got {','.join(providers)}")
    model_config(families[0], layers)


def make_rows(
    device: str, dtype: str, model: str, layers: int, setting: Setting, outcomes: dict[str, Outcome]
) -> list[ModelRow]:
    """One row per provider, in `outcomes`' order, with tokens/s and the ratio to eager torch."""
    torch_ms = outcomes["torch"].ms if "torch" in outcomes else None
    rows = []
    for provider, o in outcomes.items():
        tokens_per_s = setting.tokens_per_call / (o.ms * 1e-3) if o.ms else None
        ratio = torch_ms / o.ms if o.ms and torch_ms else None
        a = o.agreement
        rows.append(
            ModelRow(device, dtype, model, layers, setting.phase, setting.batch, setting.tokens, setting.new_tokens,
                     provider, o.ms, tokens_per_s, ratio, a.max_rel_err, a.loss_rel_err, a.max_grad_rel_err,
                     a.matching_tokens, o.status)
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


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in fp32 (the logits of a large batch are GBs: no fp64 copy);
    inf where out holds NaN/Inf."""
    diff = out.float() - ref.float()
    if not torch.isfinite(diff).all():
        return math.inf
    return (torch.linalg.norm(diff) / torch.linalg.norm(ref.float()).clamp_min(1e-30)).item()


def matching_prefix(tokens: torch.Tensor, ref: torch.Tensor) -> int:
    """How many leading positions of two (batch, n) token tensors agree in every sequence."""
    differs = (tokens != ref).any(dim=0).nonzero()
    return int(differs[0]) if len(differs) else tokens.shape[-1]


def agreement(seen: dict, ref: dict) -> Agreement:
    """Compare one provider's `observe` results with eager torch's."""
    grads = None
    if "grads" in ref:
        errors = [rel_error(seen["grads"][n], g) if seen["grads"][n] is not None else math.inf
                  for n, g in ref["grads"].items() if g is not None]  # fmt: skip
        grads = max(errors, default=None)
    return Agreement(
        max_rel_err=rel_error(seen["logits"], ref["logits"]),
        loss_rel_err=abs(seen["loss"].item() - ref["loss"].item()) / abs(ref["loss"].item()) if "loss" in ref else None,
        max_grad_rel_err=grads,
        matching_tokens=matching_prefix(seen["tokens"], ref["tokens"]) if "tokens" in ref else None,
    )


# ----------------------------------------------------------------------------------------------
# The models and the calls
# ----------------------------------------------------------------------------------------------


def _on_sm90(device) -> bool:
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def _gated_pairs_on(model: torch.nn.Module, kernel: str) -> torch.nn.Module:
    """`model` with each GatedMLP's gated pair on `kernel` (its down projection as patched)."""
    for module in model.modules():
        if isinstance(module, GatedMLP):
            module.pair_kernel = kernel
    return model


def build_models(
    family: str, config_kwargs: dict, *, device, dtype: torch.dtype = torch.bfloat16, providers=PROVIDERS
) -> dict[str, torch.nn.Module]:
    """provider -> the module it calls: the random-weight model, a copy of its module tree sharing
    every parameter and buffer with tritongemm.patch applied, and torch.compile of each."""
    info = FAMILIES[family]
    base = build_base(family, config_kwargs, device=device, dtype=dtype)
    if info.moe:  # "torch" is transformers' eager experts: a loop over the experts
        base.set_experts_implementation("eager")
    models = {"torch": base}
    if info.moe and any(p in providers for p in HF_GROUPED):
        models["hf-grouped_mm"] = sharing_copy(base)
        models["hf-grouped_mm"].set_experts_implementation("grouped_mm")
    if info.moe and "hf-grouped_mm+compile" in providers:
        models["hf-grouped_mm+compile"] = torch.compile(models["hf-grouped_mm"], dynamic=False)
    if any(p.startswith("tritongemm") for p in providers):
        models["tritongemm"] = tritongemm.patch(sharing_copy(base))
        print(f"{family}: tritongemm.patch: {models['tritongemm'].tritongemm_patch_report}")
    # Default mode; static, as each setting is compiled anew (measure_setting).
    if "torch.compile" in providers:
        models["torch.compile"] = torch.compile(models["torch"], dynamic=False)
    if "tritongemm+compile" in providers:
        models["tritongemm+compile"] = torch.compile(models["tritongemm"], dynamic=False)
    if any(p in providers for p in FUSED):  # its own joined gate/up weights, down_proj shared
        models["tritongemm-fused"] = tritongemm.patch(sharing_copy(base), fuse=True)
        print(f"{family}: tritongemm.patch(fuse=True): {models['tritongemm-fused'].tritongemm_patch_report}")
    if "tritongemm-fused+compile" in providers:
        models["tritongemm-fused+compile"] = torch.compile(models["tritongemm-fused"], dynamic=False)
    if not info.moe and "tritongemm-fused-rung6" in providers and _on_sm90(device):
        models["tritongemm-fused-rung6"] = _gated_pairs_on(
            tritongemm.patch(sharing_copy(base), fuse=True), "tma_persistent_pipelined"
        )
    for provider, (recipe, fuse) in FP8_PROVIDERS.items():
        if provider in providers:  # its own fp8 copy of the weights; the model's parameters untouched
            models[provider] = patched = tritongemm.patch(sharing_copy(base), fp8=recipe, fuse=fuse)
            print(f"{family}: tritongemm.patch(fp8={recipe!r}, fuse={fuse}): {patched.tritongemm_patch_report}")
    return {p: models[p] for p in PROVIDERS if p in providers and p in models}  # torch first: the reference


def build_base(family: str, config_kwargs: dict, *, device, dtype: torch.dtype) -> torch.nn.Module:
    """The random-weight model of `family` from its transformers configuration, in eval mode, in
    `dtype` on `device`."""
    import transformers

    info = FAMILIES[family]
    config = getattr(transformers, info.config)(**config_kwargs)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters made in their dtype where they are: no fp32 copy first
    try:
        with torch.device(device):
            return getattr(transformers, info.architecture)(config).eval()
    finally:
        torch.set_default_dtype(saved)


def sharing_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module`'s tree holding the very same parameters and buffers (deepcopy's memo)."""
    return copy.deepcopy(module, {id(t): t for t in (*module.parameters(), *module.buffers())})


def generator(model: torch.nn.Module) -> torch.nn.Module:
    """What `generate` is called on: the model, or for a torch.compile'd one a sharing copy of the
    module it wraps with that copy's forward compiled. torch.compile's wrapper compiles __call__
    only: its `generate` is the wrapped module's, which calls the uncompiled forward."""
    if not isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        return model
    module = sharing_copy(model._orig_mod)
    # Not static: the cache grows a token a step, and the first recompile makes its length dynamic.
    module.forward = torch.compile(module.forward)
    return module


def make_inputs(setting: Setting, vocab_size: int, device) -> dict:
    ids = torch.randint(0, vocab_size, (setting.batch, setting.tokens), device=device)
    if setting.phase == "generate":
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return {"input_ids": ids}


def generate_options(setting: Setting) -> dict:
    """Greedy, exactly `new_tokens` tokens (min_new_tokens keeps a random model's EOS out), with
    generate's default KV cache; the pad id given so that generate need not pick (and warn)."""
    return dict(do_sample=False, num_beams=1, max_new_tokens=setting.new_tokens, min_new_tokens=setting.new_tokens,
                pad_token_id=0)  # fmt: skip


def timed_call(model, setting: Setting, inputs: dict):
    """A function of no arguments running one call as timed."""
    if setting.phase == "prefill":
        return functools.partial(model, **inputs, use_cache=False)
    if setting.phase == "generate":
        return functools.partial(model.generate, **inputs, **generate_options(setting))

    def step():
        model.zero_grad(set_to_none=True)
        model(**inputs, labels=inputs["input_ids"], use_cache=False).loss.backward()

    return step


def observe(model, setting: Setting, inputs: dict, params: dict[str, torch.nn.Parameter]) -> dict:
    """One untimed call's results, as `agreement` compares them: logits; generate's first new
    token's logits and its new tokens; train's loss and the gradients of `params`."""
    if setting.phase == "prefill":
        return {"logits": model(**inputs, use_cache=False).logits}
    if setting.phase == "generate":
        out = model.generate(**inputs, **generate_options(setting), output_logits=True, return_dict_in_generate=True)
        return {"logits": out.logits[0], "tokens": out.sequences[:, inputs["input_ids"].shape[1] :]}
    model.zero_grad(set_to_none=True)  # the next backward makes new gradients: these stay ours
    out = model(**inputs, labels=inputs["input_ids"], use_cache=False)
    out.loss.backward()
    return {"logits": out.logits.detach(), "loss": out.loss.detach(), "grads": gradients(model, params)}


def gradients(model: torch.nn.Module, params: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor | None]:
    """The gradient of each of eager torch's linear parameters (`params`, by name) as `model`
    computed it: the shared parameter's own, or where a GatedMLP holds the gate and up weights
    joined (a copy), the matching half of the joined weight's gradient."""
    model = getattr(model, "_orig_mod", model)  # a torch.compile'd module: the one it wraps
    grads = {}
    for name, p in params.items():
        owner_name, _, leaf = name.rpartition(".")  # e.g. model.layers.0.mlp.gate_proj, weight
        mlp_name, _, proj = owner_name.rpartition(".")
        mlp = model.get_submodule(mlp_name) if mlp_name else model
        if isinstance(mlp, GatedMLP) and proj in ("gate_proj", "up_proj"):
            joined = mlp.gate_up_weight.grad
            half = None if joined is None else joined.chunk(2)[proj == "up_proj"]
            grads[name] = half
        else:
            grads[name] = p.grad
    return grads


def linear_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Every nn.Linear's weight and bias, by name: the providers share them, so one list serves all."""
    return {
        f"{name}.{kind}": p
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        for kind, p in module.named_parameters(recurse=False)
    }


@contextlib.contextmanager
def phase_mode(models: dict[str, torch.nn.Module], phase: str):
    """Train mode and autograd for "train", eval mode without autograd otherwise; afterwards eval
    mode and no gradients left behind."""
    training = phase == "train"
    for m in models.values():
        m.train(training)
    try:
        with torch.set_grad_enabled(training):
            yield
    finally:
        for m in models.values():
            m.eval()
            m.zero_grad(set_to_none=True)


def measure_setting(
    models: dict[str, torch.nn.Module],
    setting: Setting,
    *,
    vocab_size: int,
    device,
    rounds: int = ROUNDS,
    timer=eager_timer,
    bound_factor: float = 1.0,
    moe: bool = False,
) -> dict[str, Outcome]:
    """Check every provider against eager torch (the bounds times `bound_factor`: MOE_BOUND_FACTOR
    for a MoE model; a MoE model's compiled ones against COMPILED_MOE_REFERENCE where it runs), then
    time the correct ones in `rounds` interleaved rounds (torch, tritongemm, ...), each keeping its
    median."""
    torch._dynamo.reset()  # each setting compiles anew: prefill and train static, one graph per provider
    inputs = make_inputs(setting, vocab_size, device)
    with phase_mode(models, setting.phase), _recompile_limits():
        callers = {p: generator(m) for p, m in models.items()} if setting.phase == "generate" else models
        params = linear_parameters(models["torch"]) if setting.phase == "train" else {}
        compiled_reference = COMPILED_MOE_REFERENCE if moe and COMPILED_MOE_REFERENCE in callers else None
        checked = _check_all(callers, setting, inputs, params, bound_factor, compiled_reference, moe)
        status = {p: s for p, (_, s) in checked.items()}
        calls = {p: timed_call(m, setting, inputs) for p, m in callers.items()}
        samples: dict[str, list[float]] = {p: [] for p in calls}
        for _ in range(rounds):
            for provider, call in calls.items():
                if status[provider] != "ok":
                    continue
                try:
                    samples[provider].append(timer(call))
                except Exception as exc:
                    status[provider] = describe_error(exc)
    ms = {p: statistics.median(samples[p]) if status[p] == "ok" and samples[p] else None for p in calls}
    return {p: Outcome(ms[p], checked[p][0], status[p]) for p in calls}


def _recompile_limits():
    """Room for generate's compiles, and an error instead of a silent fall back to eager where it
    runs out. Each compiled provider compiles its forward three or four times (the prompt, the
    first new token, then with the cache's length dynamic), all on one code object: for the two
    compiled providers 6 (transformers 5.24) or all 8 (4.46) of dynamo's default limit."""
    wanted = {"recompile_limit": 32, "fail_on_recompile_limit_hit": True}
    config = torch._dynamo.config
    return config.patch(**{k: v for k, v in wanted.items() if hasattr(config, k)})


def _check_all(
    callers: dict,
    setting: Setting,
    inputs: dict,
    params: dict,
    bound_factor: float = 1.0,
    compiled_reference: str | None = None,
    moe: bool = False,
) -> dict[str, tuple[Agreement, str]]:
    """provider -> (its agreement with its reference, its status): eager torch, or for a compiled
    provider `compiled_reference` where given (itself against eager torch, within
    COMPILED_MOE_REFERENCE_MAX_REL_ERR, as a MoE model's ROUTER_INPUT_FUSED are). The first call of
    each compiles, untimed, and a second one leaves nothing lazy to the timed calls."""
    checked: dict[str, tuple[Agreement, str]] = {}
    references: dict[str, dict] = {}
    for provider in sorted(callers, key=lambda p: (p != "torch", p != compiled_reference)):  # references first
        model = callers[provider]
        against = _reference_of(provider, compiled_reference)
        if provider != "torch" and against not in references:
            checked[provider] = (Agreement(), f"error: {NO_REFERENCE if against == 'torch' else against + ' failed'}")
            continue
        if provider in FP8_PROVIDERS and setting.phase == "train":
            checked[provider] = (Agreement(), FP8_INFERENCE_ONLY)
            continue
        try:
            seen = observe(model, setting, inputs, params)
            found = agreement(seen, references.get(against, seen))
            if provider == compiled_reference or (moe and provider in ROUTER_INPUT_FUSED):
                # its logits within their own bound, the rest within the MoE bounds
                ok = found.ok(COMPILED_MOE_REFERENCE_MAX_REL_ERR / bound_factor, bound_factor)
            else:
                ok = found.ok(FP8_MAX_REL_ERR if provider in FP8_PROVIDERS else MAX_REL_ERR, bound_factor)
            checked[provider] = (found, "ok" if ok else "wrong")
            if provider in ("torch", compiled_reference) and ok:
                references[provider] = seen
            del seen
            timed_call(model, setting, inputs)()
        except Exception as exc:  # a compilation that fails is a result too
            checked[provider] = (Agreement(), describe_error(exc))
            _free_memory()
    return {p: checked[p] for p in callers}


def _reference_of(provider: str, compiled_reference: str | None) -> str:
    """What `provider` is checked against: eager torch, or `compiled_reference` for the other
    compiled providers where one is given."""
    if compiled_reference is None or provider == compiled_reference or not provider.endswith("+compile"):
        return "torch"
    return compiled_reference


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# The suite
# ----------------------------------------------------------------------------------------------


def run_model(
    *,
    families: tuple[str, ...] = tuple(FAMILIES),
    phases: tuple[str, ...] = PHASES,
    layers: int = 2,
    settings: tuple[Setting, ...] = SETTINGS,
    providers: tuple[str, ...] = PROVIDERS,
    out_dir: str | Path | None = "results",
    name: str = "model",
    plot: bool = True,
    rounds: int = ROUNDS,
) -> list[ModelRow]:
    """Every setting of `phases` for every provider on each family's `layers`-layer bf16 model on
    the GPU, one family at a time. Prints the table and returns the rows; writes
    `out_dir`/`name`.csv (COLUMNS, every row), .json (the environment, each model's configuration
    and every row) and .png, unless out_dir is None."""
    check_arguments(families, phases, providers, layers)
    problem = requirements_error()
    if problem:
        raise RuntimeError(problem)
    env = describe_environment()
    settings = tuple(s for s in settings if s.phase in phases)
    device = torch.device("cuda")
    start = time.perf_counter()
    rows: list[ModelRow] = []
    paths: tuple[Path, ...] = ()
    for family in families:
        config = model_config(family, layers)
        torch.manual_seed(0)  # the same weights and prompts in every run
        try:
            models = build_models(family, config, device=device, dtype=torch.bfloat16, providers=providers)
            env = _model_environment(env, family, config, models["torch"])
        except Exception as exc:  # an architecture this transformers lacks, memory: the next family may run
            models, failed = {}, _failed(providers, exc)
            print(f"{family}: could not build: {failed['torch'].status}", flush=True)
        for setting in settings:
            kwargs = dict(vocab_size=config["vocab_size"], device=device, rounds=rounds,
                          bound_factor=MOE_BOUND_FACTOR if FAMILIES[family].moe else 1.0,
                          moe=FAMILIES[family].moe)  # fmt: skip
            outcomes = _outcomes(models, setting, **kwargs) if models else failed
            rows += make_rows(env["device"], "bfloat16", family, layers, setting, outcomes)
            done = ", ".join(f"{p} {o.status}" for p, o in outcomes.items())
            print(f"[{time.perf_counter() - start:.0f} s] {family} {setting.label}: {done}", flush=True)
            if out_dir is not None:  # after every setting: a run cut short still leaves its rows
                paths = write_results(rows, env, Path(out_dir), name, columns=COLUMNS)
        del models
        torch._dynamo.reset()  # compiled graphs hold the models' tensors
        _free_memory()
    print(format_table(rows))
    print("\n".join(target_misses(rows)) or "every row meets its target")
    print(f"{len(families)} models x {len(settings)} settings in {time.perf_counter() - start:.0f} s")
    if out_dir is None or not rows:
        return rows
    if plot and any(r.ms for r in rows):
        title = f"{layers}-layer models (bf16): speed / eager torch's, on {env['device']}"
        paths += (plot_rows(rows, Path(out_dir) / f"{name}.png", title),)
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows


def _outcomes(models: dict, setting: Setting, **kwargs) -> dict[str, Outcome]:
    """measure_setting's, or where something outside any one provider's calls raised, that error
    for every provider."""
    try:
        return measure_setting(models, setting, **kwargs)
    except Exception as exc:
        return _failed(tuple(models), exc)


def _failed(providers: tuple[str, ...], exc: Exception) -> dict[str, Outcome]:
    _free_memory()
    return dict.fromkeys(providers, Outcome(None, Agreement(), describe_error(exc)))


def _model_environment(env: dict, family: str, config: dict, model) -> dict:
    """The run's environment with transformers' version and this family's configuration added."""
    import transformers

    described = {"architecture": FAMILIES[family].architecture, "mlp": FAMILIES[family].mlp, "dtype": "bfloat16",
                 **config, "attn_implementation": model.config._attn_implementation}  # fmt: skip
    return env | {"transformers": transformers.__version__, "models": env.get("models", {}) | {family: described}}


# ----------------------------------------------------------------------------------------------
# Reporting: the table, the targets, the plot
# ----------------------------------------------------------------------------------------------


def format_table(rows: list[ModelRow]) -> str:
    """One line per (model, setting, provider), a blank line between settings."""
    header = (f"{'model':<12} {'phase':<8} {'setting':<16} {'provider':<18} {'ms':>9} {'tokens/s':>10} "
              f"{'vs torch':>8} {'logits':>8} {'loss':>8} {'grads':>8} {'same':>4}  status")  # fmt: skip

    def line(r: ModelRow) -> str:
        setting = Setting(r.phase, r.batch, r.tokens, r.new_tokens)
        return (
            f"{r.model:<12} {r.phase:<8} {setting.shape:<16} {r.provider:<18} {_fmt(r.ms, '.2f'):>9} "
            f"{_fmt(r.tokens_per_s, '.0f'):>10} {_fmt(r.ratio_to_torch, '.3f'):>8} {_fmt(r.max_rel_err, '.1e'):>8} "
            f"{_fmt(r.loss_rel_err, '.1e'):>8} {_fmt(r.max_grad_rel_err, '.1e'):>8} {_fmt(r.matching_tokens, 'd'):>4}  "
            f"{r.status}"
        )

    return _grouped_table(header, rows, line, key=lambda r: (r.model, r.phase, r.batch, r.tokens))


# The issues' bars: eager tritongemm against eager torch, tritongemm+compile against torch.compile
# (every phase); an fp8 model's prefill against the eager bf16 model (issue 26).
TARGETS = {"tritongemm": ("torch", 1.0, PHASES), "tritongemm+compile": ("torch.compile", 1.0, PHASES)}
TARGETS |= {p: ("torch", 1.3, ("prefill",)) for p in FP8_PROVIDERS}
# A fused model's (issue 28): 1.05x eager torch in every phase; compiled, at least torch.compile's.
TARGETS |= {"tritongemm-fused": ("torch", 1.05, PHASES), "tritongemm-fused+compile": ("torch.compile", 1.0, PHASES),
            "tritongemm-fused-rung6": ("torch", 1.05, PHASES)}  # fmt: skip
# A MoE model's: 1.1x transformers' grouped experts, eager and compiled (issue 27).
MOE_TARGETS = {
    "tritongemm": ("hf-grouped_mm", 1.1, PHASES),
    "tritongemm+compile": ("hf-grouped_mm+compile", 1.1, PHASES),
    "tritongemm-fused": ("hf-grouped_mm", 1.1, PHASES),
    "tritongemm-fused+compile": ("hf-grouped_mm+compile", 1.1, PHASES),
}


def target_misses(rows: list[ModelRow]) -> list[str]:
    """A line for every setting where one of TARGETS' providers is slower than its baseline by
    more than the bar allows, or where either of the pair has no time."""
    ms = {(r.model, r.phase, r.batch, r.tokens, r.provider): r for r in rows}
    misses = []
    for (model, phase, batch, tokens, provider), r in ms.items():
        if provider not in TARGETS:
            continue
        moe = model in FAMILIES and FAMILIES[model].moe and provider in MOE_TARGETS
        baseline, bar, phases = (MOE_TARGETS if moe else TARGETS)[provider]
        base = ms.get((model, phase, batch, tokens, baseline))
        if base is None or phase not in phases:
            continue
        where = f"{model} {Setting(phase, batch, tokens, r.new_tokens).label}"
        if not (r.ms and base.ms):
            misses.append(f"miss: {where}: {provider} {r.status}, {baseline} {base.status}")
        elif base.ms / r.ms < bar:
            misses.append(f"miss: {where}: {provider} {base.ms / r.ms:.3f}x {baseline} (bar {bar:.2f}x)")
    return misses


def plot_rows(rows: list[ModelRow], path: Path, title: str) -> Path:
    """One panel per model: for every setting, each provider's speed as a fraction of eager torch's."""
    plt = figures.pyplot()
    models = list(dict.fromkeys(r.model for r in rows))
    key = lambda r: (r.phase, r.batch, r.tokens, r.new_tokens)  # noqa: E731
    providers = list(dict.fromkeys(r.provider for r in rows if r.provider != "torch"))
    ratio = {(r.model, key(r), r.provider): r.ratio_to_torch for r in rows}
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 5), squeeze=False, sharey=True)
    for ax, model in zip(axes[0], models):
        settings = list(dict.fromkeys(key(r) for r in rows if r.model == model))
        _ratio_bars(ax, settings, providers, lambda s, p, m=model: ratio.get((m, s, p)), "torch (eager)",
                    "speed / eager torch's speed", lambda s: f"{s[0]}\n{Setting(*s).shape}", fontsize=8)  # fmt: skip
        ax.set_title(model, fontsize=10)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 50 * len(models)))  # a one-panel figure is narrower than the title
    return figures.save(fig, path, dpi=110)
