"""One run per output directory: a lock file holding the owner's pid."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from difftransformer.errors import UsageError

LOCK_NAME = ".lock"


class RunDirectoryLocked(UsageError, RuntimeError):
    """Another live process is writing into the same output directory."""


class RunDirectoryTaken(UsageError, FileExistsError):
    """The output directory holds another run's checkpoints and the run was not asked to resume it."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """Context manager owning ``output_dir/.lock``; refuses when a live process holds it, takes over a lock left by
    a dead one. Created with O_EXCL so two processes racing for a free directory cannot both win."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.path = Path(output_dir) / LOCK_NAME
        self.held = False

    def acquire(self) -> RunLock:
        """Take the lock, or raise :class:`RunDirectoryLocked` naming the live process that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except OSError as error:
                if error.errno != errno.EEXIST:
                    raise
                owner = self._owner()
                if owner is not None and owner != os.getpid() and _alive(owner):
                    raise RunDirectoryLocked(
                        f"output directory {self.path.parent} is in use by process {owner} (lock file {self.path}); "
                        "wait for it to finish, stop it, or choose another `output_dir`"
                    ) from None
                # The owner is gone (or the file is unreadable): the lock is stale, take it over.
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(f"{os.getpid()}\n")
            self.held = True
            return self
        raise RunDirectoryLocked(f"could not take the lock {self.path}: another process keeps recreating it")

    def _owner(self) -> int | None:
        try:
            return int(self.path.read_text().strip())
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        """Give the lock up (only if this process holds it)."""
        if self.held and self._owner() == os.getpid():
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
