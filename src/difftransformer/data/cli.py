"""`difftransformer prepare`: fetch the corpus, train (or load) the tokenizer, and cache the packed blocks.

Options: the data options ``train`` and ``compare`` share (:class:`~difftransformer.data.options.DataOptions`),
then ``prepare``'s own (:class:`~difftransformer.data.options.PrepareOptions`); every one is checked, and the
output and cache folders with them, before the corpus is read.
"""

from __future__ import annotations

import argparse

from difftransformer.data.blocks import packed_blocks
from difftransformer.data.corpus import SPLITS, CorpusError
from difftransformer.data.options import DataOptions, PrepareOptions
from difftransformer.data.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from difftransformer.errors import UsageError
from difftransformer.flags import add_flags, given
from difftransformer.storage import check_output_dir


def configure(parser: argparse.ArgumentParser) -> None:
    """``prepare``'s options: the data options, then its own."""
    add_flags(parser, DataOptions, only_given=True)
    add_flags(parser, PrepareOptions, only_given=True)


def run(args: argparse.Namespace) -> int:
    """Check every option and folder, open the corpus, train or load the tokenizer, pack and cache every split,
    print their sizes."""
    data = DataOptions(**given(vars(args), DataOptions))
    own = given(vars(args), PrepareOptions)
    options = PrepareOptions(**own)
    if data.tokenizer and "vocab_size" in own:
        raise UsageError(
            "`vocab_size` sizes a tokenizer trained here; `tokenizer` brings its own: give one of the two"
        )
    data.check_locations()
    output = check_output_dir(options.output_dir, "output_dir")
    corpus = data.open_corpus(options.seed)
    if data.tokenizer:
        tokenizer = load_tokenizer(data.tokenizer)
    else:
        print(
            f"training a byte-level BPE tokenizer (vocabulary {options.vocab_size}) on {corpus.name} train split"
        )
        tokenizer = train_tokenizer(corpus.documents("train"), vocab_size=options.vocab_size)
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
                options.block_size,
                cache_dir=data.cache_dir,
                num_proc=data.num_proc,
                desc=split,
            )
        except CorpusError as err:
            raise CorpusError(
                f"`data` {' '.join(data.data or ['(built-in)'])}, {split} split: {err}"
            ) from err
        rows.append((split, n_docs, chars, blocks.numel(), blocks.shape[0]))

    print(f"\ncorpus {corpus.name}, block size {options.block_size}, vocabulary {len(tokenizer)}")
    # Tokens are those in whole blocks: what training sees (each split drops its tail shorter than a block).
    print(f"{'split':<12}{'documents':>11}{'characters':>14}{'tokens':>12}{'blocks':>9}")
    for split, n_docs, chars, tokens, n_blocks in rows:
        print(f"{split:<12}{n_docs:>11,}{chars:>14,}{tokens:>12,}{n_blocks:>9,}")
    print(f"\ntokenizer saved to {output}")
    return 0
