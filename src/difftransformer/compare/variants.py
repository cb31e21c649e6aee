"""The models a comparison trains: an attention kind plus optional config overrides, e.g. ``diff(subln=none)`` or a
composition of parts, ``diff_v2(output_gate=elementwise)`` (the part fields of layers/parts.py)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from difftransformer.errors import UsageError
from difftransformer.models import ATTENTION_KINDS, KINDS, DiffTransformerConfig, matched_config

KIND_LABELS = {name: kind.label for name, kind in KINDS.items()}
BASELINE = "softmax"
_VARIANT = re.compile(r"^\s*([a-z_0-9]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)
# Fields a variant may not override: they define the kind and the matched shape, which the preset decides.
_FIXED = {
    "attention",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
}


@dataclass(frozen=True)
class Variant:
    """One model of a comparison: the attention kind and config fields set on top of the preset's model.

    ``label`` names it in reports ("DIFF (subln=none)"), ``slug`` in folder names ("diff-subln-none").
    """

    kind: str
    overrides: dict = field(default_factory=dict, hash=False)

    @property
    def label(self) -> str:
        base = KIND_LABELS[self.kind]
        if not self.overrides:
            return base
        return f"{base} ({', '.join(f'{key}={value}' for key, value in self.overrides.items())})"

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
        if not self.overrides:
            return self.kind
        return f"{self.kind}({','.join(f'{key}={value}' for key, value in self.overrides.items())})"


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    items, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise UsageError(f"unbalanced ')' in {text!r}")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise UsageError(f"unbalanced '(' in {text!r}")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_variant(text: str) -> Variant:
    """'diff(subln=none,lambda_init=0.8)' -> Variant('diff', {'subln': 'none', 'lambda_init': 0.8})."""
    match = _VARIANT.match(text)
    if not match or match.group(1) not in ATTENTION_KINDS:
        raise UsageError(
            f"a variant is KIND or KIND(FIELD=VALUE,...) with KIND one of {', '.join(ATTENTION_KINDS)}; got {text!r}"
        )
    kind, body = match.group(1), match.group(2)
    overrides = {}
    for item in _split_top_level(body or ""):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"variant {text!r}: each override is FIELD=VALUE; got {item!r}")
        if key in _FIXED:
            raise UsageError(
                f"variant {text!r}: {key} is set by the preset and the matched-shape rule and cannot be overridden"
            )
        if key not in DiffTransformerConfig.__dataclass_fields__ and not hasattr(DiffTransformerConfig, key):
            raise UsageError(f"variant {text!r}: {key!r} is not a DiffTransformerConfig field")
        if key in overrides:
            raise UsageError(f"variant {text!r}: {key} given twice")
        overrides[key] = _value(value.strip())
    return Variant(kind, overrides)


def parse_variants(text: str) -> list[Variant]:
    """'diff,diff(subln=none),diff_v2,softmax' -> the variants, distinct, in the given order."""
    variants = [parse_variant(item) for item in _split_top_level(text)]
    specs = [v.spec() for v in variants]
    if not variants or len(set(specs)) != len(specs):
        raise UsageError(f"`variants` must list distinct variants; got {text!r}")
    return variants


def baseline_of(variants: list[Variant] | tuple[Variant, ...]) -> Variant | None:
    """The matched baseline among ``variants`` (plain ``softmax``), or None when the comparison has none."""
    return next((v for v in variants if v.is_baseline), None)
