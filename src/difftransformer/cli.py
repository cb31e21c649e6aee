"""The ``difftransformer`` command: one sub-command per job, each living beside the code it drives.

Every command module exposes ``configure(parser)`` (adds its options) and ``run(args) -> int``.
Modules are imported only when their command runs, so ``difftransformer --help`` stays fast.

A command module is a file named ``cli.py`` or ending in ``_cli.py`` (``train/plan_cli.py`` beside
``train/plan.py``); only command modules take an ``argparse.Namespace``. Each turns the parsed options into the
keywords or frozen settings dataclasses of the library modules it drives, which know nothing of the command line.

Bad input ends a command in one line on stderr with exit status 2: argparse's own errors, and every
:class:`~difftransformer.errors.UsageError` a command raises. Library code names the field or keyword it refuses in
backticks (``"`num_pairs` must be at least 1; got 0"``); here every backticked name that is a flag of the running
command becomes that flag (``--num-pairs``). Ctrl-C ends any command in one line with exit status 130 (a command
module may say how to continue in ``INTERRUPTED_NOTE``); a command that turns SIGTERM into
:class:`~difftransformer.process_signals.Terminated` (compare, while it holds Ray) ends the same way with 143.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import typing

from tqdm.auto import tqdm

from difftransformer.errors import UsageError
from difftransformer.flags import flag_spellings
from difftransformer.process_signals import was_terminated

COMMANDS: dict[str, tuple[str, str]] = {
    "prepare": (
        "difftransformer.data.cli",
        "fetch the built-in corpus, train a tokenizer, cache packed blocks",
    ),
    "train": ("difftransformer.train.cli", "train a DIFF, DIFF V2 or softmax language model"),
    "plan": ("difftransformer.train.plan_cli", "parameters, memory per device and tokens per step of a run"),
    "generate": ("difftransformer.generate_cli", "continue a prompt with a trained checkpoint"),
    "compare": (
        "difftransformer.compare.cli",
        "train DIFF and its matched baseline alike and write a report",
    ),
    "eval": ("difftransformer.eval.cli", "run one of the paper's experiments on any causal LM checkpoint"),
    "convert": ("difftransformer.convert.cli", "convert to and from transformers' DiffLlama and Llama"),
    "quantize": (
        "difftransformer.convert.quantize_cli",
        "a quantized copy of a model folder (int8, int4, W8A8)",
    ),
    "lm-eval": ("difftransformer.eval.harness_cli", "lm-evaluation-harness's command line on our folders"),
    "bench": ("difftransformer.bench.cli", "benchmark DIFF against its matched baseline and DiffLlama"),
}


BACKTICKED = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (``difftransformer train: error: ...``), exit status 2, and
    which takes a value that starts with a minus sign and a digit (``--length-schedule -1:32``, ``--seeds -1,2``)
    as the value it is, so that the option's own check says what is wrong with it (argparse takes only plain
    negative numbers so, through its private ``_negative_number_matcher``; tests/test_flags.py checks it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\d[\d.,:eE+-]*$|^-\.\d+$")

    def error(self, message: str) -> typing.NoReturn:
        spellings = {
            action.dest: next((s for s in action.option_strings if "_" not in s), action.option_strings[0])
            for action in self._actions
            if action.option_strings
        }  # a flag's own parser names its field, as library code does
        self.exit(
            2, f"{self.prog}: error: {with_flags(one_line(message), spellings)} (see {self.prog} --help)\n"
        )


def one_line(message: str) -> str:
    """``message`` on one line: its lines joined, each stripped."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def with_flags(message: str, spellings: dict[str, str]) -> str:
    """``message`` with every backticked field name that is a flag of the running command (``spellings``, from
    :func:`~difftransformer.flags.flag_spellings`) written as that flag: "`num_pairs`" -> "--num-pairs"."""
    return BACKTICKED.sub(lambda match: spellings.get(match[1], match[0]), message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``difftransformer`` parser: every command listed, only ``command``'s options added."""
    parser = CommandParser(prog="difftransformer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen command's module is imported; the others just list their one-line help.
        if name == command:
            importlib.import_module(module_name).configure(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names; bad input exits with status 2 and a one-line message (argparse's errors by
    ``SystemExit(2)``, as argparse does), Ctrl-C with status 130 and a one-line note (SIGTERM raised as
    :class:`~difftransformer.process_signals.Terminated`: 143)."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and command not in COMMANDS:
        build_parser().error(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
    parser = build_parser(command)
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except UsageError as err:
        # Bad input is the user's to fix: say what was wrong, without a traceback. Anything else is a bug and
        # keeps its traceback.
        message = with_flags(one_line(str(err)), flag_spellings(parser, args))
        print(f"difftransformer {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        note = getattr(module, "INTERRUPTED_NOTE", "")
        terminated = was_terminated(interrupt)
        ended = "terminated" if terminated else "interrupted"
        # tqdm.write: on a line of its own, whatever a progress bar left on the current one.
        tqdm.write(f"difftransformer {args.command}: {ended}{'; ' + note if note else ''}", file=sys.stderr)
        return 143 if terminated else 130


if __name__ == "__main__":
    sys.exit(main())
