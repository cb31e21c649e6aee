"""`difftransformer generate`: continue a prompt with a trained model folder (greedy or sampled)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

import difftransformer  # noqa: F401  (registers the "difftransformer" model type with the Auto classes)


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


def check(args: argparse.Namespace) -> None:
    """Refuse bad options (a ValueError naming the flag) before anything is loaded."""
    if not (Path(args.model) / "config.json").is_file():
        raise ValueError(f"model must be a folder with config.json (a trained run); got {args.model!r}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1; got {args.max_new_tokens}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0; got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1; got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1]; got {args.top_p}")


def generate_text(
    model,
    tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 100,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
) -> str:
    """The prompt's continuation (without the prompt): greedy at ``temperature`` 0, else sampled (optionally among
    the ``top_k`` most likely tokens or the ``top_p`` nucleus) from ``seed``."""
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    if ids.shape[1] == 0:
        ids = torch.tensor([[tokenizer.eos_token_id]])
    sample = temperature > 0
    options = dict(do_sample=sample, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.eos_token_id)
    if sample:
        options.update(temperature=temperature, top_k=top_k or 0, top_p=top_p or 1.0)
    set_seed(seed)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def run(args: argparse.Namespace) -> int:
    """Load the folder, continue the prompt (or standard input), print prompt and continuation."""
    check(args)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True).eval()
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    continuation = generate_text(
        model, tokenizer, prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed,
    )  # fmt: skip
    print(prompt + continuation)
    return 0
