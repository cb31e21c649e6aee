"""The error a user can fix: bad input to a command or a library call, as opposed to a bug.

:class:`UsageError` is a ``ValueError`` (what Python code expects of a bad argument), so a caller that catches
``ValueError`` keeps working; the ``difftransformer`` command turns it, and only it, into a one-line message
with exit status 2, so any other exception keeps its traceback and reads as the bug it is.
"""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input: the message names the argument, what was expected and what came."""


class MissingInputError(UsageError, FileNotFoundError):
    """A file or folder the user named does not exist (also a ``FileNotFoundError``)."""


SEED_LIMIT = 2**32  # Python's, NumPy's and transformers' set_seed take seeds in [0, 2**32)


def check_seed(seed: int, name: str = "seed") -> None:
    """Refuse a seed that NumPy (and so transformers' ``set_seed``) cannot take; ``name`` is the field or keyword
    the seed came in, for the message."""
    if not 0 <= seed < SEED_LIMIT:
        raise UsageError(f"`{name}` must lie in [0, 2**32 - 1]; got {seed}")
