"""`difftransformer convert`: our models to and from their native transformers counterparts (DIFF V1 <->
DiffLlama, the softmax baseline <-> Llama), and pretrained softmax models upcycled to DIFF V2 or DIFF V1
(``--from-llama DIR --attention KIND``). The tokenizer files and generation config travel along; the result is
written to a temporary folder moved into place at the end, so a failed conversion leaves nothing behind and never
touches its input."""

from __future__ import annotations

import argparse
from pathlib import Path

from difftransformer.convert.diffllama import from_diffllama, to_diffllama
from difftransformer.convert.folders import (
    ConversionError,
    check_output,
    load_folder,
    model_type,
    save_converted,
)
from difftransformer.convert.llama import to_llama
from difftransformer.convert.upcycle import UPCYCLE_KINDS, load_softmax, upcycle
from difftransformer.errors import MissingInputError
from difftransformer.models import DiffTransformerConfig, DiffTransformerForCausalLM


def configure(parser: argparse.ArgumentParser) -> None:
    """One conversion direction (DiffLlama or Llama, to or from), the output folder, the rotary style and, from a
    Llama, the attention to upcycle to."""
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument(
        "--from-diffllama", metavar="DIR", help="a saved DiffLlamaForCausalLM to convert to our DIFF V1"
    )
    direction.add_argument(
        "--to-diffllama", metavar="DIR", help="a saved DIFF V1 model of ours to convert to DiffLlama"
    )
    direction.add_argument(
        "--from-llama",
        metavar="DIR",
        help="a saved LlamaForCausalLM (any Llama-family folder transformers loads as one) to convert to our "
        "softmax model, or with --attention diff_v2 / diff to upcycle (our own softmax models too)",
    )
    direction.add_argument(
        "--to-llama",
        metavar="DIR",
        help="a saved softmax model of ours (a comparison's baseline) to convert to LlamaForCausalLM; "
        "DIFF V2 has no native counterpart (its folder loads with trust_remote_code=True)",
    )
    parser.add_argument(
        "--output-dir", required=True, help="a new (or empty) folder for the converted model (safetensors)"
    )
    parser.add_argument(
        "--attention",
        choices=UPCYCLE_KINDS,
        default="softmax",
        help="with --from-llama: softmax (the exact import), or diff_v2 / diff: upcycled, computing the same "
        "logits at step 0 with every differential parameter trainable (docs/training.md) (default: softmax)",
    )
    parser.add_argument(
        "--rope-style",
        choices=("half", "interleaved"),
        default="half",
        help="rotary pairing of the converted model (with --from-diffllama / --from-llama; both are exact)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of DIFF V1's upcycled lambda vectors")


def _ours(source: Path, flag: str) -> DiffTransformerForCausalLM:
    """Our model saved in ``source``, refusing a folder of another model type."""
    found = model_type(source)
    if found != DiffTransformerConfig.model_type:
        raise ConversionError(
            f"{flag} converts our own models (model_type 'difftransformer'); {source} holds model_type {found!r}"
            + (
                " (use --from-llama or --from-diffllama to import it)"
                if found in ("llama", "diffllama")
                else ""
            )
        )
    return load_folder(DiffTransformerForCausalLM.from_pretrained, source, dtype="auto")


def run(args: argparse.Namespace) -> int:
    """Convert the given folder and save the result, with the source's tokenizer and generation config, to
    --output-dir."""
    source = Path(args.from_diffllama or args.to_diffllama or args.from_llama or args.to_llama)
    output = Path(args.output_dir)
    if args.attention != "softmax" and not args.from_llama:
        raise ConversionError(
            f"--attention {args.attention} upcycles a --from-llama source; got no --from-llama"
        )
    if not source.is_dir():
        raise MissingInputError(f"{source} is not a saved model folder")
    check_output(source, output)
    if args.from_diffllama:
        converted = from_diffllama(source, rope_style=args.rope_style)
    elif args.from_llama:
        converted = upcycle(load_softmax(source, rope_style=args.rope_style), args.attention, seed=args.seed)
    elif args.to_diffllama:
        converted = to_diffllama(_ours(source, "--to-diffllama"))
    else:
        converted = to_llama(_ours(source, "--to-llama"))
    save_converted(converted, source, output)
    print(f"wrote {type(converted).__name__} to {output}")
    return 0
