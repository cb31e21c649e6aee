"""The package's attention kinds as vLLM models, built from vLLM's own layers: DIFF V1, GDA, DIFF V2, gated
attention and the matched softmax Transformer.

The kinds share everything but the attention (as in the package's transformers models): vLLM's parallel embedding,
fused QKV and MLP projections, RMSNorm, rotary embedding and paged ``Attention``. Each kind's declaration (the
package's layers/kinds.py, copied here as the configuration's ``KIND_FACTS`` by ``make hub``) names its attention
in :data:`ATTENTIONS`, and each is one call to vLLM's ``Attention`` over the layer's KV cache:

- softmax: h heads of width d on h_kv KV heads, as Llama;
- DIFF V2: 2h query heads of width d on the baseline's h_kv KV heads, lambda_proj fused into the same projection,
  then head i = out_{2i} - sigmoid(lambda_i(x)) out_{2i+1};
- gated attention: q_proj's query and gate rows in the fused projection, h heads of width d, then each head's
  output times sigmoid(gate);
- DIFF V1 and GDA (the differential heads): each first (signal) map and each second (noise) map as a query head of
  width 2d, ``Q1 | 0`` and ``0 | Q2``, on the layer's KV groups of width 2d, ``K1 | K2`` and the 2d-wide V, so
  ``(Q1 | 0) . (K1 | K2) = Q1 . K1`` and ``(0 | Q2) . (K1 | K2) = Q2 . K2`` at the scale 1/sqrt(d): the outputs are
  A1 V and A2 V, and head s is A1_s V - lambda A2_{s // G} V (G = gda_ratio, 1 for DIFF V1), normalised per head and
  scaled by 1 - lambda_init. GDA's noise maps are formed once each for their G signal heads. The cache holds
  K1 | K2 and V as the package's models do; the queries' zero halves double the attention's multiply-adds.

Weights load from the folders the package writes, under their names there (the Llama-family lambda names of older
folders too). Every layer is tensor-parallel (columns of whole heads, rows for the output projections);
:func:`check_servable` refuses what vLLM cannot run before any weight is read.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaMLP
from vllm.model_executor.models.utils import extract_layer_index, make_layers, maybe_prefix
from vllm.platforms import current_platform

# The RoPE types vLLM computes as transformers does for every position (docs/serving.md): "dynamic" is left out,
# because vLLM scales its base from the first position where transformers scales only past the trained length.
ROPE_TYPES = ("default", "linear", "yarn", "longrope", "llama3")
# (weight name in the folder, the fused vLLM parameter it is a shard of, the shard): the MLP's; each attention
# class lists its own (``stacked``).
MLP_STACKED = ((".gate_proj", ".gate_up_proj", 0), (".up_proj", ".gate_up_proj", 1))
QKV_STACKED = ((".q_proj", ".qkv_proj", "q"), (".k_proj", ".qkv_proj", "k"), (".v_proj", ".qkv_proj", "v"))


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
    if supported_head_sizes is not None and config.head_dim not in supported_head_sizes:
        what = "head_dim (2 * map_head_dim for DIFF V1 and GDA)" if config.differential_heads else "head_dim"
        raise ValueError(
            f"{what} = {config.head_dim} is not a head size this platform's vLLM attention takes; it takes "
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


class KindAttention(nn.Module):
    """What every kind's attention holds: the fused projection of its queries (``query_heads`` of width d a head:
    a kind's extra rows, the gate, count as heads), keys and values, the rotary embedding, vLLM's ``Attention``
    over ``attention_heads`` heads of ``config.head_dim`` and the output projection. Head counts are the GPU's
    share under tensor parallelism."""

    stacked = QKV_STACKED
    query_heads_per_head = 1  # q_proj's d-wide row blocks per head
    attention_heads_per_head = 1  # query heads of the attention call per head

    def __init__(self, config: PretrainedConfig, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.width, self.rotated = config.head_dim, config.map_head_dim
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.heads, self.kv_heads = heads // tp_size, kv_heads // tp_size
        self.q_size = self.query_rows(config) * self.rotated // tp_size
        self.kv_size = self.key_rows(config) * self.rotated // tp_size
        self.qkv_proj = self.projection(config, prefix)
        self.o_proj = RowParallelLinear(
            heads * config.head_dim, config.hidden_size, bias=False, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = get_rope(
            self.rotated,
            max_position=config.max_position_embeddings,
            is_neox_style=config.rope_style == "half",
            rope_parameters=config.rope_parameters,
        )
        self.attn = Attention(
            self.attention_heads(config) // tp_size,
            self.width,
            self.rotated**-0.5,
            num_kv_heads=self.kv_heads,
            cache_config=vllm_config.cache_config,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.attn",
        )

    def query_rows(self, config: PretrainedConfig) -> int:
        """q_proj's rows in d-wide blocks."""
        return self.query_heads_per_head * config.num_attention_heads

    def key_rows(self, config: PretrainedConfig) -> int:
        """k_proj's (and v_proj's) rows in d-wide blocks."""
        return config.num_key_value_heads

    def attention_heads(self, config: PretrainedConfig) -> int:
        """The attention call's query heads."""
        return self.attention_heads_per_head * config.num_attention_heads

    def projection(self, config: PretrainedConfig, prefix: str) -> nn.Module:
        return QKVParallelLinear(
            config.hidden_size,
            self.rotated,
            self.query_rows(config),
            self.key_rows(config),
            bias=False,
            prefix=f"{prefix}.qkv_proj",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states (T, d_model) at ``positions`` (T,) -> (T, d_model)."""
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        output, _ = self.o_proj(self.attn(q, k, v))
        return output


class SoftmaxAttention(KindAttention):
    """The matched baseline: h heads of width d on h_kv KV heads, as Llama."""


class PairedAttention(KindAttention):
    """DIFF V2: 2h query heads, each pair's output combined with the per-token sigmoid(lambda_proj(x)). lambda_proj's
    h rows are the fused projection's fourth part: one GEMM for q, k, v and lambda."""

    stacked = ((".q_proj", ".qkv_proj", 0), (".k_proj", ".qkv_proj", 1), (".v_proj", ".qkv_proj", 2),
               (".lambda_proj", ".qkv_proj", 3))  # fmt: skip
    query_heads_per_head = attention_heads_per_head = 2

    def projection(self, config: PretrainedConfig, prefix: str) -> nn.Module:
        d = self.rotated
        sizes = [self.query_rows(config) * d, config.num_key_value_heads * d, config.num_key_value_heads * d]
        return MergedColumnParallelLinear(
            config.hidden_size, [*sizes, config.num_attention_heads], bias=False, prefix=f"{prefix}.qkv_proj"
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        projected, _ = self.qkv_proj(hidden_states)
        q, k, v, lambdas = projected.split([self.q_size, self.kv_size, self.kv_size, self.heads], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        pairs = self.attn(q, k, v).view(-1, self.heads, 2, self.width)
        gate = torch.sigmoid(lambdas.float()).to(pairs.dtype).unsqueeze(-1)
        out = torch.addcmul(pairs[:, :, 0], gate, pairs[:, :, 1], value=-1.0)  # first - gate * second
        output, _ = self.o_proj(out.flatten(1))
        return output


class GatedAttention(KindAttention):
    """Gated attention: q_proj's query and gate rows head by head, the attention over the queries, each head's
    output times sigmoid(gate)."""

    query_heads_per_head = 2

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        query, gate = q.view(-1, self.heads, 2, self.rotated).unbind(2)
        query, k = self.rotary_emb(positions, query.reshape(-1, self.heads * self.rotated), k)
        out = self.attn(query, k, v) * torch.sigmoid(gate.float()).to(v.dtype).flatten(1)
        output, _ = self.o_proj(out)
        return output


class LambdaVectors(nn.Module):
    """DIFF V1's and GDA's four lambda vectors, float32 whatever the model's dtype, replicated on every GPU."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        for name in ("q1", "k1", "q2", "k2"):
            self.register_parameter(
                name, nn.Parameter(torch.empty(dim, dtype=torch.float32), requires_grad=False)
            )

    def forward(self, lambda_init: float) -> torch.Tensor:
        """exp(q1 . k1) - exp(q2 . k2) + lambda_init, in float32."""
        return torch.exp(torch.dot(self.q1, self.k1)) - torch.exp(torch.dot(self.q2, self.k2)) + lambda_init


class DifferentialAttention(KindAttention):
    """DIFF V1 and GDA: n = h / G groups of G signal heads and one noise map (G = gda_ratio; DIFF V1's G = 1), each
    map a query head of width 2d (the module docstring), in q_proj's order, which keeps every KV group's queries
    together as vLLM's GQA reads them; the KV cache holds each group's K1 | K2 and 2d-wide V."""

    def __init__(self, config: PretrainedConfig, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__(config, vllm_config, prefix)
        self.ratio = config.gda_ratio
        self.groups = self.heads // self.ratio
        self.lambda_init = config.layer_lambda_init(extract_layer_index(prefix))
        self.lambda_vectors = LambdaVectors(config.map_head_dim)
        self.subln = (
            None
            if config.subln == "none"
            else RMSNorm(self.width, eps=config.subln_eps, has_weight=config.subln == "affine")
        )

    def query_rows(self, config: PretrainedConfig) -> int:
        return config.num_attention_heads + config.noise_heads

    def key_rows(self, config: PretrainedConfig) -> int:
        return 2 * config.num_key_value_heads  # K1 | K2 a group; V as wide

    def attention_heads(self, config: PretrainedConfig) -> int:
        return self.query_rows(config)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        groups = q.view(-1, self.groups, self.ratio + 1, self.rotated)
        zeros = torch.zeros_like(groups)
        signal = torch.cat((groups[:, :, :-1], zeros[:, :, :-1]), dim=-1)  # Q1 | 0
        noise = torch.cat((zeros[:, :, -1:], groups[:, :, -1:]), dim=-1)  # 0 | Q2
        padded = torch.cat((signal, noise), dim=2)  # (T, n, G + 1, 2d)
        maps = self.attn(padded.flatten(1), k, v).view(-1, self.groups, self.ratio + 1, self.width)
        lambda_full = self.lambda_vectors(self.lambda_init).to(maps.dtype)
        out = (maps[:, :, :-1] - lambda_full * maps[:, :, -1:]).reshape(-1, self.width)  # A1 V - lambda A2 V
        scale = 1.0 - self.lambda_init
        out = out * scale if self.subln is None else self.subln(out) * scale
        output, _ = self.o_proj(out.view(hidden_states.shape[0], -1))
        return output


# The vLLM attention of each kind, by the name its declaration gives (``config.kind_facts()["serving"]``).
ATTENTIONS: dict[str, type[KindAttention]] = {
    "softmax": SoftmaxAttention,
    "diff_v2": PairedAttention,
    "gated": GatedAttention,
    "differential": DifferentialAttention,
}


class DiffTransformerDecoderLayer(nn.Module):
    """Pre-RMSNorm block: y = x + attn(norm(x)); out = y + mlp(norm(y)), with vLLM's fused residual adds."""

    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        attention = ATTENTIONS[config.kind_facts()["serving"]]
        self.self_attn = attention(config, vllm_config, prefix=f"{prefix}.self_attn")
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
        """Load a folder's tensors by name: the attention's projections (q/k/v, and DIFF V2's lambda_proj) and the
        MLP's gate/up into their fused parameters, the kind's Llama-family names renamed (its declaration's
        ``renamings``), the rest one to one."""
        params = dict(self.named_parameters())
        renamings = {
            f"self_attn.{old}": f"self_attn.{new}"
            for old, new in self.config.kind_facts()["renamings"].items()
        }
        stacked = (*ATTENTIONS[self.config.kind_facts()["serving"]].stacked, *MLP_STACKED)
        loaded = set()
        for name, tensor in weights:
            for old, new in renamings.items():
                name = name.replace(old, new)
            if self.config.tie_word_embeddings and name.startswith("lm_head."):
                continue
            for shard_name, fused_name, shard in stacked:
                if shard_name in name:
                    name = name.replace(shard_name, fused_name)
                    params[name].weight_loader(params[name], tensor, shard)
                    break
            else:
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded
