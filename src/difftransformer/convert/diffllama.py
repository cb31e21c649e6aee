"""Exact conversion between our DIFF V1 models and transformers' DiffLlama.

Both compute the same function in different layouts (docs/architecture.md, "Head layout"). DiffLlama counts the
2h component heads in ``num_attention_heads`` and stacks all first maps before all second maps (component head j
pairs with j + h, KV head g with g + h_kv); ours keeps each head's two maps adjacent. DiffLlama rotates halves, has no gain on
its per-head norm (``groupnorm``), uses the depth lambda_init and one eps for every RMSNorm. Conversion is a
permutation of q/k/v rows (plus, for interleaved rotary, of the rows inside each map), and folding our
per-head norm gain into o_proj's columns: exact to rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, PreTrainedConfig, PreTrainedModel
from transformers.core_model_loading import revert_weight_conversion

from difftransformer.convert.folders import ConversionError, model_type
from difftransformer.errors import UsageError
from difftransformer.layers import interleaved_to_half_permutation
from difftransformer.layers.parts import SLIDING
from difftransformer.models import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.models.folders import load_model_folder, open_folder


def _maps_first_to_adjacent(weight: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Rows [map1 of heads 0..h-1, map2 of heads 0..h-1] -> [map1 head 0, map2 head 0, map1 head 1, ...]."""
    return weight.reshape(2, heads, head_dim, -1).transpose(0, 1).reshape(weight.shape)


def _adjacent_to_maps_first(weight: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    return weight.reshape(heads, 2, head_dim, -1).transpose(0, 1).reshape(weight.shape)


def permute_rotary_rows(weight: torch.Tensor, head_dim: int, permutation: torch.Tensor) -> torch.Tensor:
    """Reorder the rows inside every d-row block of a q/k projection."""
    return weight.reshape(-1, head_dim, weight.shape[-1])[:, permutation].reshape(weight.shape)


def load_native(
    source: str | Path | PreTrainedModel,
    model_class: type[PreTrainedModel],
    check: Callable[[PreTrainedConfig], None],
    **load: Any,
) -> PreTrainedModel:
    """A transformers model of ``model_class`` (DiffLlama, Llama), given or loaded from a saved folder with
    ``load`` options, its config checked by ``check`` first; a folder of another model type is refused."""
    if isinstance(source, model_class):
        check(source.config)
        return source
    name = model_class.__name__.removesuffix("ForCausalLM")
    path = Path(source)
    found = model_type(path)
    if found != model_class.config_class.model_type:
        raise ConversionError(f"source must be a {name} checkpoint; its model_type is {found!r}")
    check(open_folder(model_class.config_class.from_pretrained, path, what="source", thing="config"))
    return load_model_folder(path, model_class, what="source", **load)


def llama_family_fields(config: DiffTransformerConfig) -> dict[str, Any]:
    """The fields a transformers Llama-family config shares with ours, as that config's arguments."""
    return dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        hidden_act="silu",
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=dict(config.rope_parameters),
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
    )


def fields_from_llama_family(src: PreTrainedConfig) -> dict[str, Any]:
    """Our config's fields read from a transformers Llama-family config (the inverse of
    :func:`llama_family_fields`)."""
    return dict(
        vocab_size=src.vocab_size,
        hidden_size=src.hidden_size,
        intermediate_size=src.intermediate_size,
        num_hidden_layers=src.num_hidden_layers,
        rms_norm_eps=src.rms_norm_eps,
        rope_parameters=dict(src.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}),
        max_position_embeddings=src.max_position_embeddings,
        initializer_range=src.initializer_range,
        tie_word_embeddings=src.tie_word_embeddings,
        pad_token_id=src.pad_token_id,
        bos_token_id=src.bos_token_id,
        eos_token_id=src.eos_token_id,
    )


