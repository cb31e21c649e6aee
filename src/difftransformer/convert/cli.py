"""`difftransformer convert`: our models to and from their native transformers counterparts (DIFF V1 <->
DiffLlama, the softmax baseline <-> Llama), tokenizer files carried along. DIFF V2 has no native counterpart."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from difftransformer.convert.diffllama import from_diffllama, to_diffllama
from difftransformer.convert.llama import from_llama, to_llama
from difftransformer.models import DiffTransformerForCausalLM

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


def configure(parser: argparse.ArgumentParser) -> None:
    """One conversion direction (DiffLlama or Llama, to or from), the output folder and the rotary style."""
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument(
        "--from-diffllama", metavar="DIR", help="a saved DiffLlamaForCausalLM to convert to our DIFF V1"
    )
    direction.add_argument(
        "--to-diffllama", metavar="DIR", help="a saved DIFF V1 model of ours to convert to DiffLlama"
    )
    direction.add_argument(
        "--from-llama", metavar="DIR", help="a saved LlamaForCausalLM to convert to our softmax model"
    )
    direction.add_argument(
        "--to-llama",
        metavar="DIR",
        help="a saved softmax model of ours (a comparison's baseline) to convert to LlamaForCausalLM; "
        "DIFF V2 has no native counterpart (its folder loads with trust_remote_code=True)",
    )
    parser.add_argument(
        "--output-dir", required=True, help="where the converted model (safetensors) is written"
    )
    parser.add_argument(
        "--rope-style",
        choices=("half", "interleaved"),
        default="half",
        help="rotary pairing of the converted model (with --from-diffllama / --from-llama; both are exact)",
    )


def run(args: argparse.Namespace) -> int:
    """Convert the given folder and save the result (with the source's tokenizer files) to --output-dir."""
    source = Path(args.from_diffllama or args.to_diffllama or args.from_llama or args.to_llama)
    if args.from_diffllama:
        converted = from_diffllama(source, rope_style=args.rope_style)
    elif args.from_llama:
        converted = from_llama(source, rope_style=args.rope_style)
    else:
        if not (source / "config.json").is_file():
            raise FileNotFoundError(f"{source} is not a saved model folder (no config.json)")
        ours = DiffTransformerForCausalLM.from_pretrained(source, dtype="auto")
        converted = to_diffllama(ours) if args.to_diffllama else to_llama(ours)
    output = Path(args.output_dir)
    converted.save_pretrained(output)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, output / name)
    print(f"wrote {type(converted).__name__} to {output}")
    return 0
