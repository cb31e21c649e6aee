"""``difftransformer generate``: continue a prompt with a trained model folder (greedy or sampled), printing the
prompt and its continuation. The options are :class:`~difftransformer.generate.GenerationSettings`' fields; the
work is :mod:`difftransformer.generate`'s. Every option, the folder's config and tokenizer, and the prompt's length
against the model's context are checked before the weights are read."""

from __future__ import annotations

import argparse
import sys

from difftransformer.flags import add_flags, given
from difftransformer.generate import (
    GenerationSettings,
    check_context,
    generate_text,
    load_for_generation,
    load_model,
    prompt_ids,
)


def configure(parser: argparse.ArgumentParser) -> None:
    """``generate``'s options: the model folder, then :class:`GenerationSettings`."""
    parser.add_argument(
        "model", help="a trained run folder (or checkpoint-N folder) holding config, weights and tokenizer"
    )
    add_flags(parser, GenerationSettings, only_given=True)


def run(args: argparse.Namespace) -> int:
    """Check the options, the folder and the prompt's length, load the weights, continue the prompt (or standard
    input), print prompt and continuation."""
    settings = GenerationSettings(**given(vars(args), GenerationSettings))
    config, tokenizer = load_for_generation(args.model, settings.tokenizer)
    prompt = settings.prompt if settings.prompt is not None else sys.stdin.read()
    check_context(config, prompt_ids(tokenizer, prompt).shape[1], settings)
    model = load_model(args.model)
    print(prompt + generate_text(model, tokenizer, prompt, settings))
    return 0
