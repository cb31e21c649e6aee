"""transformers' own common model tests, fetched at test time from the installed version's sdist on PyPI.

The wheel ships no tests; the sdist ships ``tests/test_modeling_common.py`` (``ModelTesterMixin``) and its
top-level siblings, but not the sub-packages they import (``tests/generation`` with ``GenerationTesterMixin``,
``tests/exporters``, ``tests/utils``). The sdist is downloaded with pip, checked against the sha256 recorded
below, and only the files we run are extracted into ``cache_dir() / "transformers-tests" / <version>``, laid out
as an importable package ``transformers_tests``. The missing sub-modules become empty mixins there, so that
``test_modeling_common`` imports; the generation features they would have tested are tested in
``tests/test_hf_common.py`` itself. Nothing fetched is committed.

``DIFFTRANSFORMER_TRANSFORMERS_TESTS=/path/to/transformers/tests`` (a checkout of the installed version's tag)
uses that folder instead, complete with ``GenerationTesterMixin``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import transformers

from difftransformer.storage import atomic_write, cache_dir

PACKAGE = "transformers_tests"
# sha256 of transformers' sdist on PyPI, per version we have run the common tests against.
SDIST_SHA256 = {
    "5.23.0": "19d647a4d5d903a7c644ca5cde2d86efc3dde7d8c687ae7988806ff2205efa71",
}
# The sdist's files that the common tests need (paths under its tests/ folder).
NEEDED = ("test_modeling_common.py",)
# Modules test_modeling_common imports that the sdist lacks: an empty mixin of the imported name each.
ABSENT = {
    "generation/test_utils.py": "GenerationTesterMixin",
    "exporters/test_export.py": "ExportTesterMixin",
}


class FetchError(RuntimeError):
    """The sdist could not be downloaded (no network, no pip index)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_sdist(version: str, folder: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
        "--no-build-isolation", f"transformers=={version}", "-d", str(folder),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    archives = sorted(folder.glob(f"transformers-{version}.tar.gz"))
    if result.returncode or not archives:
        raise FetchError(
            f"pip download of transformers=={version}'s sdist failed: {result.stderr.strip()[-500:]}"
        )
    return archives[0]


def _extract(archive: Path, version: str, target: Path) -> None:
    """The NEEDED files of the sdist's tests/ folder, plus the absent modules' empty mixins, as a package."""
    package = target / PACKAGE
    with tarfile.open(archive) as tar:
        for name in NEEDED:
            member = tar.extractfile(f"transformers-{version}/tests/{name}")
            if member is None:
                raise FetchError(f"transformers {version}'s sdist has no tests/{name}")
            atomic_write(package / name, member.read())
    for relative, mixin in ABSENT.items():
        atomic_write(
            package / relative,
            f'"""Not in the sdist: an empty {mixin} so that test_modeling_common imports."""\n\n\n'
            f"class {mixin}:\n    pass\n",
        )
    for folder in {package} | {(package / relative).parent for relative in ABSENT}:
        atomic_write(folder / "__init__.py", "")


def common_tests_path() -> Path:
    """A folder to put on sys.path in which ``import transformers_tests.test_modeling_common`` works.

    Raises FetchError when the sdist cannot be downloaded, and RuntimeError when the installed transformers
    version has no recorded sha256 or the download does not match it.
    """
    override = os.environ.get("DIFFTRANSFORMER_TRANSFORMERS_TESTS")
    if override:
        tests = Path(override).expanduser().resolve()
        if not (tests / "test_modeling_common.py").is_file():
            raise RuntimeError(
                f"DIFFTRANSFORMER_TRANSFORMERS_TESTS must be transformers' tests/ folder; {tests} has no "
                "test_modeling_common.py"
            )
        link_root = cache_dir() / "transformers-tests" / "checkout"
        link_root.mkdir(parents=True, exist_ok=True)
        link = link_root / PACKAGE
        if link.is_symlink() and link.resolve() != tests:
            link.unlink()
        if not link.exists():
            link.symlink_to(tests, target_is_directory=True)
        return link_root
    version = transformers.__version__
    expected = SDIST_SHA256.get(version)
    if expected is None:
        raise RuntimeError(
            f"no recorded sha256 for transformers {version}'s sdist (known: {sorted(SDIST_SHA256)}): check the "
            "common tests against it, then record its hash in tests/hf_common_fetch.py"
        )
    target = cache_dir() / "transformers-tests" / version
    done = target / "sha256"
    if done.is_file() and done.read_text().strip() == expected:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        archive = _download_sdist(version, Path(tmp))
        actual = _sha256(archive)
        if actual != expected:
            raise RuntimeError(
                f"transformers {version}'s sdist has sha256 {actual}, expected {expected}: refusing to run it"
            )
        shutil.rmtree(target / PACKAGE, ignore_errors=True)
        _extract(archive, version, target)
    atomic_write(done, expected + "\n")
    return target
