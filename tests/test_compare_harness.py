"""compare --lm-eval-tasks: harness metrics of every run in the report (planted numbers, and end to end on the
micro preset with a local task, slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difftransformer.compare.report import harness_section
from difftransformer.compare.report.arms import group
from difftransformer.compare.report.document import Report
from difftransformer.compare.variants import parse_variants
from test_claims import record
from test_compare import PNG, compare, compare_args, micro_data


def with_harness(run, acc: float):
    run.harness = {
        "options": {
            "tasks": ["dt_choice"],
            "include_path": None,
            "limit": 4,
            "batch_size": 8,
            "seed": run.seed,
        },
        "metrics": {"dt_choice": {"acc": acc, "acc_stderr": 0.1, "acc_norm": acc / 2}},
    }
    return run


def test_harness_section_tabulates_each_metric_without_stderr(tmp_path):
    records = [
        with_harness(record("diff", 0, 4.4, 0.5), 0.5),
        with_harness(record("diff", 1, 4.4, 0.5), 0.7),
        with_harness(record("softmax", 0, 4.6, 0.5), 0.25),
        with_harness(record("softmax", 1, 4.6, 0.5), 0.25),
    ]
    report = Report("harness")
    harness_section(report, group(records, parse_variants("diff,softmax")), tmp_path)
    text = report.markdown()
    assert "| variant | dt_choice acc | dt_choice acc_norm |" in text
    assert "| DIFF | 0.600 ± 0.141 | 0.300 ± 0.071 |" in text and "| Transformer | 0.250 ± 0.000 |" in text
    assert "stderr" not in text.split("| variant |")[1] and "HellaSwag 66.2 vs 63.4" in text
    assert (tmp_path / "lm_eval.png").read_bytes()[:8] == PNG
    empty = Report("none")
    harness_section(empty, group([record("diff", 0, 4.4, 0.5)], parse_variants("diff")), tmp_path)
    assert empty.markdown() == "# none\n"


@pytest.mark.slow
def test_compare_runs_local_harness_tasks_on_every_model(tmp_path):
    pytest.importorskip("lm_eval")
    from test_harness import OFFLINE, write_tasks

    tasks = write_tasks(tmp_path / "tasks")
    data = micro_data(256)
    args = compare_args(
        tmp_path / "cmp", max_steps=2, tasks=("mqar",), lm_eval_tasks=["dt_choice"], lm_eval_include=str(tasks),
        lm_eval_limit=4,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        for key, value in OFFLINE.items():
            patch.setenv(key, value)
        text = compare(data, args).read_text()
    assert "## LM Evaluation Harness" in text and "| DIFF | " in text.split("## LM Evaluation Harness")[1]
    runs = json.loads(Path(tmp_path / "cmp" / "results.json").read_text())["runs"]
    assert all(0.0 <= run["harness"]["metrics"]["dt_choice"]["acc"] <= 1.0 for run in runs)
