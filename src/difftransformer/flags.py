"""Command-line flags from a dataclass: every setting declared once, as a field, and its flag derived from it.

:func:`add_flags` adds one flag per field of a dataclass to a parser, as transformers' ``HfArgumentParser`` derives
them (``--name`` and ``--name-with-dashes``, help from the field's ``metadata``, choices from a ``Literal`` or an
enum, ``--no-X`` for a field true by default), with what our commands need on top: fields left out, fields whose
default comes from elsewhere (a preset), defaults left out of the parsed values so that the command knows what the
user gave, list and tuple fields that also take comma-separated values, a field's own parser of a word
(``metadata={"parse": ...}``), and optional booleans given bare. :func:`given` reads back, from the parsed values
as a mapping (``vars(args)``), the fields the command line set. :func:`flag_spellings` says which flag sets which
field in a parsed command line: the ``difftransformer`` command names flags, not fields, in its error messages.

Every command builds its options with it: ``train``, ``compare`` and ``plan`` for transformers'
``TrainingArguments`` and our training options (:mod:`difftransformer.train.settings`), ``eval`` for each task's
options dataclass (:mod:`difftransformer.eval.options`), ``prepare``, ``bench``, ``convert`` and ``generate`` for
theirs.

argparse offers no public way to add another parser's actions to an existing parser, to list a parser's actions
or to find its sub-commands; this module is the one place that uses argparse's private ``_actions``,
``_add_container_actions`` (what ``parents=`` does) and ``_SubParsersAction`` for that, and
``tests/test_flags.py`` checks that they still behave so.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from difftransformer.errors import UsageError

if TYPE_CHECKING:
    import torch

__all__ = ["add_flags", "flag", "flag_spellings", "given", "integer_pairs", "torch_device"]

# Our own keys of a field's ``metadata`` (HfArgumentParser hands every other key to ``add_argument``): a function
# reading one command-line word, and one writing the default as the help shows it.
PARSE = "parse"
SHOW = "show"


def flag(name: str) -> str:
    """The command-line flag of the field ``name``: ``needle_digits`` -> ``--needle-digits``."""
    return "--" + name.replace("_", "-")


INT64 = (-(2**63), 2**63 - 1)


def integer(text: str) -> int:
    """An argparse type: an integer within int64, the widest that torch, NumPy and the kernels take (argparse
    says "invalid integer value" for a word that is no integer, and what the range is for one beyond it)."""
    value = int(text)
    if not INT64[0] <= value <= INT64[1]:
        raise argparse.ArgumentTypeError(f"{text} lies beyond the integers a flag takes, [-2**63, 2**63 - 1]")
    return value


def number(text: str) -> float:
    """An argparse type: a finite float (argparse says "invalid number value" for nan or inf)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not finite")
    return value


# The types HfArgumentParser gives numeric fields, and ours in their place.
_BOUNDED_TYPES = {int: integer, float: number}


def torch_device(value: str, field: str = "device") -> torch.device:
    """The torch device a ``device`` option names; a UsageError naming ``field`` for a name torch does not know or
    a CUDA device on a machine without one (checked before any model is built)."""
    import torch  # not at the top: most flags need no torch

    try:
        device = torch.device(value)
    except RuntimeError as err:
        raise UsageError(f"`{field}` must name a torch device such as cpu or cuda; got {value!r}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"`{field}` {value}: CUDA is not available on this machine (torch {torch.__version__})"
        )
    return device


def _items(kind: Callable[[str], Any]) -> Callable[[str], list]:
    """An argparse type reading one command-line word as comma-separated ``kind`` values."""

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",")]
        if text.strip() and not all(items):
            raise argparse.ArgumentTypeError(f"{text!r} holds an empty value between commas")
        return [kind(item) for item in items if item]

    parse.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its "invalid" message
    return parse


