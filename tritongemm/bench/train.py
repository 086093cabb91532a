"""`tritongemm bench train`: one training step of a transformers model (random weights, nothing
downloaded: bench model's families), bf16 against fp8. A step is what a training loop's GEMMs
cost: the gradients cleared, a forward with labels (transformers computes the causal-LM loss) and
`loss.backward()`; the optimizer's update, the same elementwise pass for every provider, is left
out, as torchao's float8 benchmarks leave it out.

Providers, each on a copy of one model sharing its parameters:
- torch, torch.compile: the bf16 model as it is;
- tritongemm, tritongemm+compile: `tritongemm.patch(model)`, bf16 GEMMs;
- tritongemm-fp8-{tensor,row,block} (+compile): `tritongemm.patch(model, fp8_training=recipe)`,
  every nn.Linear an `Fp8TrainingLinear` (fp8/training.py) whose three GEMMs take fp8 operands;
- torchao-fp8-{tensor,row} (+compile): `torchao.float8.convert_to_float8_training` with its
  "tensorwise" and "rowwise" recipes, where torchao imports (optional: pip install torchao).
The same modules go to fp8 in both libraries: every nn.Linear, the output projection included.

Each provider is checked against eager torch first (logits, loss and every nn.Linear parameter's
gradient, relative Frobenius errors) and only a correct one is timed: `eager_timer`'s wall clock
around back-to-back steps, in interleaved rounds, the median of each. Needs a CUDA GPU and
transformers.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import tritongemm
from tritongemm.bench.environment import describe_environment
from tritongemm.bench.measure import describe_error, eager_timer
from tritongemm.bench.model import (
    FAMILIES,
    INSTALL_HINT,
    MAX_GRAD_REL_ERR,
    MAX_REL_ERR,
    MOE_BOUND_FACTOR,
    Setting,
    build_base,
    family_config,
    linear_parameters,
    make_inputs,
    rel_error,
    sharing_copy,
    timed_call,
)
from tritongemm.bench.plots import _ratio_bars
from tritongemm.bench.report import write_results
from tritongemm.tools import figures

FP8_TRAINING = {"tritongemm-fp8-tensor": "tensor", "tritongemm-fp8-row": "row", "tritongemm-fp8-block": "block"}
TORCHAO = {"torchao-fp8-tensor": "tensorwise", "torchao-fp8-row": "rowwise"}
EAGER = ("torch", "tritongemm", *FP8_TRAINING, *TORCHAO)
PROVIDERS = tuple(p for e in EAGER for p in (e, "torch.compile" if e == "torch" else f"{e}+compile"))
FAMILIES_DEFAULT = ("llama-3-8b",)
LAYERS = 4
BATCH, TOKENS = 2, 2048  # 4096 tokens a step: the "2 x 2048"
TRAIN_PHASE = Setting("train", BATCH, TOKENS)  # timed_call reads its phase only
ROUNDS = 5
# fp8 against the bf16 model: every GEMM operand rounded to e4m3 (3 mantissa bits) in all three
# GEMMs of every layer. Measured, not guessed: on the H200 (4-layer Llama-3-8B shape, 2 x 2048
# tokens, results/h200/probes/fp8_training/train-first-run.txt) torchao.float8's own tensor- and
# row-wise recipes were 0.26 off in the logits and 0.60 in the worst gradient (a small one of a
# random model's), tritongemm's three recipes 0.26 and 0.58-0.59; the loss 1e-4 to 7e-4. A wrong
# scale, axis or transpose is off by 1 or more in the gradients and far more in the loss.
FP8_MAX_REL_ERR_TRAIN = 0.4
FP8_MAX_GRAD_REL_ERR = 0.9
# bf16 bounds grow with depth: bench model's hold two layers; at four torch.compile's own
# gradients were 5.65e-2 from eager torch's (same run), past bench model's 5e-2.
DEPTH_REFERENCE = 2
COLUMNS = ["device", "model", "layers", "batch", "tokens", "provider", "recipe", "ms", "tokens_per_s",
           "ratio_to_torch", "ratio_to_torch_compile", "logits_rel_err", "loss_rel_err", "max_grad_rel_err",
           "status"]  # fmt: skip
TORCHAO_HINT = "n/a: torchao is not installed (optional: pip install torchao)"


@dataclass
class TrainRow:
    device: str
    model: str
    layers: int
    batch: int
    tokens: int
    provider: str
    recipe: str  # "bf16", or the fp8 recipe
    ms: float | None  # wall clock per step: zero_grad, forward with the loss, backward
    tokens_per_s: float | None
    ratio_to_torch: float | None  # eager torch's ms / this ms
    ratio_to_torch_compile: float | None  # torch.compile's ms / this ms
    logits_rel_err: float | None
    loss_rel_err: float | None
    max_grad_rel_err: float | None
    status: str

    def as_dict(self) -> dict:
        return asdict(self)


def recipe_of(provider: str) -> str:
    """The provider's recipe name: FP8_TRAINING's value (a recipe, or an Fp8TrainingConfig), torchao's, or bf16."""
    base = provider.removesuffix("+compile")
    fp8 = FP8_TRAINING.get(base)
    return getattr(fp8, "recipe", fp8) or TORCHAO.get(base) or "bf16"


