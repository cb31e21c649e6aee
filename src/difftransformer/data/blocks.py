"""Tokenised text packed into fixed-length blocks, cached on disk."""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from difftransformer.data.corpus import CorpusError
from difftransformer.storage import atomic_write
from difftransformer.storage import cache_dir as default_cache

_CACHE_FORMAT = 1  # bump when the packing changes, so old caches are not reused
_BATCH_DOCUMENTS = 64


def packed_blocks(
    texts: Sequence[str], tokenizer, block_size: int, *, cache_dir: Path | None = None
) -> torch.Tensor:
    """Tokenise ``texts``, join them as ``doc_1 EOS doc_2 EOS ... doc_n EOS`` and cut the stream into blocks.

    Returns an int64 tensor of shape ``(n_blocks, block_size)``; the tail shorter than a block is dropped.
    The blocks are cached in ``cache_dir/blocks`` (default: :func:`difftransformer.storage.cache_dir`) as ``<key>.npy`` plus
    ``<key>.json`` (shape and sha256 of the data), keyed by a hash of the tokenizer, the texts and the block
    size, and read back on later calls. A cache file that fails its check is rebuilt, with a warning.
    """
    if not isinstance(block_size, int) or block_size < 2:
        raise ValueError(f"block_size must be an integer >= 2, got {block_size!r}")
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of documents, got a single str")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no EOS token to put between documents")
    key = cache_key(texts, tokenizer, block_size)
    folder = Path(cache_dir or default_cache()) / "blocks"
    blocks = _read_cache(folder, key)
    if blocks is None:
        ids = np.concatenate([np.zeros(0, np.int32), *tokenize_documents(texts, tokenizer)])
        n_blocks = len(ids) // block_size
        if n_blocks == 0:
            raise CorpusError(
                f"texts: {len(texts)} document(s) give {len(ids)} tokens (EOS included), fewer than one block "
                f"of block_size={block_size}; give more text or a smaller block size"
            )
        blocks = ids[: n_blocks * block_size].reshape(n_blocks, block_size)
        _write_cache(folder, key, blocks)
    return torch.from_numpy(blocks.astype(np.int64))


def tokenize_documents(texts: Sequence[str], tokenizer) -> list[np.ndarray]:
    """Each document's token ids (no special tokens added) followed by the EOS id, as an int32 array."""
    eos = tokenizer.eos_token_id
    out: list[np.ndarray] = []
    bar = tqdm(
        total=sum(len(t) for t in texts),
        unit="char",
        unit_scale=True,
        desc="tokenising",
        disable=None,
        file=sys.stderr,
    )
    for start in range(0, len(texts), _BATCH_DOCUMENTS):
        batch = list(texts[start : start + _BATCH_DOCUMENTS])
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust tokenizer directly: parallel, and no max-length warning
            encoded = [e.ids for e in backend.encode_batch(batch, add_special_tokens=False)]
        else:
            encoded = [tokenizer.encode(t, add_special_tokens=False) for t in batch]
        out.extend(np.asarray([*ids, eos], dtype=np.int32) for ids in encoded)
        bar.update(sum(len(t) for t in batch))
    bar.close()
    return out


def cache_key(texts: Sequence[str], tokenizer, block_size: int) -> str:
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


def _read_cache(folder: Path, key: str) -> np.ndarray | None:
    array_path, meta_path = folder / f"{key}.npy", folder / f"{key}.json"
    if not array_path.exists() and not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        blocks = np.load(array_path, allow_pickle=False)
        if list(blocks.shape) != meta["shape"] or str(blocks.dtype) != meta["dtype"]:
            raise ValueError(
                f"shape {list(blocks.shape)} {blocks.dtype}, expected {meta['shape']} {meta['dtype']}"
            )
        if hashlib.sha256(blocks.tobytes()).hexdigest() != meta["sha256"]:
            raise ValueError("data sha256 differs from the recorded one")
    except (OSError, ValueError, KeyError, TypeError, EOFError) as err:
        warnings.warn(
            f"block cache {array_path} is corrupt or incomplete ({err}); rebuilding it", stacklevel=3
        )
        return None
    return blocks


def _write_cache(folder: Path, key: str, blocks: np.ndarray) -> None:
    atomic_write(folder / f"{key}.npy", lambda f: np.save(f, blocks, allow_pickle=False))
    # Written second: a cache entry counts only once its checksum exists.
    meta = {
        "shape": list(blocks.shape),
        "dtype": str(blocks.dtype),
        "sha256": hashlib.sha256(blocks.tobytes()).hexdigest(),
    }
    atomic_write(folder / f"{key}.json", json.dumps(meta))
