# Written by difftransformer 0.1.0 from its sources (src/difftransformer: ops, layers, models), model code 176890fbd293cfba; change the package, not this file.
"""The Differential Transformer's configuration, generated from difftransformer/models/configuration.py and the modules it holds."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RopeParameters

# ---- difftransformer/layers/parts.py ---------------------------------------------------------------------
# Differential attention as a space of parts: what one attention layer is built from, each part with its formula
# and its source. The attention kinds (layers/kinds.py) are named points of this space; a configuration may move any
# kind along any part (``DiffTransformerConfig(attention="diff_v2", output_gate="elementwise")``).
#
# Plain data, no torch: the configuration file a saved folder carries holds this module (models/remote_code.py).
#
# The parts of a layer whose input is x (the block's normalised hidden state), with d the width of one map's queries
# and keys:
#
# - **map layout**. ``"split"``: DIFF V1's heads (Ye et al., arXiv 2410.05258, §2.1, Eq. 1): each head's query and
#   key are split into two d-wide halves, Q1 | Q2 and K1 | K2, over one 2d-wide value V; the two maps read the same
#   value. ``"whole"``: whole query heads of width d over the matched baseline's keys and values (DIFF V2, the
#   authors' 2026 revision; Motif-3's GDLA, arXiv 2608.09119): a noise map is a query head of its own, in one ordinary
#   attention call.
# - **signal heads per noise map**, G >= 1 (``noise_ratio``; the configuration's ``gda_ratio``): G signal maps
#   subtract one shared noise map (Lim et al., "Grouped Differential Attention", arXiv 2510.06949, §2.2; Motif's
#   ``grouped_ratio``): head s subtracts noise map s // G. ``None``: no noise map at all (the softmax baseline and
#   gated attention).
# - **lambda**, the weight of the noise map. ``"scalar"``: one per layer, re-parameterised (Ye et al., Eq. 2),
#   lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 l)
#   at 0-based depth l. ``"token"``: per token and per signal head, sigmoid(lambda_proj(x)_s), lambda_proj a bias-free
#   Linear d_model -> h (DIFF V2; Motif's ``lambda_proj``). Head s's output is ``attn_s - lambda_s attn_noise(s)``.
# - **per-head norm** (``norm``; the configuration's ``subln``): RMSNorm over each head's output features (2d for the
#   split layout, d for the whole one), with a learnable gain (``"affine"``, the authors' current code) or without
#   (``"plain"``, the paper's text and DiffLlama), or none (``"none"``, DIFF V2 and Motif). With the scalar lambda the
#   output is then multiplied by the constant 1 - lambda_init (Ye et al., Eq. 3), with or without the norm; the per-token
#   lambda has no lambda_init and no such factor.
# - **output gate** (``gate``): ``"elementwise"`` multiplies each head's output, element by element, by
#   sigmoid(x W_gate) before the output projection (Qiu et al., "Gated Attention for Large Language Models", NeurIPS
#   2025, arXiv 2505.06708, position G1, Eq. 5; Motif's ``* sigmoid(q_b_gate(.))``); ``"none"``.
# - **attention window** (``window``, ``window_period``): a windowed layer's query sees its own position and the
#   ``window - 1`` keys before it (transformers' ``sliding_window`` convention; Motif's configuration counts the past
#   keys only, ``sliding_window = window - 1``, its "+1" convention). ``window_period`` 0: every layer is windowed;
#   P >= 1: layers whose 0-based index is a multiple of P keep full attention and the others are windowed (Motif's
#   "interleave" pattern as its code computes it, ``layer_idx % period != 0``; P = 1 windows no layer).
#
# Derived from the parts, never declared twice: which layer module builds it, what it keeps in float32, the
# Llama-family parameter names it loads, its tensor-parallel entries and what ``output_attentions`` returns.
MAP_LAYOUTS: tuple[str, ...] = ("split", "whole")


LAMBDA_MODES: tuple[str, ...] = ("scalar", "token")


NORMS: tuple[str, ...] = ("affine", "plain", "none")


GATES: tuple[str, ...] = ("none", "elementwise")


# transformers' layer types (config.layer_types), which its caches and masks read
FULL, SLIDING = "full_attention", "sliding_attention"


# DIFF V1's lambda vectors: the Llama-family names of the paper's code and DiffLlama -> ours (under self_attn.)
LAMBDA_RENAMINGS = {f"lambda_{name}": f"lambda_vectors.{name}" for name in ("q1", "k1", "q2", "k2")}


@dataclass(frozen=True)
class AttentionParts:
    """One point of the space (the module docstring gives each part's formula and source).

    Args:
        layout: ``"split"`` (two half-width maps a head over a 2d-wide value) or ``"whole"`` (whole query heads).
        noise_ratio: G, signal heads per noise map; None for no noise map.
        lambda_mode: ``"scalar"`` or ``"token"`` with a noise map; None without one.
        norm: the per-head norm, ``"affine"``, ``"plain"`` or ``"none"``.
        gate: the output gate, ``"none"`` or ``"elementwise"``.
        window: W, the keys a windowed layer's query sees (itself included); None for full attention everywhere.
        window_period: which layers are windowed (0 every layer; P >= 1 all but the multiples of P).
    """

    layout: str = "whole"
    noise_ratio: int | None = None
    lambda_mode: str | None = None
    norm: str = "none"
    gate: str = "none"
    window: int | None = None
    window_period: int = 0

    def conflict(self) -> str | None:
        """The first combination of parts that has no meaning, in one sentence, or None when every part fits."""
        for field, value, allowed in (
            ("map_layout", self.layout, MAP_LAYOUTS),
            ("subln", self.norm, NORMS),
            ("output_gate", self.gate, GATES),
        ):
            if value not in allowed:
                return f"{field} must be one of {allowed}; got {value!r}"
        if self.noise_ratio is None:
            if self.layout == "split":
                return "map_layout='split' splits each head into a signal and a noise map; this kind has no noise map"
            if self.lambda_mode is not None:
                return f"lambda_mode={self.lambda_mode!r} weighs a noise map; this kind has no noise map"
        else:
            if (
                isinstance(self.noise_ratio, bool)
                or not isinstance(self.noise_ratio, int)
                or self.noise_ratio < 1
            ):
                return f"gda_ratio (signal heads per noise map) must be a positive integer; got {self.noise_ratio!r}"
            if self.lambda_mode is None:
                return (
                    f"gda_ratio={self.noise_ratio} gives this kind noise maps, which need a lambda_mode "
                    f"{LAMBDA_MODES}: give it, or start from a kind with noise maps"
                )
            if self.lambda_mode not in LAMBDA_MODES:
                return f"lambda_mode must be one of {LAMBDA_MODES}; got {self.lambda_mode!r}"
        if self.window is not None and (
            isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1
        ):
            return (
                f"sliding_window must be a positive integer (keys a query sees) or None; got {self.window!r}"
            )
        if (
            isinstance(self.window_period, bool)
            or not isinstance(self.window_period, int)
            or self.window_period < 0
        ):
            return f"sliding_window_period must be 0 (every layer windowed) or a positive integer; got {self.window_period!r}"
        return None

    @property
    def differential(self) -> bool:
        """Whether the layer subtracts noise maps."""
        return self.noise_ratio is not None

    def windowed(self, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` (0-based) attends within the window."""
        if self.window is None:
            return False
        return self.window_period == 0 or layer_idx % self.window_period != 0

    def layer_types(self, num_layers: int) -> list[str]:
        """transformers' ``layer_types``: "sliding_attention" for the windowed layers, "full_attention" for the rest."""
        return [SLIDING if self.windowed(layer) else FULL for layer in range(num_layers)]

    @property
    def keep_in_fp32(self) -> tuple[str, ...]:
        """Submodules kept in float32 whatever the model's dtype: the scalar lambda's vectors (exp() of a
        half-precision dot product is too coarse for lambda)."""
        return ("lambda_vectors",) if self.lambda_mode == "scalar" else ()

    @property
    def full_precision(self) -> tuple[str, ...]:
        """Submodules no quantizer converts (docs/quantization.md): those kept in float32, and the per-token
        lambda's projection, whose sigmoid weighs the noise map near 0 where an int8 step is coarse."""
        return self.keep_in_fp32 + (("lambda_proj",) if self.lambda_mode == "token" else ())

    @property
    def renamings(self) -> dict[str, str]:
        """Llama-family parameter names (under ``self_attn.``) of checkpoints with these parts -> ours."""
        return dict(LAMBDA_RENAMINGS) if self.lambda_mode == "scalar" else {}

    @property
    def tp_plan(self) -> dict[str, str]:
        """Tensor-parallel entries beside the baseline's (keys under the base model)."""
        return {"layers.*.self_attn.lambda_proj": "colwise"} if self.lambda_mode == "token" else {}

    @property
    def maps(self) -> str:
        """What ``output_attentions`` returns: "softmax" (one map a head), "lambda" (A_s - lambda A_noise, lambda a
        scalar) or "gate" (A_s - sigmoid(lambda_s(x)) A_noise, per token)."""
        if not self.differential:
            return "softmax"
        return "lambda" if self.lambda_mode == "scalar" else "gate"


# ---- difftransformer/layers/kinds.py ---------------------------------------------------------------------
# The attention kinds, each declared once: a name, a label and its point in the space of parts
# (:mod:`difftransformer.layers.parts`). Everything else about a kind is derived from its parts: the layer that
# builds it, what it keeps in float32, its checkpoint names, its tensor-parallel entries, its maps, its parameter
# matching against the softmax baseline (models/matching.py), its FLOPs (models/flops.py) and how vLLM serves it.
#
# Plain data, no torch: the configuration file a saved folder carries holds this module (models/remote_code.py).
@dataclass(frozen=True)
class AttentionKind:
    """One attention kind.

    Args:
        name: ``config.attention``.
        label: its name in reports and tables.
        parts: its point in the space of parts; a configuration's part fields move it from there.
        source: where its definition comes from.
    """

    name: str
    label: str
    parts: AttentionParts
    source: str


SOFTMAX = AttentionKind(
    "softmax",
    "Transformer",
    AttentionParts(),
    "the matched baseline: Llama's attention",
)


GATED = AttentionKind(
    "gated",
    "Gated attention",
    AttentionParts(gate="elementwise"),
    "Qiu et al., arXiv 2505.06708: the baseline with the G1 output gate",
)


DIFF = AttentionKind(
    "diff",
    "DIFF",
    AttentionParts(layout="split", noise_ratio=1, lambda_mode="scalar", norm="affine"),
    "Ye et al., arXiv 2410.05258, §2.1 (DIFF V1)",
)


GDA = AttentionKind(
    "gda",
    "GDA",
    AttentionParts(layout="split", noise_ratio=1, lambda_mode="scalar", norm="affine"),
    "Lim et al., arXiv 2510.06949: DIFF V1 with G signal heads a noise map (set gda_ratio)",
)


DIFF_V2 = AttentionKind(
    "diff_v2",
    "DIFF V2",
    AttentionParts(noise_ratio=1, lambda_mode="token"),
    "Ye et al., Differential Transformer V2 (2026)",
)


MOTIF = AttentionKind(
    "motif",
    "Motif",
    AttentionParts(noise_ratio=4, lambda_mode="token", gate="elementwise", window=129, window_period=4),
    "Motif-3's GDLA (arXiv 2608.09119; MotifTechnologies' vLLM fork) without its low-rank Q/KV projections",
)


KINDS: dict[str, AttentionKind] = {kind.name: kind for kind in (DIFF, GDA, DIFF_V2, GATED, MOTIF, SOFTMAX)}


write_model_code = None  # package-only (models/remote_code.py): not in this file
ATTENTION_BACKENDS = ("auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex")
ROPE_STYLES = ("interleaved", "half")


ATTENTION_KINDS: tuple[str, ...] = tuple(KINDS)


# The configuration fields that move a kind along each part (None: the kind's own); the field names the package had
# before the parts (``gda_ratio``, ``subln``) keep their meaning.
PART_FIELDS = {
    "map_layout": "layout",
    "gda_ratio": "noise_ratio",
    "lambda_mode": "lambda_mode",
    "subln": "norm",
    "output_gate": "gate",
    "sliding_window": "window",
    "sliding_window_period": "window_period",
}


# config.json's ``auto_map``: the folder's own code files (models/remote_code.py writes them) for the Auto classes.
AUTO_MAP = {
    "AutoConfig": "configuration_difftransformer.DiffTransformerConfig",
    "AutoModel": "modeling_difftransformer.DiffTransformerModel",
    "AutoModelForCausalLM": "modeling_difftransformer.DiffTransformerForCausalLM",
}


# Tensor parallelism: column-wise q/k/v keep whole heads on a shard (DIFF V1's adjacent Q1|Q2 and K1|K2 rows, GDA's
# groups of signal and noise queries, DIFF V2's adjacent query-head pairs, gated attention's query|gate rows),
# row-wise o_proj, as Llama's plan; a kind adds its own modules (layers/kinds.py).
_TP_PLAN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}


