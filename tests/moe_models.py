"""Tiny Hugging Face MoE models for the CPU tests (the interpreter, fp32): a Mixtral and a
Qwen3-MoE of two layers, 64 wide, two experts a token, with tritongemm's experts implementation
registered. Skips the test where transformers or its experts interface (5.x) is missing."""

from __future__ import annotations

import pytest
import torch

TINY_MOE = {
    "MixtralForCausalLM": dict(config="MixtralConfig", intermediate_size=96, num_local_experts=4),
    "Qwen3MoeForCausalLM": dict(config="Qwen3MoeConfig", moe_intermediate_size=32, intermediate_size=96, num_experts=8,
                                head_dim=16),
}  # fmt: skip
VOCAB = 128


def tiny_moe_model(architecture: str) -> torch.nn.Module:
    """The model, seeded, in training mode; its config as `model.config`."""
    transformers = pytest.importorskip("transformers")
    from tritongemm.grouped import moe

    if not moe.register():
        pytest.skip("this transformers has no experts interface (transformers 5.x has)")
    settings = dict(TINY_MOE[architecture])
    config = getattr(transformers, settings.pop("config"))(
        hidden_size=64, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, **settings,
    )  # fmt: skip
    torch.manual_seed(0)
    return getattr(transformers, architecture)(config).train()
