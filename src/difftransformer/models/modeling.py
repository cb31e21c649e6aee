"""The attention kinds' language models (DIFF V1, GDA, DIFF V2, gated attention, Motif's attention, their
compositions and the matched softmax Transformer) as Hugging Face causal language models; each layer's attention is
the module of its map layout, built from the configuration's parts (layers/parts.py)."""

from __future__ import annotations

import copy
import os

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming, WeightTransform
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import can_return_tuple

from difftransformer.layers.mlp import SwiGLU
from difftransformer.layers.norm import RMSNorm
from difftransformer.layers.parts import FULL, LAMBDA_RENAMINGS, SLIDING
from difftransformer.layers.parts_attention import LambdaVectors
from difftransformer.layers.rotary import RotaryEmbedding
from difftransformer.layers.split_heads import SplitHeadAttention
from difftransformer.layers.whole_heads import WholeHeadAttention
from difftransformer.models.configuration import DiffTransformerConfig
from difftransformer.models.loading import strict_from_pretrained
from difftransformer.ops.diff_attention import check_implementation

# The scalar lambda's vectors live in their own float32 submodule and are saved under those names
# (`self_attn.lambda_vectors.q1` ...), so that tools reading the file by parameter name (accelerate's
# load_checkpoint_and_dispatch) find them. The Llama-family names of the paper's code and DiffLlama
# (`self_attn.lambda_q1` ...) are the "original format" of transformers' conversion machinery: folders saved with
# them still load (this mapping on from_pretrained, _load_from_state_dict on load_state_dict), and
# revert_weight_conversion gives them (the DiffLlama conversion reads it). The parts declare them (their
# ``renamings``); transformers keys the mapping by model type, which every configuration shares.
LAMBDA_KEYS = LAMBDA_RENAMINGS
# The attention module of each map layout.
LAYOUTS = {"split": SplitHeadAttention, "whole": WholeHeadAttention}


def lambda_renamings() -> list[WeightRenaming]:
    """Llama-family lambda names -> ours, as transformers' conversion mapping (fresh objects: they keep state)."""
    return [WeightRenaming(f"self_attn.{old}", f"self_attn.{new}") for old, new in LAMBDA_KEYS.items()]


register_checkpoint_conversion_mapping(
    DiffTransformerConfig.model_type,
    lambda_renamings(),
    overwrite=True,  # the remote-code copy of this module registers it again
)


