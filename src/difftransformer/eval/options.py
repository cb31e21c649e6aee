"""A task's options, declared once: one frozen dataclass per task, from which come its command-line flags
(:func:`difftransformer.flags.add_flags`), its checks (the dataclass's ``__post_init__``), its light settings for a
comparison (``dataclasses.replace`` of the defaults) and the JSON that compare compares to reuse a result.

A setting is one line, e.g. ``samples: int = option(50, "samples per cell")``: the field name is the options'
keyword and, with dashes, its flag (``--samples``, :func:`difftransformer.flags.flag`); the help text is the field's
``metadata``. A refusal names the field in backticks (``"`samples` must be >= 1; got 0"``), which the command layer
writes as its flag. ``difftransformer eval`` adds the flags with ``only_given`` (a default left unset is fitted to
the model) and ``list_items``: a list-valued field takes its values space- or comma-separated (``--depths 0 0.5`` or
``--depths 0,0.5``), and a repeated flag adds to them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from difftransformer.errors import UsageError, check_seed

# The most samples, sequences, windows, items or orderings an option may ask for: a million is more than any of
# these measures needs (their spread shrinks as one over the square root of the count) and days of work; a typo
# such as 1e12 is refused before any instead of running for years.
MOST = 10**6


def option(default: Any, help: str) -> Any:
    """One setting of an options dataclass: its default and its help. A list default is copied per instance."""
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def _values(options: Any, name: str) -> list:
    """A field's numbers: the items of a list field, else the value itself (None, an unset optional: none)."""
    value = getattr(options, name)
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def at_least(options: Any, minimum: float, *names: str) -> None:
    """Refuse a field below ``minimum`` (None, an unset optional, passes); every number of a list field is
    checked."""
    for name in names:
        if any(item < minimum for item in _values(options, name)):
            raise UsageError(f"`{name}` must be >= {minimum}; got {getattr(options, name)}")


def at_most(options: Any, maximum: float, *names: str) -> None:
    """Refuse a field above ``maximum`` (None passes); every number of a list field is checked."""
    for name in names:
        if any(item > maximum for item in _values(options, name)):
            raise UsageError(f"`{name}` must be <= {maximum}; got {getattr(options, name)}")


def counts(options: Any, *names: str) -> None:
    """Refuse a count (of samples, sequences, windows, ...) outside [1, :data:`MOST`]."""
    at_least(options, 1, *names)
    at_most(options, MOST, *names)


def not_empty(options: Any, *names: str) -> None:
    """Refuse an empty list field (None, an unset optional list, passes)."""
    for name in names:
        value = getattr(options, name)
        if value is not None and len(value) == 0:
            raise UsageError(f"`{name}` must hold at least one value; got none")


def distinct(options: Any, *names: str) -> None:
    """Refuse a list field that repeats a value (a repeated setting would be run twice)."""
    for name in names:
        values = _values(options, name)
        if len(set(values)) != len(values):
            raise UsageError(f"`{name}` must hold distinct values; got {getattr(options, name)}")


def seeded(options: Any) -> None:
    """Refuse a ``seed`` that NumPy, torch and Python's random cannot all take."""
    check_seed(options.seed)


def to_json(options: Any) -> dict:
    """The options as plain JSON data (tuples become lists), exactly as a result file read back holds them."""
    return json.loads(json.dumps(dataclasses.asdict(options)))
