"""The cluster checks compare makes before any work, each a line within seconds: an address where something other
than Ray answers (an HTTP server), a cluster that asks for a token, ``auto`` where no ``ray start`` cluster is,
an address from RAY_ADDRESS named as such, and storage some node cannot see, however many nodes share one address.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time

import pytest
import ray

from difftransformer.compare.ray import cluster as cluster_module
from difftransformer.compare.ray.cluster import Cluster, check_shared, connect
from difftransformer.errors import UsageError
from helpers import free_port


@pytest.fixture
def http_server():
    """HOST:PORT of an HTTP server (not Ray) on the loopback address."""
    server = http.server.HTTPServer(("127.0.0.1", free_port()), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def refusal(address: str | None) -> tuple[str, float]:
    """The line ``connect(address)`` refuses with, and the seconds it took."""
    start = time.monotonic()
    with pytest.raises(UsageError) as refused:
        with connect(address):
            pass
    return str(refused.value), time.monotonic() - start


def test_an_address_where_something_else_or_nothing_answers_is_refused_within_seconds(
    http_server, monkeypatch
):
    """An HTTP server at the address kept compare waiting for 450 s and more (the sweep report's defect 7)."""
    line, seconds = refusal(http_server)
    assert line.startswith(f"`ray_address` {http_server}: no Ray cluster answers there (") and seconds < 15, (
        line
    )
    nothing = f"127.0.0.1:{free_port()}"
    line, seconds = refusal(nothing)
    assert line.startswith(f"`ray_address` {nothing}: no Ray cluster answers there (") and seconds < 15, line
    # The address came from the environment: the message says so, not --ray-address (a papercut of the sweep).
    monkeypatch.setenv("RAY_ADDRESS", http_server)
    line, _ = refusal(None)
    assert line.startswith(f"RAY_ADDRESS {http_server}: no Ray cluster answers there"), line
    monkeypatch.setenv("RAY_ADDRESS", "one")
    assert refusal(None)[0] == "RAY_ADDRESS must be HOST:PORT (e.g. 10.0.0.1:6379) or auto; got 'one'"


def test_auto_is_the_cluster_ray_start_made_never_a_ray_found_running(http_server, monkeypatch, tmp_path):
    """Ray's auto takes any Ray it finds running when `ray start` recorded none: another compare's private Ray,
    which went away with it (the sweep report's defect 9). Here the scan would find one; auto must not look."""
    monkeypatch.setenv(
        "RAY_TMPDIR", str(tmp_path / "empty")
    )  # where `ray start` records its cluster: nothing
    from ray._private import services

    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset({http_server}))
    line, seconds = refusal("auto")
    assert line.startswith("`ray_address` auto: no Ray cluster was started on this machine with `ray start`")
    assert seconds < 15
    # Where `ray start` recorded one, auto is that address, and the messages say which it found.
    (tmp_path / "recorded" / "ray").mkdir(parents=True)
    (tmp_path / "recorded" / "ray" / "ray_current_cluster").write_text(http_server)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "recorded"))
    line, _ = refusal("auto")
    assert line.startswith(f"`ray_address` auto ({http_server}): no Ray cluster answers there"), line
    found = Cluster(http_server, ({"CPU": 2.0},), None, auto=True)
    assert found.describe() == f"the Ray cluster at {http_server} (found by auto): 1 node(s), 2 CPUs, 0 GPUs"


@pytest.mark.slow
def test_a_cluster_that_asks_for_a_token_is_refused_naming_token_authentication(tmp_path, monkeypatch):
    """A Ray 2.60 cluster with token authentication (a Ray started by ray.init has it by default) refused with 20
    lines of Ray's own and a message that never said "token" (the sweep report's defect 12)."""
    head = subprocess.Popen(
        [sys.executable, "-c", "import ray, sys, time\n"
         "context = ray.init(address='local', num_cpus=1, include_dashboard=False)\n"
         "print(context.address_info['gcs_address'], flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "HOME": str(tmp_path)},  # its own token, in HOME/.ray
    )  # fmt: skip
    try:
        address = head.stdout.readline().strip()
        assert address, "the token-authenticated Ray did not start"
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        line, seconds = refusal(address)
        assert line.startswith(
            f"`ray_address` {address}: the Ray cluster there asks for token authentication"
        )
        assert "set RAY_AUTH_MODE=token" in line and seconds < 15, line
    finally:
        head.stdin.close()  # the head stops when its input ends
        head.wait(timeout=60)


def test_the_storage_check_asks_every_node_even_several_at_one_address(monkeypatch, tmp_path):
    """Nodes were probed one per IP address, so a node that cannot see the output folder passed when another node
    at its address was listed after it; the refusal names the node by its ID (the sweep report's defects 8, 13).
    Ray's remote call is replaced by one that answers as each node would."""
    ids = [format(i + 1, "056x") for i in range(3)]  # Ray's node IDs: 28 bytes in hex
    nodes = tuple({"NodeID": node, "NodeManagerAddress": "10.0.0.1", "Alive": True} for node in ids)
    monkeypatch.setattr(cluster_module, "_alive_nodes", lambda: nodes)

    class OnNode:
        def options(self, scheduling_strategy):
            self.node = scheduling_strategy.node_id
            return self

        def remote(self, paths):
            return self.node, paths

    monkeypatch.setattr(ray, "remote", lambda **_: lambda function: OnNode())
    monkeypatch.setattr(ray, "get", lambda asked: [paths if node == ids[1] else [] for node, paths in asked])
    with pytest.raises(UsageError, match=rf"^node {ids[1]} \(10\.0\.0\.1\) of the Ray cluster cannot see "):
        check_shared([tmp_path], Cluster("10.0.0.1:6379", (), None))
