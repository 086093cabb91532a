"""What `patch(model, fp8=...)` adds to a transformers model's Fp8Linears: one quantization of an
input shared by the layers that read it, and, with `fuse=True`, that quantization made by the
RMSNorm before them, in its own kernel."""

from __future__ import annotations

import torch

from tritongemm.blocks.rms_norm import RMSNorm
from tritongemm.fp8.linear import SharedQuantization

# The Fp8Linears that transformers' forwards call back to back on one input: attention's
# projections and a gated MLP's pair (Llama and its kin).
SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def share_quantization(model: torch.nn.Module) -> list[str]:
    """Give each group of SHARED_INPUTS that patch made Fp8Linears one SharedQuantization; the
    names of the modules that hold them."""
    shared = []
    for name, module in model.named_modules():
        for names in SHARED_INPUTS:
            if SharedQuantization.install([getattr(module, child, None) for child in names], module) is not None:
                shared.append(f"{name}: {', '.join(names)}" if name else ", ".join(names))
    return shared


# A decoder layer's norms and the blocks they feed: (norm, or the first present of several; the
# block; its first Fp8Linear). Gemma 2 and 3 normalize the attention's output with
# post_attention_layernorm and the MLP's input with pre_feedforward_layernorm.
NORM_FEEDS = ((("input_layernorm",), "self_attn", "q_proj"),
              (("pre_feedforward_layernorm", "post_attention_layernorm"), "mlp", "gate_proj"))  # fmt: skip


def quantize_in_norms(model: torch.nn.Module) -> list[str]:
    """Have each fused RMSNorm of NORM_FEEDS quantize its output for the Fp8Linears that share it
    (rms_norm.py); the names of those norms, with the block each feeds. A norm whose output goes
    elsewhere costs its extra writes and holds them until its next call, no more: the group takes
    a kept quantization only when called with the very tensor it was made for, unchanged since."""
    done = []
    for name, layer in model.named_modules():
        for norm_names, block, first in NORM_FEEDS:
            norm_name = next((n for n in norm_names if isinstance(getattr(layer, n, None), torch.nn.Module)), None)
            share = getattr(getattr(getattr(layer, block, None), first, None), "shared", None)
            norm = getattr(layer, norm_name, None) if norm_name else None
            if isinstance(norm, RMSNorm) and share is not None and share.takes(norm.weight.shape[0]):
                norm.fp8_share = share
                done.append(f"{name + '.' if name else ''}{norm_name} -> {block}")
    return done
