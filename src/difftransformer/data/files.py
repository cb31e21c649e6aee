"""The user's own text: files, JSONL, parquet, globs, folders, or a ``datasets`` hub name, streamed as documents.

A ``.txt`` or ``.md`` file is one document. A ``.jsonl`` file holds one JSON object per line, its text in a
field (``text`` by default); a ``.json`` file is a JSON array of such objects (or of strings), or JSON lines; a
``.parquet`` file holds the text in a string column of that name. A folder is searched recursively for those five
suffixes; a glob (``data/**/*.txt``) is expanded. A string that is none of these is taken as a Hugging Face
``datasets`` name, ``NAME`` or ``NAME:CONFIG``, loaded with ``datasets.load_dataset`` (every split's rows become
documents).

Nothing here holds the corpus in memory: :func:`open_corpus` reads the sources once to count their documents and
draw the split, and :class:`FileCorpus` streams each split's documents again whenever they are asked for (JSON
lines one at a time, parquet a batch of rows at a time; a ``.txt``, ``.md`` or ``.json`` file is read whole).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from difftransformer.data.corpus import (
    SPLITS,
    CorpusError,
    CorpusSplits,
    _split_by_position,
    held_out_ids,
    warn_split_by_position,
)

TEXT_SUFFIXES = (".txt", ".md")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
_GLOB_CHARS = frozenset("*?[")
_UTF8_BOM = b"\xef\xbb\xbf"
_PARQUET_BATCH_ROWS = 1024


@dataclass(frozen=True)
class FileCorpus:
    """The user's sources split by document without being held in memory: :meth:`documents` reads them again,
    in their deterministic order, and keeps the documents of one split (the same split that
    :func:`difftransformer.data.corpus.split_documents` draws for the same documents and seed)."""

    name: str
    sources: tuple[str, ...]
    text_field: str
    count: int
    validation_ids: frozenset[int]
    test_ids: frozenset[int]

    def documents(self, split: str) -> Iterator[str]:
        """The documents of ``split`` (``train``, ``validation`` or ``test``), in input order, streamed."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        for index, document in enumerate(iter_documents(self.sources, text_field=self.text_field)):
            held = (
                "validation"
                if index in self.validation_ids
                else "test"
                if index in self.test_ids
                else "train"
            )
            if held == split:
                yield document

    def materialize(self) -> CorpusSplits:
        """The same split as lists of documents in memory."""
        return CorpusSplits(self.name, *(list(self.documents(split)) for split in SPLITS))


def open_corpus(
    data: Sequence[str] | str | None = None,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    validation_fraction: float = 0.05,
    test_fraction: float = 0.05,
    text_field: str = "text",
) -> CorpusSplits | FileCorpus:
    """``data`` (paths, globs, folders or ``datasets`` names) split by document, seeded, streamed.

    ``data=None`` gives the built-in Shakespeare corpus (in memory; small), whose split is fixed by play (the
    fractions and seed do not apply to it); ``cache_dir`` is where it is cached. The sources are read once here,
    to count their documents and refuse unreadable or empty ones. Too few documents to split by document (one
    big text file) are read into memory and each is split by position, with a warning.
    """
    if data is None:
        from difftransformer.data.shakespeare import builtin_corpus

        return builtin_corpus(cache_dir)
    if isinstance(data, (str, Path)):
        data = [str(data)]
    if not data:
        raise CorpusError("`data`: expected at least one file, glob, folder or datasets name, got none")
    sources = tuple(str(d) for d in data)
    name = ",".join(sources)
    count = sum(_count_source(source, text_field) for source in sources)
    ids = held_out_ids(count, seed=seed, validation_fraction=validation_fraction, test_fraction=test_fraction)
    if ids is None:
        warn_split_by_position(name, count, validation_fraction, test_fraction)
        documents = list(iter_documents(sources, text_field=text_field))
        return _split_by_position(name, documents, validation_fraction, test_fraction)
    return FileCorpus(name, sources, text_field, count, *ids)


