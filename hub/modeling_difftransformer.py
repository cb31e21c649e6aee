# Written by difftransformer 0.1.0 from its sources (src/difftransformer: ops, layers, models), model code 0e26c40f72130f94; change the package, not this file.
"""The Differential Transformer (DIFF V1, DIFF V2), the kinds compared with it (GDA, gated attention, Motif's
attention) and the matched softmax Transformer as transformers models: their layers and model classes,
generated from the package's sources named below (documented there)."""

from __future__ import annotations

import copy
import os
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
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
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import can_return_tuple

from .configuration_difftransformer import FULL, LAMBDA_RENAMINGS, SLIDING, DiffTransformerConfig
from .loading_difftransformer import strict_from_pretrained
from .operators_difftransformer import (
    QueryRotary,
    apply_rotary,
    check_implementation,
    diff_attention,
    diff_attention_reference,
    lambda_full,
    rms_norm,
    rotate_queries,
    softmax_attention_reference,
)


# ---- difftransformer/layers/mlp.py -----------------------------------------------------------------------
class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ---- difftransformer/layers/norm.py ----------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, scale)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, elementwise_affine={self.weight is not None}"


# ---- difftransformer/layers/parts_attention.py -----------------------------------------------------------
LogitsHook = None  # package-only (models/remote_code.py): not in this file


class LambdaVectors(nn.Module):
    def __init__(self, dim: int, std: float = 0.1) -> None:
        super().__init__()
        self.std = std
        self.q1 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.k1 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.q2 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.k2 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for vector in (self.q1, self.k1, self.q2, self.k2):
            nn.init.normal_(vector, mean=0.0, std=self.std)

    def forward(self, lambda_init: float) -> torch.Tensor | float:
        return lambda_full(self.q1, self.k1, self.q2, self.k2, lambda_init)


