"""`difftransformer prepare`: fetch the corpus, train (or load) the tokenizer, and cache the packed blocks."""

from __future__ import annotations

import argparse
from pathlib import Path

from difftransformer.data.blocks import packed_blocks
from difftransformer.data.corpus import SPLITS, CorpusError
from difftransformer.data.files import open_corpus
from difftransformer.data.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from difftransformer.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    """``prepare``'s options."""
    parser.add_argument(
        "--data",
        nargs="+",
        metavar="SOURCE",
        help="your own text instead of the built-in Shakespeare corpus: .txt/.md/.jsonl/.json/.parquet files, globs "
        "(quote them), folders (searched recursively), or a Hugging Face datasets name NAME[:CONFIG] "
        "(needs the `datasets` package and a reachable hub)",
    )
    parser.add_argument(
        "--text-field",
        default="text",
        help="the field holding the text in JSON/JSONL records and parquet rows (default: text)",
    )
    parser.add_argument(
        "--num-proc",
        type=int,
        default=None,
        help="worker processes that tokenise (default: the CPU count)",
    )
    parser.add_argument(
        "--output-dir",
        default="runs/tokenizer",
        help="where the tokenizer is saved; AutoTokenizer.from_pretrained(DIR) loads it (default: runs/tokenizer)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="use this saved tokenizer folder instead of training one (it is copied to --output-dir)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=4096,
        help="vocabulary size of the trained BPE tokenizer (default: 4096)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=256,
        help="tokens per packed training block; train with the same value to reuse the cache (default: 256)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help="cache for the downloaded corpus and packed blocks (default: $DIFFTRANSFORMER_CACHE or "
        "~/.cache/difftransformer)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the by-document split of --data (default: 0)"
    )
    parser.add_argument(
        "--validation-fraction",
        type=float,
        default=0.05,
        help="share of --data documents held out for validation (default: 0.05; the built-in corpus is split "
        "by fixed plays)",
    )
    parser.add_argument(
        "--test-fraction",
        type=float,
        default=0.05,
        help="share of --data documents held out for testing (default: 0.05)",
    )


def run(args: argparse.Namespace) -> int:
    """Open the corpus, train or load the tokenizer, pack and cache every split, print their sizes."""
    if args.num_proc is not None and args.num_proc < 1:
        raise UsageError(f"--num-proc must be a positive integer, got {args.num_proc}")
    corpus = open_corpus(
        args.data,
        cache_dir=args.cache_dir,
        seed=args.seed,
        validation_fraction=args.validation_fraction,
        test_fraction=args.test_fraction,
        text_field=args.text_field,
    )
    output = Path(args.output_dir)
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
    else:
        print(
            f"training a byte-level BPE tokenizer (vocabulary {args.vocab_size}) on {corpus.name} train split"
        )
        tokenizer = train_tokenizer(corpus.documents("train"), vocab_size=args.vocab_size)
    save_tokenizer(tokenizer, output)

    rows = []
    for split in SPLITS:
        n_docs = chars = 0
        for document in corpus.documents(split):
            n_docs += 1
            chars += len(document)
        if not n_docs:
            rows.append((split, 0, 0, 0, 0))
            continue
        try:
            blocks = packed_blocks(
                lambda split=split: corpus.documents(split),
                tokenizer,
                args.block_size,
                cache_dir=args.cache_dir,
                num_proc=args.num_proc,
                desc=split,
            )
        except CorpusError as err:
            raise CorpusError(
                f"--data {' '.join(args.data or ['(built-in)'])}, {split} split: {err}"
            ) from err
        rows.append((split, n_docs, chars, blocks.numel(), blocks.shape[0]))

    print(f"\ncorpus {corpus.name}, block size {args.block_size}, vocabulary {len(tokenizer)}")
    # Tokens are those in whole blocks: what training sees (each split drops its tail shorter than a block).
    print(f"{'split':<12}{'documents':>11}{'characters':>14}{'tokens':>12}{'blocks':>9}")
    for split, n_docs, chars, tokens, n_blocks in rows:
        print(f"{split:<12}{n_docs:>11,}{chars:>14,}{tokens:>12,}{n_blocks:>9,}")
    print(f"\ntokenizer saved to {output}")
    return 0
