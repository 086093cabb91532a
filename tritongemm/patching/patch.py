"""`tritongemm.patch`: a model's `nn.Linear` modules served by tritongemm, in place, and the
report of what it did. It swaps modules one for one and fuses nothing unless asked (`fuse=True`:
patching/fuse.py, blocks/residual.py): fusing an activation module into the Linear before it
would change the model's structure, and with it the meaning of hooks and names.

    >>> mlp = torch.nn.Sequential(torch.nn.Linear(4096, 14336), torch.nn.SiLU(), torch.nn.Linear(14336, 4096))
    >>> tritongemm.patch(mlp.cuda().half())   # both GEMMs by tritongemm; the SiLU stays a module
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from tritongemm.blocks.residual import fuse_residuals
from tritongemm.core import registry
from tritongemm.core.checks import SUPPORTED_DTYPES as _DTYPES  # the weight dtypes some kernel computes
from tritongemm.core.checks import invariant_kernel
from tritongemm.core.registry import dtype_name
from tritongemm.dense.module import Linear
from tritongemm.fp8 import grouped_training as fp8_grouped
from tritongemm.fp8.linear import Fp8Linear, fp8_unsupported_reason
from tritongemm.fp8.recipes import RECIPES
from tritongemm.fp8.training import Fp8TrainingConfig, fp8_training_unsupported_reason
from tritongemm.grouped import moe
from tritongemm.patching.fp8 import quantize_in_norms, share_quantization
from tritongemm.patching.fuse import fuse_mlps, fuse_norms, fuse_qkv

logger = logging.getLogger("tritongemm")


@dataclass
class PatchReport:
    """What `patch` did: the qualified names of the modules it replaced, and of those it left
    with the reason ("" is the model itself, as in `named_modules`)."""

    replaced: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    # A transformers MoE model's experts: the implementation patch selected ("tritongemm", or
    # "tritongemm-fp8-row" for Fp8TrainingConfig(experts="fp8")), under fp8_training with what it
    # means in brackets; else why not (None: the model has no experts interface).
    experts: str | None = None
    # fuse=True: the gated MLPs put in place as GatedMLP, the attention modules whose q, k and v
    # projections became one GEMM (QKVProjection), and those left of either kind with the reason.
    fused: list[str] = field(default_factory=list)
    fused_qkv: list[str] = field(default_factory=list)
    # fuse=True: the decoder layers whose residual adds are done in o_proj's and down_proj's stores.
    fused_residuals: list[str] = field(default_factory=list)
    # fuse=True: the RMSNorms put in place as tritongemm.blocks.RMSNorm (one kernel each way).
    fused_norms: list[str] = field(default_factory=list)
    not_fused: dict[str, str] = field(default_factory=dict)
    # fp8: the modules whose Fp8Linears of one input share its quantization (SHARED_INPUTS).
    shared_quantization: list[str] = field(default_factory=list)
    # fp8 and fuse=True: the fused RMSNorms that quantize their output for the block they feed.
    quantized_in_norms: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        total = len(self.replaced) + len(self.skipped)
        text = f"patched {len(self.replaced)} of {total} nn.Linear modules"
        if self.skipped:
            text += "; left: " + ", ".join(f"{name or '<root>'} ({why})" for name, why in self.skipped.items())
        if self.experts is not None:
            text += f"; experts: {self.experts}"
        if self.shared_quantization:
            text += f"; {len(self.shared_quantization)} groups of fp8 layers share their input's quantization"
        if self.quantized_in_norms:
            text += f", {len(self.quantized_in_norms)} of them made by the RMSNorm before them"
        if self.fused or self.fused_qkv or self.fused_residuals or self.fused_norms or self.not_fused:
            text += f"; fused {len(self.fused)} gated MLPs into GatedMLP"
            text += f", {len(self.fused_qkv)} attention q/k/v projections into one GEMM each"
            text += f", the residual adds of {len(self.fused_residuals)} decoder layers into their GEMMs"
            text += f" and {len(self.fused_norms)} RMSNorms into one kernel each"
            if self.not_fused:
                text += "; not fused: " + ", ".join(f"{name} ({why})" for name, why in self.not_fused.items())
        return text


def patch(model: torch.nn.Module, *, kernel: str = "auto", fp8: str | None = None, fuse: bool = False,
          batch_invariant: bool = False,
          fp8_training: str | Fp8TrainingConfig | None = None) -> torch.nn.Module:  # fmt: skip
    """Replace, in place, every `torch.nn.Linear` in `model` with a tritongemm `Linear` sharing
    its parameters; return `model`, with a `PatchReport` as `model.tritongemm_patch_report`
    (also logged at INFO on the "tritongemm" logger).

    `fp8="row"`, `"block"` or `"tensor"` puts an inference-only `Fp8Linear` there instead (fp8/
    linear.py): the weight quantized once with that recipe (a copy: the model's parameters stay
    as they are, unused), each input quantized on the fly. Modules whose in_features the recipe
    can't take (not a multiple of 128 for "block") are left, with the reason.

    `fuse=True` first puts a `tritongemm.blocks.GatedMLP` in place of each of transformers' gated
    MLPs (Llama, Qwen2/3, Mistral, Gemma, ...; patching/fuse.py says which): the gate and up
    projections as one GEMM with act(g) * u in its epilogue (their weights copied once into one;
    the state_dict keeps transformers' keys), then the down projection; and joins each of their
    attention modules' q, k and v projections into one GEMM (`QKVProjection`, blocks/qkv.py). The
    report's `fused`, `fused_qkv` and `not_fused` say which and why. Last, it moves the residual
    adds of transformers' pre-norm decoder layers into the stores of o_proj and down_proj (the
    layer's forward rebuilt from its own source: blocks/residual.py); `fused_residuals` lists them.
    It also puts a `tritongemm.blocks.RMSNorm` (one kernel forward, one backward; the same weight)
    in place of each of transformers' RMSNorms of Llama's or Gemma's form; `fused_norms` lists them.
    With `fp8`, `fuse=True` fuses the norms only: the GEMMs stay Fp8Linears (q, k and v share one
    quantization of their input, gate and up another), with no blocks or residuals; a decoder
    layer's norm quantizes its output for the layers it feeds in its own kernel where the recipe
    allows (row, or block with a hidden size a multiple of 128): `quantized_in_norms` lists them.

    On a transformers (5.x) mixture-of-experts model, patch also makes tritongemm its experts
    implementation (grouped/moe.py: the experts on `grouped_mm`); the report's `experts` says so.

    `fp8_training="row"`, `"tensor"` or `"block"` puts an `Fp8TrainingLinear` there instead (fp8/
    training.py): the module's own parameters, which the optimizer keeps updating, and the forward
    and both gradients computed on fp8 operands quantized each step with that recipe ("block":
    the weight gradient in the weight's dtype); an `Fp8TrainingConfig` also chooses the weight
    gradient's precision and whether Wᵀ's fp8 copy is kept for the backward (not under FSDP). Not
    with `fp8`, `fuse` or `batch_invariant` yet. On a MoE model every recipe trains the experts on
    tritongemm's bf16 grouped GEMMs, and in fp8 where
    `Fp8TrainingConfig(experts="fp8")` asks (fp8/grouped_training.py: grouped GEMMs on e4m3 operands,
    the weight gradient's scaled per expert; on the H200 they are still slower than the bf16 ones).

    `batch_invariant=True` gives each replacement Linear (or Fp8Linear, recipes "row" and "block")
    batch_invariant=True: a row's output the same bits whatever else is in the batch. Not with
    `fp8="tensor"` (its input scale is the batch's) or `fuse` (the fused blocks' kernels have no
    invariant mode yet), and a MoE model's experts are left as they are. What else a model
    needs to be invariant end to end (attention, norms): `tritongemm.batch_invariant()`.

    Left as they are, with the reason in the report: modules whose weight dtype or device no
    kernel serves (float64; CPU without TRITON_INTERPRET=1; bfloat16 on the CPU, which the
    interpreter computes wrongly), subclasses of nn.Linear (a quantized or LoRA linear computes
    something else in its forward, so only the exact type is replaced), and the model itself when
    it is an nn.Linear (patch cannot rebind the caller's reference: use `Linear.from_linear`).
    Patching twice changes nothing: a tritongemm `Linear` is not replaced again.
    """
    if fp8_training is not None:
        if not isinstance(fp8_training, Fp8TrainingConfig) and fp8_training not in RECIPES:
            raise ValueError(f"patch: expected fp8_training to be None, one of {RECIPES} or an Fp8TrainingConfig, "
                             f"but got {fp8_training!r}")  # fmt: skip
        given = [name for name, on in (("fp8", fp8 is not None), ("fuse", fuse), ("batch_invariant", batch_invariant),
                                       ("kernel", kernel != "auto")) if on]  # fmt: skip
        if given:
            raise ValueError(f"patch: fp8_training={fp8_training!r} trains plain fp8 Linears only, so expected "
                             f"{given[0]} unset, but it was given")  # fmt: skip
        if not isinstance(fp8_training, Fp8TrainingConfig):
            fp8_training = Fp8TrainingConfig(fp8_training)
    if fp8 is not None and fp8 not in RECIPES:
        raise ValueError(f"patch: expected fp8 to be None or one of {RECIPES}, but got {fp8!r}")
    if fp8 is not None and kernel != "auto":
        raise ValueError(f"patch: kernel={kernel!r} names a bf16 kernel; with fp8={fp8!r}, the fp8 kernels serve")
    invariant_kernel(kernel, batch_invariant, "patch")
    if batch_invariant and (fp8 == "tensor" or fuse):
        given = "fp8='tensor', whose input scale is the whole batch's absmax," if fp8 else "fuse=True's kernels"
        raise ValueError(f"patch: batch_invariant=True covers Linear and Fp8Linear (fp8='row' or 'block'); "
                         f"{given} cannot be batch-invariant yet, so expected it unset")  # fmt: skip
    served = _served_dtypes(kernel)
    report = PatchReport()
    if fuse and fp8 is None:
        refuse = lambda linear: _why_not(linear, served)  # noqa: E731
        report.fused, report.not_fused = fuse_mlps(model, kernel, refuse=refuse)
        report.fused_qkv, left = fuse_qkv(model, kernel, refuse=refuse)
        report.not_fused.update(left)
    if fuse:
        report.fused_norms, left = fuse_norms(model)
        report.not_fused.update(left)
    seen = {}  # id(nn.Linear) -> its replacement (None: left), so a module shared by two parents stays shared
    for name, module in list(model.named_modules(remove_duplicate=False)):  # every path to a shared module
        if not name or not isinstance(module, torch.nn.Linear) or isinstance(module, Linear):
            continue
        if id(module) not in seen:
            reason = _why_not(module, served, fp8, fp8_training)
            if reason is not None:
                seen[id(module)] = None
            elif fp8_training is not None:
                seen[id(module)] = fp8_training.layer(module)
            elif fp8 is not None:
                seen[id(module)] = Fp8Linear.from_linear(module, fp8, batch_invariant=batch_invariant)
            else:
                seen[id(module)] = Linear.from_linear(module, kernel=kernel, batch_invariant=batch_invariant)
            if reason is None:
                report.replaced.append(name)
            else:
                report.skipped[name] = reason
        if seen[id(module)] is not None:
            parent_name, _, child_name = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child_name, seen[id(module)])
    if fuse and fp8 is None:
        report.fused_residuals, left = fuse_residuals(model)
        report.not_fused.update(left)
    if fp8 is not None:
        report.shared_quantization = share_quantization(model)
        if fuse:
            report.quantized_in_norms = quantize_in_norms(model)
    if isinstance(model, torch.nn.Linear) and not isinstance(model, Linear):
        report.skipped[""] = "the model itself: patch cannot rebind your reference; use Linear.from_linear(model)"
    fp8_given = f"fp8={fp8!r}" if fp8 else f"fp8_training={fp8_training!r}" if fp8_training else None
    report.experts = _patch_experts(model, served, fp8_given, batch_invariant, fp8_training)
    model.tritongemm_patch_report = report  # a plain attribute: not in the state_dict
    logger.info(str(report))
    return model


def _patch_experts(model: torch.nn.Module, served, fp8_given: str | None, batch_invariant: bool,
                   fp8_training: Fp8TrainingConfig | None = None) -> str | None:  # fmt: skip
    """Select tritongemm's experts implementation (grouped/moe.py; fp8/grouped_training.py's where
    `fp8_training.experts` is "fp8") on a transformers MoE model; what happened, for the report
    (None: the model has no experts). `fp8_given`: the fp8 argument patch was called with, as
    "fp8='row'" (inference, which leaves the experts) or "fp8_training='row'"."""
    if not moe.uses_experts(model):
        return None
    fp8_experts = fp8_training is not None and fp8_training.experts == "fp8"
    if fp8_given is not None and fp8_training is None:
        return f"left as they are: {fp8_given} covers nn.Linear modules only"
    if batch_invariant:
        return "left as they are: grouped_mm has no batch-invariant mode yet"
    device = next(p.device for n, p in model.named_parameters() if "experts" in n or "down_proj" in n)
    unavailable = served(device)[1]
    if unavailable is not None:
        return f"left as they are: {device} weights: {unavailable}"
    if fp8_experts:
        fp8_grouped.register_experts()
        model.set_experts_implementation(fp8_grouped.EXPERTS_NAME)
        return fp8_grouped.EXPERTS_NAME
    moe.register()
    model.set_experts_implementation(moe.NAME)
    if fp8_training is not None:
        return f"{moe.NAME} (bf16 experts; Fp8TrainingConfig('row', experts='fp8') trains them in fp8, slower today)"
    return moe.NAME


def _served_dtypes(kernel: str):
    """device -> (the dtypes `kernel`, or any kernel for "auto", computes there, or why none runs
    there), from the registry's `matmul` kernels; each device asked once."""
    names = [k["name"] for k in registry.kernels(family="matmul")]
    if kernel != "auto" and kernel not in names:
        raise ValueError(f"patch: expected kernel to be 'auto' or one of {names}, but got {kernel!r}")
    cache: dict[torch.device, tuple[set[str], str | None]] = {}

    def lookup(device: torch.device) -> tuple[set[str], str | None]:
        if device not in cache:
            infos = [k for k in registry.kernels(device, family="matmul") if kernel in ("auto", k["name"])]
            running = [k for k in infos if k["available"]]
            # On the CPU, the interpreter's dtypes: it computes bf16 wrongly, so CPU bf16 is refused.
            key = "interpreter_dtypes" if device.type == "cpu" else "dtypes"
            dtypes = {d for k in running for d in k[key]}
            cache[device] = (dtypes, None if running else infos[0]["unavailable"])
        return cache[device]

    return lookup


def _why_not(module: torch.nn.Linear, served, fp8: str | None = None,
             fp8_training: Fp8TrainingConfig | None = None) -> str | None:  # fmt: skip
    """Why `patch` leaves this nn.Linear (None: it replaces it, or fuse may take it: tritongemm's own
    Linear, from an earlier patch, passes too)."""
    if type(module) not in (torch.nn.Linear, Linear):
        return f"{type(module).__name__}, a subclass of nn.Linear: its forward may compute something else"
    hooks = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks, module._backward_pre_hooks)
    if any(hooks):  # accelerate's device hooks, PEFT's, a user's: a replacement would drop them
        return "it has hooks, which a replacement would not carry"
    if "forward" in module.__dict__:
        return "its forward is replaced on the instance"
    weight = module.weight
    if type(weight.data) is not torch.Tensor:  # quantized, sharded (DTensor) or float8 weights
        return f"{type(weight.data).__name__} weights, a tensor subclass: tritongemm reads plain tensors"
    if fp8 is not None or fp8_training is not None:  # quantized: any dtype fp8 takes, where the kernels run
        unavailable = served(weight.device)[1]
        if fp8:
            reason = fp8_unsupported_reason(module, fp8)
        else:
            reason = fp8_training_unsupported_reason(module, fp8_training.recipe, fp8_training.wgrad)
        return reason or (unavailable and f"{weight.device} weights: {unavailable}")
    dtype = dtype_name(weight.dtype)
    if weight.dtype not in _DTYPES:
        return f"{dtype} weights: tritongemm computes {', '.join(map(dtype_name, _DTYPES))}"
    dtypes, unavailable = served(weight.device)
    if unavailable is not None:
        return f"{weight.device} weights: {unavailable}"
    if dtype not in dtypes:
        there = ", ".join(d for d in map(dtype_name, _DTYPES) if d in dtypes)
        return f"{dtype} weights on {weight.device}: the kernels there compute {there}"
    return None
