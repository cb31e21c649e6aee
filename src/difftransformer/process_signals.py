"""The process's SIGTERM handler, set for a stretch of work and put back after it, and the handler that makes
SIGTERM end a command as Ctrl-C does."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Handler = Callable[[int, Any], Any] | int | None


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a cluster scheduler's stop) raised as Ctrl-C's KeyboardInterrupt is, so that the same
    clean-up runs; the ``difftransformer`` command then ends with status 143."""


_terminated = threading.Event()


def raise_terminated(signum: int, frame: Any) -> None:
    """A SIGTERM handler: :class:`Terminated` in the main thread (and :func:`was_terminated` true from then on)."""
    _terminated.set()
    raise Terminated()


def was_terminated(interrupt: BaseException) -> bool:
    """Whether ``interrupt``, a KeyboardInterrupt that ended a command, came from SIGTERM: a :class:`Terminated`, or
    the plain KeyboardInterrupt a library raised in its place after :func:`raise_terminated` ran (Ray replaces the
    exception of a signal handler that runs while its driver waits in C++ with one of its own)."""
    return isinstance(interrupt, Terminated) or _terminated.is_set()


@contextmanager
def sigterm_handler(during: Handler = None) -> Iterator[None]:
    """The main thread's SIGTERM handler as it was once the block ends, whatever the block installed (Ray's
    driver installs its own); with ``during``, that handler inside the block (``signal.SIG_DFL``: what processes
    forked inside it are born with). Off the main thread, where handlers cannot be set, the block runs untouched."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if during is not None:
        signal.signal(signal.SIGTERM, during)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler set outside Python, which cannot be put back from it
            signal.signal(signal.SIGTERM, previous)
