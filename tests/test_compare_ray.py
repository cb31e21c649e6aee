"""`compare` on Ray clusters started here: a grid fanned out over two nodes gives the numbers of the same grid run
one run at a time, a worker killed mid-run is started again and ends with the uninterrupted run's weights, and a
cluster that cannot serve the command is refused before any training.

The clusters are Ray's test clusters (``ray.cluster_utils.Cluster``: several nodes on this machine), listening on
the loopback address alone; each test stops the cluster it started and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from safetensors.torch import load_file

from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.checkpoints import COMPLETE_MARKER
from difftransformer.train.lock import LOCK_NAME
from difftransformer.train.runner import METRICS_CSV
from test_train_support import as_from_a_shell, synthetic_texts

# Ray resolves a loopback address to the machine's own network address unless told that clusters stay local.
LOCAL = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Timings and where a run was trained differ between two runs of one grid; every other number must not.
_UNSTABLE = {"tokens_per_second", "train_seconds", "seconds", "folder", "reused", "date", "cluster", "runs", "usage",
             "ray_address", "output_dir"}  # fmt: skip


@pytest.fixture
def cluster(monkeypatch):
    """One node of one CPU; the test may add a second (``cluster.add_node(**NODE)``)."""
    for name, value in LOCAL.items():
        monkeypatch.setenv(name, value)
    from ray.cluster_utils import Cluster

    started = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        yield started
    finally:
        started.shutdown()


NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.txt"
    path.write_text("\n\n".join(synthetic_texts(count=120)))
    return path


def compare_command(
    text_file: Path,
    out: Path,
    address: str | None,
    *extra: str,
    variants: str = "diff,softmax",
    seeds: str = "0,1",
) -> list[str]:
    """compare on the micro preset, with a learning-rate sweep and the cluster at ``address`` (None: its own)."""
    return [
        sys.executable, "-m", "difftransformer", "compare", "--preset", "micro", "--data", str(text_file),
        "--vocab-size", "320", "--output-dir", str(out), "--variants", variants, "--seeds", seeds,
        "--learning-rates", "1e-3,3e-3", "--tasks", "mqar", "--test-blocks", "4", "--report-to", "none",
        "--max-steps", "30", "--save-steps", "10", "--eval-steps", "10", "--logging-steps", "5",
        "--per-device-train-batch-size", "32", *(["--ray-address", address] if address else []), *extra,
    ]  # fmt: skip


def run_compare(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **LOCAL}, timeout=600, **kwargs
    )


def interrupt_compare(
    command: list[str], when, sig: int, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Start ``command`` (with ``env`` added to the environment), send it ``sig`` once ``when()`` holds, and wait
    for it to end."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **LOCAL, **(env or {})}, cwd=cwd, preexec_fn=as_from_a_shell)  # fmt: skip
    deadline = time.monotonic() + 300
    while not when() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if process.poll() is not None:
        raise AssertionError(
            f"compare ended before it could be interrupted: {process.communicate()[1][-3000:]}"
        )
    process.send_signal(sig)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def processes_with(marker: str) -> set[int]:
    """Pids of this user's processes whose environment holds ``marker``: what one command started (Ray's head
    processes and workers inherit the environment of the driver that started them), whatever else runs here."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environment = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if marker.encode() in environment.split(b"\0"):
            found.add(int(pid))
    return found


def stable(value):
    """``value`` (results.json's data) without what differs between two runs of one grid."""
    if isinstance(value, dict):
        return {key: stable(item) for key, item in value.items() if key not in _UNSTABLE}
    if isinstance(value, list):
        return [stable(item) for item in value]
    return value


def nodes_of(folder: Path) -> list[str]:
    """The Ray nodes that ran the run in ``folder``, one per attempt (run.log's headers)."""
    return re.findall(r"on Ray node (\w+) ---", (folder / "run.log").read_text())


def kill_when_saved(folder: Path, step: int, killed: list[int]) -> None:
    """SIGKILL the process training ``folder`` once its checkpoint ``step`` is finished (its pid from the lock)."""
    marker = folder / f"checkpoint-{step}" / COMPLETE_MARKER
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if marker.is_file() and (folder / LOCK_NAME).is_file():
            pid = int((folder / LOCK_NAME).read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.02)


