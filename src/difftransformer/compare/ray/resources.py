"""What one run of a comparison holds while it trains: CPUs, GPUs and data-parallel worker processes.

``compare --run-resources cpus=4,gpus=2`` sets it for every run; unset, :func:`default_resources` fits it to the
cluster: one GPU a run where there are GPUs, else the CPUs split between as many runs as can train at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from difftransformer.errors import UsageError

_KEYS = ("cpus", "gpus", "workers")


@dataclass(frozen=True)
class RunResources:
    """One run's share of the cluster.

    Attributes:
        cpus: CPU cores (the run's torch threads, split between its workers).
        gpus: GPUs (0: the run trains on CPUs).
        workers: data-parallel processes of the run (DDP, or FSDP with ``--fsdp``), each with ``gpus / workers``
            GPUs and ``cpus / workers`` cores; more than one trains under Ray Train.
    """

    cpus: int = 1
    gpus: int = 0
    workers: int = 1

    def __post_init__(self) -> None:
        for name, low in (("cpus", 1), ("gpus", 0), ("workers", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UsageError(f"`run_resources`: {name} must be an integer >= {low}; got {value!r}")
        if self.cpus % self.workers:
            raise UsageError(
                f"`run_resources`: cpus ({self.cpus}) must be a multiple of workers ({self.workers}), so that "
                "each worker gets whole cores"
            )
        if self.gpus and self.gpus % self.workers:
            raise UsageError(
                f"`run_resources`: gpus ({self.gpus}) must be a multiple of workers ({self.workers}), so that "
                "each worker gets whole GPUs"
            )

    @property
    def cpus_per_worker(self) -> int:
        return self.cpus // self.workers

    @property
    def gpus_per_worker(self) -> int:
        return self.gpus // self.workers

    def __str__(self) -> str:
        return f"cpus={self.cpus},gpus={self.gpus},workers={self.workers}"


def parse_run_resources(text: str) -> RunResources:
    """'cpus=4,gpus=2' -> RunResources(cpus=4, gpus=2, workers=2): keys cpus, gpus and workers, each at most once;
    workers defaults to one per GPU (one process on CPUs)."""
    values: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _KEYS:
            raise UsageError(
                f"`run_resources` is KEY=N,... with KEY one of {', '.join(_KEYS)} (e.g. cpus=4,gpus=1); got {text!r}"
            )
        if key in values:
            raise UsageError(f"`run_resources`: {key} given twice in {text!r}")
        try:
            values[key] = int(value.strip())
        except ValueError:
            raise UsageError(f"`run_resources`: {key} must be an integer; got {value.strip()!r}") from None
    if "workers" not in values and values.get("gpus", 0) > 1:
        values["workers"] = values["gpus"]
    return RunResources(**values)


def default_resources(nodes: list[dict[str, float]], runs: int) -> RunResources:
    """One run's resources on a cluster whose nodes hold ``nodes`` (Ray's resource dicts: "CPU", "GPU"), for a
    grid of ``runs``: one GPU a run (with the CPUs of its node shared between its GPUs) where any node has GPUs;
    otherwise the cores split evenly between as many runs as can train at once (on 2 cores and 2 or more runs,
    one core each), never more cores than the smallest node holds, so that every node takes runs."""
    gpu_nodes = [node for node in nodes if node.get("GPU", 0) >= 1]
    if gpu_nodes:
        cpus = min(max(1, int(node.get("CPU", 1) // node["GPU"])) for node in gpu_nodes)
        return RunResources(cpus=cpus, gpus=1)
    cores = [int(node.get("CPU", 0)) for node in nodes if node.get("CPU", 0) >= 1]
    if not cores:
        return RunResources()
    total = sum(cores)
    return RunResources(cpus=max(1, min(min(cores), total // max(1, min(runs, total)))))
