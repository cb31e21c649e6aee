"""Where the text and the tokenizer come from, declared once for ``prepare``, ``train`` and ``compare``
(:class:`DataOptions`), and ``prepare``'s own options (:class:`PrepareOptions`). Their fields are the commands'
flags (:mod:`difftransformer.flags`); each checks its values when it is made, before any work."""

from __future__ import annotations

from dataclasses import dataclass, field

from difftransformer.data.corpus import CorpusSplits
from difftransformer.data.files import FileCorpus, open_corpus
from difftransformer.data.tokenizer import MIN_VOCAB_SIZE, TOKENIZER_FILES
from difftransformer.errors import UsageError, check_seed
from difftransformer.storage import cache_dir, check_input_dir, check_output_dir

DEFAULT_HELD_OUT_FRACTION = 0.05  # of the --data documents, for validation and for testing each


@dataclass(frozen=True)
class DataOptions:
    """Where the text and the tokenizer come from (unset: the built-in Shakespeare corpus, a BPE trained on it)."""

    _argument_group_name = "data"

    data: list[str] | None = field(
        default=None,
        metadata={"help": "your own text instead of the built-in Shakespeare corpus: .txt/.md/.jsonl/.json/"
                  ".parquet files, globs (quote them), folders (searched recursively), or a Hugging Face datasets "
                  "name NAME[:CONFIG] where a hub is reachable"},
    )  # fmt: skip
    text_field: str | None = field(
        default=None,
        metadata={"help": "with --data: the field holding the text in JSON/JSONL records and parquet rows "
                  "(default: text)"},
    )  # fmt: skip
    validation_fraction: float | None = field(
        default=None,
        metadata={"help": "with --data: share of its documents held out for validation (default: "
                  f"{DEFAULT_HELD_OUT_FRACTION}; the built-in corpus is split by fixed plays)"},
    )  # fmt: skip
    test_fraction: float | None = field(
        default=None,
        metadata={"help": f"with --data: share of its documents held out for testing (default: "
                  f"{DEFAULT_HELD_OUT_FRACTION})"},
    )  # fmt: skip
    tokenizer: str | None = field(
        default=None, metadata={"help": "a saved tokenizer folder instead of training one"}
    )
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "cache for the corpus and packed blocks (default: $DIFFTRANSFORMER_CACHE, else "
                  "$XDG_CACHE_HOME/difftransformer, else ~/.cache/difftransformer)"},
    )  # fmt: skip
    num_proc: int | None = field(
        default=None,
        metadata={"help": "worker processes that tokenise uncached data (default: the CPU count)"},
    )

    def __post_init__(self) -> None:
        if self.data is not None and not self.data:
            raise UsageError("`data` must name at least one file, glob, folder or datasets name; got none")
        if self.num_proc is not None and self.num_proc < 1:
            raise UsageError(f"`num_proc` must be a positive integer; got {self.num_proc}")
        for name in ("text_field", "validation_fraction", "test_fraction"):
            if getattr(self, name) is not None and self.data is None:
                raise UsageError(
                    f"`{name}` applies to `data`; the built-in corpus has its own fixed split and format: give "
                    f"`data`, or leave `{name}` out"
                )
        for name in ("validation_fraction", "test_fraction"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1:
                raise UsageError(f"`{name}` must lie in [0, 1); got {value}")
        validation, test = self.held_out
        if validation + test >= 1:
            raise UsageError(
                f"`validation_fraction` + `test_fraction` must be below 1 to leave training data; got "
                f"{validation} + {test}"
            )
        if self.text_field is not None and not self.text_field:
            raise UsageError("`text_field` must name a field; got an empty name")

    @property
    def held_out(self) -> tuple[float, float]:
        """The validation and test shares of the ``data`` documents (defaults filled in)."""
        return (
            DEFAULT_HELD_OUT_FRACTION if self.validation_fraction is None else self.validation_fraction,
            DEFAULT_HELD_OUT_FRACTION if self.test_fraction is None else self.test_fraction,
        )

    @property
    def field_name(self) -> str:
        """The record field holding the text (default: text)."""
        return self.text_field or "text"

    def open_corpus(self, seed: int) -> CorpusSplits | FileCorpus:
        """The corpus these options name, split by document with ``seed``
        (:func:`~difftransformer.data.files.open_corpus`; the built-in corpus when ``data`` is unset)."""
        validation_fraction, test_fraction = self.held_out
        return open_corpus(
            self.data,
            cache_dir=self.cache_dir,
            seed=seed,
            validation_fraction=validation_fraction,
            test_fraction=test_fraction,
            text_field=self.field_name,
        )

    def check_locations(self) -> None:
        """Refuse, before any work, a tokenizer folder that does not exist or holds no tokenizer, and a cache
        folder (given or the default) that cannot be written."""
        if self.tokenizer is not None:
            folder = check_input_dir(self.tokenizer, "tokenizer", "a saved tokenizer")
            if not any((folder / name).is_file() for name in TOKENIZER_FILES):
                raise UsageError(
                    f"`tokenizer`: {self.tokenizer!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})"
                )
        check_output_dir(self.cache_dir or cache_dir(), "cache_dir")


@dataclass(frozen=True)
class PrepareOptions:
    """``prepare``'s own options: where the tokenizer goes, and the vocabulary, block size and split seed."""

    _argument_group_name = "prepare"

    output_dir: str = field(
        default="runs/tokenizer",
        metadata={"help": "where the tokenizer is saved; AutoTokenizer.from_pretrained(DIR) loads it"},
    )
    vocab_size: int = field(
        default=4096, metadata={"help": "vocabulary size of the trained BPE tokenizer (not with --tokenizer)"}
    )
    block_size: int = field(
        default=256,
        metadata={"help": "tokens per packed training block; train with the same value to reuse the cache"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the by-document split of --data"})

    def __post_init__(self) -> None:
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise UsageError(
                f"`vocab_size` must be at least {MIN_VOCAB_SIZE} (256 bytes + 2 special); got {self.vocab_size}"
            )
        if self.block_size < 2:
            raise UsageError(f"`block_size` must be at least 2; got {self.block_size}")
        check_seed(self.seed)
