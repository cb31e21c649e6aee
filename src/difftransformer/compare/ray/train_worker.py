"""A run of several data-parallel workers under Ray Train: its ``TorchTrainer`` sets up the process group (DDP, or
FSDP with ``--fsdp``) that the Trainer then uses, each worker with its share of the run's cores and GPUs, and the
run's progress reported to its Tune trial."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from difftransformer.compare.ray.grid import Grid
from difftransformer.compare.ray.reporting import TuneReport, node_name

# The detached actor through which Ray Train asks the cluster for its workers' resources (Ray Data's name for it).
_COORDINATOR = {"name": "AutoscalingCoordinator", "namespace": "AutoscalingCoordinator"}


def train_data_parallel(index: int, grid: Grid) -> None:
    """Train the run ``index`` of ``grid`` with ``grid.resources.workers`` data-parallel processes under Ray Train,
    its progress reported to this trial."""
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    run, resources = grid.runs[index], grid.resources
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"run": index, "grid": grid},
        scaling_config=ray.train.ScalingConfig(
            num_workers=resources.workers,
            use_gpu=resources.gpus > 0,
            resources_per_worker={"CPU": resources.cpus_per_worker, "GPU": resources.gpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            name=f"{run.folder.name}-{int(time.time())}",
            storage_path=str(run.folder / "ray-train"),
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=0),  # Tune starts the trial again instead
        ),
    )
    trainer.fit()


def _worker(config: dict[str, Any]) -> None:
    """One of a run's data-parallel workers (Ray Train set RANK, WORLD_SIZE and the process group)."""
    import ray.train
    import torch

    grid: Grid = config["grid"]
    torch.set_num_threads(grid.resources.cpus_per_worker)
    grid.work(grid.runs[config["run"]], [TuneReport(ray.train.report, every_process=True)], node_name())


@contextlib.contextmanager
def no_coordinator_left() -> Iterator[None]:
    """Stop, once the block ends, the detached actor that Ray Train starts on the cluster to coordinate its
    workers' resources, unless it was there before (another job's): a cluster that ``compare`` only connects to
    would keep it for good."""
    import ray

    def coordinator():
        try:
            return ray.get_actor(**_COORDINATOR)
        except ValueError:  # no such actor
            return None

    found = coordinator() is not None
    try:
        yield
    finally:
        left = None if found else coordinator()
        if left is not None:
            ray.kill(left, no_restart=True)
