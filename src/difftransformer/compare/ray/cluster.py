"""The Ray cluster a comparison runs on: one started on this machine, or an existing one at an address.

:func:`connect` refuses, in one line, within seconds and before any training: an address of the wrong form, one
where no Ray answers (nothing there, or another service), a cluster that asks for a token this command does not
hold, ``auto`` where no cluster was started with ``ray start`` on this machine (it never attaches to a Ray another
program started for itself, such as another ``compare``'s), a run's resources no node (or, for a data-parallel run,
no set of nodes) can hold, and an output folder or data file that some node cannot see (every node reads the
prepared data and writes its runs into the output folder, so they need storage they all mount: NFS, Lustre, a
shared volume). Each message names where the address came from: ``--ray-address`` or ``RAY_ADDRESS``. A Ray this
process started is stopped when the block ends; one found at an address is only disconnected from.
"""

from __future__ import annotations

import contextlib
import logging
import os
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
# How long an address has to answer as a Ray cluster does (Ray's own connection attempt retries for minutes).
_CONNECT_TIMEOUT = 5.0
FLAG = "`ray_address`"  # the option, as library messages name it (the command writes it --ray-address)
ENVIRONMENT = "RAY_ADDRESS"
_TOKEN_SOURCES = (
    "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; `ray get-auth-token` on its head prints it"
)


@dataclass(frozen=True)
class Cluster:
    """A connected Ray cluster: where it is (HOST:PORT, the one ``auto`` found where ``auto`` is true; None:
    started here), its alive nodes' resources, the dashboard."""

    address: str | None
    nodes: tuple[dict[str, float], ...]
    dashboard_url: str | None
    auto: bool = False

    def describe(self) -> str:
        where = "a Ray started on this machine"
        if self.address:
            where = f"the Ray cluster at {self.address}" + (" (found by auto)" if self.auto else "")
        cpus = sum(node.get("CPU", 0) for node in self.nodes)
        gpus = sum(node.get("GPU", 0) for node in self.nodes)
        return f"{where}: {len(self.nodes)} node(s), {cpus:g} CPUs, {gpus:g} GPUs"

    def resources_for(self, requested: RunResources | None, runs: int) -> RunResources:
        """``requested``, refused when the cluster cannot hold one run of it; else the default for ``runs``."""
        resources = requested or default_resources(list(self.nodes), runs)
        check_fits(resources, self.nodes, self.address)
        return resources


def requested_address(address: str | None) -> tuple[str, str] | None:
    """(the address, where it came from as messages name it) of the cluster to use: ``address`` (the option),
    else ``$RAY_ADDRESS``; None: start one here."""
    if address:
        return address, FLAG
    found = os.environ.get(ENVIRONMENT)
    return (found, ENVIRONMENT) if found else None


def check_address(address: str, source: str = FLAG) -> tuple[str, int] | None:
    """(host, port) of a cluster address HOST:PORT, None for auto (the cluster started on this machine with
    `ray start`); a UsageError naming ``source`` (where the address came from) for any other form."""
    if address == "auto":
        return None
    if "://" in address:
        raise UsageError(
            f"{source} must be HOST:PORT of the cluster's head (as `ray start --head` prints it) or auto; got "
            f"{address!r} (Ray Client addresses are not supported: run compare on a node of the cluster)"
        )
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{source} must be HOST:PORT (e.g. 10.0.0.1:6379) or auto; got {address!r}")
    return host.strip("[]"), int(port)


