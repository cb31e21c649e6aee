"""One table of attention kinds for the tests: every kind the package declares (layers/kinds.py), matched to one tiny
softmax baseline by the parts' rule (models/matching.py), and the documented compositions of parts
(docs/architecture.md, "Attention as parts"). A test that loops over kinds takes them from here, so a new kind or
composition is tested everywhere at once.

Each entry is the configuration fields on top of :func:`helpers.tiny_config` (d_model 32): the baseline has 8 heads of
width 4 over 4 KV heads, so every kind has grouped KV heads.
"""

from __future__ import annotations

from difftransformer.models import KINDS, PART_FIELDS, matched_config
from helpers import tiny_config

BASELINE = dict(attention="softmax", num_attention_heads=8, num_key_value_heads=4)
# the fields a kind's own table entry sets beyond its name (GDA's ratio: its declared 1 is DIFF V1's shape)
KIND_PARTS = {"gda": dict(gda_ratio=3)}
# the compositions the docs name, each a kind moved along parts; windows small enough to bite on short inputs
COMPOSITION_PARTS = {
    "diff_v2+gate": ("diff_v2", dict(output_gate="elementwise")),
    "grouped": ("diff_v2", dict(gda_ratio=4)),
    "motif-window-3": ("motif", dict(sliding_window=3)),
    "diff-token-lambda": ("diff", dict(lambda_mode="token")),
    "diff-gate-window": ("diff", dict(output_gate="elementwise", sliding_window=4, sliding_window_period=2)),
    "diff_v2-scalar-norm": ("diff_v2", dict(lambda_mode="scalar", subln="affine")),
    "softmax-window": ("softmax", dict(sliding_window=4, sliding_window_period=2)),
    "gda-token-gate": ("gda", dict(gda_ratio=3, lambda_mode="token", output_gate="elementwise")),
}


def matched_fields(kind: str, **parts) -> dict:
    """The fields of ``kind`` with ``parts`` matched to the table's baseline: the kind, its head counts and map
    width, and the parts given."""
    config = matched_config(tiny_config(**BASELINE), kind, **parts)
    fields = dict(
        attention=kind,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
    )
    if config.map_dim is not None:
        fields["map_dim"] = config.map_dim
    return {**fields, **parts}


KIND_FIELDS: dict[str, dict] = {name: matched_fields(name, **KIND_PARTS.get(name, {})) for name in KINDS}
COMPOSITION_FIELDS: dict[str, dict] = {
    name: matched_fields(kind, **parts) for name, (kind, parts) in COMPOSITION_PARTS.items()
}
ALL_FIELDS: dict[str, dict] = {**KIND_FIELDS, **COMPOSITION_FIELDS}
assert set(PART_FIELDS) >= {p for _, parts in COMPOSITION_PARTS.values() for p in parts}