class PartsAttention(nn.Module):
    def __init__(self, config: PreTrainedConfig, layer_idx: int, width: int) -> None:
        super().__init__()
        self.config, self.layer_idx, self.parts = config, layer_idx, config.parts
        self.rope_style, self.is_causal = config.rope_style, config.causal
        self.logits_hook: LogitsHook | None = None
        self.map_head_dim, self.width = config.map_head_dim, width
        self.heads = config.num_attention_heads
        self.ratio = self.parts.noise_ratio or 1
        self.groups = self.heads // self.ratio
        self.sliding_window = config.sliding_window if self.parts.windowed(layer_idx) else None
        blocks = self.ratio + (1 if self.parts.differential else 0)  # a group's query blocks
        gate = self.ratio * width if self.parts.gate == "elementwise" else 0
        hidden, kv_rows = config.hidden_size, config.num_key_value_heads * config.head_dim
        self.group_width = blocks * self.map_head_dim + gate
        self.q_proj = nn.Linear(hidden, self.groups * self.group_width, bias=False)
        self.k_proj = nn.Linear(hidden, kv_rows, bias=False)
        self.v_proj = nn.Linear(hidden, kv_rows, bias=False)
        self.o_proj = nn.Linear(self.heads * width, hidden, bias=False)
        self.lambda_init = config.layer_lambda_init(layer_idx)
        if self.parts.lambda_mode == "scalar":
            self.lambda_vectors = LambdaVectors(self.map_head_dim, config.lambda_std)
        elif self.parts.lambda_mode == "token":
            self.lambda_proj = nn.Linear(config.hidden_size, self.heads, bias=False)
        self.out_scale = 1.0 - self.lambda_init if self.parts.lambda_mode == "scalar" else 1.0
        self.subln = (
            None
            if self.parts.norm == "none"
            else RMSNorm(width, eps=config.subln_eps, elementwise_affine=self.parts.norm == "affine")
        )

    def query_groups(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, q_len, _ = hidden_states.shape
        groups = self.q_proj(hidden_states).view(batch, q_len, -1, self.group_width)
        if self.parts.gate == "none":
            return groups.unflatten(-1, (-1, self.map_head_dim)), None
        queries, gate = groups.split(
            [groups.shape[-1] - self.ratio * self.width, self.ratio * self.width], -1
        )
        return queries.unflatten(-1, (-1, self.map_head_dim)), gate.unflatten(-1, (self.ratio, self.width))

    def lambda_full(self) -> torch.Tensor | float:
        return self.lambda_vectors(self.lambda_init)

    def noise_weight(self, hidden_states: torch.Tensor) -> torch.Tensor | float:
        if self.parts.lambda_mode == "scalar":
            return self.lambda_full()
        lambdas = self.lambda_proj(hidden_states)
        return torch.sigmoid(lambdas.to(torch.promote_types(lambdas.dtype, torch.float32)))

    def finish(self, out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        if self.subln is not None:
            out = self.subln(out, self.out_scale)
        elif self.out_scale != 1.0:
            out = out * self.out_scale
        if gate is not None:
            gate = gate.reshape(out.shape)
            out = out * torch.sigmoid(gate.to(torch.promote_types(gate.dtype, torch.float32))).to(out.dtype)
        return self.o_proj(out.flatten(-2))

    def reset_parameters(self) -> None:
        for module in self.children():
            if isinstance(module, (nn.Linear, LambdaVectors, RMSNorm)):
                module.reset_parameters()


# ---- difftransformer/layers/rotary.py --------------------------------------------------------------------
class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        config: PreTrainedConfig | None = None,
        *,
        dim: int | None = None,
        rope_parameters: dict | None = None,
        max_position_embeddings: int = 2048,
    ) -> None:
        super().__init__()
        if (config is None) == (dim is None):
            raise ValueError(
                "give RotaryEmbedding either config or dim (with rope_parameters, max_position_embeddings)"
            )
        if config is not None:
            dim = (
                getattr(config, "map_head_dim", None)
                or getattr(config, "head_dim", None)
                or config.hidden_size // config.num_attention_heads
            )
            rope_parameters, max_position_embeddings = config.rope_parameters, config.max_position_embeddings
        if dim % 2:
            raise ValueError(f"rotary dim must be even; got {dim}")
        parameters = {"rope_type": "default", "rope_theta": 10000.0, **(rope_parameters or {})}
        self.dim, self.rope_type, self.theta = dim, parameters["rope_type"], float(parameters["rope_theta"])
        if self.rope_type != "default" and self.rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(
                f"rope_parameters['rope_type'] must be 'default' or one of {sorted(ROPE_INIT_FUNCTIONS)}; "
                f"got {self.rope_type!r}"
            )
        if self.rope_type in ("llama3", "yarn", "longrope"):
            parameters.setdefault("original_max_position_embeddings", max_position_embeddings)
        self.config = PreTrainedConfig(
            head_dim=dim,
            hidden_size=dim,
            num_attention_heads=1,
            max_position_embeddings=max_position_embeddings,
            rope_parameters=dict(parameters),
        )
        self.max_seq_len_cached = self.original_max_seq_len = max_position_embeddings
        init = self.compute_default_rope_parameters
        if self.rope_type != "default":
            init = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = init(self.config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    @staticmethod
    def compute_default_rope_parameters(
        config: PreTrainedConfig, device: torch.device | None = None, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        dim, theta = config.head_dim, float(config.rope_parameters["rope_theta"])
        exponents = torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim
        return (1.0 / theta**exponents).float(), 1.0

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope_type == "default":
            compute_dtype = torch.promote_types(x.dtype, torch.float32)
            exponents = (
                torch.arange(0, self.dim, 2, device=position_ids.device, dtype=torch.float64) / self.dim
            )
            inv_freq = (1.0 / self.theta**exponents).to(compute_dtype)
            angles = position_ids.to(compute_dtype).unsqueeze(-1) * inv_freq
            return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return self._scaled(x, position_ids)

    @torch.no_grad()
    @dynamic_rope_update
    def _scaled(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        angles = position_ids.to(compute_dtype).unsqueeze(-1) * self.inv_freq.to(x.device, compute_dtype)
        cos, sin = angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


# ---- difftransformer/layers/split_heads.py ---------------------------------------------------------------
class SplitHeadAttention(PartsAttention):
    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx, config.head_dim)
        self.head_dim = config.head_dim
        self.reset_parameters()  # as earlier versions did: a seed gives the same initial weights

    def queries(self, queries: torch.Tensor) -> torch.Tensor:
        if self.ratio == 1:
            return queries.flatten(-2).transpose(1, 2)
        signal, noise = queries[..., :-1, :], queries[..., -1:, :]
        return torch.cat((signal, noise.expand_as(signal)), dim=-1).flatten(2, 3).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        output_component_maps: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...] | None]:
        batch, q_len, _ = hidden_states.shape
        cos, sin = position_embeddings
        queries, gate = self.query_groups(hidden_states)
        q = self.queries(queries)  # Q1 | Q2 per head
        k = self.k_proj(hidden_states).view(batch, q_len, -1, self.map_head_dim)
        k = apply_rotary(k, cos.unsqueeze(2), sin.unsqueeze(2), self.rope_style)
        k = k.view(batch, q_len, -1, self.head_dim).transpose(1, 2)  # K1 | K2 per KV head
        v = self.v_proj(hidden_states).view(batch, q_len, -1, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        elif kwargs.get("cache") is not None:  # continuous batching's paged cache
            k, v = kwargs["cache"].update(k, v, self.layer_idx, kwargs)

        if attention_mask is None and self.is_causal and 1 < q_len < k.shape[2]:
            k, v = k[:, :, :q_len], v[:, :, :q_len]
        weight = self.noise_weight(hidden_states)
        if isinstance(weight, torch.Tensor) and weight.dim():  # per token: (B, T, h) -> (B, h, T, 1)
            weight = weight.transpose(1, 2).unsqueeze(-1)
        rotary = QueryRotary(cos, sin, self.rope_style)
        causal = self.is_causal and attention_mask is None
        maps = None
        if output_attentions or output_component_maps or self.logits_hook is not None:
            hook = None if self.logits_hook is None else partial(self.logits_hook, self)
            out, maps = diff_attention_reference(
                rotate_queries(q, rotary), k, v, weight, causal=causal, attn_mask=attention_mask,
                logits_hook=hook, return_maps=output_attentions or output_component_maps,
            )  # fmt: skip
        else:
            out = diff_attention(
                q, k, v, weight, causal=causal, attn_mask=attention_mask, rotary=rotary,
                backend=self.config.attention_backend, implementation=self.config._attn_implementation,
            )  # fmt: skip
        out = self.finish(out.transpose(1, 2), gate)
        if output_component_maps:
            return out, maps
        return out, maps[0] if maps is not None else None


# ---- difftransformer/layers/whole_heads.py ---------------------------------------------------------------
def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    hook = None if module.logits_hook is None else partial(module.logits_hook, module)
    out, probs = softmax_attention_reference(
        query,
        key,
        value,
        causal=module.is_causal and attention_mask is None,
        attn_mask=attention_mask,
        scale=scaling,
        logits_hook=hook,
    )
    return out.transpose(1, 2), probs


class WholeHeadAttention(PartsAttention):
    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx, config.head_dim)
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.num_key_value_groups = config.query_heads // config.num_key_value_heads

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        implementation = "eager" if output_attentions else self.config._attn_implementation
        if implementation == "flex_attention" and self.sliding_window is not None and q.device.type == "cpu":
            raise ValueError(
                "attn_implementation 'flex_attention' cannot run a sliding-window layer on the CPU: torch 2.13's "
                "inductor fails to compile FlexAttention's windowed block mask there (CppCompileError); use "
                "'sdpa' or 'eager' on the CPU"
            )
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        return attention(
            self, q, k, v, attention_mask, scaling=self.scaling, dropout=0.0, sliding_window=self.sliding_window,
            **kwargs,
        )  # fmt: skip

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        output_component_maps: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...] | None]:
        batch, q_len, _ = hidden_states.shape
        queries, gate = self.query_groups(hidden_states)  # (B, T, n, G [+ 1], d)
        cos, sin = position_embeddings[0].unsqueeze(2), position_embeddings[1].unsqueeze(2)
        q = apply_rotary(queries.flatten(2, 3), cos, sin, self.rope_style).transpose(1, 2)
        k = self.k_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        k = apply_rotary(k, cos, sin, self.rope_style).transpose(1, 2)
        v = self.v_proj(hidden_states).view(batch, q_len, -1, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        maps = output_attentions or output_component_maps
        out, probs = self.attend(q, k, v, attention_mask, maps, **kwargs)  # (B, T, H_q, d), (B, H_q, T, S)
        if not self.parts.differential:
            return self.finish(out, gate), probs if maps else None
        weight = self.noise_weight(hidden_states)  # a scalar, or (B, T, h)
        if maps:
            groups = probs.unflatten(1, (-1, self.ratio + 1))  # (B, n, G + 1, T, S); n of this shard
            first, noise = groups[:, :, :-1], groups[:, :, -1:]
            if isinstance(weight, torch.Tensor) and weight.dim():
                weight = weight.transpose(1, 2).unflatten(1, (-1, self.ratio)).unsqueeze(-1).to(probs.dtype)
            combined = (first - weight * noise).flatten(1, 2)  # (B, h, T, S)
            query_head = torch.arange(first.shape[1] * self.ratio, device=q.device)
            query_head = query_head + query_head // self.ratio
            values = v.to(combined.dtype)[:, query_head // self.num_key_value_groups]
            out = (combined @ values).transpose(1, 2).to(q.dtype)  # (B, T, h, d)
            result = (combined, first.flatten(1, 2), noise.expand_as(first).flatten(1, 2))
        else:
            groups = out.unflatten(2, (-1, self.ratio + 1))  # (B, T, n, G + 1, d)
            first, noise = groups[:, :, :, :-1], groups[:, :, :, -1:]
            if isinstance(weight, torch.Tensor) and weight.dim():
                weight = weight.unflatten(2, (-1, self.ratio)).unsqueeze(-1)
            if isinstance(weight, torch.Tensor):
                weight = weight.to(out.dtype)
            out = (first - weight * noise).flatten(2, 3)  # (B, T, h, d)
        output = self.finish(out, gate)
        if not maps:
            return output, None
        return output, result if output_component_maps else result[0]


# ---- difftransformer/models/modeling.py ------------------------------------------------------------------
LAMBDA_KEYS = LAMBDA_RENAMINGS


LAYOUTS = {"split": SplitHeadAttention, "whole": WholeHeadAttention}


def lambda_renamings() -> list[WeightRenaming]:
    return [WeightRenaming(f"self_attn.{old}", f"self_attn.{new}") for old, new in LAMBDA_KEYS.items()]


register_checkpoint_conversion_mapping(
    DiffTransformerConfig.model_type,
    lambda_renamings(),
    overwrite=True,  # the remote-code copy of this module registers it again
)


class DiffTransformerDecoderLayer(GradientCheckpointingLayer):
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
        attn_out, attn_map = self.self_attn(
            self.input_layernorm(hidden_states), position_embeddings, **attention
        )
        hidden_states = hidden_states + attn_out
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)), attn_map