def load_corpus(
    data: Sequence[str] | str | None = None,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    validation_fraction: float = 0.05,
    test_fraction: float = 0.05,
    text_field: str = "text",
) -> CorpusSplits:
    """:func:`open_corpus` with every split read into memory (lists of documents): for small corpora and for
    callers that index documents; training streams the corpus instead."""
    corpus = open_corpus(
        data,
        cache_dir=cache_dir,
        seed=seed,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
        text_field=text_field,
    )
    return corpus.materialize() if isinstance(corpus, FileCorpus) else corpus


def iter_documents(data: Sequence[str], *, text_field: str = "text") -> Iterator[str]:
    """Every non-blank document in ``data``, streamed in a deterministic order (each source's files sorted by
    path)."""
    for source in data:
        yield from (doc for doc in _iter_source(str(source), text_field) if doc.strip())


def _count_source(source: str, text_field: str) -> int:
    found = sum(1 for doc in _iter_source(source, text_field) if doc.strip())
    if not found:
        raise CorpusError(f"`data`: {source!r} holds no text (only empty documents)")
    return found


def resolve_files(source: str) -> list[Path] | None:
    """The files ``source`` names (a file, a folder searched recursively, or a glob), sorted; ``None`` when it
    is not a local path at all (then it may be a ``datasets`` name)."""
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise CorpusError(f"`data`: folder {source!r} holds no {'/'.join(SUFFIXES)} files")
        return files
    if _GLOB_CHARS & set(source):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not files:
            raise CorpusError(f"`data`: glob {source!r} matches no files")
        return files
    if path.exists():
        raise CorpusError(f"`data`: {source!r} is neither a regular file nor a folder")
    if _looks_like_path(source):
        raise CorpusError(f"`data`: no such file or folder {source!r}")
    return None


def _looks_like_path(source: str) -> bool:
    # A hub name is ``name`` or ``owner/name``; anything with a file suffix or a path prefix is meant locally.
    return (
        source.startswith((".", "/", "~", "\\"))
        or Path(source).suffix.lower() in SUFFIXES
        or source.count("/") > 1
        or "\\" in source
    )


def _iter_source(source: str, text_field: str) -> Iterator[str]:
    files = resolve_files(source)
    if files is None:
        yield from _read_hub(source, text_field)
        return
    for path in files:
        yield from iter_file(path, text_field=text_field)


def iter_file(path: Path, *, text_field: str = "text") -> Iterator[str]:
    """The documents in one file: the whole text of a ``.txt``/``.md`` file (any other suffix is read as
    text too), the ``text_field`` of each record of a ``.jsonl``/``.json`` file, or of each row of a
    ``.parquet`` file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from _json_lines(path, text_field)
    elif suffix == ".json":
        yield from _json_documents(path, text_field)
    elif suffix in PARQUET_SUFFIXES:
        yield from _parquet_documents(path, text_field)
    else:
        yield _decode(path, _read_bytes(path), 0).replace("\r\n", "\n")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise CorpusError(f"`data`: cannot read {path}: {err.strerror or err}") from err


def _decode(path: Path, data: bytes, offset: int) -> str:
    """``data`` (found at byte ``offset`` of ``path``) as UTF-8 without a leading BOM, or a refusal naming the
    byte offset."""
    skip = len(_UTF8_BOM) if offset == 0 and data.startswith(_UTF8_BOM) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = offset + skip + err.start
        bad = data[skip + err.start : skip + err.start + 4]
        raise CorpusError(
            f"`data`: {path} is not valid UTF-8: byte offset {at} ({bad!r}...): {err.reason}; "
            "convert it to UTF-8 first"
        ) from err


def _json_lines(path: Path, text_field: str, text: str | None = None) -> Iterator[str]:
    """Each line's record, read line by line from the file (or from ``text`` when it was read already)."""
    try:
        handle = open(path, "rb") if text is None else None  # closed in the finally below
    except OSError as err:
        raise CorpusError(f"`data`: cannot read {path}: {err.strerror or err}") from err
    lines = iter(text.splitlines(keepends=True)) if handle is None else handle
    offset = 0
    try:
        for number, raw in enumerate(lines, start=1):
            line = _decode(path, raw, offset) if isinstance(raw, bytes) else raw
            offset += len(raw)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusError(f"`data`: {path} line {number} is not valid JSON: {err.msg}") from err
            yield _record_text(path, f"line {number}", record, text_field)
    except OSError as err:
        raise CorpusError(f"`data`: cannot read {path}: {err.strerror or err}") from err
    finally:
        if handle is not None:
            handle.close()


