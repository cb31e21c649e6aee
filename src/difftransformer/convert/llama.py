"""Exact conversion between our softmax baseline and transformers' Llama.

The matched baseline is a Llama in all but name: pre-RMSNorm blocks, SwiGLU, grouped-query attention with the
default 1/sqrt(d) scale, no biases, and the same parameter names. Only the rotary pairing can differ: our
"interleaved" style (the authors' code) rotates dims (2j, 2j+1) where Llama rotates (j, j + d/2) by the same
angle, so converting permutes the rows inside every head of q_proj and k_proj; "half" models convert with no
change at all. RoPE scaling (``rope_parameters``: linear, dynamic, YaRN, ...) is carried across as it is, both
sides computing it with transformers' own functions. Tensors are moved, never recomputed: round trips are
bit-identical and the logits agree to float32 rounding.

DIFF V1 converts to DiffLlama instead (:mod:`difftransformer.convert.diffllama`). DIFF V2 has no counterpart in
transformers; its folders load with ``trust_remote_code=True`` (docs/sharing.md).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from difftransformer.convert.diffllama import (
    ConversionError,
    fields_from_llama_family,
    llama_family_fields,
    load_native,
    permute_rotary_rows,
)
from difftransformer.errors import UsageError
from difftransformer.layers import interleaved_to_half_permutation
from difftransformer.models import KINDS, DiffTransformerConfig, DiffTransformerForCausalLM

NO_NATIVE_COUNTERPART = {
    "diff": "DIFF V1 converts to transformers' DiffLlama instead: use to_diffllama (`convert --to-diffllama`)",
    "diff_v2": (
        "DIFF V2 has no counterpart in transformers; share its folder as it is, which loads with "
        "trust_remote_code=True where difftransformer is not installed (docs/sharing.md)"
    ),
    "gda": (
        "GDA has no counterpart in transformers; share its folder as it is, which loads with "
        "trust_remote_code=True where difftransformer is not installed (docs/sharing.md)"
    ),
    "gated": (
        "transformers' gated attention (Qwen3-Next) also normalises q and k and rotates a quarter of each head; "
        "share the folder as it is, which loads with trust_remote_code=True (docs/sharing.md)"
    ),
    "motif": (
        "Motif's attention has no counterpart in transformers; share its folder as it is, which loads with "
        "trust_remote_code=True where difftransformer is not installed (docs/sharing.md)"
    ),
}


def check_llama_config(config: LlamaConfig) -> None:
    """Raise ConversionError naming the first field our softmax model cannot represent exactly."""
    checks = {
        "hidden_act": (config.hidden_act == "silu", "'silu' (SwiGLU)"),
        "attention_bias": (not config.attention_bias, "False (our projections have no bias)"),
        "mlp_bias": (not config.mlp_bias, "False (our projections have no bias)"),
        "head_dim": (
            config.head_dim == config.hidden_size // config.num_attention_heads,
            f"hidden_size / num_attention_heads = {config.hidden_size // config.num_attention_heads}",
        ),
        "attention_dropout": (not config.attention_dropout, "0 (our attention has no dropout)"),
    }
    for field, (ok, expected) in checks.items():
        if not ok:
            raise ConversionError(
                f"{field} must be {expected} to convert from Llama; got {getattr(config, field)!r}"
            )


def from_llama(
    source: str | Path | LlamaForCausalLM, *, rope_style: str = "half"
) -> DiffTransformerForCausalLM:
    """Our softmax model computing what a Llama model (or saved directory) computes.

    ``rope_style="half"`` keeps Llama's rotary pairing (the tensors are copied unchanged); "interleaved"
    permutes q/k rows to the authors' pairing (the same function).
    """
    if rope_style not in ("half", "interleaved"):
        raise UsageError(f"rope_style must be 'half' or 'interleaved'; got {rope_style!r}")
    llama = load_native(source, LlamaForCausalLM, check_llama_config, dtype="auto")
    src = llama.config
    config = DiffTransformerConfig(
        num_attention_heads=src.num_attention_heads,
        num_key_value_heads=src.num_key_value_heads,
        attention="softmax",
        rope_style=rope_style,
        **fields_from_llama_family(src),
    )
    half_to_interleaved = torch.argsort(interleaved_to_half_permutation(src.head_dim))
    state = {}
    for name, tensor in llama.state_dict().items():
        if rope_style == "interleaved" and name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = permute_rotary_rows(tensor, src.head_dim, half_to_interleaved)
        state[name] = tensor
    model = DiffTransformerForCausalLM(config).to(llama.dtype)
    model.load_state_dict(state, strict=True)
    return model.eval()


def to_llama(model: DiffTransformerForCausalLM) -> LlamaForCausalLM:
    """The LlamaForCausalLM computing what our softmax model computes (causal attention needed)."""
    config = model.config
    if config.attention != "softmax":
        raise ConversionError(
            f"attention must be 'softmax' to convert to Llama; got {config.attention!r}: "
            f"{NO_NATIVE_COUNTERPART.get(config.attention, '')}"
        )
    if config.parts != KINDS["softmax"].parts:
        raise ConversionError(
            f"Llama's attention is the softmax baseline's parts ({KINDS['softmax'].parts}); got {config.parts}: share "
            "the folder as it is, which loads with trust_remote_code=True (docs/sharing.md)"
        )
    if not config.causal:
        raise ConversionError("causal must be True to convert to Llama (a causal language model); got False")
    target = LlamaConfig(
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        **llama_family_fields(config),
    )
    interleaved_to_half = interleaved_to_half_permutation(config.head_dim)
    state = {}
    for name, tensor in model.state_dict().items():
        if config.rope_style == "interleaved" and name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = permute_rotary_rows(tensor, config.head_dim, interleaved_to_half)
        state[name] = tensor
    llama = LlamaForCausalLM(target).to(model.dtype)
    llama.load_state_dict(state, strict=True)
    return llama.eval()
