"""The ``difftransformer`` command: one sub-command per job, each living beside the code it drives.

Every command module exposes ``configure(parser)`` (adds its options) and ``run(args) -> int``.
Modules are imported only when their command runs, so ``difftransformer --help`` stays fast.

A command module is a file named ``cli.py`` or ending in ``_cli.py`` (``train/plan_cli.py`` beside
``train/plan.py``); only command modules take an ``argparse.Namespace``. Each turns the parsed options into the
keywords or frozen settings dataclasses of the library modules it drives, which know nothing of the command line.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from difftransformer.errors import UsageError

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
    "lm-eval": ("difftransformer.eval.harness_cli", "lm-evaluation-harness's command line on our folders"),
    "bench": ("difftransformer.bench.cli", "benchmark DIFF against its matched baseline and DiffLlama"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``difftransformer`` parser: every command listed, only ``command``'s options added."""
    parser = argparse.ArgumentParser(prog="difftransformer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen command's module is imported; the others just list their one-line help.
        if name == command:
            importlib.import_module(module_name).configure(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names; bad input exits with status 2 and a one-line message."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and command not in COMMANDS:
        build_parser().error(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
    args = build_parser(command).parse_args(argv)
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except UsageError as err:
        # Bad input is the user's to fix: say what was wrong, without a traceback. Anything else is a bug and
        # keeps its traceback.
        print(f"difftransformer {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
