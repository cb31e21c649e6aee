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
from typing import Any, TypeVar

from difftransformer.errors import UsageError

T = TypeVar("T")


def option(default: Any, help: str) -> Any:
    """One setting of an options dataclass: its default and its help. A list default is copied per instance."""
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def at_least(options: Any, minimum: float, *names: str) -> None:
    """Refuse a field below ``minimum`` (None, an unset optional, passes); every number of a list field is
    checked."""
    for name in names:
        value = getattr(options, name)
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is not None and item < minimum:
                raise UsageError(f"`{name}` must be >= {minimum}; got {value}")


def not_empty(options: Any, *names: str) -> None:
    """Refuse an empty list field (None, an unset optional list, passes)."""
    for name in names:
        value = getattr(options, name)
        if value is not None and len(value) == 0:
            raise UsageError(f"`{name}` must hold at least one value; got none")


def with_settings(options: T | None, defaults: type[T], settings: dict[str, Any]) -> T:
    """``options`` (or ``defaults()``) with the keyword ``settings`` replaced: what lets a ``run_<task>`` function
    take either an options object or its fields as keywords. An unknown name is a UsageError naming the known
    ones."""
    known = [f.name for f in dataclasses.fields(defaults)]
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise UsageError(
            f"{defaults.__name__} has no setting {', '.join(unknown)}; its settings are {', '.join(known)}"
        )
    base = defaults() if options is None else options
    return dataclasses.replace(base, **settings) if settings else base


def to_json(options: Any) -> dict:
    """The options as plain JSON data (tuples become lists), exactly as a result file read back holds them."""
    return json.loads(json.dumps(dataclasses.asdict(options)))
