"""Which runs a comparison trained and which it reused, and which runs its report holds, across reruns: a sweep
that trains its runs and then reads them again as the first seed's, a rerun that reuses everything, a comparison
folder copied elsewhere and rerun, one grown by a variant.

The runs are real (the micro preset, 2 steps, one evaluation task); the grid runs them one after the other in this
process (``run_grid`` replaced), which is what Ray does with them on one node, without starting a Ray."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from difftransformer.compare import cli as compare_cli
from difftransformer.compare import comparison
from difftransformer.compare.plan import plan_comparison
from difftransformer.compare.ray.cluster import Cluster
from difftransformer.compare.variants import parse_variants
from difftransformer.errors import UsageError
from difftransformer.train.cli import resolved_preset, training_options
from test_compare import compare_args, micro_data

HERE = Cluster(address=None, nodes=({"CPU": 2.0},), dashboard_url=None)


def _one_after_the_other(grid) -> None:
    for run in grid.runs:
        grid.work(run, [], "this process")


@pytest.fixture(scope="module")
def data():
    return micro_data(256)


@pytest.fixture
def serial(monkeypatch):
    monkeypatch.setattr(comparison, "run_grid", _one_after_the_other)


def compare_into(data, out: Path, **overrides) -> tuple[str, dict]:
    """(the report's first line, results.json) of a 2-step comparison into ``out``."""
    args = compare_args(out, max_steps=2, tasks=("outliers",), test_blocks=4, **overrides)
    training = {k: v for k, v in training_options(args).items() if k != "output_dir"}
    plan = plan_comparison(resolved_preset(args), compare_cli.comparison_settings(args), training)
    markdown = comparison.carry_out(plan, data, HERE)
    return markdown.read_text().splitlines()[2], json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_a_sweep_counts_every_run_it_trained_and_a_rerun_reuses_them(data, serial, tmp_path):
    """The sweep's runs at full length are the first seed's runs: trained by this invocation, though the seed phase
    reads them again (issue 46; the sweep report's defect 4a)."""
    first, results = compare_into(data, tmp_path, learning_rates=[1e-3, 3e-3])
    sweep = {
        f"runs/micro-{spec}-lr{rate}-seed0" for spec in ("diff", "softmax") for rate in ("0.001", "0.003")
    }
    assert results["provenance"]["runs"] == dict.fromkeys(sorted(sweep), "trained")
    assert "; 4 run(s) trained by this invocation, 0 reused from an earlier one" in first
    assert not any(run["reused"] for run in results["runs"])
    assert {run["folder"] for run in results["runs"]} <= sweep  # folders relative to the comparison folder
    again, results = compare_into(data, tmp_path, learning_rates=[1e-3, 3e-3])
    assert results["provenance"]["runs"] == dict.fromkeys(sorted(sweep), "reused")
    assert "; 0 run(s) trained by this invocation, 4 reused from an earlier one" in again
    assert all(run["reused"] for run in results["runs"])
    # A finished run whose folder no longer loads is refused in one line naming it, as generate, eval and convert
    # refuse it (it ended in a traceback: the sweep report's defect 10; Ray's trial reports a UsageError as such).
    config = tmp_path / "runs" / "micro-diff-lr0.003-seed0" / "config.json"
    config.write_text(config.read_text().replace('"attention": "diff"', '"attention": "foo"'))
    with pytest.raises(
        UsageError, match=r"^`output_dir` '\S*micro-diff-lr0.003-seed0': cannot load the model: "
    ):
        compare_into(data, tmp_path, learning_rates=[1e-3, 3e-3])


@pytest.mark.slow  # three comparisons; tests/test_compare_history.py covers both halves on planted runs
def test_a_copied_comparison_reads_its_own_runs_once_and_a_grown_one_reuses_the_earlier_ones(
    data, serial, tmp_path
):
    """A comparison folder copied and rerun reports its runs once, from the copy (the sweep report's defect 1: 8
    runs for a 4-run grid, the earlier folder's read too); adding a variant trains one run and reuses the rest
    (defect 4b)."""
    compare_into(data, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b", symlinks=True)
    first, results = compare_into(data, tmp_path / "b")
    folders = ["runs/micro-diff-seed0", "runs/micro-softmax-seed0"]
    assert sorted(run["folder"] for run in results["runs"]) == folders
    assert "; 0 run(s) trained by this invocation, 2 reused" in first
    shutil.rmtree(tmp_path / "a")  # nothing of the copy's report depended on the source
    grown, results = compare_into(data, tmp_path / "b", variants=parse_variants("diff_v2"))
    assert sorted(run["folder"] for run in results["runs"]) == [
        *folders[:1],
        "runs/micro-diff_v2-seed0",
        folders[1],
    ]
    assert results["provenance"]["runs"] == {
        "runs/micro-diff-seed0": "reused",
        "runs/micro-softmax-seed0": "reused",
        "runs/micro-diff_v2-seed0": "trained",
    }
    assert "; 1 run(s) trained by this invocation, 2 reused" in grown
    assert results["provenance"]["comparison"]["variants"] == ["diff", "softmax", "diff_v2"]
