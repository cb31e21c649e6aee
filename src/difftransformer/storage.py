"""Files on disk: the project's cache folder, atomic writes and JSON results.

The one module every layer of the package uses for these (it imports nothing from the package but
:mod:`difftransformer.errors`), so that a reader never sees half a file and every cache lands in the same folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from difftransformer.errors import UsageError


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
