"""``difftransformer lm-eval``: lm-evaluation-harness's own command line on our folders, ``trust_remote_code=True``
added to its model arguments. The forwarding is :func:`difftransformer.eval.harness.run_lm_eval_command`'s."""

from __future__ import annotations

import argparse
import sys

from difftransformer.eval.harness import require_lm_eval, run_lm_eval_command


def configure(parser: argparse.ArgumentParser) -> None:
    """Every argument is lm-eval's, ``--help`` included: this parser recognises no option of its own."""
    parser.description = (
        "lm-evaluation-harness's own command line on our folders, trust_remote_code=True added to --model_args; "
        "e.g. difftransformer lm-eval --model_args pretrained=runs/demo/diff --tasks hellaswag. "
        "`difftransformer lm-eval --help` shows lm-eval's options."
    )
    parser.prefix_chars = "\0"
    parser.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="lm-eval's arguments")


def run(args: argparse.Namespace) -> int:
    """Run lm-eval's command line and return its exit status; without lm-eval, say how to install it (exit 2)."""
    try:
        require_lm_eval()
    except ImportError as err:
        print(f"difftransformer lm-eval: error: {err}", file=sys.stderr)
        return 2
    return run_lm_eval_command(args.lm_eval_args)
