"""DIFF V1, DIFF V2 and the matched softmax Transformer as vLLM models, built from vLLM's own layers.

The three kinds share everything but the attention (as in the package's transformers models): vLLM's parallel
embedding, fused QKV and MLP projections, RMSNorm, rotary embedding and paged ``Attention``. Each attention is one
call to vLLM's ``Attention`` over the layer's KV cache:

- the softmax baseline: h heads of width d on h_kv KV heads, as Llama;
- DIFF V2: 2h query heads of width d on the baseline's h_kv KV heads, then head i = out_{2i} - sigmoid(lambda_i(x))
  out_{2i+1};
- DIFF V1: each differential head's two maps as two query heads of width 2d, ``Q1 | 0`` and ``0 | Q2``, on the
  layer's h_kv KV heads of width 2d, ``K1 | K2`` and the 2d-wide V, so ``(Q1 | 0) . (K1 | K2) = Q1 . K1`` and
  ``(0 | Q2) . (K1 | K2) = Q2 . K2`` at the scale 1/sqrt(d): the two outputs are A1 V and A2 V, combined as
  A1 V - lambda A2 V, normalised per head and scaled by 1 - lambda_init. The cache holds K1 | K2 and V as the package's
  models do (the matched baseline's bytes); the queries' zero halves double the attention's multiply-adds.

Weights load from the folders the package writes, under their names there (the Llama-family lambda names of older
folders too). Every layer is tensor-parallel (columns of whole heads, rows for the output projections);
:func:`check_servable` refuses what vLLM cannot run before any weight is read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaMLP
from vllm.model_executor.models.utils import extract_layer_index, make_layers, maybe_prefix
from vllm.platforms import current_platform

# Llama-family names of DIFF V1's lambda vectors (the paper's code, DiffLlama, older folders) -> the package's.
LAMBDA_NAMES = {
    f"self_attn.lambda_{name}": f"self_attn.lambda_vectors.{name}" for name in ("q1", "k1", "q2", "k2")
}
# The RoPE types vLLM computes as transformers does for every position (docs/serving.md): "dynamic" is left out,
# because vLLM scales its base from the first position where transformers scales only past the trained length.
ROPE_TYPES = ("default", "linear", "yarn", "longrope", "llama3")
# (weight name in the folder, the fused vLLM parameter it is a shard of, the shard)
STACKED = (
    (".q_proj", ".qkv_proj", "q"),
    (".k_proj", ".qkv_proj", "k"),
    (".v_proj", ".qkv_proj", "v"),
    (".gate_proj", ".gate_up_proj", 0),
    (".up_proj", ".gate_up_proj", 1),
)


def attention_head_sizes(config: PretrainedConfig) -> tuple[int, int]:
    """(the width vLLM's attention runs at, the width its queries and keys are rotated at): DIFF V1 2d and d, the
    others d and d."""
    if config.attention == "diff":
        return 2 * config.map_head_dim, config.map_head_dim
    return config.head_dim, config.head_dim


def check_servable(
    config: PretrainedConfig,
    tensor_parallel_size: int,
    max_model_len: int,
    supported_head_sizes: list[int] | None,
) -> None:
    """Raise ValueError, one line naming the setting and what would work, for a model vLLM cannot run as the
    package's transformers model computes it."""
    if config.model_type != "difftransformer":
        raise ValueError(f"model_type must be 'difftransformer'; got {config.model_type!r}")
    if not config.causal:
        raise ValueError(
            "causal=False (an encoder) cannot be served: vLLM's decoder attention is causal; use the transformers "
            "model (AutoModel) for bidirectional attention"
        )
    rope_type = (config.rope_parameters or {}).get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"rope_parameters['rope_type']={rope_type!r} cannot be served exactly (vLLM applies it from the first "
            f"position); these can: {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "longrope" and config.rope_style != "half":
        raise ValueError(
            "rope_parameters['rope_type']='longrope' with rope_style='interleaved' cannot be served: vLLM computes "
            "longrope with the half pairing only; convert the folder with rope_style='half'"
        )
    original = (config.rope_parameters or {}).get("original_max_position_embeddings")
    if rope_type == "longrope" and original is not None and max_model_len > original:
        raise ValueError(
            f"rope_parameters['rope_type']='longrope' with max_model_len={max_model_len}: vLLM then takes the long "
            "factors at every position, where transformers takes the short ones up to "
            f"original_max_position_embeddings; serve with --max-model-len {original} (or less) to match"
        )
    attention_width, _ = attention_head_sizes(config)
    if supported_head_sizes is not None and attention_width not in supported_head_sizes:
        what = "2 * map_head_dim (a DIFF V1 head's width)" if config.attention == "diff" else "head_dim"
        raise ValueError(
            f"{what} = {attention_width} is not a head size this platform's vLLM attention takes; it takes "
            f"{supported_head_sizes}: choose hidden_size / num_attention_heads to match"
        )
    kv_heads = config.num_key_value_heads
    if kv_heads % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} must divide num_key_value_heads={kv_heads}, so that each "
            "GPU holds whole KV heads (and, for DIFF, whole pairs of maps); use a divisor of it"
        )