def check_diffllama_config(config: DiffLlamaConfig) -> None:
    """Raise ConversionError naming the field that our DIFF V1 cannot represent."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % 2 or kv_heads % 2:
        raise ConversionError(
            "num_attention_heads and num_key_value_heads must be even (they count both maps of each "
            f"differential head); got {heads} and {kv_heads}"
        )
    if config.head_dim != config.hidden_size // heads:
        raise ConversionError(
            f"head_dim must equal hidden_size / num_attention_heads = {config.hidden_size // heads}; "
            f"got {config.head_dim}"
        )
    if config.hidden_act != "silu":
        raise ConversionError(f"hidden_act must be 'silu' (SwiGLU); got {config.hidden_act!r}")
    if config.attention_bias:
        raise ConversionError("attention_bias must be False: our projections have no bias")


def from_diffllama(
    source: str | Path | DiffLlamaForCausalLM, *, rope_style: str = "half"
) -> DiffTransformerForCausalLM:
    """Build our DIFF V1 model computing what a DiffLlama model (or saved directory) computes.

    ``rope_style="half"`` keeps DiffLlama's rotary pairing; "interleaved" permutes q/k rows to the authors'
    pairing (the same function).
    """
    if rope_style not in ("half", "interleaved"):
        raise UsageError(f"rope_style must be 'half' or 'interleaved'; got {rope_style!r}")
    diffllama = load_native(source, DiffLlamaForCausalLM, check_diffllama_config)
    src = diffllama.config
    heads, kv_heads, head_dim = src.num_attention_heads // 2, src.num_key_value_heads // 2, src.head_dim
    config = DiffTransformerConfig(
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        attention="diff",
        rope_style=rope_style,
        subln="plain",
        subln_eps=src.rms_norm_eps,
        lambda_init="depth",
        lambda_std=src.lambda_std_dev,
        **fields_from_llama_family(src),
    )
    half_to_interleaved = torch.argsort(interleaved_to_half_permutation(head_dim))
    state = {}
    for name, tensor in diffllama.state_dict().items():
        if ".self_attn.groupnorm" in name:
            continue
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            groups = heads if name.endswith("q_proj.weight") else kv_heads
            tensor = _maps_first_to_adjacent(tensor, groups, head_dim)
            if rope_style == "interleaved" and not name.endswith("v_proj.weight"):
                tensor = permute_rotary_rows(tensor, head_dim, half_to_interleaved)
        state[name] = tensor
    model = DiffTransformerForCausalLM(config).to(diffllama.dtype)
    model.load_state_dict(state, strict=True)
    return model.eval()


def to_diffllama(model: DiffTransformerForCausalLM) -> DiffLlamaForCausalLM:
    """Build the DiffLlama model computing what our DIFF V1 model computes.

    Needs DIFF V1's parts (split maps, one noise map a head, the scalar lambda, no gate, no window), the depth
    lambda_init, a per-head norm (its gain, if any, is folded into o_proj), causal attention and
    ``subln_eps == rms_norm_eps`` (DiffLlama has a single eps). Any kind with those parts converts: GDA with
    ``gda_ratio=1`` is DIFF V1 exactly, in DIFF V1's layout (docs/architecture.md).
    """
    config = model.config
    # DiffLlama is DIFF V1's parts exactly, whatever the kind's name (layers/parts.py)
    checks = {
        "map_layout": (config.map_layout == "split", "'split' (DiffLlama splits each head into two maps)"),
        "gda_ratio": (config.gda_ratio == 1, "1 (DiffLlama gives each head its own noise map)"),
        "lambda_mode": (
            config.lambda_mode == "scalar",
            "'scalar' (DiffLlama's lambda is one number a layer)",
        ),
        "output_gate": (config.output_gate == "none", "'none' (DiffLlama has no output gate)"),
        "sliding_window": (
            SLIDING not in config.layer_types,
            "None (DiffLlama attends to every earlier key)",
        ),
        "lambda_init": (config.lambda_init == "depth", "'depth' (DiffLlama has no constant lambda_init)"),
        "subln": (config.subln != "none", "'affine' or 'plain' (DiffLlama always normalises each head)"),
        "causal": (config.causal, "True"),
        "subln_eps": (config.subln_eps == config.rms_norm_eps, f"rms_norm_eps={config.rms_norm_eps}"),
    }
    for field, (ok, expected) in checks.items():
        if not ok:
            raise ConversionError(
                f"{field} must be {expected} to convert to DiffLlama; got {getattr(config, field)!r}"
            )
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.map_head_dim
    target = DiffLlamaConfig(
        num_attention_heads=2 * heads,
        num_key_value_heads=2 * kv_heads,
        head_dim=head_dim,
        lambda_std_dev=config.lambda_std,
        **llama_family_fields(config),
    )
    interleaved_to_half = interleaved_to_half_permutation(head_dim)
    state = {}
    with torch.no_grad():
        for name, tensor in revert_weight_conversion(model, model.state_dict()).items():  # checkpoint names
            if name.endswith("self_attn.subln.weight"):
                continue
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                if config.rope_style == "interleaved" and not name.endswith("v_proj.weight"):
                    tensor = permute_rotary_rows(tensor, head_dim, interleaved_to_half)
                groups = heads if name.endswith("q_proj.weight") else kv_heads
                tensor = _adjacent_to_maps_first(tensor, groups, head_dim)
            if name.endswith("o_proj.weight") and config.subln == "affine":
                gain = model.get_parameter(name.replace("o_proj.weight", "subln.weight"))
                tensor = (tensor.unflatten(1, (heads, 2 * head_dim)) * gain.to(tensor.dtype)).flatten(1)
            state[name] = tensor
    diffllama = DiffLlamaForCausalLM(target).to(model.dtype)
    diffllama.load_state_dict(state, strict=True)
    return diffllama.eval()
