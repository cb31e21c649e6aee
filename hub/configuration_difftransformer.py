# Written by difftransformer 0.1.0 from its sources (src/difftransformer: ops, layers, models), model code 0e26c40f72130f94; change the package, not this file.
"""The Differential Transformer's configuration, generated from difftransformer/models/configuration.py and the modules it holds."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RopeParameters

# ---- difftransformer/layers/parts.py ---------------------------------------------------------------------
MAP_LAYOUTS: tuple[str, ...] = ("split", "whole")


LAMBDA_MODES: tuple[str, ...] = ("scalar", "token")


NORMS: tuple[str, ...] = ("affine", "plain", "none")


GATES: tuple[str, ...] = ("none", "elementwise")


FULL, SLIDING = "full_attention", "sliding_attention"


LAMBDA_RENAMINGS = {f"lambda_{name}": f"lambda_vectors.{name}" for name in ("q1", "k1", "q2", "k2")}


@dataclass(frozen=True)
class AttentionParts:
    layout: str = "whole"
    noise_ratio: int | None = None
    lambda_mode: str | None = None
    norm: str = "none"
    gate: str = "none"
    window: int | None = None
    window_period: int = 0

    def conflict(self) -> str | None:
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
        return self.noise_ratio is not None

    def windowed(self, layer_idx: int) -> bool:
        if self.window is None:
            return False
        return self.window_period == 0 or layer_idx % self.window_period != 0

    def layer_types(self, num_layers: int) -> list[str]:
        return [SLIDING if self.windowed(layer) else FULL for layer in range(num_layers)]

    @property
    def keep_in_fp32(self) -> tuple[str, ...]:
        return ("lambda_vectors",) if self.lambda_mode == "scalar" else ()

    @property
    def renamings(self) -> dict[str, str]:
        return dict(LAMBDA_RENAMINGS) if self.lambda_mode == "scalar" else {}

    @property
    def tp_plan(self) -> dict[str, str]:
        return {"layers.*.self_attn.lambda_proj": "colwise"} if self.lambda_mode == "token" else {}


# ---- difftransformer/layers/kinds.py ---------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionKind:
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


PART_FIELDS = {
    "map_layout": "layout",
    "gda_ratio": "noise_ratio",
    "lambda_mode": "lambda_mode",
    "subln": "norm",
    "output_gate": "gate",
    "sliding_window": "window",
    "sliding_window_period": "window_period",
}


AUTO_MAP = {
    "AutoConfig": "configuration_difftransformer.DiffTransformerConfig",
    "AutoModel": "modeling_difftransformer.DiffTransformerModel",
    "AutoModelForCausalLM": "modeling_difftransformer.DiffTransformerForCausalLM",
}


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
    declared = KINDS[attention].parts
    moved = {
        PART_FIELDS[name]: value
        for name, value in fields.items()
        if name in PART_FIELDS and value is not None
    }
    return dataclasses.replace(declared, **moved)


class DiffTransformerConfig(PreTrainedConfig):
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
        parts = parts_of(self.attention, **{field: getattr(self, field) for field in PART_FIELDS})
        for field, part in PART_FIELDS.items():
            setattr(self, field, getattr(parts, part))
        conflict = self.parts.conflict()
        self.base_model_tp_plan = {**_TP_PLAN, **(self.parts.tp_plan if conflict is None else {})}
        super().__post_init__(**kwargs)
        self.check()

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> DiffTransformerConfig:
        if "map_layout" not in config_dict and config_dict.get("attention") not in ("diff", "gda"):
            config_dict = {k: v for k, v in config_dict.items() if k not in ("subln", "gda_ratio")}
        return super().from_dict(config_dict, **kwargs)

    def check(self) -> None:
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
        return AttentionParts(**{part: getattr(self, field) for field, part in PART_FIELDS.items()})

    @property
    def layer_types(self) -> list[str]:
        return self.parts.layer_types(self.num_hidden_layers)

    @property
    def differential_heads(self) -> bool:
        return self.map_layout == "split"

    @property
    def noise_heads(self) -> int:
        return (
            self.num_attention_heads // self.gda_ratio
            if self.parts.differential
            else self.num_attention_heads
        )

    @property
    def query_heads(self) -> int:
        return self.num_attention_heads + (self.noise_heads if self.parts.differential else 0)

    @property
    def map_head_dim(self) -> int:
        if self.map_dim is not None:
            return self.map_dim
        if self.differential_heads:
            return self.hidden_size // (self.num_attention_heads + self.noise_heads)
        return self.hidden_size // self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return 2 * self.map_head_dim if self.differential_heads else self.map_head_dim

    def layer_lambda_init(self, layer_idx: int) -> float:
        if self.lambda_init == "depth":
            return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        return float(self.lambda_init)

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs) -> None:
        self.auto_map = {**(getattr(self, "auto_map", None) or {}), **AUTO_MAP}
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        if write_model_code is not None:
            write_model_code(save_directory)


# transformers copies this file along when a model loaded from it is saved again
DiffTransformerConfig.register_for_auto_class("AutoConfig")
