"""A model's attention written as one string: a kind moved along its parts or other configuration fields,
``KIND(FIELD=VALUE,...)``, e.g. ``diff(subln=none)`` or ``diff_v2(output_gate=elementwise)`` (layers/parts.py names
the part fields). The one spelling ``compare --variants``, ``plan --kinds`` and ``bench --kinds`` take."""

from __future__ import annotations

import ast
import re

from difftransformer.errors import UsageError
from difftransformer.layers.kinds import KINDS
from difftransformer.models.configuration import ATTENTION_KINDS, DiffTransformerConfig

_COMPOSITION = re.compile(r"^\s*([a-z_0-9]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)
# Fields a composition may not set: they name the kind and the matched shape, which the preset and the parts'
# matching rule decide.
FIXED_FIELDS = frozenset(
    {
        "attention",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
    }
)


def split_top_level(text: str) -> list[str]:
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


def parse_composition(text: str, noun: str = "variant") -> tuple[str, dict]:
    """'diff(subln=none,lambda_init=0.8)' -> ('diff', {'subln': 'none', 'lambda_init': 0.8}); UsageError, naming
    the text as a ``noun``, for anything else."""
    match = _COMPOSITION.match(text)
    if not match or match.group(1) not in ATTENTION_KINDS:
        raise UsageError(
            f"a {noun} is KIND or KIND(FIELD=VALUE,...) with KIND one of {', '.join(ATTENTION_KINDS)}; got {text!r}"
        )
    kind, body = match.group(1), match.group(2)
    overrides = {}
    for item in split_top_level(body or ""):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"{noun} {text!r}: each override is FIELD=VALUE; got {item!r}")
        if key in FIXED_FIELDS:
            raise UsageError(
                f"{noun} {text!r}: {key} is set by the preset and the matched-shape rule and cannot be overridden"
            )
        if key not in DiffTransformerConfig.__dataclass_fields__ and not hasattr(DiffTransformerConfig, key):
            raise UsageError(f"{noun} {text!r}: {key!r} is not a DiffTransformerConfig field")
        if key in overrides:
            raise UsageError(f"{noun} {text!r}: {key} given twice")
        overrides[key] = _value(value.strip())
    return kind, overrides


def composition_label(kind: str, overrides: dict) -> str:
    """Its name in reports and tables: the kind's label and the fields set, e.g. "DIFF V2 (output_gate=elementwise)"."""
    base = KINDS[kind].label
    if not overrides:
        return base
    return f"{base} ({', '.join(f'{key}={value}' for key, value in overrides.items())})"


def composition_spec(kind: str, overrides: dict) -> str:
    """The text that parses back to ``kind`` with ``overrides``."""
    if not overrides:
        return kind
    return f"{kind}({','.join(f'{key}={value}' for key, value in overrides.items())})"
