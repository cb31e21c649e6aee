"""The parameter-matching rule: the configuration of any point of the space of parts that is matched to a softmax
baseline (H heads of width d over H_kv KV heads; same depth, width, FFN and vocabulary). The rule is the parts',
not the kind's, so two configurations that differ in one part are matched alike and differ in that part alone.

- No noise map (the softmax baseline, gated attention): the baseline's H heads of width d over its H_kv KV heads.
- Split layout, G signal heads a noise map (DIFF V1 at G = 1, GDA): the baseline's H query heads, rounded up to M,
  a multiple of G + 1, as maps of width d: n = M / (G + 1) noise maps and h = G n signal heads over
  gcd(H_kv / 2, n) KV groups of 2d (Lim et al., arXiv 2510.06949); at G = 1 DIFF V1's halving (Ye et al.): h = H / 2,
  h_kv = H_kv / 2, which needs H and H_kv even. q, k, v and o_proj then have the baseline's shapes where nothing is
  rounded.
- Whole layout, G signal heads a noise map (DIFF V2 at G = 1, Motif): the baseline's H heads as signal heads of
  width d, n = H / G noise query heads (G divides H), over H_kv / G KV heads where G divides H_kv (else
  gcd(H_kv, n)), so that a noise map and its signal heads read one KV head.

The parts that do not shape heads add their own parameters: the output gate d_model x (h times a head's output
width), the per-token lambda d_model x h, the scalar lambda 4d, the norm's gain a head's output width, each a layer.
"""

from __future__ import annotations

import math

from difftransformer.layers.kinds import KINDS
from difftransformer.models.configuration import DiffTransformerConfig, parts_of


def matched_config(baseline: DiffTransformerConfig, attention: str, **fields) -> DiffTransformerConfig:
    """The configuration of kind ``attention`` with part and other ``fields`` set (e.g. ``gda_ratio=4``,
    ``output_gate="elementwise"``) that is matched to the softmax ``baseline`` by the rule above; ValueError naming
    what the rule cannot meet."""
    if baseline.attention != "softmax":
        raise ValueError(
            f"the baseline must be a softmax configuration; got attention={baseline.attention!r}"
        )
    if attention not in KINDS:
        raise ValueError(f"attention must be one of {tuple(KINDS)}; got {attention!r}")
    heads, kv_heads, width = baseline.num_attention_heads, baseline.num_key_value_heads, baseline.head_dim
    parts = parts_of(attention, **fields)
    ratio, layout = parts.noise_ratio, parts.layout
    shape: dict = {}
    if ratio is not None and layout == "split" and ratio == 1:
        if heads % 2 or kv_heads % 2:
            raise ValueError(
                "DIFF V1 halves the baseline's heads and KV heads: num_attention_heads and num_key_value_heads must "
                f"be even; got {heads} and {kv_heads}"
            )
        shape = dict(num_attention_heads=heads // 2, num_key_value_heads=kv_heads // 2)
    elif ratio is not None and layout == "split":
        if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1:
            raise ValueError(f"gda_ratio must be a positive integer; got {ratio!r}")
        group = ratio + 1  # a noise map and its signal heads
        maps = group * -(-heads // group)  # the baseline's heads, rounded up to whole groups
        noise = maps // group
        shape = dict(
            num_attention_heads=ratio * noise,
            num_key_value_heads=math.gcd(max(kv_heads // 2, 1), noise),
            map_dim=None if maps * width == baseline.hidden_size else width,
        )
    elif ratio is not None:
        if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1 or heads % ratio:
            raise ValueError(
                f"gda_ratio ({ratio!r}) must be a positive divisor of the baseline's {heads} heads: the whole layout "
                "keeps them as signal heads, gda_ratio to a noise map"
            )
        noise = heads // ratio
        shape = dict(
            num_key_value_heads=kv_heads // ratio if kv_heads % ratio == 0 else math.gcd(kv_heads, noise)
        )
    return baseline.with_attention(attention, **{**shape, **fields})


def matching_rule(config: DiffTransformerConfig) -> str:
    """The rule that matched ``config`` to its baseline, in words, with what its parts add."""
    parts = config.parts
    if not parts.differential:
        rule = "the baseline's H heads of width d over its H_kv KV heads"
    elif parts.layout == "split":
        rule = (
            f"the baseline's H query heads as maps of width d: {config.noise_heads} noise maps and "
            f"{config.num_attention_heads} signal heads (G = {parts.noise_ratio}) over {config.num_key_value_heads} "
            "KV groups of 2d (q, k, v and o_proj the baseline's shapes where G + 1 divides H)"
        )
    else:
        rule = (
            f"the baseline's H heads as signal heads of width d, H / G = {config.noise_heads} noise query heads "
            f"(G = {parts.noise_ratio}) over {config.num_key_value_heads} KV heads"
        )
    extras = []
    if parts.lambda_mode == "scalar":
        extras.append("4d lambda entries")
    elif parts.lambda_mode == "token":
        extras.append("lambda_proj d_model x h")
    if parts.norm == "affine":
        extras.append("the norm's gain")
    if parts.gate == "elementwise":
        extras.append("the gate's rows of q_proj, d_model x h x the head width")
    return rule + (f"; adds {', '.join(extras)} a layer" if extras else "")
