"""A task's options, declared once: one frozen dataclass per task, from which come its command-line flags
(transformers' ``HfArgumentParser``), its checks (the dataclass's ``__post_init__``), its light settings for a
comparison (``dataclasses.replace`` of the defaults) and the JSON that compare compares to reuse a result.

A setting is one line, e.g. ``samples: int = option(50, "samples per cell")``: the field name is the keyword of
the task's ``run_<task>`` function and, with dashes, its flag (``--samples``); the help text is the field's
``metadata``. A list-valued field takes its values space- or comma-separated (``--depths 0 0.5`` or
``--depths 0,0.5``), and a repeated flag adds to them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from transformers import HfArgumentParser

T = TypeVar("T")


def option(default: Any, help: str) -> Any:
    """One setting of an options dataclass: its default and its help. A list default is copied per instance."""
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def flag(name: str) -> str:
    """The command-line flag of the field ``name``: ``needle_digits`` -> ``--needle-digits``."""
    return "--" + name.replace("_", "-")


def at_least(options: Any, minimum: float, *names: str) -> None:
    """Refuse a field below ``minimum`` (None, an unset optional, passes); every number of a list field is
    checked."""
    for name in names:
        value = getattr(options, name)
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is not None and item < minimum:
                raise ValueError(f"{flag(name)} must be >= {minimum}; got {value}")


def not_empty(options: Any, *names: str) -> None:
    """Refuse an empty list field."""
    for name in names:
        if len(getattr(options, name)) == 0:
            raise ValueError(f"{flag(name)} must hold at least one value; got none")


def with_settings(options: T | None, defaults: type[T], settings: dict[str, Any]) -> T:
    """``options`` (or ``defaults()``) with the keyword ``settings`` replaced: what lets a ``run_<task>`` function
    take either an options object or its fields as keywords. An unknown name is a ValueError naming the known
    ones."""
    known = [f.name for f in dataclasses.fields(defaults)]
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ValueError(
            f"{defaults.__name__} has no setting {', '.join(unknown)}; its settings are {', '.join(known)}"
        )
    base = defaults() if options is None else options
    return dataclasses.replace(base, **settings) if settings else base


def to_json(options: Any) -> dict:
    """The options as plain JSON data (tuples become lists), exactly as a result file read back holds them."""
    return json.loads(json.dumps(dataclasses.asdict(options)))


def _items(kind: Callable[[str], Any]) -> Callable[[str], list]:
    """An argparse type reading one command-line word as comma-separated ``kind`` values."""

    def parse(text: str) -> list:
        return [kind(item.strip()) for item in text.split(",") if item.strip()]

    parse.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its "invalid" message
    return parse


def add_flags(parser: argparse.ArgumentParser, options_type: type, exclude: Iterable[str] = ()) -> None:
    """Add one flag per field of ``options_type`` to ``parser`` as ``HfArgumentParser`` derives them (help from
    the field's metadata, choices from a ``Literal``, ``--no-X`` for a field true by default). Defaults are left
    out of the parsed namespace, so that :func:`given_settings` tells what the user gave; the help shows them.
    Fields in ``exclude`` get no flag (the command line sets them otherwise)."""
    skip = set(exclude)
    defaults = {f.name: getattr(options_type(), f.name) for f in dataclasses.fields(options_type)}
    source = HfArgumentParser(options_type, add_help=False)
    for action in source._actions:
        if action.dest in defaults and not action.option_strings[0].startswith("--no"):
            action.help = f"{action.help} (default: {defaults[action.dest]})"
        action.default = argparse.SUPPRESS
        if action.nargs == "+":
            action.type = _items(action.type)
            action.__class__ = (
                argparse._ExtendAction
            )  # a repeated flag adds values (--documents A --documents B)
    for group in source._action_groups:
        group._group_actions[:] = [a for a in group._group_actions if a.dest not in skip]
    source._actions[:] = [a for a in source._actions if a.dest not in skip]
    parser._add_container_actions(source)  # what argparse's ``parents=`` does


def given_settings(args: argparse.Namespace, options_type: type) -> dict[str, Any]:
    """The fields of ``options_type`` the command line gave (see :func:`add_flags`), list fields flattened from
    their comma-separated words."""
    settings = {}
    for f in dataclasses.fields(options_type):
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            if isinstance(value, list):
                value = [item for word in value for item in word]
            settings[f.name] = value
    return settings