def eager_of(provider: str) -> str:
    return "torch" if provider == "torch.compile" else provider.removesuffix("+compile")


def check_arguments(families=FAMILIES_DEFAULT, providers=PROVIDERS, layers: int = LAYERS) -> None:
    """Raise the ValueError run_train would raise for these arguments, running nothing."""
    for given, choices, option in ((families, FAMILIES, "--models"), (providers, PROVIDERS, "--providers")):
        unknown = [x for x in given if x not in choices]
        if unknown or not given:
            got = repr(unknown[0]) if unknown else "none"
            raise ValueError(f"bench train: {option}: expected names from {', '.join(choices)}, but got {got}")
    if "torch" not in providers:
        raise ValueError(f"bench train: --providers must include torch, the reference, but got {','.join(providers)}")
    if layers < 1:
        raise ValueError(f"bench train: --layers: expected a positive number of layers, but got {layers}")


def requirements_error() -> str | None:
    if not torch.cuda.is_available():
        return "bench train: needs a CUDA GPU (a training step's GEMMs are pointless in the Triton interpreter)"
    try:
        import transformers  # noqa: F401
    except ImportError:
        return INSTALL_HINT.replace("bench model", "bench train")
    return None


def torchao_error() -> str | None:
    try:
        from torchao.float8 import convert_to_float8_training  # noqa: F401
    except Exception as exc:  # ImportError, or a torchao built for another torch
        return TORCHAO_HINT if isinstance(exc, ModuleNotFoundError) else f"n/a: torchao.float8: {describe_error(exc)}"
    return None


def build_models(base: torch.nn.Module, providers: tuple[str, ...]) -> tuple[dict, dict[str, str]]:
    """(provider -> the module a step calls, provider -> why it can't run): sharing copies of
    `base`, patched or converted, and torch.compile of each where asked for."""
    models, unavailable = {}, {}
    ao_problem = torchao_error() if any(eager_of(p) in TORCHAO for p in providers) else None
    for eager in dict.fromkeys(eager_of(p) for p in providers):
        if eager == "torch":
            models[eager] = base
        elif eager == "tritongemm":
            models[eager] = tritongemm.patch(sharing_copy(base))
        elif eager in FP8_TRAINING:
            models[eager] = tritongemm.patch(sharing_copy(base), fp8_training=FP8_TRAINING[eager])
            print(f"{eager}: {models[eager].tritongemm_patch_report}")
        elif ao_problem:
            unavailable[eager] = ao_problem
        else:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            config = Float8LinearConfig.from_recipe_name(TORCHAO[eager])
            models[eager] = convert_to_float8_training(sharing_copy(base), config=config)
    for provider in providers:
        eager = eager_of(provider)
        if provider != eager:
            if eager in unavailable:
                unavailable[provider] = unavailable[eager]
            else:  # static: one shape a run
                models[provider] = torch.compile(models[eager], dynamic=False)
    ordered = {p: models[p] for p in providers if p in models}
    return ordered, {p: unavailable[p] for p in providers if p in unavailable}


def step_of(model, inputs: dict):
    """A function of no arguments running one training step: bench model's train call."""
    return timed_call(model, TRAIN_PHASE, inputs)


