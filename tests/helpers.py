"""Small models with every parameter randomised, for the model and conversion tests."""

from __future__ import annotations

import torch

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM


def tiny_config(**overrides) -> DiffTransformerConfig:
    fields = dict(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2
    )
    fields.update(overrides)
    return DiffTransformerConfig(**fields)


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial values everywhere: gains around 1, lambda vectors and projections well away from 0."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
        if name.endswith("layernorm.weight") or name.endswith("norm.weight") or "subln" in name:
            param.copy_(1.0 + 0.3 * noise)
        elif "lambda_" in name and "proj" not in name:
            param.copy_(0.3 * noise)
        else:
            param.copy_(noise / param.shape[-1] ** 0.5 * 1.3)
    return model


def random_model(
    seed: int = 0, dtype: torch.dtype = torch.float64, **overrides
) -> DiffTransformerForCausalLM:
    model = DiffTransformerForCausalLM(tiny_config(**overrides)).to(dtype)
    return randomize(model, seed).eval()
