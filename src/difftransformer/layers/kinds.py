"""The attention kinds, each declared once: a name, a label and its point in the space of parts
(:mod:`difftransformer.layers.parts`). Everything else about a kind is derived from its parts: the layer that
builds it, what it keeps in float32, its checkpoint names, its tensor-parallel entries, its maps, its parameter
matching against the softmax baseline (models/matching.py), its FLOPs (models/flops.py) and how vLLM serves it.

Plain data, no torch: the configuration file a saved folder carries holds this module (models/remote_code.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from difftransformer.layers.parts import AttentionParts


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