def _started_here(source: str) -> str:
    """HOST:PORT of the cluster `ray start` made on this machine (what ``auto`` means), as Ray records it; Ray's
    own ``auto`` would also take any Ray it finds running, another program's private one included."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )
    from ray._private.utils import read_ray_address

    found = read_ray_address()
    if not found:
        raise UsageError(
            f"{source} auto: no Ray cluster was started on this machine with `ray start` (auto never attaches to a "
            "Ray another program started for itself, such as another compare's); start one, or give HOST:PORT"
        )
    # As Ray's auto does: a cluster of this machine that asks for a token gets the one this machine holds.
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    return found


def _check_answers(address: str, given: str, source: str) -> None:
    """Refuse, within :data:`_CONNECT_TIMEOUT` seconds, an ``address`` where no Ray cluster answers (nothing, or a
    service that is not Ray) or whose cluster refuses this command's authentication, naming the address as the
    user ``given`` it (and the address auto found) and its ``source``: one request to the cluster's control service (the GCS), as Ray's own
    connection makes it first, with the token Ray would send."""
    import grpc
    from ray._raylet import AuthenticationTokenLoader
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    if address != given:  # found by auto
        given = f"{given} ({address})"
    token_mode = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    loader = AuthenticationTokenLoader.instance()
    metadata = tuple(loader.get_token_for_http_header().items()) if token_mode and loader.has_token() else ()
    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=_CONNECT_TIMEOUT, metadata=metadata
            )
            return
        except grpc.RpcError as error:
            code, details = error.code(), (error.details() or "").strip()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        if token_mode:
            raise UsageError(
                f"{source} {given}: the Ray cluster there refused this machine's authentication token "
                f"(RAY_AUTH_MODE=token): give it the cluster's token ({_TOKEN_SOURCES})"
            )
        raise UsageError(
            f"{source} {given}: the Ray cluster there asks for token authentication; set RAY_AUTH_MODE=token "
            f"and its token ({_TOKEN_SOURCES})"
        )
    raise UsageError(
        f"{source} {given}: no Ray cluster answers there ({details.rsplit(': ', 1)[-1] or code.name}); start one "
        f"with `ray start --head`, or leave {FLAG} (and {ENVIRONMENT}) unset to start one on this machine"
    )


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
    """Connect to the cluster at ``address`` (:func:`requested_address`), checked first (see the module's
    docstring), or start one on this machine with its cores and GPUs, listening on the loopback address alone;
    yields the :class:`Cluster` and disconnects (stopping a Ray it started) when the block ends. Ray's own messages
    stay in its logs: runs write to their folders."""
    import ray
    import torch

    requested = requested_address(address)
    target, auto = None, False
    if requested is not None:
        given, source = requested
        auto = check_address(given, source) is None
        target = _started_here(source) if auto else given
        _check_answers(target, given, source)
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
            if target is None:
                context = ray.init(
                    address="local",
                    num_cpus=len(os.sched_getaffinity(0)),
                    num_gpus=torch.cuda.device_count(),
                    _node_ip_address="127.0.0.1",
                    **options,
                )
            else:
                context = ray.init(address=target, **options)
        except (ConnectionError, RuntimeError, ValueError) as error:
            given, source = requested or ("local", FLAG)
            raise UsageError(f"{source} {given}: cannot connect to Ray ({error})") from None
        # Ray's driver aborts the process on SIGTERM (its C++ failure handler); it ends as Ctrl-C does instead:
        # the runs stopped, Ray shut down, finished runs kept for the same command to reuse.
        with sigterm_handler(raise_terminated):
            try:
                nodes = tuple(
                    {key: float(value) for key, value in node["Resources"].items()} for node in _alive_nodes()
                )
                url = getattr(context, "dashboard_url", None) or None
                yield Cluster(target, nodes, f"http://{url}" if url else None, auto)
            finally:
                ray.shutdown()


def check_shared(paths: Sequence[Path], cluster: Cluster) -> None:
    """Refuse, in one line naming the node by its ID (several nodes may share an address), when some node of
    ``cluster`` cannot read every one of ``paths`` (files and folders the driver made: the output folder, the
    prepared data's cache files) at the same path; nothing to check on a Ray started here."""
    if cluster.address is None or not paths:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(_missing)
    nodes = _alive_nodes()
    checks = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
            [str(path) for path in paths]
        )
        for node in nodes
    ]
    for node, missing in zip(nodes, ray.get(checks)):
        if missing:
            raise UsageError(
                f"node {node['NodeID']} ({node['NodeManagerAddress']}) of the Ray cluster cannot see {missing[0]}: "
                "the output folder and the data cache must lie on storage every node mounts at the same path (give "
                "`output_dir` and `cache_dir` there)"
            )


def _missing(paths: list[str]) -> list[str]:
    """The paths this node cannot see (run on each node)."""
    return [path for path in paths if not os.path.exists(path)]
