"""``difftransformer generate``: continue a prompt with a trained model folder (greedy or sampled), printing the
prompt and its continuation. The work is :mod:`difftransformer.generate`'s."""

from __future__ import annotations

import argparse
import sys

from difftransformer.generate import check_sampling, generate_text, load_for_generation


def configure(parser: argparse.ArgumentParser) -> None:
    """``generate``'s options."""
    parser.add_argument(
        "model", help="a trained run folder (or checkpoint-N folder) holding config, weights and tokenizer"
    )
    parser.add_argument("--prompt", help="text to continue (default: read standard input)")
    parser.add_argument("--max-new-tokens", type=int, default=100, help="tokens to generate (default: 100)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature; 0 decodes greedily (default: 0)",
    )
    parser.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely tokens")
    parser.add_argument(
        "--top-p", type=float, default=None, help="sample from the smallest set with this much mass"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for sampling (default: 0)")
    parser.add_argument(
        "--tokenizer", help="tokenizer folder, when the model folder has none (e.g. a checkpoint-N folder)"
    )


def run(args: argparse.Namespace) -> int:
    """Check the options, load the folder, continue the prompt (or standard input), print prompt and
    continuation."""
    sampling = dict(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p
    )
    check_sampling(**sampling)  # before anything is loaded
    model, tokenizer = load_for_generation(args.model, args.tokenizer)
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    print(prompt + generate_text(model, tokenizer, prompt, **sampling, seed=args.seed))
    return 0
