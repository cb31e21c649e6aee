"""DIFF V1, DIFF V2 and the matched softmax Transformer as Hugging Face causal language models."""

from __future__ import annotations

import os

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming, WeightTransform
from transformers.masking_utils import find_packed_sequence_indices
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import can_return_tuple

from difftransformer.layers import (
    DiffAttention,
    DiffAttentionV2,
    LambdaVectors,
    RMSNorm,
    RotaryEmbedding,
    SoftmaxAttention,
    SwiGLU,
)
from difftransformer.models.configuration import DiffTransformerConfig
from difftransformer.ops import additive_to_bool

# DIFF V1's lambda vectors live in their own float32 submodule and are saved under those names
# (`self_attn.lambda_vectors.q1` ...), so that tools reading the file by parameter name (accelerate's
# load_checkpoint_and_dispatch) find them. The Llama-family names of the paper's code and DiffLlama
# (`self_attn.lambda_q1` ...) are the "original format" of transformers' conversion machinery: folders saved with
# them still load (this mapping on from_pretrained, _load_from_state_dict on load_state_dict), and
# revert_weight_conversion gives them (the DiffLlama conversion reads it).
LAMBDA_KEYS = {f"lambda_{name}": f"lambda_vectors.{name}" for name in ("q1", "k1", "q2", "k2")}


def lambda_renamings() -> list[WeightRenaming]:
    """Llama-family lambda names -> ours, as transformers' conversion mapping (fresh objects: they keep state)."""
    return [WeightRenaming(f"self_attn.{old}", f"self_attn.{new}") for old, new in LAMBDA_KEYS.items()]


register_checkpoint_conversion_mapping(
    DiffTransformerConfig.model_type,
    lambda_renamings(),
    overwrite=True,  # the remote-code copy of this module registers it again
)

# transformers' attn_implementation -> our backend; "sdpa" (its default) runs config.attention_backend.
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")


def attention_backend(config: DiffTransformerConfig, implementation: str | None = None) -> str:
    """The ops backend for ``implementation`` (default: ``config``'s ``attn_implementation``): "eager" ->
    "reference" (materialized, as transformers' eager), "sdpa" (the default) -> ``config.attention_backend``,
    "flex_attention" -> "flex" (DIFF V1 only). Anything else raises ValueError: an implementation is never
    silently ignored."""
    implementation = implementation or config._attn_implementation or "sdpa"
    if implementation == "sdpa":
        return config.attention_backend
    if implementation == "eager":
        return "reference"
    if implementation == "flex_attention" and config.attention == "diff":
        return "flex"
    supported = ATTN_IMPLEMENTATIONS if config.attention == "diff" else ATTN_IMPLEMENTATIONS[:2]
    raise ValueError(
        f"attn_implementation must be one of {supported} for attention={config.attention!r} (docs/performance.md); "
        f"got {implementation!r}"
    )


def build_attention(config: DiffTransformerConfig, layer_idx: int) -> nn.Module:
    """The attention module that ``config.attention`` names, for one layer."""
    common = dict(rope_style=config.rope_style, causal=config.causal)
    args = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, layer_idx)
    if config.attention == "diff":
        lambda_init = None if config.lambda_init == "depth" else float(config.lambda_init)
        return DiffAttention(
            *args,
            head_dim=config.head_dim,
            lambda_init=lambda_init,
            lambda_std=config.lambda_std,
            subln=config.subln,
            subln_eps=config.subln_eps,
            **common,
        )
    if config.attention == "diff_v2":
        return DiffAttentionV2(*args, **common)
    return SoftmaxAttention(*args, **common)


class DiffTransformerDecoderLayer(GradientCheckpointingLayer):
    """Pre-RMSNorm block: y = x + attn(norm(x)); out = y + mlp(norm(y))."""

    def __init__(self, config: DiffTransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = build_attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        backend: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T, d_model) -> (B, T, d_model), and the layer's attention map or None."""
        attn_out, attn_map = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            output_attentions=output_attentions,
            backend=backend,
        )
        hidden_states = hidden_states + attn_out
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)), attn_map