def parts_of(attention: str, **fields) -> AttentionParts:
    """The parts of kind ``attention`` moved along the part ``fields`` given (the configuration's names, e.g.
    ``gda_ratio``; None or absent: the kind's); other fields are ignored."""
    declared = KINDS[attention].parts
    moved = {
        PART_FIELDS[name]: value
        for name, value in fields.items()
        if name in PART_FIELDS and value is not None
    }
    return dataclasses.replace(declared, **moved)


class DiffTransformerConfig(PreTrainedConfig):
    r"""Llama-style configuration for the Differential Transformer, the kinds compared with it, their compositions and
    the matched baseline.

    A model's attention is a point in the space of parts (layers/parts.py gives each part's formula and source):
    ``attention`` names a kind (layers/kinds.py), which declares every part, and the part fields below move it along
    any of them; a field left None takes the kind's value, and the configuration holds (and saves) the resolved
    parts. A combination without meaning is refused in one line naming it.

    Args:
        vocab_size: number of token ids.
        hidden_size: d_model.
        intermediate_size: SwiGLU hidden size; None gives 8/3 * d_model rounded up to a multiple of 64.
        num_hidden_layers: depth.
        num_attention_heads: the heads h whose outputs the output projection reads (each with a noise map of its
            group in a differential kind: G = gda_ratio signal heads share one). For the split layout (DIFF V1, GDA)
            each signal head and each noise map is d = hidden_size / (h + h / G) wide (d = hidden_size / (2h) for
            DIFF V1, as in the authors' code); for the whole layout every query head is d = hidden_size / h wide (the
            baseline's). ``head_dim`` is the width of a head's value and of its cache entries: 2d for the split
            layout, d for the whole one, as transformers sizes caches.
        num_key_value_heads: KV heads (for the split layout the KV groups, each K1 | K2 and a 2d-wide V); they divide
            the noise maps (a noise map and its signal heads read one KV head), or the heads without noise maps.
            None means no GQA.
        map_dim: split layout only: the maps' width d when it is not the one above, so that heads are 2d wide
            whatever d_model; a DIFF V1 model upcycled from a softmax one keeps the source's head width as d
            (convert/upcycle.py). None: derived from hidden_size as above.
        attention: the attention kind (layers/kinds.py): "diff" (DIFF V1), "gda" (grouped differential attention),
            "diff_v2" (the authors' 2026 revision), "gated" (gated attention), "motif" (Motif-3's attention without
            its low-rank projections) or "softmax" (the baseline).
        map_layout: the map layout, "split" or "whole" (None: the kind's).
        gda_ratio: signal heads per noise map, G (None: the kind's; GDA's is set here); it divides
            num_attention_heads. Refused for kinds without noise maps.
        lambda_mode: the noise map's weight, "scalar" (DIFF V1's lambda, one per layer) or "token" (per token and
            signal head, sigmoid(lambda_proj(x))) (None: the kind's). Refused for kinds without noise maps.
        subln: the per-head norm: "affine" (learnable gain, the authors' current code), "plain" (no gain: the
            paper, DiffLlama), "none" (DIFF V1's ablation; DIFF V2, Motif) (None: the kind's).
        subln_eps: eps of that per-head norm.
        output_gate: "elementwise" (each head's output times sigmoid(x W_gate), before o_proj) or "none" (None: the
            kind's).
        sliding_window: keys a windowed layer's query sees, itself included (transformers' convention; Motif's
            configuration writes one less) (None: the kind's, full attention for all but "motif"). Needs causal.
        sliding_window_period: which layers are windowed: 0 every layer, P >= 1 all layers but those whose 0-based
            index is a multiple of P (Motif: 4); 1 windows none (None: the kind's). ``layer_types`` (transformers'
            per-layer list, which its caches and masks read) follows from these two.
        rope_style: "interleaved" (the authors' GPT-J pairing) or "half" (Llama/DiffLlama pairing).
        lambda_init: the scalar lambda's "depth" for 0.8 - 0.6 exp(-0.3 l) with l the 0-based layer, or a constant.
        lambda_std: std of the scalar lambda's vectors' normal init.
        rms_norm_eps: eps of the block and final RMSNorms.
        rope_parameters: transformers' RoPE dict: ``rope_type`` ("default", "linear", "dynamic", "yarn", ...),
            ``rope_theta`` (the rotary base, default 10000) and the type's fields (``factor``, ...). A
            ``rope_theta=`` argument (older configs) lands in it.
        max_position_embeddings: longest sequence the model is meant for (checked on input).
        initializer_range: std of the normal init of linear and embedding weights.
        causal: causal self-attention (False gives an encoder).
        attention_backend: the split layout's operator backend under ``attn_implementation="sdpa"``
            (transformers' default): "auto" (chosen per device, dtype and shape; the fused C++ kernel on CPU
            float32), "reference" (materialized, exact), "sdpa" (two fused SDPA calls over V's halves), "blocked"
            (the baseline's FLOPs, one query block at a time), "decode" (a few queries: K and V read once),
            "fused_cpu" or "flex". See docs/performance.md. ``attn_implementation`` "eager" runs "reference",
            "flex_attention" "flex". The whole layout takes every attention implementation transformers registers,
            as Llama does; for it this field stays "auto".
        tie_word_embeddings: share the embedding and lm_head weights.
    """

    model_type = "difftransformer"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int | None = None
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    map_dim: int | None = None
    attention: str = "diff"
    map_layout: str | None = None
    gda_ratio: int | None = None
    lambda_mode: str | None = None
    subln: str | None = None
    subln_eps: float = 1e-5
    output_gate: str | None = None
    sliding_window: int | None = None
    sliding_window_period: int | None = None
    rope_style: str = "interleaved"
    lambda_init: str | float = "depth"
    lambda_std: float = 0.1
    rms_norm_eps: float = 1e-5
    rope_parameters: RopeParameters | dict | None = None
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    causal: bool = True
    attention_backend: str = "auto"
    use_cache: bool = True
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.intermediate_size is None:
            self.intermediate_size = 64 * math.ceil(8 * self.hidden_size / 3 / 64)
        if self.attention not in KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}; got {self.attention!r}")
        # A part left unset takes the kind's value: the configuration holds, and saves, the resolved parts.
        parts = parts_of(self.attention, **{field: getattr(self, field) for field in PART_FIELDS})
        for field, part in PART_FIELDS.items():
            setattr(self, field, getattr(parts, part))
        # Tensor-parallel plan of the base model (``from_pretrained(..., tp_plan="auto")``), for these parts; an
        # instance attribute, as transformers' own __post_init__ extends it for tied embeddings in some versions.
        conflict = self.parts.conflict()
        self.base_model_tp_plan = {**_TP_PLAN, **(self.parts.tp_plan if conflict is None else {})}
        super().__post_init__(**kwargs)
        self.check()

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> DiffTransformerConfig:
        """transformers' ``from_dict``, reading a configuration saved before the parts existed (no ``map_layout``)
        as it was meant: its ``subln`` and ``gda_ratio``, then written for every kind, were read only by DIFF V1 and
        GDA, so for the other kinds they take the kind's parts."""
        if "map_layout" not in config_dict and config_dict.get("attention") not in ("diff", "gda"):
            config_dict = {k: v for k, v in config_dict.items() if k not in ("subln", "gda_ratio")}
        return super().from_dict(config_dict, **kwargs)

    def check(self) -> None:
        """Raise ValueError naming the first field that cannot build a model."""

        def choose(field: str, allowed: tuple[str, ...]) -> None:
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} must be one of {allowed}; got {getattr(self, field)!r}")

        choose("rope_style", ROPE_STYLES)
        choose("attention_backend", ATTENTION_BACKENDS)
        conflict = self.parts.conflict()
        if conflict is not None:
            raise ValueError(f"attention={self.attention!r}: {conflict}")
        differential = self.differential_heads
        if not differential and self.attention_backend != "auto":
            raise ValueError(
                "attention_backend picks the split layout's operator (map_layout='split'); the whole layout runs "
                "transformers' attention implementations (attn_implementation='eager', 'sdpa', ...): got "
                f"attention_backend={self.attention_backend!r}, expected 'auto'"
            )
        if not self.causal and any(self.parts.windowed(layer) for layer in range(self.num_hidden_layers)):
            raise ValueError(
                f"sliding_window={self.sliding_window} needs causal=True: a window is the keys before a query "
                "(sliding_window_period=1 windows no layer)"
            )
        if self.sliding_window is None and self.sliding_window_period > 1:
            raise ValueError(
                f"sliding_window_period={self.sliding_window_period} picks the windowed layers, but "
                "sliding_window is None (no window)"
            )
        for field in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
        ):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < 1:
                raise ValueError(f"{field} must be a positive integer; got {getattr(self, field)!r}")
        for field in ("rms_norm_eps", "subln_eps", "lambda_std", "initializer_range"):
            value, positive = getattr(self, field), field.endswith("eps")  # an eps of 0 divides by 0
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
                or (positive and value == 0)
            ):
                kind = "positive" if positive else "non-negative"
                raise ValueError(f"{field} must be a finite {kind} number; got {value!r}")
        for field in ("causal", "tie_word_embeddings", "use_cache"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"{field} must be true or false; got {getattr(self, field)!r}")
        for field in ("pad_token_id", "bos_token_id", "eos_token_id"):
            ids = getattr(self, field)
            for token in ids if isinstance(ids, list) else [ids]:
                if token is not None and (
                    isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self.vocab_size
                ):
                    raise ValueError(
                        f"{field} must be a token id in [0, vocab_size={self.vocab_size}); got {ids!r}"
                    )
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if self.parts.differential and heads % self.gda_ratio:
            raise ValueError(
                f"gda_ratio ({self.gda_ratio}) must divide num_attention_heads ({heads}): each noise map serves "
                "gda_ratio signal heads"
            )
        if not isinstance(kv_heads, int) or kv_heads < 1 or self.noise_heads % kv_heads:
            what = "the noise maps" if self.parts.differential else "num_attention_heads"
            raise ValueError(
                f"num_key_value_heads must be a positive divisor of {what} ({self.noise_heads}); got {kv_heads}"
            )
        maps = self.num_attention_heads + self.noise_heads if differential else heads
        if self.map_dim is not None:
            if not differential:
                raise ValueError(
                    f"map_dim is for map_layout='split' only; got map_layout={self.map_layout!r}"
                )
            if not isinstance(self.map_dim, int) or self.map_dim < 1:
                raise ValueError(f"map_dim must be a positive integer or None; got {self.map_dim!r}")
        elif self.hidden_size % maps:
            what = (
                "num_attention_heads + num_attention_heads / gda_ratio (signal and noise maps)"
                if differential
                else "num_attention_heads"
            )
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by {what} = {maps}")
        if self.map_head_dim % 2:
            raise ValueError(
                f"the rotary width (the maps' head dim d = map_dim or hidden_size / {maps} = {self.map_head_dim}) "
                "must be even"
            )
        rope_type = self.rope_parameters.get("rope_type")
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(
                f"rope_parameters['rope_type'] must be 'default' or one of {sorted(ROPE_INIT_FUNCTIONS)}; "
                f"got {rope_type!r}"
            )
        self.validate_rope()
        if isinstance(self.lambda_init, str):
            if self.lambda_init != "depth":
                raise ValueError(f"lambda_init must be 'depth' or a number; got {self.lambda_init!r}")
        elif (
            not isinstance(self.lambda_init, (int, float))
            or isinstance(self.lambda_init, bool)
            or not math.isfinite(self.lambda_init)
        ):
            raise ValueError(f"lambda_init must be 'depth' or a finite number; got {self.lambda_init!r}")

    @property
    def parts(self) -> AttentionParts:
        """The attention's point in the space of parts (layers/parts.py), as this configuration resolves it."""
        return AttentionParts(**{part: getattr(self, field) for field, part in PART_FIELDS.items()})

    @property
    def layer_types(self) -> list[str]:
        """transformers' per-layer attention types, "sliding_attention" where the parts window a layer, else
        "full_attention" (its caches and masks read them)."""
        return self.parts.layer_types(self.num_hidden_layers)

    @property
    def differential_heads(self) -> bool:
        """Whether the heads are split into two maps over a 2d-wide value (map_layout 'split': DIFF V1, GDA)."""
        return self.map_layout == "split"

    @property
    def noise_heads(self) -> int:
        """The noise maps, num_attention_heads / gda_ratio; num_attention_heads for a kind without noise maps."""
        return (
            self.num_attention_heads // self.gda_ratio
            if self.parts.differential
            else self.num_attention_heads
        )

    @property
    def query_heads(self) -> int:
        """The d-wide query maps a layer forms: the signal heads and the noise maps (the heads without noise)."""
        return self.num_attention_heads + (self.noise_heads if self.parts.differential else 0)

    @property
    def map_head_dim(self) -> int:
        """Width d of one softmax map's queries and keys, the rotated width (the matched Transformer's head dim)."""
        if self.map_dim is not None:
            return self.map_dim
        if self.differential_heads:
            return self.hidden_size // (self.num_attention_heads + self.noise_heads)
        return self.hidden_size // self.num_attention_heads

    @property
    def head_dim(self) -> int:
        """Width of one head's value and cache entries: 2d for the split layout (its K1 | K2 and 2d-wide V), d for
        the whole one. Caches are (B, num_key_value_heads, S, head_dim)."""
        return 2 * self.map_head_dim if self.differential_heads else self.map_head_dim

    def layer_lambda_init(self, layer_idx: int) -> float:
        """The scalar lambda's lambda_init at 0-based depth ``layer_idx``: the paper's schedule
        0.8 - 0.6 exp(-0.3 l) for "depth" (0.2 at layer 0), else the constant."""
        if self.lambda_init == "depth":
            return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        return float(self.lambda_init)

    def with_attention(self, attention: str, **fields) -> DiffTransformerConfig:
        """This configuration with another kind (its parts unset, so the kind declares them) and ``fields`` set;
        every field that is not the attention's is kept."""
        unset = dict.fromkeys(PART_FIELDS)
        return dataclasses.replace(
            self,
            attention=attention,
            rope_parameters=dict(self.rope_parameters),
            **{**unset, **fields},
        )

    def matched_baseline(self) -> DiffTransformerConfig:
        """The softmax Transformer this model is matched to, the same window included: the split layout's maps as
        its heads of width d (two KV heads a KV group); the whole layout's signal heads as its heads, over
        num_key_value_heads * gda_ratio KV heads; every other field unchanged. The inverse of the parts' matching
        rule (models/matching.py) where that rule neither rounds GDA's maps up nor takes fewer KV heads than
        H_kv / 2 (split) or H_kv / G (whole)."""
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if self.differential_heads:
            heads, kv_heads = heads + self.noise_heads, 2 * kv_heads
        elif self.parts.differential:
            kv_heads = min(heads, kv_heads * self.gda_ratio)
        return self.with_attention(
            "softmax",
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            sliding_window=self.sliding_window,
            sliding_window_period=self.sliding_window_period,
        )

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs) -> None:
        """transformers' ``save_pretrained`` with ``auto_map`` naming the folder's code files, so the folder loads
        with ``trust_remote_code=True`` where difftransformer is not installed (docs/sharing.md); the package then
        writes the code files there (models/remote_code.py; the code a saved folder carries has no writer, and
        transformers copies its files along). A model's ``save_pretrained`` and the Trainer's checkpoints come
        here."""
        self.auto_map = {**(getattr(self, "auto_map", None) or {}), **AUTO_MAP}
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        if write_model_code is not None:
            write_model_code(save_directory)


# transformers copies this file along when a model loaded from it is saved again
DiffTransformerConfig.register_for_auto_class("AutoConfig")