class DiffTransformerPreTrainedModel(PreTrainedModel):
    config: DiffTransformerConfig
    config_class = DiffTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DiffTransformerDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True

    def __init__(self, config: DiffTransformerConfig, *inputs, **kwargs) -> None:
        super().__init__(config, *inputs, **kwargs)
        self._keep_in_fp32_modules_strict = list(config.parts.keep_in_fp32)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        return strict_from_pretrained(super().from_pretrained, pretrained_model_name_or_path, *args, **kwargs)

    @property
    def _weight_conversions(self) -> list[WeightTransform]:
        return self.__dict__.get("_recorded_weight_conversions", []) + lambda_renamings()

    @_weight_conversions.setter
    def _weight_conversions(self, conversions: list[WeightTransform]) -> None:
        self.__dict__["_recorded_weight_conversions"] = list(conversions)

    def save_pretrained(
        self, save_directory: str | os.PathLike, *args, save_original_format: bool = False, **kwargs
    ) -> None:
        super().save_pretrained(save_directory, *args, save_original_format=save_original_format, **kwargs)

    def get_correct_attn_implementation(
        self, requested_attention: str | None, is_init_check: bool = False
    ) -> str:
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
        for key in [key for key in state_dict if key.startswith(prefix) and ".self_attn.lambda_" in key]:
            head, _, name = key.rpartition(".")
            if name in LAMBDA_KEYS:
                state_dict[f"{head}.{LAMBDA_KEYS[name]}"] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    if input_ids.is_cpu and input_ids.numel() and not torch.compiler.is_compiling():
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"input_ids must lie in [0, vocab_size={vocab_size}); got values in [{low}, {high}]"
            )


def check_mask_shape(
    attention_mask: torch.Tensor, batch_and_queries: torch.Size, cache: Cache | None, paged: bool
) -> None:
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
    if not output_attentions or config._attn_implementation == "eager":
        return config
    eager = copy.copy(config)
    eager._attn_implementation = "eager"
    return eager


class DiffTransformerModel(DiffTransformerPreTrainedModel):
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
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
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
        config = mask_config(self.config, output_attentions)
        if isinstance(attention_mask, torch.Tensor):
            check_mask_shape(attention_mask, inputs_embeds.shape[:2], past_key_values, paged)
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


# transformers copies this file along when a model loaded from it is saved again
DiffTransformerModel.register_for_auto_class("AutoModel")
DiffTransformerForCausalLM.register_for_auto_class("AutoModelForCausalLM")
