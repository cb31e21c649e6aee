"""Files on disk: the project's cache folder, atomic writes and JSON results.

The one module every layer of the package uses for these (it imports nothing from the package but
:mod:`difftransformer.errors`), so that a reader never sees half a file and every cache lands in the same folder.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from difftransformer.errors import MissingInputError, UsageError


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir() -> Path:
    """Where corpora, packed blocks, built kernels and fetched data are cached: ``$DIFFTRANSFORMER_CACHE``,
    else ``$XDG_CACHE_HOME/difftransformer``, else ``~/.cache/difftransformer``."""
    if os.environ.get("DIFFTRANSFORMER_CACHE"):
        return Path(os.environ["DIFFTRANSFORMER_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "difftransformer"
    return Path.home() / ".cache" / "difftransformer"


def check_output_dir(path: str | os.PathLike, field: str) -> Path:
    """Refuse an output folder that cannot be created or written, leaving nothing behind: ``path`` (the value of the
    option ``field``) must be a writable folder or not exist yet under a writable folder. A UsageError naming
    ``field`` says which (a file, a path under a file, no permission, a disk that refuses: the folder is made and a
    file written and removed there, then what was made is removed again). Commands call it for every output location
    before any work, so that a bad location never loses a finished result."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"`{field}` must be a folder; {str(path)!r} is a file")
    existing = path
    while not existing.exists():  # the nearest ancestor that exists decides whether ``path`` can be created
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(
            f"`{field}` {str(path)!r} cannot be created: {str(existing)!r} is a file, not a folder"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            f"`{field}` {str(path)!r} cannot be written: no write permission in {str(existing)!r}"
        )
    _probe(path, field)
    return path


def _probe(path: Path, field: str) -> None:
    """Make ``path`` (with its missing parents), write and remove a file in it, then remove the folders made: what
    permissions do not show (a read-only mount, a pseudo file system, a full disk) is refused now."""
    made: list[Path] = []
    try:
        for folder in [*reversed(path.parents), path]:
            if not folder.exists():
                folder.mkdir()
                made.append(folder)
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UsageError(
            f"`{field}` {str(path)!r} cannot be written: {err.strerror or err} ({err.filename or path}); choose a "
            "folder on a writable disk"
        ) from err
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass  # something else wrote there meanwhile: it is theirs


def check_output_file(path: str | os.PathLike, field: str) -> Path:
    """Refuse, creating nothing, an output file that cannot be written: ``path`` (the value of the option
    ``field``) must not be a folder, and its folder must be writable or creatable (:func:`check_output_dir`)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UsageError(f"`{field}` must be a file; {str(path)!r} is a folder")
    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(
            f"`{field}` {str(path)!r} cannot be created: {str(path.parent)!r} is a file, not a folder"
        )
    check_output_dir(path.parent, field)
    return path


def check_input_dir(path: str | os.PathLike, field: str, holding: str = "") -> Path:
    """Refuse an input folder that does not exist (:class:`~difftransformer.errors.MissingInputError`) or is a
    file; ``holding`` says what it should hold (e.g. "a saved model")."""
    path = Path(path).expanduser()
    what = f"a folder holding {holding}" if holding else "a folder"
    if not path.exists():
        raise MissingInputError(f"`{field}` must be {what}; {str(path)!r} does not exist")
    if not path.is_dir():
        raise UsageError(f"`{field}` must be {what}; {str(path)!r} is a file")
    return path


def atomic_write(path: str | os.PathLike, content: bytes | str | Callable[[IO[bytes]], None]) -> Path:
    """Write ``content`` (bytes, text as UTF-8, or a function writing to a binary file) to a temporary file
    beside ``path``, fsync it, then rename it over ``path``: readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            if callable(content):
                content(handle)
            else:
                handle.write(content.encode("utf-8") if isinstance(content, str) else content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def jsonable(value: Any) -> Any:
    """``value`` with tensors, numpy scalars, paths and tuples turned into JSON types; NaN becomes null and
    infinities the strings "inf" / "-inf" (strict JSON has neither)."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist"):  # torch tensors and numpy arrays / scalars
        return jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def versions() -> dict[str, str]:
    """The versions a result records beside its settings: this package, torch, transformers and Python."""
    found = {name: importlib.metadata.version(name) for name in ("difftransformer", "torch", "transformers")}
    return {**found, "python": platform.python_version()}


def write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Write ``payload`` as indented JSON, atomically."""
    return atomic_write(path, json.dumps(jsonable(payload), indent=2) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a missing, corrupt or truncated one is refused with a UsageError naming it (the user can
    restore or delete it)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UsageError(
            f"cannot read {path}: not a readable JSON file (missing, corrupt or truncated): {err}"
        ) from err