def platform_head_sizes() -> list[int] | None:
    """The head sizes the CPU attention backend takes; None elsewhere (the GPU backends check their own)."""
    if not current_platform.is_cpu():
        return None
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return CPUAttentionBackend.get_supported_head_sizes()


class LambdaVectors(nn.Module):
    """DIFF V1's four lambda vectors, float32 whatever the model's dtype, replicated on every GPU."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        for name in ("q1", "k1", "q2", "k2"):
            self.register_parameter(
                name, nn.Parameter(torch.empty(dim, dtype=torch.float32), requires_grad=False)
            )

    def forward(self, lambda_init: float) -> torch.Tensor:
        """exp(q1 . k1) - exp(q2 . k2) + lambda_init, in float32."""
        return torch.exp(torch.dot(self.q1, self.k1)) - torch.exp(torch.dot(self.q2, self.k2)) + lambda_init


class DiffTransformerAttention(nn.Module):
    """One layer's attention of any of the three kinds (see the module docstring)."""

    def __init__(self, config: PretrainedConfig, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        self.kind = config.attention
        layer_idx = extract_layer_index(prefix)
        tp_size = get_tensor_model_parallel_world_size()
        self.width, rotated = attention_head_sizes(config)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.heads, self.kv_heads = heads // tp_size, kv_heads // tp_size
        # The projections in the width of the rotated (sub-)heads: DIFF V1's q and k hold 2h and 2h_kv of them, its v
        # h_kv heads of 2d = 2h_kv columns of d; DIFF V2's q 2h heads.
        q_heads = 2 * heads if self.kind in ("diff", "diff_v2") else heads
        k_heads = 2 * kv_heads if self.kind == "diff" else kv_heads
        self.q_size, self.kv_size = q_heads * rotated // tp_size, k_heads * rotated // tp_size
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, rotated, q_heads, k_heads, bias=False, prefix=f"{prefix}.qkv_proj"
        )
        self.o_proj = RowParallelLinear(
            heads * config.head_dim, config.hidden_size, bias=False, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = get_rope(
            rotated,
            max_position=config.max_position_embeddings,
            is_neox_style=config.rope_style == "half",
            rope_parameters=config.rope_parameters,
        )
        attention_heads = 2 * self.heads if self.kind in ("diff", "diff_v2") else self.heads
        self.attn = Attention(
            attention_heads,
            self.width,
            rotated**-0.5,
            num_kv_heads=self.kv_heads,
            cache_config=vllm_config.cache_config,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.attn",
        )
        if self.kind == "diff_v2":
            self.lambda_proj = ColumnParallelLinear(
                config.hidden_size, heads, bias=False, prefix=f"{prefix}.lambda_proj"
            )
        if self.kind == "diff":
            init = config.lambda_init
            self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer_idx) if init == "depth" else float(init)
            self.lambda_vectors = LambdaVectors(config.map_head_dim)
            self.subln = (
                None
                if config.subln == "none"
                else RMSNorm(self.width, eps=config.subln_eps, has_weight=config.subln == "affine")
            )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states (T, d_model) at ``positions`` (T,) -> (T, d_model)."""
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        tokens = q.shape[0]
        if self.kind == "softmax":
            out = self.attn(q, k, v)
        elif self.kind == "diff_v2":
            pairs = self.attn(q, k, v).view(tokens, self.heads, 2, self.width)
            lambdas, _ = self.lambda_proj(hidden_states)
            gate = torch.sigmoid(lambdas.float()).to(pairs.dtype).unsqueeze(-1)
            out = (pairs[:, :, 0] - gate * pairs[:, :, 1]).reshape(tokens, -1)
        else:
            out = self.diff_attention(q, k, v, tokens)
        output, _ = self.o_proj(out)
        return output

    def diff_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tokens: int) -> torch.Tensor:
        """DIFF V1: both maps of every head in one attention call, then (A1 - lambda A2) V through the norm."""
        halves = q.view(tokens, self.heads, 2, self.width // 2)
        zeros = torch.zeros_like(halves[:, :, 0])
        padded = torch.stack(
            (torch.cat((halves[:, :, 0], zeros), dim=-1), torch.cat((zeros, halves[:, :, 1]), dim=-1)), dim=2
        )  # (T, h, 2, 2d): Q1 | 0 and 0 | Q2
        maps = self.attn(padded.reshape(tokens, -1), k, v).view(tokens, self.heads, 2, self.width)
        lambda_full = self.lambda_vectors(self.lambda_init).to(maps.dtype)
        out = maps[:, :, 0] - lambda_full * maps[:, :, 1]  # (T, h, 2d)
        scale = 1.0 - self.lambda_init
        if self.subln is None:
            return (out * scale).reshape(tokens, -1)
        return (self.subln(out.reshape(-1, self.width)) * scale).reshape(tokens, -1)


class DiffTransformerDecoderLayer(nn.Module):
    """Pre-RMSNorm block: y = x + attn(norm(x)); out = y + mlp(norm(y)), with vLLM's fused residual adds."""

    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.self_attn = DiffTransformerAttention(config, vllm_config, prefix=f"{prefix}.self_attn")
        self.mlp = LlamaMLP(
            config.hidden_size,
            config.intermediate_size,
            hidden_act="silu",
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.mlp",
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class DiffTransformerModel(nn.Module):
    """Embeddings, decoder layers and the final norm."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda prefix: DiffTransformerDecoderLayer(vllm_config, prefix),
            prefix=f"{prefix}.layers",
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer in self.layers[self.start_layer : self.end_layer]:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class DiffTransformerForCausalLM(nn.Module):
    """The language model vLLM serves for ``architectures: ["DiffTransformerForCausalLM"]`` (the folders the
    package writes)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        check_servable(
            config,
            vllm_config.parallel_config.tensor_parallel_size,
            vllm_config.model_config.max_model_len,
            platform_head_sizes(),
        )
        self.config = config
        self.model = DiffTransformerModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(
            config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head")
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: object | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load a folder's tensors by name: q/k/v and gate/up into their fused parameters, the rest one to one."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            for old, new in LAMBDA_NAMES.items():
                name = name.replace(old, new)
            if self.config.tie_word_embeddings and name.startswith("lm_head."):
                continue
            for shard_name, fused_name, shard in STACKED:
                if shard_name in name:
                    name = name.replace(shard_name, fused_name)
                    params[name].weight_loader(params[name], tensor, shard)
                    break
            else:
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded
