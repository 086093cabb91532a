"""`fuse_mlps`, `fuse_qkv` and `fuse_norms`: transformers' gated MLPs put in place as `GatedMLP`s,
their attention's q, k and v projections as one GEMM (`QKVProjection`), and their RMSNorms as one
kernel each (`RMSNorm`); what `tritongemm.patch(model, fuse=True)` runs first.

A module is fused only where its forward is known to compute what the fused one does: its class
is one of transformers' that do (by name, so nothing imports transformers), its projections are
plain linears (for an MLP without bias), and, for an MLP, its activation is one the epilogue
computes. Everything else is left, with the reason, for the report.
"""

from __future__ import annotations

import torch

from tritongemm.blocks.gated_mlp import GatedMLP
from tritongemm.blocks.qkv import NAMES as QKV_NAMES
from tritongemm.blocks.qkv import QKVProjection
from tritongemm.blocks.rms_norm import RMSNorm, kernel_serves, rms_norm_reference
from tritongemm.core.epilogue import GLU_ACTIVATIONS, activation_of
from tritongemm.dense.module import Linear

# transformers' MLP classes whose forward is down_proj(act_fn(gate_proj(x)) * up_proj(x)).
GATED_MLP_CLASSES = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP",
                               "Gemma3MLP", "Qwen2MoeMLP", "Qwen3MoeMLP", "Olmo2MLP", "GraniteMLP"})  # fmt: skip


def why_not_fused(module: torch.nn.Module) -> str | None:
    """Why `module`, a gated MLP by its attributes, is not fused (None: it is fusable)."""
    name = type(module).__name__
    if name not in GATED_MLP_CLASSES:
        return f"{name}: not a class known to compute down(act(gate(x)) * up(x))"
    if "forward" in module.__dict__ or any((module._forward_hooks, module._forward_pre_hooks)):
        return "its forward is replaced or hooked"
    projections = ("gate_proj", "up_proj", "down_proj")
    reason = _why_not_plain(module, projections)
    if reason is not None:
        return reason
    for proj in projections:
        linear = getattr(module, proj)
        if linear.bias is not None:
            return f"{proj} is {type(linear).__name__} with a bias"
    if module.gate_proj.weight.dtype != module.up_proj.weight.dtype:
        return "gate_proj and up_proj differ in dtype"
    act = activation_of(getattr(module, "act_fn", None))
    if act not in GLU_ACTIVATIONS:
        return f"activation {type(getattr(module, 'act_fn', None)).__name__}: the epilogue computes {GLU_ACTIVATIONS}"
    return None


def _why_not_plain(module: torch.nn.Module, projections: tuple[str, ...]) -> str | None:
    """Why one of `module`'s projections is not a plain linear whose weight a fused module can take
    over (None: each is): exactly nn.Linear or tritongemm's, its forward neither replaced nor
    hooked, plain-tensor weights, no activation of its own."""
    for proj in projections:
        linear = getattr(module, proj)
        if type(linear) not in (torch.nn.Linear, Linear):
            return f"{proj} is {type(linear).__name__}"
        if any((linear._forward_hooks, linear._forward_pre_hooks)) or "forward" in linear.__dict__:
            return f"{proj}'s forward is replaced or hooked"
        if type(linear.weight.data) is not torch.Tensor:
            return f"{proj} holds {type(linear.weight.data).__name__} weights"
        if getattr(linear, "activation", None) is not None:
            return f"{proj} has an activation of its own"
    return None


def fuse_mlps(model: torch.nn.Module, kernel: str = "auto", refuse=None) -> tuple[list[str], dict[str, str]]:
    """Replace, in place, every fusable gated MLP in `model` with a `GatedMLP` (the gate and up
    weights copied once into one; down_proj's shared). `refuse(linear) -> reason or None` adds
    the caller's reasons (patch's: dtypes and devices no kernel serves). Returns (the names
    fused, {name: why not} for the gated MLPs left)."""

    def candidate(module: torch.nn.Module) -> bool:
        return not isinstance(module, GatedMLP) and all(
            hasattr(module, p) for p in ("gate_proj", "up_proj", "down_proj")
        )

    def build(module: torch.nn.Module):
        reason = why_not_fused(module) or (refuse and refuse(module.gate_proj))
        if reason is not None:
            return None, reason
        return GatedMLP.from_mlp(module, activation_of(getattr(module, "act_fn", None)), kernel=kernel), None

    return _replace_each(model, candidate, build)


def _replace_each(model: torch.nn.Module, candidate, build) -> tuple[list[str], dict[str, str]]:
    """Put `build(module)`'s replacement, in place, at every path to each submodule that
    `candidate(module)` picks; `build` returns (the replacement, None) or (None, why not). A module
    reached by several paths is built once, so that it stays shared. Returns (the paths replaced,
    {path: why not} for those left)."""
    fused, left, seen = [], {}, {}
    for name, module in list(model.named_modules(remove_duplicate=False)):  # every path to a shared module
        if not name or not candidate(module):
            continue
        if id(module) not in seen:
            seen[id(module)] = build(module)
        replacement, reason = seen[id(module)]
        if replacement is None:
            left[name] = reason
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, replacement)
        fused.append(name)
    return fused, left


