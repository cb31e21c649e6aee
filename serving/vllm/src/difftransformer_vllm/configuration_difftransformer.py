# Written by difftransformer 0.1.0 from its sources (src/difftransformer: ops, layers, models), model code be51da110a1c9d4f; change the package, not this file.
"""The Differential Transformer's configuration, generated from difftransformer/models/configuration.py."""

from __future__ import annotations

import dataclasses
import math
import os

from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RopeParameters

SUBLN_MODES = ("affine", "plain", "none")
KIND_FACTS = {
    "diff": {
        "label": "DIFF",
        "differential_heads": True,
        "fields": (),
        "tp_plan": {},
        "keep_in_fp32": ("lambda_vectors",),
        "renamings": {
            "lambda_q1": "lambda_vectors.q1",
            "lambda_k1": "lambda_vectors.k1",
            "lambda_q2": "lambda_vectors.q2",
            "lambda_k2": "lambda_vectors.k2",
        },
        "serving": "differential",
        "maps": "lambda",
    },
    "gda": {
        "label": "GDA",
        "differential_heads": True,
        "fields": ("gda_ratio",),
        "tp_plan": {},
        "keep_in_fp32": ("lambda_vectors",),
        "renamings": {
            "lambda_q1": "lambda_vectors.q1",
            "lambda_k1": "lambda_vectors.k1",
            "lambda_q2": "lambda_vectors.q2",
            "lambda_k2": "lambda_vectors.k2",
        },
        "serving": "differential",
        "maps": "lambda",
    },
    "diff_v2": {
        "label": "DIFF V2",
        "differential_heads": False,
        "fields": (),
        "tp_plan": {
            "layers.*.self_attn.lambda_proj": "colwise",
        },
        "keep_in_fp32": (),
        "renamings": {},
        "serving": "diff_v2",
        "maps": "gate",
    },
    "gated": {
        "label": "Gated attention",
        "differential_heads": False,
        "fields": (),
        "tp_plan": {},
        "keep_in_fp32": (),
        "renamings": {},
        "serving": "gated",
        "maps": "softmax",
    },
    "softmax": {
        "label": "Transformer",
        "differential_heads": False,
        "fields": (),
        "tp_plan": {},
        "keep_in_fp32": (),
        "renamings": {},
        "serving": "softmax",
        "maps": "softmax",
    },
}
write_model_code = None  # package-only (models/remote_code.py): not in this file
ATTENTION_BACKENDS = ("auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex")
ROPE_STYLES = ("interleaved", "half")


ATTENTION_KINDS: tuple[str, ...] = tuple(KIND_FACTS)


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


