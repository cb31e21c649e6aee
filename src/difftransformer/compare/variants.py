"""The models a comparison trains: an attention kind plus optional config overrides, e.g. ``diff(subln=none)`` or a
composition of parts, ``diff_v2(output_gate=elementwise)`` (the part fields of layers/parts.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from difftransformer.errors import UsageError
from difftransformer.models import DiffTransformerConfig, matched_config
from difftransformer.models.compositions import (
    composition_label,
    composition_spec,
    parse_composition,
    split_top_level,
)

BASELINE = "softmax"


@dataclass(frozen=True)
class Variant:
    """One model of a comparison: the attention kind and config fields set on top of the preset's model.

    ``label`` names it in reports ("DIFF (subln=none)"), ``slug`` in folder names ("diff-subln-none").
    """

    kind: str
    overrides: dict = field(default_factory=dict, hash=False)

    @property
    def label(self) -> str:
        return composition_label(self.kind, self.overrides)

    @property
    def slug(self) -> str:
        parts = [self.kind] + [f"{key}-{value}" for key, value in self.overrides.items()]
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(str(p) for p in parts))

    @property
    def is_baseline(self) -> bool:
        return self.kind == BASELINE and not self.overrides

    def config(self, base: DiffTransformerConfig) -> DiffTransformerConfig:
        """``base`` (the preset's model of this kind) with the overrides applied: the kind moved along the parts they
        set and matched again to the baseline by the parts' rule (models/matching.py), so ``gda_ratio`` or
        ``map_layout`` reshape the heads. A value the config refuses is a UsageError naming this variant."""
        if not self.overrides:
            return base
        try:
            return matched_config(base.matched_baseline(), self.kind, **self.overrides)
        except (TypeError, ValueError) as err:
            raise UsageError(f"variant {self.spec()}: {err}") from err

    def spec(self) -> str:
        """The text that parses back to this variant."""
        return composition_spec(self.kind, self.overrides)


def parse_variant(text: str) -> Variant:
    """'diff(subln=none,lambda_init=0.8)' -> Variant('diff', {'subln': 'none', 'lambda_init': 0.8})."""
    return Variant(*parse_composition(text))


def parse_variants(text: str) -> list[Variant]:
    """'diff,diff(subln=none),diff_v2,softmax' -> the variants, distinct, in the given order."""
    variants = [parse_variant(item) for item in split_top_level(text)]
    specs = [v.spec() for v in variants]
    if not variants or len(set(specs)) != len(specs):
        raise UsageError(f"`variants` must list distinct variants; got {text!r}")
    return variants


def baseline_of(variants: list[Variant] | tuple[Variant, ...]) -> Variant | None:
    """The matched baseline among ``variants`` (plain ``softmax``), or None when the comparison has none."""
    return next((v for v in variants if v.is_baseline), None)