def observe(model, inputs: dict, names: list[str]) -> dict:
    """One untimed step's logits, loss and the gradients of the parameters `names` (each looked up
    in `model` itself: torchao's modules may hold their own parameter objects)."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs, labels=inputs["input_ids"], use_cache=False)
    out.loss.backward()
    inner = getattr(model, "_orig_mod", model)
    grads = {n: inner.get_parameter(n).grad for n in names}
    return {"logits": out.logits.detach(), "loss": out.loss.detach(), "grads": grads}


def compare(seen: dict, ref: dict) -> tuple[float, float, float]:
    """(logits, loss, worst gradient) relative errors of `seen` against `ref`."""
    grads = [rel_error(seen["grads"][n], g) if seen["grads"][n] is not None else math.inf
             for n, g in ref["grads"].items() if g is not None]  # fmt: skip
    loss = abs(seen["loss"].item() - ref["loss"].item()) / abs(ref["loss"].item())
    return rel_error(seen["logits"], ref["logits"]), loss, max(grads, default=math.nan)


def within_bounds(provider: str, errors: tuple[float, float, float], layers: int = LAYERS, moe: bool = False) -> bool:
    """(logits, loss, worst gradient) within the provider's bounds: fp8's measured ones, or bf16's
    grown with depth as sqrt(layers / DEPTH_REFERENCE), and for a MoE model (`moe`) times bench
    model's MOE_BOUND_FACTOR: a token whose router scores nearly tie changes experts where they
    round differently. (H200, 4-layer Mixtral shape: tritongemm's bf16 experts 8.7e-2 from torch's
    grouped_mm in the logits and 0.17 in a gradient, past the dense bounds, where one projection's
    experts are 1.7e-3 from fp64 either way: results/h200/probes/fp8_training/.) Unlike bench
    model, the fp8 bounds and the loss's are not widened: fp8's are near O(1) already, where a
    broken kernel lands (4x would pass one), and a few rerouted tokens barely move a mean loss."""
    if recipe_of(provider) != "bf16":
        bounds = (FP8_MAX_REL_ERR_TRAIN, MAX_REL_ERR, FP8_MAX_GRAD_REL_ERR)
    else:
        depth = math.sqrt(max(1.0, layers / DEPTH_REFERENCE)) * (MOE_BOUND_FACTOR if moe else 1.0)
        bounds = (MAX_REL_ERR * depth, MAX_REL_ERR, MAX_GRAD_REL_ERR * depth)
    return all(e <= b for e, b in zip(errors, bounds))


def measure(models: dict, unavailable: dict, inputs: dict, names: list[str], rounds: int,
            timer=eager_timer, layers: int = LAYERS, moe: bool = False) -> dict:  # fmt: skip
    """provider -> [ms or None, errors or None, status]: every provider checked against eager
    torch (the first of `models`) before any is timed (`within_bounds`, a MoE model's where `moe`);
    only the correct ones are timed."""
    results, reference = {}, None
    for provider, model in models.items():
        if provider != "torch" and reference is None:
            results[provider] = [None, None, "error: no reference: eager torch failed"]
            continue
        try:
            seen = observe(model, inputs, names)
            reference = seen if provider == "torch" else reference
            errors = compare(seen, reference)
            del seen
            status = "ok" if within_bounds(provider, errors, layers, moe) else "wrong"
            step_of(model, inputs)()  # nothing lazy left to the timed steps
        except Exception as exc:  # a compile that fails is a result too
            errors, status = None, describe_error(exc)
        results[provider] = [None, errors, status]
        shown = " (errors {:.2e} {:.2e} {:.2e})".format(*errors) if errors else ""
        print(f"  {provider}: {status}{shown}", flush=True)
    samples = {p: [] for p in models}
    for _ in range(rounds):  # interleaved: a shared machine's drift falls on every provider alike
        for provider, model in models.items():
            if results[provider][2] == "ok":
                samples[provider].append(timer(step_of(model, inputs)))
    for provider, times in samples.items():
        results[provider][0] = statistics.median(times) if times else None
    for provider, why in unavailable.items():
        results[provider] = [None, None, why]
    return results


def make_rows(env_device: str, family: str, layers: int, setting: Setting, results: dict, providers) -> list[TrainRow]:
    torch_ms = results.get("torch", [None])[0]
    compiled_ms = results.get("torch.compile", [None])[0]
    rows = []
    for provider in providers:
        ms, errors, status = results[provider]
        errors = errors or (None, None, None)
        rows.append(TrainRow(
            env_device, family, layers, setting.batch, setting.tokens, provider, recipe_of(provider), ms,
            setting.batch * setting.tokens / (ms * 1e-3) if ms else None,
            torch_ms / ms if ms and torch_ms else None, compiled_ms / ms if ms and compiled_ms else None,
            *errors, status,
        ))  # fmt: skip
    return rows


def format_table(rows: list[TrainRow]) -> str:
    head = (
        f"{'model':<16} {'provider':<28} {'ms':>9} {'tok/s':>9} {'/torch':>7} {'/compile':>8} {'grad err':>9}  status"
    )
    lines = [head]
    for r in rows:
        ms = f"{r.ms:9.2f}" if r.ms else f"{'-':>9}"
        tps = f"{r.tokens_per_s:9.0f}" if r.tokens_per_s else f"{'-':>9}"
        rt = f"{r.ratio_to_torch:7.3f}" if r.ratio_to_torch else f"{'-':>7}"
        rc = f"{r.ratio_to_torch_compile:8.3f}" if r.ratio_to_torch_compile else f"{'-':>8}"
        ge = f"{r.max_grad_rel_err:9.2e}" if r.max_grad_rel_err is not None else f"{'-':>9}"
        lines.append(f"{r.model:<16} {r.provider:<28} {ms} {tps} {rt} {rc} {ge}  {r.status}")
    return "\n".join(lines)


def run_train(*, families=FAMILIES_DEFAULT, providers=PROVIDERS, layers: int = LAYERS, batch: int = BATCH,
              tokens: int = TOKENS, out_dir="results", name: str = "train", plot: bool = True,
              rounds: int = ROUNDS) -> list[TrainRow]:  # fmt: skip
    """Every provider's training step on each family's `layers`-layer bf16 model, `batch` x
    `tokens` tokens. Prints the table; writes `out_dir`/`name`.csv, .json and .png unless
    out_dir is None."""
    check_arguments(families, providers, layers)
    problem = requirements_error()
    if problem:
        raise RuntimeError(problem)
    providers = ("torch", *[p for p in providers if p != "torch"])
    env = describe_environment()
    setting = Setting("train", batch, tokens)
    start, rows, paths = time.perf_counter(), [], ()
    for family in families:
        config = family_config(family, layers)
        torch.manual_seed(0)
        base = build_base(family, config, device="cuda", dtype=torch.bfloat16).train()
        if FAMILIES[family].moe:
            base.set_experts_implementation("grouped_mm")  # the bf16 step users train with
        models, unavailable = build_models(base, providers)
        inputs = make_inputs(setting, config["vocab_size"], "cuda")
        names = list(linear_parameters(base))
        torch._dynamo.reset()
        with torch._dynamo.config.patch(cache_size_limit=64):
            results = measure(models, unavailable, inputs, names, rounds, layers=layers, moe=FAMILIES[family].moe)
        rows += make_rows(env["device"], family, layers, setting, results, providers)
        print(f"[{time.perf_counter() - start:.0f} s] {family}", flush=True)
        if out_dir is not None:
            paths = write_results(rows, env, Path(out_dir), name, columns=COLUMNS)
        del models, base
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    print(format_table(rows))
    if out_dir is not None and plot and any(r.ms for r in rows):
        paths += (plot_rows(rows, Path(out_dir) / f"{name}.png", env["device"], layers, setting),)
    if paths:
        print("wrote " + ", ".join(str(p) for p in paths))
    return rows


def plot_rows(rows: list[TrainRow], path: Path, device: str, layers: int, setting: Setting) -> Path:
    """A panel per model: each provider's step speed over bf16 torch.compile's."""
    plt = figures.pyplot()
    models = list(dict.fromkeys(r.model for r in rows))
    providers = list(dict.fromkeys(r.provider for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.5 * len(providers) * len(models) + 2), 4.5))

    def ratio(model, provider):
        return next((r.ratio_to_torch_compile for r in rows if r.model == model and r.provider == provider), None)

    _ratio_bars(ax, models, providers, ratio, "bf16 torch.compile", "speed / torch.compile's", str)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"training step (forward + backward), {layers} layers, {setting.batch} x {setting.tokens} tokens, "
                 f"{device}", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
