"""The user's own text: files, JSONL, globs, folders, or a ``datasets`` hub name, read into documents.

A ``.txt`` or ``.md`` file is one document. A ``.jsonl`` file holds one JSON object per line, its text in a
field (``text`` by default); a ``.json`` file is a JSON array of such objects (or of strings), or JSON lines.
A folder is searched recursively for those four suffixes; a glob (``data/**/*.txt``) is expanded. A string that
is none of these is taken as a Hugging Face ``datasets`` name, ``NAME`` or ``NAME:CONFIG``, loaded with
``datasets.load_dataset`` (every split's rows become documents).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Sequence
from pathlib import Path

from difftransformer.data.corpus import CorpusError, CorpusSplits, split_documents

TEXT_SUFFIXES = (".txt", ".md")
JSON_SUFFIXES = (".jsonl", ".json")
SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES
_GLOB_CHARS = frozenset("*?[")
_UTF8_BOM = b"\xef\xbb\xbf"


def load_corpus(
    data: Sequence[str] | None = None,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    validation_fraction: float = 0.05,
    test_fraction: float = 0.05,
    text_field: str = "text",
) -> CorpusSplits:
    """Read ``data`` (paths, globs, folders or ``datasets`` names) and split it by document, seeded.

    ``data=None`` gives the built-in Shakespeare corpus, whose split is fixed by play (the fractions and seed
    do not apply to it). ``cache_dir`` is where the built-in corpus is cached.
    """
    if data is None:
        from difftransformer.data.shakespeare import builtin_corpus

        return builtin_corpus(cache_dir)
    if isinstance(data, (str, Path)):
        data = [str(data)]
    if not data:
        raise CorpusError("data: expected at least one file, glob, folder or datasets name, got none")
    documents = read_documents(data, text_field=text_field)
    name = ",".join(str(d) for d in data)
    return split_documents(
        name, documents, seed=seed, validation_fraction=validation_fraction, test_fraction=test_fraction
    )


def read_documents(data: Sequence[str], *, text_field: str = "text") -> list[str]:
    """Every non-blank document in ``data``, in a deterministic order (each source's files sorted by path)."""
    documents: list[str] = []
    for source in data:
        source = str(source)
        found = [doc for doc in _read_source(source, text_field) if doc.strip()]
        if not found:
            raise CorpusError(f"data: {source!r} holds no text (only empty documents)")
        documents.extend(found)
    return documents


def resolve_files(source: str) -> list[Path] | None:
    """The files ``source`` names (a file, a folder searched recursively, or a glob), sorted; ``None`` when it
    is not a local path at all (then it may be a ``datasets`` name)."""
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise CorpusError(f"data: folder {source!r} holds no {'/'.join(SUFFIXES)} files")
        return files
    if _GLOB_CHARS & set(source):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not files:
            raise CorpusError(f"data: glob {source!r} matches no files")
        return files
    if path.exists():
        raise CorpusError(f"data: {source!r} is neither a regular file nor a folder")
    if _looks_like_path(source):
        raise CorpusError(f"data: no such file or folder {source!r}")
    return None


def _looks_like_path(source: str) -> bool:
    # A hub name is ``name`` or ``owner/name``; anything with a file suffix or a path prefix is meant locally.
    return (
        source.startswith((".", "/", "~", "\\"))
        or Path(source).suffix.lower() in SUFFIXES
        or source.count("/") > 1
        or "\\" in source
    )


def _read_source(source: str, text_field: str) -> list[str]:
    files = resolve_files(source)
    if files is None:
        return _read_hub(source, text_field)
    documents = []
    for path in files:
        documents.extend(read_file(path, text_field=text_field))
    return documents


def read_file(path: Path, *, text_field: str = "text") -> list[str]:
    """The documents in one file: the whole text of a ``.txt``/``.md`` file (any other suffix is read as
    text too), or the ``text_field`` of each record of a ``.jsonl``/``.json`` file."""
    text = _read_utf8(Path(path))
    if Path(path).suffix.lower() in JSON_SUFFIXES:
        return _json_documents(path, text, text_field)
    return [text.replace("\r\n", "\n")]


def _read_utf8(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CorpusError(f"data: cannot read {path}: {err.strerror or err}") from err
    offset = len(_UTF8_BOM) if data.startswith(_UTF8_BOM) else 0
    try:
        return data[offset:].decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[offset + err.start : offset + err.start + 4]
        raise CorpusError(
            f"data: {path} is not valid UTF-8: byte offset {offset + err.start} ({bad!r}...): {err.reason}; "
            "convert it to UTF-8 first"
        ) from err


def _json_documents(path: Path, text: str, text_field: str) -> list[str]:
    records: list[tuple[int, object]]
    if Path(path).suffix.lower() == ".json":
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = None  # not one JSON value: read it as JSON lines below
        if isinstance(parsed, list):
            return [_record_text(path, f"item {i}", item, text_field) for i, item in enumerate(parsed)]
        if isinstance(parsed, dict):
            return [_record_text(path, "top-level object", parsed, text_field)]
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as err:
            raise CorpusError(f"data: {path} line {number} is not valid JSON: {err.msg}") from err
    return [_record_text(path, f"line {number}", record, text_field) for number, record in records]


def _record_text(path: Path, where: str, record: object, text_field: str) -> str:
    if isinstance(record, str):
        return record
    if not isinstance(record, dict) or text_field not in record:
        got = f"keys {sorted(record)}" if isinstance(record, dict) else type(record).__name__
        raise CorpusError(
            f"data: {path} {where}: expected an object with a {text_field!r} field, got {got} "
            "(choose the field with text_field / --text-field)"
        )
    value = record[text_field]
    if not isinstance(value, str):
        raise CorpusError(
            f"data: {path} {where}: field {text_field!r} should be a string, got {type(value).__name__}"
        )
    return value


def _read_hub(name: str, text_field: str) -> list[str]:
    try:
        import datasets
    except ImportError as err:
        raise CorpusError(
            f"data: {name!r} is not a local file, folder or glob, and reading it as a Hugging Face datasets "
            "name needs the `datasets` package: pip install 'difftransformer[hub]'"
        ) from err
    dataset_name, _, config = name.partition(":")
    try:
        loaded = datasets.load_dataset(dataset_name, config or None)
    except Exception as err:  # the hub client raises many types; all mean the same to the user
        raise CorpusError(
            f"data: {name!r} is not a local file, folder or glob, and datasets.load_dataset failed: {err}"
        ) from err
    documents = []
    for split in sorted(loaded):
        rows = loaded[split]
        if text_field not in rows.column_names:
            raise CorpusError(
                f"data: datasets {name!r} split {split!r} has no {text_field!r} column "
                f"(columns: {rows.column_names}); choose one with text_field / --text-field"
            )
        documents.extend(str(t) for t in rows[text_field])
    return documents
