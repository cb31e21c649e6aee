"""Flags from dataclasses (difftransformer.flags): what HfArgumentParser derives, what we add on top, the argparse
internals we rely on for it, and the command's translation of field names into flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

import pytest

from difftransformer.cli import CommandParser, one_line, with_flags
from difftransformer.flags import INT64, add_flags, flag, flag_spellings, given


def _parse_pair(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in item.split(":")) for item in text.split(",")]


@dataclass(frozen=True)
class Example:
    _argument_group_name = "example"

    num_pairs: int = field(default=4, metadata={"help": "pairs per sequence"})
    rate: float = field(default=0.5, metadata={"help": "a share"})
    lengths: tuple[int, ...] = field(default=(8, 16), metadata={"help": "lengths"})
    sections: tuple[Literal["op", "train"], ...] = field(default=("op",), metadata={"help": "sections"})
    pairs: tuple[tuple[int, int], ...] = field(
        default=((1, 1),),
        metadata={
            "help": "N:R pairs",
            "parse": _parse_pair,
            "show": lambda v: ",".join(f"{n}:{r}" for n, r in v),
        },
    )
    quick: bool = field(default=False, metadata={"help": "a fast run"})
    name: str | None = field(default=None, metadata={"help": "a name (unset: none)"})
    hidden: int = field(default=1, metadata={"help": "set by the command"})


def parser(**options) -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(exit_on_error=False)
    add_flags(result, Example, exclude={"hidden"}, **options)
    return result


def test_only_given_leaves_defaults_out_and_shows_them_in_the_help():
    flags = parser(only_given=True, list_items=True)
    assert given(vars(flags.parse_args([])), Example) == {}
    help_text = " ".join(flags.format_help().split())
    assert "--num-pairs NUM_PAIRS, --num_pairs NUM_PAIRS pairs per sequence (default: 4)" in help_text
    assert "(default: 1:1)" in help_text  # the field's own way of writing its default
    assert "(unset: none)" in help_text and "(default: None)" not in help_text
    assert "example:" in flags.format_help() and "--hidden" not in help_text  # its group; the excluded field


def test_list_and_tuple_fields_take_comma_separated_and_repeated_values():
    flags = parser(only_given=True, list_items=True)
    values = given(
        vars(flags.parse_args(["--lengths", "1,2", "3", "--lengths", "4", "--pairs", "2:1,4:2"])), Example
    )
    assert values == {"lengths": (1, 2, 3, 4), "pairs": ((2, 1), (4, 2))}  # tuple fields come back as tuples
    assert Example(**values).lengths == (1, 2, 3, 4)
    assert given(vars(flags.parse_args(["--sections", "op,train"])), Example) == {"sections": ("op", "train")}
    with pytest.raises(argparse.ArgumentError, match="invalid choice 'bogus'"):
        flags.parse_args(["--sections", "op,bogus"])
    with pytest.raises(argparse.ArgumentError, match="'1,,2' holds an empty value between commas"):
        flags.parse_args(["--lengths", "1,,2"])


def test_numbers_beyond_int64_and_non_finite_floats_are_refused_by_the_parser():
    flags = parser()
    assert flags.parse_args(["--num-pairs", str(INT64[1])]).num_pairs == INT64[1]
    for argv, says in (
        (["--num-pairs", str(INT64[1] + 1)], r"beyond the integers a flag takes, \[-2\*\*63, 2\*\*63 - 1\]"),
        (["--rate", "nan"], "invalid"),
        (["--rate", "1e400"], "invalid"),
        (["--num-pairs", "x"], "invalid"),
    ):
        with pytest.raises(argparse.ArgumentError, match=says):
            flags.parse_args(argv)


def test_a_boolean_may_be_given_bare_and_the_dashed_spelling_comes_first():
    flags = parser()
    assert (
        flags.parse_args(["--quick"]).quick is True and flags.parse_args(["--quick", "false"]).quick is False
    )
    assert flags.parse_args(["--num_pairs", "3"]).num_pairs == 3  # the underscore spelling still works
    usage = flags.format_usage()
    assert "--num-pairs" in usage and "--num_pairs" not in usage


def test_preset_fields_are_left_out_unless_given():
    flags = argparse.ArgumentParser()
    add_flags(flags, Example, preset_fields={"rate"})
    assert "rate" not in vars(flags.parse_args([])) and flags.parse_args(["--rate", "0.1"]).rate == 0.1
    assert "(default: the preset's)" in " ".join(flags.format_help().split())


def test_the_argparse_internals_flags_uses_still_behave():
    # add_flags copies HfArgumentParser's actions into the parser (argparse's _add_container_actions, what
    # parents= does) and reads them back (_actions); flag_spellings walks sub-commands (_SubParsersAction).
    top = argparse.ArgumentParser()
    commands = top.add_subparsers(dest="command")
    sub = commands.add_parser("run")
    add_flags(sub, Example)
    assert isinstance(next(a for a in top._actions if a.dest == "command"), argparse._SubParsersAction)
    assert {"num_pairs", "rate", "quick"} <= {a.dest for a in sub._actions}
    args = top.parse_args(["run", "--num-pairs", "2"])
    spellings = flag_spellings(top, args)
    assert (
        spellings["num_pairs"] == "--num-pairs" and spellings["quick"] == "--quick" and "hidden" in spellings
    )


def test_the_command_names_flags_where_the_library_names_fields():
    spellings = {"num_pairs": "--num-pairs", "output_dir": "--output-dir"}
    message = (
        "`num_pairs` must be >= 1; got 0 (and `length`, which is no flag here); choose another `output_dir`"
    )
    assert with_flags(message, spellings) == (
        "--num-pairs must be >= 1; got 0 (and `length`, which is no flag here); choose another --output-dir"
    )
    assert one_line("first line\n  second line\n\n") == "first line second line"
    assert flag("needle_digits") == "--needle-digits"


def test_argparse_errors_are_one_line_with_exit_status_2(capsys):
    command = CommandParser(prog="difftransformer demo")
    command.add_argument("--count", type=int)
    with pytest.raises(SystemExit) as exit_info:
        command.parse_args(["--count", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "difftransformer demo: error: argument --count: invalid int"
    )


def test_a_value_starting_with_a_minus_sign_and_a_digit_reaches_its_option(capsys):
    # argparse's private _negative_number_matcher, widened by CommandParser: "-1:32" is a value, not an option, so
    # the option's own check says what is wrong with it (and names the flag, not the field)
    command = CommandParser(prog="difftransformer demo")
    add_flags(command, Example, only_given=True, list_items=True)
    assert command.parse_args(["--pairs", "-1:2", "--lengths", "-3,4", "--rate", "-.5"]).pairs == [(-1, 2)]
    assert command.parse_args(["--lengths", "-3,4"]).lengths == [-3, 4]
    with pytest.raises(SystemExit):  # a flag's own parser names its field, as library code does
        command.error("argument --num-pairs: `num_pairs` must be positive")
    assert "argument --num-pairs: --num-pairs must be positive" in capsys.readouterr().err
