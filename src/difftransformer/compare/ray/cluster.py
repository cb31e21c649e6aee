"""The Ray cluster a comparison runs on: one started on this machine, or an existing one at an address.

:func:`connect` refuses, in one line and before any training, an address nothing answers at, a run's resources
no node (or, for a data-parallel run, no set of nodes) can hold, and an output folder or data file that some node
cannot see (every node reads the prepared data and writes its runs into the output folder, so they need storage
they all mount: NFS, Lustre, a shared volume). A Ray this process started is stopped when the block ends; one found
at an address is only disconnected from.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from difftransformer.compare.ray.resources import RunResources, default_resources
from difftransformer.errors import UsageError
from difftransformer.process_signals import raise_terminated, sigterm_handler

# Environment of every worker process: tqdm bars in the runs' logs (run.log, a file) redraw at most twice a minute,
# and Tune leaves a trial in the worker's own folder rather than its trial folder (every path a run reads or writes
# is absolute; compare.settings makes them so).
WORKER_ENV = {"TQDM_MININTERVAL": "30", "RAY_CHDIR_TO_TRIAL_DIR": "0"}
_CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class Cluster:
    """A connected Ray cluster: where it is (None: started here), its alive nodes' resources, the dashboard."""

    address: str | None
    nodes: tuple[dict[str, float], ...]
    dashboard_url: str | None

    def describe(self) -> str:
        where = f"the Ray cluster at {self.address}" if self.address else "a Ray started on this machine"
        cpus = sum(node.get("CPU", 0) for node in self.nodes)
        gpus = sum(node.get("GPU", 0) for node in self.nodes)
        return f"{where}: {len(self.nodes)} node(s), {cpus:g} CPUs, {gpus:g} GPUs"

    def resources_for(self, requested: RunResources | None, runs: int) -> RunResources:
        """``requested``, refused when the cluster cannot hold one run of it; else the default for ``runs``."""
        resources = requested or default_resources(list(self.nodes), runs)
        check_fits(resources, self.nodes, self.address)
        return resources


def requested_address(address: str | None) -> str | None:
    """The cluster to use: ``address``, else ``$RAY_ADDRESS``, else None (start one here)."""
    return address or os.environ.get("RAY_ADDRESS") or None


def check_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a cluster address HOST:PORT, None for auto (Ray finds the cluster started on this machine
    with `ray start`); a UsageError for any other form."""
    if address == "auto":
        return None
    if "://" in address:
        raise UsageError(
            f"`ray_address` must be HOST:PORT of the cluster's head (as `ray start --head` prints it) or auto; got "
            f"{address!r} (Ray Client addresses are not supported: run compare on a node of the cluster)"
        )
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"`ray_address` must be HOST:PORT (e.g. 10.0.0.1:6379) or auto; got {address!r}")
    return host.strip("[]"), int(port)


def _check_reachable(address: str) -> None:
    """Refuse an address of the wrong form, or HOST:PORT where nothing answers within a few seconds (Ray's own
    connection attempt would retry for minutes)."""
    endpoint = check_address(address)
    if endpoint is None:
        return
    try:
        with socket.create_connection(endpoint, timeout=_CONNECT_TIMEOUT):
            pass
    except OSError as error:
        raise UsageError(
            f"`ray_address` {address}: no Ray cluster answers there ({error.strerror or error}); start one with "
            "`ray start --head`, or leave `ray_address` (and RAY_ADDRESS) unset to start one on this machine"
        ) from None


def check_fits(resources: RunResources, nodes: Sequence[dict[str, float]], address: str | None) -> None:
    """Refuse run resources that no node holds (one worker), or that the nodes together cannot hold (several)."""
    per_cpu, per_gpu = resources.cpus_per_worker, resources.gpus_per_worker

    def workers_on(node: dict[str, float]) -> int:
        fits = [node.get("CPU", 0) // per_cpu]
        if per_gpu:
            fits.append(node.get("GPU", 0) // per_gpu)
        return int(min(fits))

    if sum(workers_on(node) for node in nodes) >= resources.workers and (
        resources.workers > 1 or any(workers_on(node) for node in nodes)
    ):
        return
    where = f"the Ray cluster at {address}" if address else "this machine's Ray"
    shown = ", ".join(f"{node.get('CPU', 0):g} CPUs and {node.get('GPU', 0):g} GPUs" for node in nodes)
    raise UsageError(
        f"`run_resources` {resources}: {where} cannot hold one run (its nodes hold {shown or 'nothing'}); ask for "
        "less, or add nodes"
    )


def _alive_nodes() -> tuple[dict, ...]:
    import ray

    return tuple(node for node in ray.nodes() if node.get("Alive"))


@contextlib.contextmanager
def connect(address: str | None) -> Iterator[Cluster]:
    """Connect to the cluster at ``address`` (:func:`requested_address`), or start one on this machine with its
    cores and GPUs, listening on the loopback address alone; yields the :class:`Cluster` and disconnects (stopping
    a Ray it started) when the block ends. Ray's own messages stay in its logs: runs write to their folders."""
    import ray
    import torch

    address = requested_address(address)
    if address is not None:
        _check_reachable(address)
    options = dict(
        log_to_driver=False,
        logging_level=logging.ERROR,
        runtime_env={"env_vars": WORKER_ENV},
        configure_logging=True,
    )
    if ray.is_initialized():
        raise RuntimeError("compare connects to Ray itself; this process is already connected")
    # ray.init installs a SIGTERM handler for its driver; the caller's is put back when Ray is left.
    with sigterm_handler():
        try:
            if address is None:
                context = ray.init(
                    address="local",
                    num_cpus=len(os.sched_getaffinity(0)),
                    num_gpus=torch.cuda.device_count(),
                    _node_ip_address="127.0.0.1",
                    **options,
                )
            else:
                context = ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise UsageError(f"`ray_address` {address}: cannot connect to Ray ({error})") from None
        # Ray's driver aborts the process on SIGTERM (its C++ failure handler); it ends as Ctrl-C does instead:
        # the runs stopped, Ray shut down, finished runs kept for the same command to reuse.
        with sigterm_handler(raise_terminated):
            try:
                nodes = tuple(
                    {key: float(value) for key, value in node["Resources"].items()} for node in _alive_nodes()
                )
                url = getattr(context, "dashboard_url", None) or None
                yield Cluster(address=address, nodes=nodes, dashboard_url=f"http://{url}" if url else None)
            finally:
                ray.shutdown()


def check_shared(paths: Sequence[Path], cluster: Cluster) -> None:
    """Refuse, in one line, when some node of ``cluster`` cannot read every one of ``paths`` (files and folders
    the driver made: the output folder, the prepared data's cache files) at the same path; nothing to check on a
    Ray started here."""
    if cluster.address is None or not paths:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(_missing)
    checks = {
        node["NodeManagerAddress"]: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote([str(path) for path in paths])
        for node in _alive_nodes()
    }
    for node, missing in zip(checks, ray.get(list(checks.values()))):
        if missing:
            raise UsageError(
                f"node {node} of the Ray cluster cannot see {missing[0]}: the output folder and the data cache must "
                "lie on storage every node mounts at the same path (give `output_dir` and `cache_dir` there)"
            )


def _missing(paths: list[str]) -> list[str]:
    """The paths this node cannot see (run on each node)."""
    return [path for path in paths if not os.path.exists(path)]
