"""Command-line flags from a dataclass: every setting declared once, as a field, and its flag derived from it.

:func:`add_flags` adds one flag per field of a dataclass to a parser, as transformers' ``HfArgumentParser`` derives
them (``--name`` and ``--name-with-dashes``, help from the field's ``metadata``, choices from a ``Literal`` or an
enum, ``--no-X`` for a field true by default), with what our commands need on top: fields left out, fields whose
default comes from elsewhere (a preset), defaults left out of the parsed values so that the command knows what the
user gave, list fields that also take comma-separated values, and optional booleans given bare. :func:`given`
reads back, from the parsed values as a mapping (``vars(args)``), the fields the command line set.

``train``, ``compare`` and ``plan`` use it for transformers' ``TrainingArguments`` and our training options
(:mod:`difftransformer.train.settings`); ``eval`` for each task's options dataclass
(:mod:`difftransformer.eval.options`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

__all__ = ["add_flags", "flag", "given"]


def flag(name: str) -> str:
    """The command-line flag of the field ``name``: ``needle_digits`` -> ``--needle-digits``."""
    return "--" + name.replace("_", "-")


def _items(kind: Callable[[str], Any]) -> Callable[[str], list]:
    """An argparse type reading one command-line word as comma-separated ``kind`` values."""

    def parse(text: str) -> list:
        return [kind(item.strip()) for item in text.split(",") if item.strip()]

    parse.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its "invalid" message
    return parse


class _ExtendItems(argparse.Action):
    """A list flag whose words each hold comma-separated values (see :func:`_items`): the first use replaces the
    default, a repeated flag adds to the values (``--documents A --documents B``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is None or current is self.default else list(current)
        items.extend(item for word in values for item in word)
        setattr(namespace, self.dest, items)


def _field_defaults(dataclass_type: type) -> dict[str, Any]:
    """Each field's default value (fields without one are left out)."""
    defaults = {}
    for f in dataclasses.fields(dataclass_type):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    dataclass_type: type,
    *,
    exclude: Collection[str] = (),
    preset_fields: Collection[str] = (),
    only_given: bool = False,
    list_items: bool = False,
) -> None:
    """Add one flag per field of ``dataclass_type`` to ``parser`` (a parser or an argument group), as transformers'
    ``HfArgumentParser`` derives them, in one argument group per dataclass. An optional boolean (``--bf16``) may
    be given bare, meaning true.

    Args:
        parser: where the flags go.
        dataclass_type: the dataclass whose fields become flags.
        exclude: fields that get no flag (the command sets them otherwise).
        preset_fields: fields whose default is a preset's: left out of the parsed values unless given, their help
            saying "(default: the preset's)".
        only_given: leave every field's default out of the parsed values (the help shows it), so that
            :func:`given` tells what the user gave.
        list_items: a list field also takes comma-separated values (``--depths 0 0.5`` or ``--depths 0,0.5``),
            and a repeated flag adds to them.
    """
    defaults = _field_defaults(dataclass_type) if only_given else {}
    source = HfArgumentParser(dataclass_type, add_help=False)
    for action in source._actions:
        if action.type is string_to_bool and action.nargs is None:
            action.nargs, action.const = "?", True
        if only_given:
            if action.dest in defaults and not action.option_strings[0].startswith("--no"):
                action.help = f"{action.help or ''} (default: {defaults[action.dest]})".strip()
            action.default = argparse.SUPPRESS
        elif action.dest in preset_fields:
            action.default = argparse.SUPPRESS
            action.help = f"{action.help or ''} (default: the preset's)".strip()
        if list_items and action.nargs == "+":
            action.type = _items(action.type)
            action.__class__ = _ExtendItems
    for group in source._action_groups:
        group._group_actions[:] = [a for a in group._group_actions if a.dest not in exclude]
    source._actions[:] = [a for a in source._actions if a.dest not in exclude]
    parser._add_container_actions(source)  # what argparse's ``parents=`` does


def given(values: Mapping[str, Any], dataclass_type: type) -> dict[str, Any]:
    """The fields of ``dataclass_type`` among the parsed ``values`` (``vars(args)``): every field with a flag,
    except those whose default :func:`add_flags` left out and the command line did not give."""
    return {f.name: values[f.name] for f in dataclasses.fields(dataclass_type) if f.name in values}
