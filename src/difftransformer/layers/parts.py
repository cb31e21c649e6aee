"""Differential attention as a space of parts: what one attention layer is built from, each part with its formula
and its source. The attention kinds (layers/kinds.py) are named points of this space; a configuration may move any
kind along any part (``DiffTransformerConfig(attention="diff_v2", output_gate="elementwise")``).

Plain data, no torch: the configuration file a saved folder carries holds this module (models/remote_code.py).

The parts of a layer whose input is x (the block's normalised hidden state), with d the width of one map's queries
and keys:

- **map layout**. ``"split"``: DIFF V1's heads (Ye et al., arXiv 2410.05258, §2.1, Eq. 1): each head's query and
  key are split into two d-wide halves, Q1 | Q2 and K1 | K2, over one 2d-wide value V; the two maps read the same
  value. ``"whole"``: whole query heads of width d over the matched baseline's keys and values (DIFF V2, the
  authors' 2026 revision; Motif-3's GDLA, arXiv 2608.09119): a noise map is a query head of its own, in one ordinary
  attention call.
- **signal heads per noise map**, G >= 1 (``noise_ratio``; the configuration's ``gda_ratio``): G signal maps
  subtract one shared noise map (Lim et al., "Grouped Differential Attention", arXiv 2510.06949, §2.2; Motif's
  ``grouped_ratio``): head s subtracts noise map s // G. ``None``: no noise map at all (the softmax baseline and
  gated attention).
- **lambda**, the weight of the noise map. ``"scalar"``: one per layer, re-parameterised (Ye et al., Eq. 2),
  lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 l)
  at 0-based depth l. ``"token"``: per token and per signal head, sigmoid(lambda_proj(x)_s), lambda_proj a bias-free
  Linear d_model -> h (DIFF V2; Motif's ``lambda_proj``). Head s's output is ``attn_s - lambda_s attn_noise(s)``.
- **per-head norm** (``norm``; the configuration's ``subln``): RMSNorm over each head's output features (2d for the
  split layout, d for the whole one), with a learnable gain (``"affine"``, the authors' current code) or without
  (``"plain"``, the paper's text and DiffLlama), or none (``"none"``, DIFF V2 and Motif). With the scalar lambda the
  output is then multiplied by the constant 1 - lambda_init (Ye et al., Eq. 3), with or without the norm; the per-token
  lambda has no lambda_init and no such factor.
- **output gate** (``gate``): ``"elementwise"`` multiplies each head's output, element by element, by
  sigmoid(x W_gate) before the output projection (Qiu et al., "Gated Attention for Large Language Models", NeurIPS
  2025, arXiv 2505.06708, position G1, Eq. 5; Motif's ``* sigmoid(q_b_gate(.))``); ``"none"``.
- **attention window** (``window``, ``window_period``): a windowed layer's query sees its own position and the
  ``window - 1`` keys before it (transformers' ``sliding_window`` convention; Motif's configuration counts the past
  keys only, ``sliding_window = window - 1``, its "+1" convention). ``window_period`` 0: every layer is windowed;
  P >= 1: layers whose 0-based index is a multiple of P keep full attention and the others are windowed (Motif's
  "interleave" pattern as its code computes it, ``layer_idx % period != 0``; P = 1 windows no layer).

Derived from the parts, never declared twice: which layer module builds it, what it keeps in float32, the
Llama-family parameter names it loads, its tensor-parallel entries and what ``output_attentions`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

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