@pytest.mark.slow
def test_a_grid_on_two_nodes_gives_the_numbers_of_one_run_at_a_time(cluster, text_file, tmp_path):
    # One run at a time (one node of one core), the driver killed after the first run and during the second;
    # the same command again reuses the first and resumes the second.
    # A relative output folder (the workers stand elsewhere).
    command = compare_command(text_file, Path("one"), cluster.address)
    first, second = (
        tmp_path / "one" / "runs" / name for name in ("micro-diff-lr0.001-seed0", "micro-diff-lr0.003-seed0")
    )
    killed = interrupt_compare(
        command, lambda: (second / "checkpoint-10" / COMPLETE_MARKER).is_file(), signal.SIGKILL, cwd=tmp_path
    )
    assert killed.returncode == -signal.SIGKILL
    finished = (first / "train_summary.json").stat().st_mtime_ns
    assert not (second / "train_summary.json").exists()
    one_at_a_time = run_compare(command, cwd=tmp_path)
    assert one_at_a_time.returncode == 0, one_at_a_time.stderr[-3000:]
    assert (first / "train_summary.json").stat().st_mtime_ns == finished
    assert "resuming from" in (second / "run.log").read_text()

    cluster.add_node(**NODE)
    fanned = tmp_path / "fanned"
    victim = fanned / "runs" / "micro-diff-lr0.001-seed0"
    killed: list[int] = []
    killer = threading.Thread(target=kill_when_saved, args=(victim, 10, killed))
    killer.start()
    both = run_compare(compare_command(text_file, fanned, cluster.address))
    killer.join()
    assert both.returncode == 0, both.stderr[-3000:]

    first = json.loads((tmp_path / "one" / "results.json").read_text())
    second = json.loads((fanned / "results.json").read_text())
    assert stable(second) == stable(first)
    # The sweep and the seeds at the chosen rates: 2 variants x 2 rates on seed 0, then seed 1.
    assert len(second["learning_rates"]["sweep"]) == 4 and len(second["runs"]) >= 4
    runs = sorted(path for path in (fanned / "runs").iterdir())
    assert len({node for run in runs for node in nodes_of(run)}) == 2, "every run landed on one node"
    # The killed worker was started again from its checkpoint and ended with the uninterrupted run's weights.
    assert killed, "the run finished before its worker could be killed"
    assert len(nodes_of(victim)) == 2 and "resuming from" in (victim / "run.log").read_text()
    for folder in runs:
        ours = load_file(folder / "model.safetensors")
        theirs = load_file(tmp_path / "one" / "runs" / folder.name / "model.safetensors")
        assert ours.keys() == theirs.keys()
        assert all((ours[name] == theirs[name]).all() for name in ours), folder.name
    assert (fanned / "report.md").is_file() and "Learning rates" in (fanned / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, status, ended",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
    ids=["ctrl-c", "sigterm"],
)
def test_ctrl_c_or_sigterm_stops_the_grid_in_one_line_and_the_ray_it_started(
    sig, status, ended, text_file, tmp_path, monkeypatch
):
    """SIGTERM (kill, a scheduler's stop) ends compare as Ctrl-C does, where Ray's driver would abort."""
    for name, value in LOCAL.items():
        monkeypatch.setenv(name, value)
    # This compare's processes, and only them: another Ray on the machine (a test beside this one, a cluster
    # someone started) failed the count of every Ray process (the sweep report's defect 16).
    marker = f"DIFFTRANSFORMER_TEST_RUN={uuid.uuid4().hex}"
    out = tmp_path / "out"
    seen: set[int] = set()

    def checkpointed() -> bool:
        if any(out.glob("runs/*/checkpoint-10")):
            seen.update(processes_with(marker))
            return True
        return False

    # A run far longer than the wait for its first checkpoint: a slow machine cannot finish it before the signal.
    command = compare_command(
        text_file, out, None, "--max-steps", "3000", "--allow-unjudged", variants="softmax", seeds="0"
    )
    stopped = interrupt_compare(command, checkpointed, sig, env=dict([marker.split("=")]))
    assert stopped.returncode == status, stopped.stderr[-3000:]
    assert re.search(r"compare: Ray's dashboard at http://127\.0\.0\.1:\d+ ", stopped.stdout), stopped.stdout
    lines = [line for line in stopped.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert lines[-1] == (
        f"difftransformer compare: {ended}; the same command continues it (finished runs are reused, a killed "
        "one resumes)"
    )
    assert not [line for line in lines if "Traceback" in line]
    assert len(seen) > 2, "the Ray this compare started (its head's processes and a worker) was not found"
    deadline = time.monotonic() + 30
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_with(marker), "the Ray compare started outlived it"


@pytest.mark.slow
def test_a_cluster_that_cannot_serve_the_command_is_refused_before_training(cluster, text_file, tmp_path):
    out = tmp_path / "out"
    too_big = run_compare(compare_command(text_file, out, cluster.address, "--run-resources", "cpus=2"))
    assert too_big.returncode == 2
    assert (
        too_big.stderr.strip().splitlines()[-1].startswith("difftransformer compare: error: --run-resources")
    )
    gpus = run_compare(compare_command(text_file, out, cluster.address, "--run-resources", "gpus=1"))
    assert gpus.returncode == 2 and "cannot hold one run" in gpus.stderr
    nobody = run_compare(compare_command(text_file, out, "127.0.0.1:9"))
    assert nobody.returncode == 2
    assert "--ray-address 127.0.0.1:9: no Ray cluster answers there" in nobody.stderr.strip().splitlines()[-1]
    assert not (out / "runs").exists() or not any((out / "runs").iterdir())


@pytest.mark.slow
def test_a_run_of_two_workers_trains_as_one_process_with_their_whole_batch(text_file, tmp_path, monkeypatch):
    """Ray Train's two CPU workers (DDP over gloo) log the losses of one process with twice the per-device batch,
    as two torchrun processes do (tests/test_train_ddp.py)."""
    for name, value in LOCAL.items():
        monkeypatch.setenv(name, value)
    runs = {}
    for name, resources, batch in (("two", "cpus=2,workers=2", "4"), ("one", "cpus=1", "8")):
        command = [
            sys.executable, "-m", "difftransformer", "compare", "--preset", "micro", "--data", str(text_file),
            "--vocab-size", "320", "--output-dir", str(tmp_path / name), "--variants", "diff", "--allow-unjudged",
            "--tasks", "mqar", "--test-blocks", "4", "--report-to", "none", "--max-steps", "4", "--logging-steps", "1",
            "--eval-steps", "4", "--per-device-train-batch-size", batch, "--run-resources", resources,
        ]  # fmt: skip
        done = run_compare(command)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = read_metrics(tmp_path / name / "runs" / "micro-diff-seed0" / METRICS_CSV)
        assert json.loads((tmp_path / name / "results.json").read_text())["runs"][0]["tokens"] == 4 * 8 * 256
    assert column(runs["two"], "loss")[0] == column(runs["one"], "loss")[0] == [1, 2, 3, 4]
    assert column(runs["two"], "loss")[1] == pytest.approx(column(runs["one"], "loss")[1], abs=1e-5)
    assert column(runs["two"], "eval_loss")[1] == pytest.approx(column(runs["one"], "eval_loss")[1], abs=1e-5)
    assert list((tmp_path / "two" / "runs" / "micro-diff-seed0").glob("run.rank.*.log"))


@pytest.mark.slow
def test_leaving_ray_puts_back_the_callers_sigterm_handler():
    """ray.init installs its driver's SIGTERM handler; a program that calls compare keeps its own after."""
    from difftransformer.compare.ray.cluster import connect

    def own(*_):
        return None

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with connect(None):
            assert signal.getsignal(signal.SIGTERM) is not own
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.slow
def test_ray_trains_coordinator_is_not_left_on_the_cluster_unless_it_was_there():
    """Ray Train starts a detached actor that coordinates its workers' resources; after a data-parallel grid on a
    cluster compare only connects to, it stayed there for good (the sweep report). One that was there before
    belongs to another job and stays."""
    import ray
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    from difftransformer.compare.ray.cluster import connect
    from difftransformer.compare.ray.train_worker import no_coordinator_left

    def coordinator():
        try:
            return ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
        except ValueError:
            return None

    with connect(None):
        with no_coordinator_left():
            ray.get(get_or_create_autoscaling_coordinator().__ray_ready__.remote())  # as Ray Train makes it
        deadline = time.monotonic() + 30
        while coordinator() is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert coordinator() is None
        ray.get(get_or_create_autoscaling_coordinator().__ray_ready__.remote())  # another job's
        with no_coordinator_left():
            pass
        assert coordinator() is not None