class DiffTransformerPreTrainedModel(PreTrainedModel):
    """Weight init, checkpoint-name mapping and the transformers flags shared by the base model and the LM."""

    config: DiffTransformerConfig
    config_class = DiffTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DiffTransformerDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flex_attn = True  # DIFF V1 only: get_correct_attn_implementation refuses it for the others
    _can_compile_fullgraph = True

    def __init__(self, config: DiffTransformerConfig, *inputs, **kwargs) -> None:
        super().__init__(config, *inputs, **kwargs)
        # exp() of a half-precision dot product is too coarse for lambda: DIFF V1 loads its lambda vectors in float32
        # whatever the dtype (their own submodule, so that FSDP2 groups them apart from the bf16 projections).
        self._keep_in_fp32_modules_strict = ["lambda_vectors"] if config.attention == "diff" else []

    @property
    def _weight_conversions(self) -> list[WeightTransform]:
        """What transformers' ``revert_weight_conversion`` undoes: the conversions ``from_pretrained`` used,
        always with the lambda renaming, so the "original format" is the Llama-family names however the model
        was made (transformers records only the conversions a load matched, none for a folder in our names)."""
        # A load that matched the renaming recorded it too: reverted twice, the second finds nothing to rename.
        return self.__dict__.get("_recorded_weight_conversions", []) + lambda_renamings()

    @_weight_conversions.setter
    def _weight_conversions(self, conversions: list[WeightTransform]) -> None:
        self.__dict__["_recorded_weight_conversions"] = list(conversions)

    def save_pretrained(
        self, save_directory: str | os.PathLike, *args, save_original_format: bool = False, **kwargs
    ) -> None:
        """transformers' ``save_pretrained``, writing the in-memory names by default (``save_original_format=True``
        writes the lambda vectors under their Llama-family names); a wrapper's subclass of this model (FSDP2's)
        leaves only our code in the folder (:func:`~difftransformer.models.remote_code.remove_foreign_sources`)."""
        from difftransformer.models.remote_code import remove_foreign_sources

        super().save_pretrained(save_directory, *args, save_original_format=save_original_format, **kwargs)
        remove_foreign_sources(save_directory, type(self))

    def get_correct_attn_implementation(
        self, requested_attention: str | None, is_init_check: bool = False
    ) -> str:
        """transformers' check, then ours: only the implementations :func:`attention_backend` maps."""
        implementation = super().get_correct_attn_implementation(requested_attention, is_init_check)
        attention_backend(self.config, implementation)
        return implementation

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, LambdaVectors):
            for vector in (module.q1, module.k1, module.q2, module.k2):
                init.normal_(vector, mean=0.0, std=self.config.lambda_std)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        # load_state_dict() of an on-disk state dict (the Trainer's resume does this) sees the lambda vectors' disk
        # names; from_pretrained() renames them through the registered conversion mapping instead.
        for key in [key for key in state_dict if key.startswith(prefix) and ".self_attn.lambda_" in key]:
            head, _, name = key.rpartition(".")
            if name in LAMBDA_KEYS:
                state_dict[f"{head}.{LAMBDA_KEYS[name]}"] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def padding_and_causal_mask(
    attention_mask: torch.Tensor | None,
    *,
    batch: int,
    query_positions: torch.Tensor,
    kv_len: int,
    causal: bool,
    documents: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Boolean (B or 1, 1, T, S) mask, True = attend, from a 2-D padding mask (B, <= S) of 1/0 or a ready 4-D mask.

    Returns None where plain causal (or full) attention is exact, so fused kernels take their fastest path.
    ``query_positions`` (T,) are the queries' slots in the key sequence (the cache position). ``documents``
    (B, T), for packed rows without a cache (T = S), numbers each token's document: no token sees another
    document's.
    """
    q_len = query_positions.shape[0]
    if attention_mask is not None and attention_mask.dim() == 4:
        if attention_mask.shape[0] not in (1, batch) or tuple(attention_mask.shape[1:]) != (1, q_len, kv_len):
            raise ValueError(
                f"a 4-D attention_mask must be ({batch} or 1, 1, {q_len}, {kv_len}); got {tuple(attention_mask.shape)}"
            )
        return attention_mask if attention_mask.dtype == torch.bool else additive_to_bool(attention_mask)
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] > kv_len:
            raise ValueError(
                f"attention_mask must be (batch={batch}, key length <= {kv_len}) of 1 (token) / 0 (padding); "
                f"got {tuple(attention_mask.shape)}"
            )
        if (
            not torch.compiler.is_compiling()
            and bool(attention_mask.all())
            and kv_len == attention_mask.shape[1]
        ):
            attention_mask = None
    if attention_mask is None and documents is None:
        if kv_len == q_len:
            return None
        if (
            query_positions.device.type == "cpu"  # reading the position on a GPU would sync every step
            and not torch.compiler.is_compiling()
            and int(query_positions[0]) == kv_len - q_len
        ):
            return None  # the queries fill the cache's last slots (a dynamic cache): bottom-right causal is exact
    keys = torch.arange(kv_len, device=query_positions.device)
    mask = (keys <= query_positions[:, None]) if causal else torch.ones(q_len, kv_len, dtype=torch.bool)
    mask = mask.to(query_positions.device)[None, None]
    if attention_mask is not None:
        padded = torch.zeros(batch, kv_len, dtype=torch.bool, device=attention_mask.device)
        padded[:, : attention_mask.shape[1]] = attention_mask.bool()
        mask = mask & padded[:, None, None, :]
    if documents is not None:
        mask = mask & (documents[:, None, :, None] == documents[:, None, None, :])
    return mask


class DiffTransformerModel(DiffTransformerPreTrainedModel):
    """Embeddings, decoder layers and the final norm; returns hidden states (no LM head)."""

    def __init__(self, config: DiffTransformerConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(
            DiffTransformerDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding."""
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Replace the token embedding (``resize_token_embeddings`` does)."""
        self.embed_tokens = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """
        Args:
            input_ids: (B, T) token ids in [0, vocab_size).
            attention_mask: (B, S) with 1 for tokens and 0 for padding (S = cached + new tokens), or a
                (B, 1, T, S) bool / additive mask.
            position_ids: (B, T); by default counted from the first non-padding token. Without an
                attention_mask and a cache, positions that restart mark packed documents (as transformers
                detects them): each token then attends only within its document.
            past_key_values: a transformers Cache (DynamicCache, StaticCache, ...).
            inputs_embeds: (B, T, d_model) instead of input_ids.
            return_dict: False (or ``config.return_dict`` False) returns a tuple.

        Returns:
            last_hidden_state (B, T, d_model); hidden_states: embeddings then each layer's output;
            attentions: one (B, H, T, S) map per layer (for DIFF the combined map A1 - lambda A2).
        """
        output_attentions = (
            output_attentions if output_attentions is not None else self.config.output_attentions
        )
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be (batch, seq); got shape {tuple(input_ids.shape)}")
            if (
                not torch.compiler.is_compiling()
                and input_ids.numel()
                and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.config.vocab_size)
            ):
                raise ValueError(
                    f"input_ids must lie in [0, vocab_size={self.config.vocab_size}); "
                    f"got values in [{int(input_ids.min())}, {int(input_ids.max())}]"
                )
            inputs_embeds = self.embed_tokens(input_ids)
        batch, q_len, _ = inputs_embeds.shape

        documents = None
        if position_ids is not None and attention_mask is None and past_key_values is None:
            documents = find_packed_sequence_indices(position_ids.expand(batch, -1))
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
        kv_len = past_key_values.get_mask_sizes(q_len, 0)[0] if past_key_values is not None else q_len
        query_positions = torch.arange(q_len, device=inputs_embeds.device) + past_len
        if position_ids is None:
            if attention_mask is not None and attention_mask.dim() == 2:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -q_len:]
            else:
                position_ids = query_positions.unsqueeze(0).expand(batch, -1)
        mask = padding_and_causal_mask(
            attention_mask,
            batch=batch,
            query_positions=query_positions,
            kv_len=kv_len,
            causal=self.config.causal,
            documents=documents,
        )

        backend = attention_backend(self.config)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        all_hidden = [hidden_states] if output_hidden_states else None
        all_maps = [] if output_attentions else None
        for layer in self.layers:
            hidden_states, attn_map = layer(
                hidden_states,
                position_embeddings,
                attention_mask=mask,
                past_key_values=past_key_values,
                output_attentions=bool(output_attentions),
                backend=backend,
            )
            if all_hidden is not None:
                all_hidden.append(hidden_states)
            if all_maps is not None:
                all_maps.append(attn_map)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden_states),
            past_key_values=past_key_values if use_cache else None,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            attentions=tuple(all_maps) if all_maps is not None else None,
        )


class DiffTransformerForCausalLM(DiffTransformerPreTrainedModel, GenerationMixin):
    """:class:`DiffTransformerModel` with a language-model head; ``generate`` works as for Llama."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _fsdp_plan = {"lm_head": "keep_full_weight"}

    def __init__(self, config: DiffTransformerConfig) -> None:
        super().__init__(config)
        self.model = DiffTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Arguments as :meth:`DiffTransformerModel.forward`; ``labels`` (B, T) give the next-token loss
        (shifted inside, -100 ignored). Returns logits (B, T, vocab_size), or a tuple with ``return_dict=False``."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# auto_map's model entries: folders we save load with trust_remote_code=True without this package (remote_code.py)
DiffTransformerModel.register_for_auto_class("AutoModel")
DiffTransformerForCausalLM.register_for_auto_class("AutoModelForCausalLM")
