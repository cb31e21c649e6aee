"""The attention kinds, each declared once: its layer, its parameter-matching rule against the matched softmax
baseline, and the facts every other place reads (the configuration, the models, compare's labels, the presets, the
vLLM plugin).

A kind is one :class:`AttentionKind` in :data:`KINDS`. The configuration reads :data:`KIND_FACTS`, the plain-data
part of the declarations, which the configuration files a saved folder and the vLLM plugin carry hold as a literal
(models/remote_code.py writes them; a test checks both against the sources).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from torch import nn
from transformers import PreTrainedConfig

from difftransformer.layers.diff_attention import DiffAttention
from difftransformer.layers.diff_attention_v2 import DiffAttentionV2
from difftransformer.layers.gated_attention import GatedAttention
from difftransformer.layers.grouped_diff_attention import GroupedDiffAttention
from difftransformer.layers.softmax_attention import SoftmaxAttention

# DIFF V1's and GDA's lambda vectors: the Llama-family names of the paper's code and DiffLlama -> ours (self_attn.).
LAMBDA_RENAMINGS = {f"lambda_{name}": f"lambda_vectors.{name}" for name in ("q1", "k1", "q2", "k2")}


@dataclass(frozen=True)
class AttentionKind:
    """One attention kind.

    Args:
        name: ``config.attention``.
        label: its name in reports and tables.
        layer: the attention module, built as ``layer(config, layer_idx)``.
        match: the parameter-matching rule: ``match(baseline, **fields)`` is this kind's configuration for the
            matched softmax ``baseline`` (every field but the attention's kept), with this kind's own ``fields``.
        matching: that rule in words, with the parameters it adds over the baseline.
        differential_heads: heads of two maps over a 2d-wide value, normalised per head (DIFF V1, GDA): the cache
            holds 2d-wide entries and the fields ``map_dim``, ``subln``, ``lambda_init``, ``lambda_std`` and
            ``attention_backend`` apply.
        fields: configuration fields of this kind alone (any other kind keeps their defaults).
        tp_plan: tensor-parallel entries beside the baseline's (keys under the base model, as ``base_model_tp_plan``).
        keep_in_fp32: submodules kept in float32 whatever the model's dtype (``_keep_in_fp32_modules_strict``).
        renamings: parameter names under ``self_attn.`` in the Llama-family checkpoints of this kind -> ours.
        serving: the vLLM plugin's attention for it (serving/vllm: ``ATTENTIONS``).
        maps: what ``output_attentions`` returns: "softmax" (one map a head), "lambda" (A1 - lambda A2, lambda a
            scalar) or "gate" (A_2i - sigmoid(lambda_i(x)) A_2i+1, per token).
    """

    name: str
    label: str
    layer: type[nn.Module]
    match: Callable[..., PreTrainedConfig]
    matching: str
    differential_heads: bool = False
    fields: tuple[str, ...] = ()
    tp_plan: Mapping[str, str] = field(default_factory=dict)
    keep_in_fp32: tuple[str, ...] = ()
    renamings: Mapping[str, str] = field(default_factory=dict)
    serving: str = "softmax"
    maps: str = "softmax"

    def facts(self) -> dict:
        """The declaration's plain data (no classes or functions), as the configuration reads it."""
        return dict(
            label=self.label,
            differential_heads=self.differential_heads,
            fields=self.fields,
            tp_plan=dict(self.tp_plan),
            keep_in_fp32=self.keep_in_fp32,
            renamings=dict(self.renamings),
            serving=self.serving,
            maps=self.maps,
        )


def _same_heads(kind: str) -> Callable[..., PreTrainedConfig]:
    def match(baseline: PreTrainedConfig) -> PreTrainedConfig:
        return dataclasses.replace(baseline, attention=kind)

    return match


def _halved_heads(baseline: PreTrainedConfig) -> PreTrainedConfig:
    heads, kv_heads = baseline.num_attention_heads, baseline.num_key_value_heads
    if heads % 2 or kv_heads % 2:
        raise ValueError(
            "DIFF V1 halves the baseline's heads and KV heads: num_attention_heads and num_key_value_heads must be "
            f"even; got {heads} and {kv_heads}"
        )
    return dataclasses.replace(
        baseline, attention="diff", num_attention_heads=heads // 2, num_key_value_heads=kv_heads // 2
    )


def _grouped_heads(baseline: PreTrainedConfig, gda_ratio: int = 1) -> PreTrainedConfig:
    if not isinstance(gda_ratio, int) or isinstance(gda_ratio, bool) or gda_ratio < 1:
        raise ValueError(f"gda_ratio must be a positive integer; got {gda_ratio!r}")
    heads, kv_heads, width = baseline.num_attention_heads, baseline.num_key_value_heads, baseline.head_dim
    group = gda_ratio + 1  # a noise map and its signal heads
    maps = group * -(-heads // group)  # the baseline's heads, rounded up to whole groups
    noise = maps // group
    return dataclasses.replace(
        baseline,
        attention="gda",
        num_attention_heads=gda_ratio * noise,
        num_key_value_heads=math.gcd(max(kv_heads // 2, 1), noise),
        gda_ratio=gda_ratio,
        map_dim=None if maps * width == baseline.hidden_size else width,
    )


SOFTMAX = AttentionKind(
    name="softmax",
    label="Transformer",
    layer=SoftmaxAttention,
    match=_same_heads("softmax"),
    matching="the matched baseline itself: H heads of width d over H_kv KV heads",
)
DIFF = AttentionKind(
    name="diff",
    label="DIFF",
    layer=DiffAttention,
    match=_halved_heads,
    matching=(
        "h = H / 2 differential heads of two d-wide maps (h_kv = H_kv / 2 KV groups): q, k, v and o_proj have the "
        "baseline's shapes; adds 4d lambda entries a layer, and 2d with subln='affine'"
    ),
    differential_heads=True,
    keep_in_fp32=("lambda_vectors",),
    renamings=LAMBDA_RENAMINGS,
    serving="differential",
    maps="lambda",
)
GDA = AttentionKind(
    name="gda",
    label="GDA",
    layer=GroupedDiffAttention,
    match=_grouped_heads,
    matching=(
        "the baseline's H query heads, rounded up to M, a multiple of G + 1 (G = gda_ratio), as maps of width d: "
        "n = M / (G + 1) noise maps and h = G n signal heads over gcd(H_kv / 2, n) KV groups (a noise map and its "
        "signal heads read one); q_proj has M d rows (the baseline's H d where G + 1 divides H), o_proj reads h "
        "heads of 2d (2h d columns for the baseline's H d), k_proj and v_proj 2d rows a KV group (the baseline's "
        "H_kv d with H_kv / 2 groups), and DIFF V1's lambda vectors and gain; at G = 1 DIFF V1's shapes"
    ),
    differential_heads=True,
    fields=("gda_ratio",),
    keep_in_fp32=("lambda_vectors",),
    renamings=LAMBDA_RENAMINGS,
    serving="differential",
    maps="lambda",
)
DIFF_V2 = AttentionKind(
    name="diff_v2",
    label="DIFF V2",
    layer=DiffAttentionV2,
    match=_same_heads("diff_v2"),
    matching=(
        "the baseline's H heads, each a pair of query heads over the baseline's K/V: adds d_model H (d + 1) a layer "
        "(q_proj's second H d rows and lambda_proj)"
    ),
    tp_plan={"layers.*.self_attn.lambda_proj": "colwise"},
    serving="diff_v2",
    maps="gate",
)
GATED = AttentionKind(
    name="gated",
    label="Gated attention",
    layer=GatedAttention,
    match=_same_heads("gated"),
    matching="the baseline's H heads with a d-wide gate each: adds d_model H d a layer (q_proj's gate rows)",
    serving="gated",
)

KINDS: dict[str, AttentionKind] = {kind.name: kind for kind in (DIFF, GDA, DIFF_V2, GATED, SOFTMAX)}
KIND_FACTS: dict[str, dict] = {name: kind.facts() for name, kind in KINDS.items()}
