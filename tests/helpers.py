"""Small models with every parameter randomised, for the model and conversion tests; a local port and a
completion from an OpenAI-compatible server, for the serving tests."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import torch

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM


def tiny_config(**overrides) -> DiffTransformerConfig:
    fields = dict(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2
    )
    fields.update(overrides)
    return DiffTransformerConfig(**fields)


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial values everywhere: gains around 1, lambda vectors and projections well away from 0."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
        if name.endswith("layernorm.weight") or name.endswith("norm.weight") or "subln" in name:
            param.copy_(1.0 + 0.3 * noise)
        elif "lambda_" in name and "proj" not in name:
            param.copy_(0.3 * noise)
        else:
            param.copy_(noise / param.shape[-1] ** 0.5 * 1.3)
    return model


def random_model(
    seed: int = 0, dtype: torch.dtype = torch.float64, **overrides
) -> DiffTransformerForCausalLM:
    model = DiffTransformerForCausalLM(tiny_config(**overrides)).to(dtype)
    return randomize(model, seed).eval()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def completion_from_server(command: list[str], env: dict, port: int, body: dict, timeout: float) -> dict:
    """Start the OpenAI-compatible server ``command`` (listening on 127.0.0.1:``port``), wait up to ``timeout``
    seconds for /health, POST ``body`` to /v1/completions and return the answer; the server is stopped whatever
    happens."""
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()[-4000:]
                time.sleep(0.5)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        return json.loads(urllib.request.urlopen(request, timeout=timeout).read())
    finally:
        server.terminate()
        server.wait(timeout=60)


# The start of a script run in a fresh interpreter (arguments: the package's source root, then the script's own):
# difftransformer is made impossible to import (a meta-path finder refusing it and its source root off sys.path).
NO_PACKAGE = r"""
import importlib.abc, os, sys

package_root, work = sys.argv[1], sys.argv[2]


class RefuseDifftransformer(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "difftransformer":
            raise ImportError(f"{name} cannot be imported in this test")
        return None


sys.meta_path.insert(0, RefuseDifftransformer())
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != package_root]
try:
    import difftransformer  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("difftransformer is importable: the test proves nothing")
"""
