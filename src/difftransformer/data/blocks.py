"""Tokenised text packed into fixed-length blocks, cached on disk and read back memory-mapped.

The documents are streamed: read in batches, tokenised by ``num_proc`` worker processes (the Rust tokenizer in
each, one thread apiece), and their ids appended to a raw int64 file as they come, so neither the text nor the
token stream is held in memory. The file is memory-mapped for training: a process touches only the blocks its
sampler hands it, and every process (every DDP/FSDP rank) shares the same page cache.
"""

from __future__ import annotations

import collections
import hashlib
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from difftransformer.data.corpus import CorpusError
from difftransformer.errors import UsageError
from difftransformer.process_signals import sigterm_handler
from difftransformer.storage import atomic_write, file_sha256
from difftransformer.storage import cache_dir as default_cache

_CACHE_FORMAT = 2  # bump when the packing or the file layout changes, so old caches are not reused
_DTYPE = np.dtype("<i8")  # the ids as training takes them: int64, little-endian
_BATCH_CHARACTERS = 1 << 20  # documents are tokenised in batches of about this many characters
_MAX_BATCH_DOCUMENTS = 4096

Texts = Sequence[str] | Callable[[], Iterable[str]]


@dataclass(frozen=True)
class BlockFile:
    """The cache file a tensor of :func:`packed_blocks` views: what another process (a worker of a comparison)
    maps itself instead of receiving the blocks."""

    path: str
    shape: tuple[int, int]

    def open(self) -> torch.Tensor:
        """The blocks, memory-mapped from the file (copy-on-write); a UsageError when this machine lacks it."""
        path = Path(self.path)
        if not path.is_file() or path.stat().st_size != self.shape[0] * self.shape[1] * _DTYPE.itemsize:
            raise UsageError(
                f"the block cache {path} is missing here or holds other blocks: its folder must lie on storage "
                "every node mounts (`cache_dir`)"
            )
        return _mapped(path, self.shape)


# The file behind each tensor packed_blocks returned, by the tensor's id while it lives (tensors compare
# elementwise, so they cannot be dictionary keys themselves).
_FILES: dict[int, BlockFile] = {}


def block_file(blocks: torch.Tensor) -> BlockFile | None:
    """The cache file ``blocks`` (a tensor :func:`packed_blocks` returned) views, or None for any other tensor."""
    return _FILES.get(id(blocks))


def _mapped(path: Path, shape: tuple[int, int]) -> torch.Tensor:
    # Copy-on-write: writable in memory (torch views it without a warning), the file never changes.
    blocks = torch.from_numpy(np.memmap(path, dtype=_DTYPE, mode="c", shape=shape))
    _FILES[id(blocks)] = BlockFile(str(path), tuple(shape))
    weakref.finalize(blocks, _FILES.pop, id(blocks), None)
    return blocks


def packed_blocks(
    texts: Texts,
    tokenizer,
    block_size: int,
    *,
    cache_dir: Path | None = None,
    num_proc: int | None = None,
    desc: str = "",
) -> torch.Tensor:
    """Tokenise ``texts``, join them as ``doc_1 EOS doc_2 EOS ... doc_n EOS`` and cut the stream into blocks.

    ``texts`` is a sequence of documents, or a function returning a fresh iterable of them on each call (it is
    called twice when the blocks are not cached yet: once for the cache key, once to tokenise). Returns an int64
    tensor of shape ``(n_blocks, block_size)`` that views a memory-mapped file (copy-on-write: writing to it
    never changes the file); the tail shorter than a block is dropped. The blocks are cached in
    ``cache_dir/blocks`` (default: :func:`difftransformer.storage.cache_dir`) as ``<key>.bin`` (raw
    little-endian int64) plus ``<key>.json`` (shape, dtype and sha256 of the data), keyed by a hash of the
    tokenizer, the texts and the block size, and read back on later calls. A cache file that fails its check is
    rebuilt, with a warning. ``num_proc`` worker processes tokenise (default: the CPU count); ``desc`` labels
    the progress bar.
    """
    if not isinstance(block_size, int) or block_size < 2:
        raise UsageError(f"`block_size` must be an integer >= 2, got {block_size!r}")
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of documents, got a single str")
    if tokenizer.eos_token_id is None:
        raise UsageError(f"tokenizer {type(tokenizer).__name__} has no EOS token to put between documents")
    stream = texts if callable(texts) else lambda: texts
    key = cache_key(stream(), tokenizer, block_size)
    folder = Path(cache_dir or default_cache()) / "blocks"
    shape = _read_cache(folder, key)
    if shape is None:
        _write_cache(folder, key, stream(), tokenizer, block_size, _num_proc(num_proc), desc)
        shape = _read_cache(folder, key)
        if shape is None:
            raise RuntimeError(f"block cache {folder / key}.bin failed its check right after being written")
    return _mapped(folder / f"{key}.bin", shape)


