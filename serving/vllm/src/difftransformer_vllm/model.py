"""The package's attention kinds and every composition of their parts (the package's layers/parts.py) as vLLM models,
built from vLLM's own layers: DIFF V1, GDA, DIFF V2, gated attention, Motif's attention and the matched softmax
Transformer.

The kinds share everything but the attention (as in the package's transformers models): vLLM's parallel embedding,
fused QKV and MLP projections, RMSNorm, rotary embedding and paged ``Attention``. The configuration this plugin
carries (the package's, copied by ``make hub``) resolves a model's parts, and each map layout is one class of
:data:`LAYOUTS`, one call to vLLM's ``Attention`` over the layer's KV cache, with vLLM's own per-layer sliding window
on the layers the parts window (its window W counts the query and W - 1 earlier keys, as transformers' does):

- whole heads (the softmax baseline, gated attention, DIFF V2, Motif): the query heads of width d (a noise map's
  query head beside its G signal heads) on the baseline's KV heads; head s's output is out_s - lambda_s out_noise(s)
  with noise maps, lambda the layer's scalar or sigmoid(lambda_proj(x)_s) (lambda_proj fused into the same
  projection as q, k and v: one GEMM);
- split heads (DIFF V1, GDA): each signal map and each noise map as a query head of width 2d, ``Q1 | 0`` and
  ``0 | Q2``, on the layer's KV groups of width 2d, ``K1 | K2`` and the 2d-wide V, so ``(Q1 | 0) . (K1 | K2) =
  Q1 . K1`` and ``(0 | Q2) . (K1 | K2) = Q2 . K2`` at the scale 1/sqrt(d): the outputs are A1 V and A2 V, and head s
  is A1_s V - lambda_s A2_{s // G} V. A noise map is formed once for its G signal heads; the cache holds K1 | K2 and
  V as the package's models do; the queries' zero halves double the attention's multiply-adds.

Then, in both, the per-head norm and the 1 - lambda_init scale of the scalar lambda, the output gate (its rows of
q_proj, after each group's queries: sigmoid of them times each head's output) and the output projection.

Weights load from the folders the package writes, under their names there (the Llama-family lambda names of older
folders too). Every layer is tensor-parallel (columns of whole groups of heads, rows for the output projections);
:func:`check_servable` refuses what vLLM cannot run before any weight is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import PretrainedConfig
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
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
# The largest int8 weight whose products with u8 inputs (up to 255) pair-sum within int16: 2 x 255 x 64 < 2^15.
SATURATION_FREE = 64
# (weight name in the folder, the fused vLLM parameter it is a shard of, the shard): the MLP's; each attention
# layout lists its own (``stacked_weights``).
MLP_STACKED = ((".gate_proj", ".gate_up_proj", 0), (".up_proj", ".gate_up_proj", 1))


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
    quantization = getattr(config, "quantization_config", None)
    method = (quantization or {}).get("quant_method") if isinstance(quantization, dict) else quantization
    if quantization is not None and method != "compressed-tensors":
        raise ValueError(
            f"quantization_config quant_method={method!r} cannot be served; quantized folders are served in "
            "compressed-tensors' format (`difftransformer quantize --scheme w8a8`)"
        )
    kv_heads = config.num_key_value_heads
    if kv_heads % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} must divide num_key_value_heads={kv_heads}, so that each "
            "GPU holds whole KV heads (and, for DIFF, whole pairs of maps); use a divisor of it"
        )


def check_kv_cache(cache_dtype: str, config: PretrainedConfig) -> None:
    """Raise ValueError, one line, for a KV cache dtype vLLM's CPU attention cannot keep for this model: an fp8 cache
    (``kv_cache_dtype="fp8"``, keys and values stored as float8 at their scales) needs x86 with AVX-512 or AMX, and
    heads whose size is a multiple of 32 (vLLM's own rule, which it raises from inside every worker)."""
    if not cache_dtype.startswith("fp8") or not current_platform.is_cpu():
        return
    if not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
        raise ValueError(
            f"kv_cache_dtype={cache_dtype!r}: vLLM's fp8 KV cache needs AVX-512 or AMX on a CPU, which this one "
            "lacks; serve with the default kv_cache_dtype, or on such a CPU or a GPU"
        )
    if config.head_dim % 32:
        raise ValueError(
            f"kv_cache_dtype={cache_dtype!r} with head_dim = {config.head_dim}: vLLM's CPU attention keeps an fp8 "
            "cache for head sizes that are multiples of 32; serve with the default kv_cache_dtype"
        )


def int8_sums_saturate() -> bool:
    """Whether vLLM's int8 GEMM here can overflow: on a CPU without VNNI instructions (AVX-512 VNNI, AVX-VNNI or AMX)
    oneDNN sums each pair of u8 x s8 products (the inputs shifted to u8) in int16, which weights beyond
    :data:`SATURATION_FREE` can exceed."""
    if not current_platform.is_cpu():
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = {
                flag for line in cpuinfo if line.startswith("flags") for flag in line.split(":", 1)[1].split()
            }
    except OSError:
        return True
    return not flags & {"avx512_vnni", "avx_vnni", "amx_int8"}


def check_int8_range(folder: str) -> None:
    """Raise ValueError, one line, where the int8 weights of the quantized folder ``folder`` reach beyond
    :data:`SATURATION_FREE` on a machine whose int8 sums saturate (:func:`int8_sums_saturate`): vLLM would answer
    with overflowed sums."""
    if not os.path.isdir(folder) or not int8_sums_saturate():
        return
    largest, where = 0, ""
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            for name in weights.keys():
                tensor = weights.get_tensor(name)
                if tensor.dtype == torch.int8 and (top := int(tensor.abs().max())) > largest:
                    largest, where = top, name
    if largest > SATURATION_FREE:
        raise ValueError(
            f"int8 weights up to {largest} ({where}) overflow vLLM's int8 GEMM on this CPU, which lacks VNNI "
            f"(AVX-512 VNNI, AVX-VNNI or AMX) and sums exactly only weights within +-{SATURATION_FREE}; serve the "
            "folder on a CPU with VNNI or a GPU, or serve the full-precision folder"
        )


def platform_head_sizes() -> list[int] | None:
    """The head sizes the CPU attention backend takes; None elsewhere (the GPU backends check their own)."""
    if not current_platform.is_cpu():
        return None
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return CPUAttentionBackend.get_supported_head_sizes()


class LambdaVectors(nn.Module):
    """The scalar lambda's four vectors, float32 whatever the model's dtype, replicated on every GPU."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        for name in ("q1", "k1", "q2", "k2"):
            self.register_parameter(
                name, nn.Parameter(torch.empty(dim, dtype=torch.float32), requires_grad=False)
            )

    def forward(self, lambda_init: float) -> torch.Tensor:
        """exp(q1 . k1) - exp(q2 . k2) + lambda_init, in float32."""
        return torch.exp(torch.dot(self.q1, self.k1)) - torch.exp(torch.dot(self.q2, self.k2)) + lambda_init


class PartsAttention(nn.Module):
    """What both layouts build from the parts: the fused projection of q_proj (per noise map, or per head without
    noise maps: the group's G signal query blocks, its noise query block, then its G gate blocks), k_proj, v_proj and,
    with the per-token lambda, lambda_proj; the rotary embedding; vLLM's ``Attention`` (the layer's window where the
    parts window it); the noise map's weight, the per-head norm, the gate and the output projection. Head counts
    are the GPU's share under tensor parallelism."""

    def __init__(self, config: PretrainedConfig, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        parts, layer = config.parts, extract_layer_index(prefix)
        self.d, self.width = config.map_head_dim, config.head_dim  # a map's query width; a head's value width
        self.ratio = parts.noise_ratio or 1
        self.differential = parts.differential
        self.heads = config.num_attention_heads // tp_size
        self.groups = self.heads // self.ratio
        self.blocks = self.ratio + (1 if self.differential else 0)  # a group's query blocks
        self.gate = self.ratio * self.width if parts.gate == "elementwise" else 0  # a group's gate rows
        self.kv_size = config.num_key_value_heads * config.head_dim // tp_size
        self.q_size = self.groups * (self.blocks * self.d + self.gate)
        self.token_lambda = parts.lambda_mode == "token"
        quant_config = vllm_config.quant_config
        # vLLM quantizes every shard of a fused layer alike, so a quantized folder's lambda_proj, which stays in full
        # precision (docs/quantization.md), is a layer of its own; otherwise it is fused with q/k/v
        self.own_lambda = self.token_lambda and quant_config is not None
        self.fused_lambda = self.token_lambda and not self.own_lambda
        fused_lambda = [config.num_attention_heads] if self.fused_lambda else []
        self.qkv_proj = MergedColumnParallelLinear(
            config.hidden_size,
            [self.q_size * tp_size, self.kv_size * tp_size, self.kv_size * tp_size] + fused_lambda,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        if self.own_lambda:
            self.lambda_proj = ColumnParallelLinear(
                config.hidden_size, config.num_attention_heads, bias=False, prefix=f"{prefix}.lambda_proj"
            )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * config.head_dim,
            config.hidden_size,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.rotary_emb = get_rope(
            self.d,
            max_position=config.max_position_embeddings,
            is_neox_style=config.rope_style == "half",
            rope_parameters=config.rope_parameters,
        )
        self.attn = Attention(
            self.groups * self.blocks,
            self.width,
            self.d**-0.5,
            num_kv_heads=config.num_key_value_heads // tp_size,
            cache_config=vllm_config.cache_config,
            quant_config=vllm_config.quant_config,
            per_layer_sliding_window=config.sliding_window if parts.windowed(layer) else None,
            prefix=f"{prefix}.attn",
        )
        self.lambda_init = config.layer_lambda_init(layer)
        if parts.lambda_mode == "scalar":
            self.lambda_vectors = LambdaVectors(self.d)
        self.out_scale = 1.0 - self.lambda_init if parts.lambda_mode == "scalar" else 1.0
        self.subln = (
            None
            if parts.norm == "none"
            else RMSNorm(self.width, eps=config.subln_eps, has_weight=parts.norm == "affine")
        )

    @property
    def stacked_weights(self) -> tuple[tuple[str, str, int], ...]:
        """(folder name, fused parameter, shard) of the fused projection."""
        shards = [(".q_proj", ".qkv_proj", 0), (".k_proj", ".qkv_proj", 1), (".v_proj", ".qkv_proj", 2)]
        return tuple(shards + ([(".lambda_proj", ".qkv_proj", 3)] if self.fused_lambda else []))

    def project(self, positions: torch.Tensor, hidden_states: torch.Tensor):
        """The rotated queries (T, n blocks d), k (T, kv) rotated, v, the gate (T, n, G, width) or None and the
        per-token lambda's logits (T, h) or None."""
        projected, _ = self.qkv_proj(hidden_states)
        q, k, v, *lambdas = projected.split(
            [self.q_size, self.kv_size, self.kv_size] + ([self.heads] if self.fused_lambda else []), dim=-1
        )
        if self.own_lambda:
            lambdas = [self.lambda_proj(hidden_states)[0]]
        groups = q.view(-1, self.groups, self.blocks * self.d + self.gate)
        queries, gate = groups.split([self.blocks * self.d, self.gate], dim=-1)
        rotated = self.rotary_emb(positions, queries.reshape(-1, self.groups * self.blocks * self.d), k)
        gate = gate.unflatten(-1, (self.ratio, self.width)) if self.gate else None
        return *rotated, v, gate, (lambdas[0] if lambdas else None)

    def noise_weight(self, lambdas: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """The scalar lambda, or sigmoid(lambda_proj(x)) as (T, n, G, 1), in ``dtype``."""
        if lambdas is None:
            return self.lambda_vectors(self.lambda_init).to(dtype)
        return torch.sigmoid(lambdas.float()).to(dtype).view(-1, self.groups, self.ratio, 1)

    def finish(self, out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """Heads' outputs (T, n, G, width) -> (T, d_model): the norm and scale, the gate, o_proj."""
        out = out.reshape(-1, self.width)
        if self.subln is not None:
            out = self.subln(out)
        if self.out_scale != 1.0:
            out = out * self.out_scale
        out = out.view(-1, self.groups, self.ratio, self.width)
        if gate is not None:
            out = out * torch.sigmoid(gate.float()).to(out.dtype)
        output, _ = self.o_proj(out.flatten(1))
        return output


class WholeHeadAttention(PartsAttention):
    """The whole-head layout: the query heads (a group's G signal heads then its noise head) of width d on the
    baseline's KV heads; each signal head's output minus lambda times its noise head's."""

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states (T, d_model) at ``positions`` (T,) -> (T, d_model)."""
        q, k, v, gate, lambdas = self.project(positions, hidden_states)
        heads = self.attn(q, k, v).view(-1, self.groups, self.blocks, self.width)
        if not self.differential:
            return self.finish(heads, gate)
        signal, noise = heads[:, :, : self.ratio], heads[:, :, self.ratio :]
        return self.finish(signal - self.noise_weight(lambdas, heads.dtype) * noise, gate)


class SplitHeadAttention(PartsAttention):
    """The split-head layout: n = h / G groups of G signal maps and one noise map, each map a query head of width 2d
    (the module docstring), in q_proj's order, which keeps every KV group's queries together as vLLM's GQA reads
    them; the KV cache holds each group's K1 | K2 and 2d-wide V."""

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        q, k, v, gate, lambdas = self.project(positions, hidden_states)
        groups = q.view(-1, self.groups, self.ratio + 1, self.d)
        zeros = torch.zeros_like(groups)
        signal = torch.cat((groups[:, :, :-1], zeros[:, :, :-1]), dim=-1)  # Q1 | 0
        noise = torch.cat((zeros[:, :, -1:], groups[:, :, -1:]), dim=-1)  # 0 | Q2
        padded = torch.cat((signal, noise), dim=2)  # (T, n, G + 1, 2d)
        maps = self.attn(padded.flatten(1), k, v).view(-1, self.groups, self.ratio + 1, self.width)
        weight = self.noise_weight(lambdas, maps.dtype)
        return self.finish(maps[:, :, :-1] - weight * maps[:, :, -1:], gate)  # A1 V - lambda A2 V


# The vLLM attention of each map layout, by the name the configuration resolves (``config.map_layout``).
LAYOUTS: dict[str, type[PartsAttention]] = {"whole": WholeHeadAttention, "split": SplitHeadAttention}


class DiffTransformerDecoderLayer(nn.Module):
    """Pre-RMSNorm block: y = x + attn(norm(x)); out = y + mlp(norm(y)), with vLLM's fused residual adds."""

    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.self_attn = LAYOUTS[config.map_layout](config, vllm_config, prefix=f"{prefix}.self_attn")
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
        """Load a folder's tensors by name: the attention's projections (q/k/v, and the per-token lambda's
        lambda_proj) and the MLP's gate/up into their fused parameters, the parts' Llama-family names renamed (their
        ``renamings``), the rest one to one."""
        params = dict(self.named_parameters())
        renamings = {
            f"self_attn.{old}": f"self_attn.{new}" for old, new in self.config.parts.renamings.items()
        }
        stacked = (*self.model.layers[self.model.start_layer].self_attn.stacked_weights, *MLP_STACKED)
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