class DiffTransformerDecoderLayer(GradientCheckpointingLayer):
    """Pre-RMSNorm block: y = x + attn(norm(x)); out = y + mlp(norm(y))."""

    def __init__(self, config: DiffTransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = LAYOUTS[config.map_layout](config, layer_idx)
        self.attention_type = config.layer_types[layer_idx]
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], **attention
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T, d_model) -> (B, T, d_model), and the layer's attention map or None; the keywords (the mask, the
        cache, ``output_attentions``, continuous batching's paged cache) go to the attention module."""
        attn_out, attn_map = self.self_attn(
            self.input_layernorm(hidden_states), position_embeddings, **attention
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
    # The softmax kinds run every implementation transformers registers; DIFF V1 and GDA the ones their operators
    # can (get_correct_attn_implementation refuses the rest, saying why).
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True

    def __init__(self, config: DiffTransformerConfig, *inputs, **kwargs) -> None:
        super().__init__(config, *inputs, **kwargs)
        # exp() of a half-precision dot product is too coarse for lambda: the scalar lambda's vectors load in float32
        # whatever the dtype (their own submodule, so that FSDP2 groups them apart from the bf16 projections).
        self._keep_in_fp32_modules_strict = list(config.parts.keep_in_fp32)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' ``from_pretrained``, refusing in one line a folder whose weights and config.json disagree
        (tensors missing, unexpected or of another shape, ties left undone): models/loading.py."""
        return strict_from_pretrained(super().from_pretrained, pretrained_model_name_or_path, *args, **kwargs)

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
        writes the lambda vectors under their Llama-family names); the config's ``save_pretrained`` adds the
        model's code files."""
        super().save_pretrained(save_directory, *args, save_original_format=save_original_format, **kwargs)

    def get_correct_attn_implementation(
        self, requested_attention: str | None, is_init_check: bool = False
    ) -> str:
        """transformers' check and, for DIFF V1 and GDA, only the implementations their operators run
        (:func:`~difftransformer.ops.check_implementation` says why it refuses the others: before transformers
        looks for a flash-attention package, after it has refused an unknown name)."""
        differential = self.config.differential_heads
        if differential and requested_attention in ALL_ATTENTION_FUNCTIONS:
            check_implementation(requested_attention)
        implementation = super().get_correct_attn_implementation(requested_attention, is_init_check)
        if differential:
            check_implementation(implementation)
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


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Raise ValueError when an id lies outside [0, vocab_size), on the CPU, where reading the ids costs nothing. On
    an accelerator reading them back would stall the device at every step, so there the embedding's own index
    check reports it."""
    if input_ids.is_cpu and input_ids.numel() and not torch.compiler.is_compiling():
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"input_ids must lie in [0, vocab_size={vocab_size}); got values in [{low}, {high}]"
            )


def check_mask_shape(
    attention_mask: torch.Tensor, batch_and_queries: torch.Size, cache: Cache | None, paged: bool
) -> None:
    """Raise ValueError unless ``attention_mask`` is (B, S) with the queries' and the cache's S keys, or a ready
    (B or 1, 1, T, S) mask (with a ``paged`` cache, continuous batching's, S is its keys, not counted here); shapes
    only, nothing read back."""
    batch, q_len = batch_and_queries
    kv_len = cache.get_mask_sizes(q_len, 0)[0] if cache is not None else q_len
    if attention_mask.dim() == 4:
        expected = (1, q_len) if paged else (1, q_len, kv_len)
        if (
            attention_mask.shape[0] not in (1, batch)
            or tuple(attention_mask.shape[1:])[: len(expected)] != expected
        ):
            keys = "keys" if paged else kv_len
            raise ValueError(
                f"a 4-D attention_mask must be ({batch} or 1, 1, {q_len}, {keys}); got {tuple(attention_mask.shape)}"
            )
        return
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] > kv_len:
        raise ValueError(
            f"attention_mask must be (batch={batch}, key length <= {kv_len}) of 1 (token) / 0 (padding); got "
            f"{tuple(attention_mask.shape)}"
        )


def mask_config(config: DiffTransformerConfig, output_attentions: bool) -> DiffTransformerConfig:
    """The configuration masks are built for: ``config``, or with ``output_attentions`` a copy set to the eager
    implementation, whose (materialized) masks every layer's maps are computed with."""
    if not output_attentions or config._attn_implementation == "eager":
        return config
    eager = copy.copy(config)
    eager._attn_implementation = "eager"
    return eager


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

    def attention_mask(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None,
        position_ids: torch.Tensor | None,
        output_attentions: bool,
        paged: bool,
    ) -> dict[str, torch.Tensor | None]:
        """The layers' masks by layer type ("full_attention", and "sliding_attention" where the parts window a
        layer), as transformers' ``masking_utils`` builds them for the attention implementation (causal or
        bidirectional, the window, padding, packed documents in the given ``position_ids``, the cache's offsets),
        or None where the implementation's own causal or full attention is exact."""
        config = mask_config(self.config, output_attentions)
        if isinstance(attention_mask, torch.Tensor):
            check_mask_shape(attention_mask, inputs_embeds.shape[:2], past_key_values, paged)
        # Deciding that a padding mask hides nothing reads it back: free on the CPU, a device stall elsewhere.
        may_skip = attention_mask is None or attention_mask.is_cpu
        if not self.config.causal:
            return {
                FULL: create_bidirectional_mask(
                    config, inputs_embeds, attention_mask, past_key_values=past_key_values,
                    allow_is_bidirectional_skip=may_skip,
                )
            }  # fmt: skip
        arguments = dict(
            config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
            past_key_values=past_key_values, position_ids=position_ids, allow_is_causal_skip=may_skip,
        )  # fmt: skip
        masks = {FULL: create_causal_mask(**arguments)}
        if SLIDING in self.config.layer_types:
            masks[SLIDING] = create_sliding_window_causal_mask(**arguments)
        return masks

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
            attention_mask: (B, S) with 1 for tokens and 0 for padding (S = cached + new tokens), a
                (B, 1, T, S) bool / additive mask, or the masks by layer type ("full_attention",
                "sliding_attention") as transformers' generation builds them.
            position_ids: (B, T); by default counted from the first non-padding token. Without an
                attention_mask and a cache, positions that restart mark packed documents (as transformers
                detects them): each token then attends only within its document.
            past_key_values: a transformers Cache (DynamicCache, StaticCache, ...).
            inputs_embeds: (B, T, d_model) instead of input_ids.
            output_attentions: every layer's map, whatever the attention implementation (the layers compute it
                with the materialized "eager" one).
            return_dict: False (or ``config.return_dict`` False) returns a tuple.
            kwargs: passed to the attention modules, as transformers' models do (continuous batching's paged
                cache and its indices).

        Returns:
            last_hidden_state (B, T, d_model); hidden_states: embeddings then each layer's output;
            attentions: one (B, H, T, S) map per layer (for DIFF the combined map A1 - lambda A2).
        """
        output_attentions = bool(
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
            check_token_ids(input_ids, self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)
        batch, q_len, _ = inputs_embeds.shape

        # The mask before a new cache: an empty cache changes no size, and without one the positions a caller gives
        # are read for packed documents (restarting positions; ours never restart, so they are not read).
        paged = kwargs.get("cache") is not None  # continuous batching's paged cache, read by the attention
        if isinstance(attention_mask, dict):  # the masks by layer type, as transformers' generate builds them
            masks = attention_mask
        else:
            masks = self.attention_mask(
                inputs_embeds, attention_mask, past_key_values, position_ids, output_attentions, paged
            )
        if position_ids is None:
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -q_len:]
            else:
                past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
                position_ids = torch.arange(past_len, past_len + q_len, device=inputs_embeds.device)[None]
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)

        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        all_hidden = [hidden_states] if output_hidden_states else None
        all_maps = [] if output_attentions else None
        for layer in self.layers:
            hidden_states, attn_map = layer(
                hidden_states,
                position_embeddings,
                attention_mask=masks[layer.attention_type],
                past_key_values=past_key_values,
                output_attentions=output_attentions,
                **kwargs,
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
            **kwargs,
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