def tokenize_documents(
    texts: Iterable[str], tokenizer, *, num_proc: int = 1, desc: str = ""
) -> Iterator[np.ndarray]:
    """The token ids of ``texts``, each document's ids (no special tokens added) followed by the EOS id, as int32
    arrays of a batch of documents each, in document order; a progress bar shows tokens/s."""
    bar = tqdm(unit="tok", unit_scale=True, desc=f"tokenising {desc}".strip(), disable=None, file=sys.stderr)
    try:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if num_proc > 1 and backend is not None:
            batches = _parallel(_batches(texts), backend.to_str(), tokenizer.eos_token_id, num_proc)
        else:
            batches = (_encode(batch, tokenizer, tokenizer.eos_token_id) for batch in _batches(texts))
        for ids in batches:
            bar.update(len(ids))
            yield ids
    finally:
        bar.close()


def cache_key(texts: Iterable[str], tokenizer, block_size: int) -> str:
    """sha256 of everything the blocks depend on: the tokenizer's full definition, the texts and block size."""
    digest = hashlib.sha256(f"packed-blocks/{_CACHE_FORMAT}/{block_size}/{tokenizer.eos_token_id}\n".encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode("utf-8"))
    else:
        digest.update(type(tokenizer).__name__.encode())
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode("utf-8"))
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))  # length-prefixed so document boundaries count
        digest.update(data)
    return digest.hexdigest()


def _num_proc(num_proc: int | None) -> int:
    if num_proc is None:
        return os.cpu_count() or 1
    if not isinstance(num_proc, int) or num_proc < 1:
        raise UsageError(f"`num_proc` must be a positive integer, got {num_proc!r}")
    return num_proc