def _json_documents(path: Path, text_field: str) -> Iterator[str]:
    text = _decode(path, _read_bytes(path), 0)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None  # not one JSON value: read it as JSON lines below
    if isinstance(parsed, list):
        yield from (_record_text(path, f"item {i}", item, text_field) for i, item in enumerate(parsed))
    elif isinstance(parsed, dict):
        yield _record_text(path, "top-level object", parsed, text_field)
    else:
        yield from _json_lines(path, text_field, text)


def _parquet_documents(path: Path, text_field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise CorpusError(f"`data`: reading {path} needs the `pyarrow` package: pip install pyarrow") from err
    try:
        table = pq.ParquetFile(path)
    except OSError as err:
        raise CorpusError(f"`data`: cannot read {path} as parquet: {err}") from err
    except Exception as err:  # pyarrow raises its own error types for damaged files
        raise CorpusError(f"`data`: {path} is not a readable parquet file: {err}") from err
    columns = table.schema_arrow.names
    if text_field not in columns:
        raise CorpusError(
            f"`data`: {path}: expected a {text_field!r} column, got columns {columns} "
            "(choose the column with `text_field`)"
        )
    kind = table.schema_arrow.field(text_field).type
    if str(kind) not in ("string", "large_string", "string_view"):
        raise CorpusError(f"`data`: {path}: column {text_field!r} should hold strings, got {kind}")
    try:
        for batch in table.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=[text_field]):
            yield from (text or "" for text in batch.column(0).to_pylist())
    except OSError as err:
        raise CorpusError(f"`data`: cannot read {path}: {err}") from err
    except Exception as err:
        raise CorpusError(f"`data`: {path} is not a readable parquet file: {err}") from err


def _record_text(path: Path, where: str, record: object, text_field: str) -> str:
    if isinstance(record, str):
        return record
    if not isinstance(record, dict) or text_field not in record:
        got = f"keys {sorted(record)}" if isinstance(record, dict) else type(record).__name__
        raise CorpusError(
            f"`data`: {path} {where}: expected an object with a {text_field!r} field, got {got} "
            "(choose the field with `text_field`)"
        )
    value = record[text_field]
    if not isinstance(value, str):
        raise CorpusError(
            f"`data`: {path} {where}: field {text_field!r} should be a string, got {type(value).__name__}"
        )
    return value


def _read_hub(name: str, text_field: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError as err:
        raise CorpusError(
            f"`data`: {name!r} is not a local file, folder or glob, and reading it as a Hugging Face datasets "
            "name needs the `datasets` package: pip install 'difftransformer[hub]'"
        ) from err
    dataset_name, _, config = name.partition(":")
    try:
        loaded = datasets.load_dataset(dataset_name, config or None)
    except Exception as err:  # the hub client raises many types; all mean the same to the user
        raise CorpusError(
            f"`data`: {name!r} is not a local file, folder or glob, and datasets.load_dataset failed: {err}"
        ) from err
    for split in sorted(loaded):
        rows = loaded[split]
        if text_field not in rows.column_names:
            raise CorpusError(
                f"`data`: datasets {name!r} split {split!r} has no {text_field!r} column "
                f"(columns: {rows.column_names}); choose one with `text_field`"
            )
        yield from (str(t) for t in rows[text_field])
