"""`difftransformer convert`: DiffLlama checkpoints to ours and back, tokenizer files carried along."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from difftransformer.convert.diffllama import from_diffllama, to_diffllama
from difftransformer.models import DiffTransformerForCausalLM

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


def configure(parser: argparse.ArgumentParser) -> None:
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument(
        "--from-diffllama", metavar="DIR", help="a saved DiffLlamaForCausalLM to convert to ours"
    )
    direction.add_argument(
        "--to-diffllama", metavar="DIR", help="a saved DIFF V1 model of ours to convert to DiffLlama"
    )
    parser.add_argument(
        "--output-dir", required=True, help="where the converted model (safetensors) is written"
    )
    parser.add_argument(
        "--rope-style",
        choices=("half", "interleaved"),
        default="half",
        help="rotary pairing of the converted model (with --from-diffllama; both are exact)",
    )


def run(args: argparse.Namespace) -> int:
    source = Path(args.from_diffllama or args.to_diffllama)
    if args.from_diffllama:
        converted = from_diffllama(source, rope_style=args.rope_style)
    else:
        converted = to_diffllama(DiffTransformerForCausalLM.from_pretrained(source))
    output = Path(args.output_dir)
    converted.save_pretrained(output)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, output / name)
    print(f"wrote {type(converted).__name__} to {output}")
    return 0