def _batches(texts: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= _BATCH_CHARACTERS or len(batch) >= _MAX_BATCH_DOCUMENTS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _encode(batch: list[str], tokenizer, eos: int) -> np.ndarray:
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if hasattr(backend, "encode_batch"):  # the Rust tokenizer directly: no max-length warning
        encoded = [e.ids for e in backend.encode_batch(batch, add_special_tokens=False)]
    else:
        encoded = [tokenizer.encode(t, add_special_tokens=False) for t in batch]
    out = np.empty(sum(len(ids) for ids in encoded) + len(encoded), dtype=np.int32)
    at = 0
    for ids in encoded:
        out[at : at + len(ids)] = ids
        out[at + len(ids)] = eos
        at += len(ids) + 1
    return out


_worker_tokenizer = None  # the tokenizer of a worker process, set by _start_worker
_worker_eos = 0


def _start_worker(definition: str, eos: int) -> None:
    global _worker_tokenizer, _worker_eos
    from tokenizers import Tokenizer

    _worker_tokenizer, _worker_eos = Tokenizer.from_str(definition), eos


def _encode_in_worker(batch: list[str]) -> np.ndarray:
    return _encode(batch, _worker_tokenizer, _worker_eos)


@contextmanager
def _single_threaded_tokenizers() -> Iterator[None]:
    """TOKENIZERS_PARALLELISM=false while worker processes are forked: each worker is one thread, and the Rust
    library sees the setting as chosen (no fork warning); the parent's own setting is restored after."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def _parallel(batches: Iterator[list[str]], definition: str, eos: int, num_proc: int) -> Iterator[np.ndarray]:
    """``_encode`` of each batch in ``num_proc`` forked workers, in order, with at most two batches per worker
    in flight (reading never runs ahead of tokenising by more than that)."""
    # Workers are born with SIGTERM at its default: a handler that returns (a Ray driver's, which compare holds)
    # would swallow Pool.terminate's signal in a worker still starting up and leave the pool's join waiting forever.
    with _single_threaded_tokenizers(), sigterm_handler(signal.SIG_DFL):
        pool = multiprocessing.get_context("fork").Pool(num_proc, _start_worker, (definition, eos))
    finished = False
    try:
        pending: collections.deque = collections.deque()
        for batch in batches:
            pending.append(pool.apply_async(_encode_in_worker, (batch,)))
            if len(pending) >= 2 * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
        finished = True
    finally:
        if finished:
            pool.close()  # the workers take their end-of-work sentinels and leave
        else:
            pool.terminate()
        pool.join()


def _read_cache(folder: Path, key: str) -> tuple[int, int] | None:
    """The shape of the cache entry ``key`` when its files pass their checks, else None (a warning when they exist
    but fail)."""
    data_path, meta_path = folder / f"{key}.bin", folder / f"{key}.json"
    if not data_path.exists() and not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        shape, dtype = tuple(meta["shape"]), np.dtype(meta["dtype"])
        if dtype != _DTYPE or len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"recorded shape {list(shape)} {dtype}, expected (n, T) {_DTYPE}")
        expected = shape[0] * shape[1] * dtype.itemsize
        if data_path.stat().st_size != expected:
            raise ValueError(f"{data_path.stat().st_size} bytes, expected {expected} for shape {list(shape)}")
        if file_sha256(data_path) != meta["sha256"]:
            raise ValueError("data sha256 differs from the recorded one")
    except (OSError, ValueError, KeyError, TypeError) as err:
        warnings.warn(
            f"block cache {data_path} is corrupt or incomplete ({err}); rebuilding it", stacklevel=3
        )
        return None
    return shape


def _write_cache(
    folder: Path, key: str, texts: Iterable[str], tokenizer, block_size: int, num_proc: int, desc: str
) -> None:
    """Stream the token ids into a temporary file beside the cache entry, cut its tail to whole blocks, fsync
    it and rename it into place; the metadata (with the checksum) is written last, so an entry counts only once
    it is whole."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=folder)
    try:
        documents = tokens = 0
        with os.fdopen(fd, "wb") as handle:
            for ids in tokenize_documents(texts, tokenizer, num_proc=num_proc, desc=desc):
                handle.write(ids.astype(_DTYPE).tobytes())
                tokens += len(ids)
                documents += int(np.count_nonzero(ids == tokenizer.eos_token_id))
            n_blocks = tokens // block_size
            if n_blocks == 0:
                raise CorpusError(
                    f"`texts`: {documents} document(s) give {tokens} tokens (EOS included), fewer than one "
                    f"block of block_size={block_size}; give more text or a smaller block size"
                )
            handle.truncate(n_blocks * block_size * _DTYPE.itemsize)
            handle.flush()
            os.fsync(handle.fileno())
        digest = file_sha256(Path(tmp))
        os.replace(tmp, folder / f"{key}.bin")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    meta = {"shape": [n_blocks, block_size], "dtype": _DTYPE.str, "sha256": digest, "tokens": tokens}
    atomic_write(folder / f"{key}.json", json.dumps(meta))