# transformers' attention classes whose forward calls q_proj, k_proj and v_proj on the same
# hidden states, in that order (what QKVProjection's one GEMM serves; any other call still gets
# its own GEMM, only the joined one is then wasted).
QKV_ATTENTION_CLASSES = frozenset({"LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention",
                                   "GemmaAttention", "Gemma2Attention", "Gemma3Attention", "Olmo2Attention",
                                   "GraniteAttention", "Qwen2MoeAttention", "Qwen3MoeAttention",
                                   "MixtralAttention"})  # fmt: skip


def why_not_qkv(module: torch.nn.Module) -> str | None:
    """Why `module`, an attention module by its attributes, keeps its three projections (None: they
    can be one GEMM)."""
    name = type(module).__name__
    if name not in QKV_ATTENTION_CLASSES:
        return f"{name}: not a class known to project one input by q_proj, k_proj and v_proj"
    reason = _why_not_plain(module, QKV_NAMES)
    if reason is not None:
        return reason
    linears = [getattr(module, proj) for proj in QKV_NAMES]
    q = linears[0]
    if any((linear.bias is None) != (q.bias is None) for linear in linears):
        return "some of q_proj, k_proj and v_proj have a bias and some not"
    facts = {(linear.in_features, linear.weight.dtype, linear.weight.device) for linear in linears}
    if len(facts) > 1:
        return f"q_proj, k_proj and v_proj differ in in_features, dtype or device: {sorted(map(str, facts))}"
    return None


def fuse_qkv(model: torch.nn.Module, kernel: str = "auto", refuse=None) -> tuple[list[str], dict[str, str]]:
    """Put, in place, a `QKVProjection` (the three weights copied once into one) in q_proj's
    place of every attention module whose projections can be one GEMM, and its shared views in
    k_proj's and v_proj's. `refuse` as fuse_mlps'. Returns (the attention modules fused, {name: why
    not} for those left)."""
    fused, left = [], {}
    for name, module in list(model.named_modules()):  # a module shared by two parents: once
        if not name or not all(hasattr(module, p) for p in QKV_NAMES) or isinstance(module.q_proj, QKVProjection):
            continue
        reason = why_not_qkv(module) or (refuse and refuse(module.q_proj))
        if reason is not None:
            left[name] = reason
            continue
        QKVProjection.install(module, kernel)
        fused.append(name)
    return fused, left


# transformers' RMSNorm classes by form (rms_norm.py): (offset, cast) for Llama's weight * cast(x̂)
# and Gemma's cast(x̂ * (1 + weight)). Olmo2's, cast(weight * x̂), is neither, and is left.
RMS_NORM_FORMS = {
    **dict.fromkeys(("LlamaRMSNorm", "MistralRMSNorm", "MixtralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm",
                     "Qwen2MoeRMSNorm", "Qwen3MoeRMSNorm", "GraniteRMSNorm"), (0.0, True)),
    **dict.fromkeys(("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"), (1.0, False)),
}  # fmt: skip


def why_not_norm(module: torch.nn.Module) -> str | None:
    """Why `module`, an RMSNorm by its class name, keeps its own forward (None: the kernel can take
    it). Besides the class, a probe: on a random input the module must compute what its form does,
    so a transformers release that changes a norm's formula is left, not silently misread."""
    name = type(module).__name__
    if name not in RMS_NORM_FORMS:
        return f"{name}: not a class known to compute an RMSNorm of Llama's or Gemma's form"
    if "forward" in module.__dict__ or any((module._forward_hooks, module._forward_pre_hooks)):
        return "its forward is replaced or hooked"
    weight, eps = getattr(module, "weight", None), _eps(module)
    if not isinstance(weight, torch.nn.Parameter) or type(weight.data) is not torch.Tensor or weight.dim() != 1:
        return "its weight is not a plain 1-D parameter"
    if not isinstance(eps, float):
        return "it has no float variance_epsilon or eps"
    probe = torch.randn(2, weight.shape[0], generator=torch.Generator().manual_seed(0)).to(weight)
    if not kernel_serves(probe, weight):
        return f"{weight.dtype} weights on {weight.device}: the kernel does not run there"
    with torch.no_grad():
        seen, expected = module(probe), rms_norm_reference(probe, weight, eps, *RMS_NORM_FORMS[name])
    if seen.dtype != expected.dtype or not torch.allclose(seen.float(), expected.float(), rtol=1e-2, atol=1e-2):
        return "on a probe input it computed something else than its form's formula"
    return None


def _eps(module: torch.nn.Module):
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return float(eps) if isinstance(eps, (float, int)) and not isinstance(eps, bool) else None


def fuse_norms(model: torch.nn.Module) -> tuple[list[str], dict[str, str]]:
    """Put, in place, an `RMSNorm` (the same weight Parameter) in place of every transformers RMSNorm
    `why_not_norm` passes. Returns (the names fused, {name: why not} for those left)."""

    def candidate(module: torch.nn.Module) -> bool:
        return not isinstance(module, RMSNorm) and type(module).__name__.endswith("RMSNorm")

    def build(module: torch.nn.Module):
        reason = why_not_norm(module)
        if reason is not None:
            return None, reason
        return RMSNorm.from_norm(module, _eps(module), *RMS_NORM_FORMS[type(module).__name__]), None

    return _replace_each(model, candidate, build)