def _choice(choices: tuple) -> Callable[[str], Any]:
    """An argparse type accepting one of ``choices`` (the values of a ``Literal``), for each item of a list flag
    (argparse's own ``choices`` would compare the whole list of a comma-separated word)."""

    def choice(text: str) -> Any:
        for value in choices:
            if text == str(value):
                return value
        raise argparse.ArgumentTypeError(
            f"invalid choice {text!r} (choose from {', '.join(map(str, choices))})"
        )

    return choice


def _list_choices(hint: Any) -> tuple | None:
    """The choices of a list (or tuple) field of ``Literal`` values, or None."""
    listed = _as_list(hint)
    args = typing.get_args(listed)
    if type(None) in args:
        listed = next(arg for arg in args if arg is not type(None))
    if typing.get_origin(listed) is not list:
        return None
    (element,) = typing.get_args(listed)
    return typing.get_args(element) if typing.get_origin(element) is typing.Literal else None


def _word(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A field's own parser as an argparse type: a ValueError it raises (a UsageError is one) is argparse's
    "invalid value" message, saying what was wrong."""

    def read(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return read


def integer_pairs(text: str, field: str, example: str) -> list[tuple[int, int]]:
    """A flag word of A:B integer pairs separated by commas, ``'1:1,4:2'`` -> ``[(1, 1), (4, 2)]``; a UsageError
    naming ``field`` with ``example`` for anything else."""
    pairs = []
    for item in text.split(","):
        try:
            first, second = (int(part) for part in item.split(":"))
        except ValueError as err:
            raise UsageError(
                f"`{field}` must be pairs separated by commas (e.g. {example}); got {text!r}"
            ) from err
        pairs.append((first, second))
    return pairs


class _ExtendItems(argparse.Action):
    """A list flag whose words each hold several values (comma-separated, or as the field's parser reads them):
    the first use replaces the default, a repeated flag adds to the values (``--documents A --documents B``)."""

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


def _as_list(hint: Any) -> Any:
    """``tuple[X, ...]`` (or an optional one) as ``list[X]``: HfArgumentParser reads lists, not tuples."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return list[args[0]]
    if type(None) in args and len(args) == 2:
        inner = next(arg for arg in args if arg is not type(None))
        listed = _as_list(inner)
        return hint if listed is inner else listed | None
    return hint


def _flag_fields(dataclass_type: type, exclude: Collection[str], title: str | None) -> type:
    """A dataclass with the flagged fields of ``dataclass_type`` alone (``exclude`` left out), tuple fields as
    lists and our own metadata keys removed, its flags grouped under ``title`` (default: the dataclass's
    ``_argument_group_name``): what HfArgumentParser reads."""
    hints = typing.get_type_hints(dataclass_type)
    fields = []
    for f in dataclasses.fields(dataclass_type):
        if not f.init or f.name in exclude:
            continue
        metadata = {key: value for key, value in f.metadata.items() if key not in (PARSE, SHOW)}
        spec = dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=metadata)
        fields.append((f.name, _as_list(hints[f.name]), spec))
    flagged = dataclasses.make_dataclass(dataclass_type.__name__, fields, kw_only=True)
    title = title or getattr(dataclass_type, "_argument_group_name", None)
    if title:
        flagged._argument_group_name = title
    return flagged


def add_flags(
    parser: argparse.ArgumentParser,
    dataclass_type: type,
    *,
    exclude: Collection[str] = (),
    preset_fields: Collection[str] = (),
    only_given: bool = False,
    list_items: bool = False,
    title: str | None = None,
) -> None:
    """Add one flag per field of ``dataclass_type`` to ``parser``, as transformers' ``HfArgumentParser`` derives
    them, in one argument group per dataclass (titled ``title``, or the dataclass's ``_argument_group_name``; its
    help lists each flag with its help text). An optional boolean (``--bf16``) may
    be given bare, meaning true. A field whose metadata holds ``"parse"`` (a function of one command-line word)
    reads its words with it; for a list or tuple field it returns the list of values one word gives. With
    ``only_given``, the help shows each default that is not None, written by the field's ``"show"`` function
    when it has one (a None default is the help's to explain).

    Args:
        parser: where the flags go.
        dataclass_type: the dataclass whose fields become flags.
        exclude: fields that get no flag (the command sets them otherwise).
        preset_fields: fields whose default is a preset's: left out of the parsed values unless given, their help
            saying "(default: the preset's)".
        only_given: leave every field's default out of the parsed values (the help shows it), so that
            :func:`given` tells what the user gave.
        list_items: a list or tuple field also takes comma-separated values (``--depths 0 0.5`` or
            ``--depths 0,0.5``), and a repeated flag adds to them.
        title: the title of the flags' group in the help.
    """
    defaults = _field_defaults(dataclass_type) if only_given else {}
    parsers = {f.name: f.metadata[PARSE] for f in dataclasses.fields(dataclass_type) if PARSE in f.metadata}
    shows = {f.name: f.metadata[SHOW] for f in dataclasses.fields(dataclass_type) if SHOW in f.metadata}
    hints = typing.get_type_hints(dataclass_type)
    choices = {name: found for name, hint in hints.items() if (found := _list_choices(hint))}
    source = HfArgumentParser(_flag_fields(dataclass_type, exclude, title), add_help=False)
    for action in source._actions:
        # The dashed spelling first: argparse's usage line and messages show it.
        action.option_strings.sort(key=lambda option: "_" in option)
        if action.type is string_to_bool and action.nargs is None:
            action.nargs, action.const = "?", True
        if only_given:
            default = defaults.get(action.dest)
            if default is not None and not action.option_strings[0].startswith("--no"):
                shown = shows.get(action.dest, _shown)(default)
                action.help = f"{action.help or ''} (default: {shown})".strip()
            action.default = argparse.SUPPRESS
        elif action.dest in preset_fields:
            action.default = argparse.SUPPRESS
            action.help = f"{action.help or ''} (default: the preset's)".strip()
        action.type = _BOUNDED_TYPES.get(action.type, action.type)
        if action.dest in choices:
            action.type, action.metavar = (
                _choice(choices[action.dest]),
                "{" + ",".join(choices[action.dest]) + "}",
            )
        if action.dest in parsers:
            action.type = _word(parsers[action.dest])
        if action.nargs == "+" and (list_items or action.dest in parsers):
            if action.dest not in parsers:
                action.type = _items(action.type)
            action.__class__ = _ExtendItems  # the same action, reading several values per word
    parser._add_container_actions(source)  # what argparse's ``parents=`` does


def _shown(value: Any) -> Any:
    """A default as the help shows it: a tuple as the list it is given as."""
    return list(value) if isinstance(value, tuple) else value


def given(values: Mapping[str, Any], dataclass_type: type) -> dict[str, Any]:
    """The fields of ``dataclass_type`` among the parsed ``values`` (``vars(args)``): every field with a flag,
    except those whose default :func:`add_flags` left out and the command line did not give. A tuple field's
    values come as a tuple."""
    hints = typing.get_type_hints(dataclass_type)
    found = {}
    for f in dataclasses.fields(dataclass_type):
        if f.name not in values:
            continue
        value = values[f.name]
        if isinstance(value, list) and _as_list(hints[f.name]) != hints[f.name]:
            value = tuple(value)
        found[f.name] = value
    return found


def flag_spellings(parser: argparse.ArgumentParser, values: argparse.Namespace) -> dict[str, str]:
    """``{field: flag}`` for the command ``values`` were parsed from by ``parser``: every option of the parser and
    of the sub-commands ``values`` chose (``eval needle``), each under its dashed spelling (``--num-pairs``; a
    ``--no-X`` complement of a boolean field never)."""
    spellings: dict[str, str] = {}
    current: argparse.ArgumentParser | None = parser
    while current is not None:
        chosen = None
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(values, action.dest, None))
            elif action.option_strings and action.dest not in spellings:  # a --no-X complement comes second
                names = [s for s in action.option_strings if s.startswith("--")] or action.option_strings
                spellings[action.dest] = next((s for s in names if "_" not in s), names[0])
        current = chosen
    return spellings