class DiffTransformerConfig(PreTrainedConfig):
    r"""Llama-style configuration for the Differential Transformer, the kinds compared with it and its matched
    baseline.

    Args:
        vocab_size: number of token ids.
        hidden_size: d_model.
        intermediate_size: SwiGLU hidden size; None gives 8/3 * d_model rounded up to a multiple of 64.
        num_hidden_layers: depth.
        num_attention_heads: for ``attention="diff"`` the differential heads h (each holds two maps of width
            d = hidden_size / (2h)), as in the authors' code; for "gda" the signal heads h (each with its own first
            map and the second map of its group, d = hidden_size / (h + h / gda_ratio)); for "diff_v2", "gated" and
            "softmax" the ordinary heads (width d = hidden_size / heads). ``head_dim`` is the width of a head's
            value and of its cache entries: 2d for DIFF V1 and GDA, d for the others, as transformers sizes caches.
        num_key_value_heads: KV heads counted like ``num_attention_heads`` (for DIFF V1 and GDA the KV groups, each
            K1 | K2 and a 2d-wide V); None means no GQA.
        map_dim: DIFF V1 and GDA: the maps' width d when it is not the one above, so that heads are 2d wide whatever
            d_model; a DIFF V1 model upcycled from a softmax one keeps the source's head width as d
            (convert/upcycle.py). None: derived from hidden_size as above.
        attention: the attention kind (layers/kinds.py): "diff" (DIFF V1), "gda" (grouped differential attention),
            "diff_v2" (the authors' 2026 revision), "gated" (gated attention) or "softmax" (the baseline).
        gda_ratio: GDA only: signal heads per noise map, G (1 is DIFF V1); it divides num_attention_heads, and
            num_key_value_heads divides the noise maps num_attention_heads / G.
        rope_style: "interleaved" (the authors' GPT-J pairing) or "half" (Llama/DiffLlama pairing).
        subln: DIFF V1 and GDA per-head RMSNorm: "affine" (learnable gain, the authors' current code), "plain" (no
            gain: the paper, DiffLlama), "none" (the ablation).
        subln_eps: eps of that per-head norm.
        lambda_init: "depth" for 0.8 - 0.6 exp(-0.3 l) with l the 0-based layer, or a constant.
        lambda_std: std of the lambda vectors' normal init.
        rms_norm_eps: eps of the block and final RMSNorms.
        rope_parameters: transformers' RoPE dict: ``rope_type`` ("default", "linear", "dynamic", "yarn", ...),
            ``rope_theta`` (the rotary base, default 10000) and the type's fields (``factor``, ...). A
            ``rope_theta=`` argument (older configs) lands in it.
        max_position_embeddings: longest sequence the model is meant for (checked on input).
        initializer_range: std of the normal init of linear and embedding weights.
        causal: causal self-attention (False gives an encoder).
        attention_backend: DIFF V1's and GDA's operator backend under ``attn_implementation="sdpa"``
            (transformers' default): "auto" (chosen per device, dtype and shape; the fused C++ kernel on CPU
            float32), "reference" (materialized, exact), "sdpa" (two fused SDPA calls over V's halves), "blocked"
            (the baseline's FLOPs, one query block at a time), "decode" (a few queries: K and V read once),
            "fused_cpu" or "flex". See docs/performance.md. ``attn_implementation`` "eager" runs "reference",
            "flex_attention" "flex". The other kinds take every attention implementation transformers registers,
            as Llama does; for them this field stays "auto".
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
    gda_ratio: int = 1
    rope_style: str = "interleaved"
    subln: str = "affine"
    subln_eps: float = 1e-5
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
        # Tensor-parallel plan of the base model (``from_pretrained(..., tp_plan="auto")``), for this kind; an instance
        # attribute, as transformers' own __post_init__ extends it for tied embeddings in some versions.
        self.base_model_tp_plan = {**_TP_PLAN, **KIND_FACTS.get(self.attention, {}).get("tp_plan", {})}
        super().__post_init__(**kwargs)
        self.check()

    def check(self) -> None:
        """Raise ValueError naming the first field that cannot build a model."""

        def choose(field: str, allowed: tuple[str, ...]) -> None:
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} must be one of {allowed}; got {getattr(self, field)!r}")

        choose("attention", ATTENTION_KINDS)
        choose("rope_style", ROPE_STYLES)
        choose("subln", SUBLN_MODES)
        choose("attention_backend", ATTENTION_BACKENDS)
        differential = self.differential_heads
        if not differential and self.attention_backend != "auto":
            raise ValueError(
                f"attention_backend picks DIFF V1's and GDA's operator; attention={self.attention!r} runs "
                "transformers' attention implementations (attn_implementation='eager', 'sdpa', ...): got "
                f"attention_backend={self.attention_backend!r}, expected 'auto'"
            )
        for name, facts in KIND_FACTS.items():
            for field in facts["fields"]:
                default = type(self).__dataclass_fields__[field].default
                if name != self.attention and getattr(self, field) != default:
                    raise ValueError(
                        f"{field} is for attention={name!r} only; got {field}={getattr(self, field)!r} with "
                        f"attention={self.attention!r}"
                    )
        for field in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
            "gda_ratio",
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
        if heads % self.gda_ratio:
            raise ValueError(
                f"gda_ratio ({self.gda_ratio}) must divide num_attention_heads ({heads}): each noise map serves "
                "gda_ratio signal heads"
            )
        if not isinstance(kv_heads, int) or kv_heads < 1 or self.noise_heads % kv_heads:
            what = "the noise maps" if self.attention == "gda" else "num_attention_heads"
            raise ValueError(
                f"num_key_value_heads must be a positive divisor of {what} ({self.noise_heads}); got {kv_heads}"
            )
        maps = self.num_attention_heads + self.noise_heads if differential else heads
        if self.map_dim is not None:
            if not differential:
                raise ValueError(
                    f"map_dim is for attention='diff' and 'gda' only; got attention={self.attention!r}"
                )
            if not isinstance(self.map_dim, int) or self.map_dim < 1:
                raise ValueError(f"map_dim must be a positive integer or None; got {self.map_dim!r}")
        elif self.hidden_size % maps:
            what = {
                "diff": "2 * num_attention_heads (two maps per differential head)",
                "gda": "num_attention_heads + num_attention_heads / gda_ratio (signal and noise maps)",
            }.get(self.attention, "num_attention_heads")
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

    def kind_facts(self) -> dict:
        """The declaration of this configuration's attention kind, as plain data (layers/kinds.py)."""
        return KIND_FACTS[self.attention]

    @property
    def differential_heads(self) -> bool:
        """Whether the kind's heads are differential, two maps over a 2d-wide value (DIFF V1, GDA)."""
        return KIND_FACTS.get(self.attention, {}).get("differential_heads", False)

    @property
    def noise_heads(self) -> int:
        """The second (noise) maps of DIFF V1 and GDA, num_attention_heads / gda_ratio; for the other kinds
        num_attention_heads."""
        return self.num_attention_heads // self.gda_ratio

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
        """Width of one head's value and cache entries: 2d for DIFF V1 and GDA (their K1 | K2 and 2d-wide V), d for
        the others. Caches are (B, num_key_value_heads, S, head_dim)."""
        return 2 * self.map_head_dim if self.differential_heads else self.map_head_dim

    def layer_lambda_init(self, layer_idx: int) -> float:
        """DIFF V1's and GDA's lambda_init at 0-based depth ``layer_idx``: the paper's schedule
        0.8 - 0.6 exp(-0.3 l) for "depth" (0.2 at layer 0), else the constant."""
        if self.lambda_init == "depth":
            return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        return float(self.lambda_init)

    def matched_baseline(self) -> DiffTransformerConfig:
        """The softmax Transformer this model is matched to: DIFF V1's and GDA's maps as its heads of width d (two
        KV heads a KV group), the same heads for the other kinds; every other field unchanged. The inverse of the
        kind's matching rule (layers/kinds.py) where that rule neither rounds GDA's maps up nor takes fewer KV
        groups than H_kv / 2."""
        maps, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if self.differential_heads:
            maps, kv_heads = maps + self.noise_heads, 2 * kv_heads
        return dataclasses.replace(
            self,
            attention="softmax",
            num_attention_heads=maps,
            num_key_value_heads=kv_heads,
            gda_ratio=1,
            rope_parameters=dict(self.rope_parameters),
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
