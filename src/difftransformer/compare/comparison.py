"""One comparison carried out: its plan's runs fanned out on the cluster (the sweep first when there is one, then
every seed at each arm's chosen rate and the shared rate), their records gathered with those of an earlier report
of the same comparison, results.json written, and the report.

The data flows one way: :mod:`.plan` decides the runs, :mod:`.ray` runs them (each doing :mod:`.work` in its
worker), :mod:`.rates` chooses each arm's rate, :mod:`.history` adds what the folder reported before, and
:mod:`.report` writes what the records say.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from difftransformer.compare.history import extend_earlier
from difftransformer.compare.plan import ComparisonPlan, PlannedRun, plan_comparison, suite_settings
from difftransformer.compare.rates import best_rates, sweep_point
from difftransformer.compare.ray.cluster import Cluster, check_shared, connect
from difftransformer.compare.ray.grid import Grid
from difftransformer.compare.ray.tune import run_grid
from difftransformer.compare.records import RESULTS_JSON, read_evaluation, usage_seconds
from difftransformer.compare.report import build_report
from difftransformer.compare.settings import ComparisonSettings
from difftransformer.compare.work import RunWork
from difftransformer.data import DataOptions
from difftransformer.storage import versions, write_json
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.presets import Preset


def run_comparison(
    data: PreparedData,
    preset: Preset,
    comparison: ComparisonSettings,
    training: dict[str, Any],
    data_options: DataOptions | None = None,
    cluster: Cluster | None = None,
) -> Path:
    """Plan the comparison (:func:`~difftransformer.compare.plan.plan_comparison`), carry it out on ``cluster``
    (None: connect to the one ``comparison.ray_address`` names, or start one here) and write its report into
    ``comparison.output_dir``; returns the path of report.md. ``training``: the command line's training options
    beyond the preset's; ``data_options``: where ``data`` came from (recorded with every run and the report)."""
    plan = plan_comparison(preset, comparison, training, data_options)
    if cluster is not None:
        return carry_out(plan, data, cluster)
    with connect(comparison.ray_address) as connected:
        return carry_out(plan, data, connected)


def carry_out(plan: ComparisonPlan, data: PreparedData, cluster: Cluster) -> Path:
    """Train and evaluate every run of ``plan`` on ``cluster``, the sweep first when there is one, and write
    results.json and the report; returns the path of report.md."""
    comparison, out = plan.comparison, plan.out
    work = RunWork(data, suite_settings(plan, data), comparison, plan.data_options)
    out.mkdir(parents=True, exist_ok=True)
    data.tokenizer.save_pretrained(str(out / "tokenizer"))
    check_shared([out, *data.block_files()], cluster)

    def fan_out(runs: list[PlannedRun], desc: str) -> None:
        resources = cluster.resources_for(comparison.run_resources, len(runs))
        early_stop = comparison.sweep_early_stop and desc == "sweep"
        run_grid(Grid(tuple(runs), work, resources, comparison.run_retries, early_stop, desc))

    points = []
    if plan.sweep:
        fan_out(list(plan.sweep), "sweep")
        points = [sweep_point(run) for run in plan.sweep]
    final = plan.final(best_rates(points, comparison.rate_choice) if points else None)
    fan_out(final, "compare")
    provenance = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "comparison": comparison.to_json(),
        "preset": plan.preset.name,
        "training": dict(plan.training),
        "data": dataclasses.asdict(plan.data_options),
        "cluster": cluster.describe(),
    }
    extended = extend_earlier(
        out, provenance, [read_evaluation(run.folder) for run in final], points, comparison.variants
    )
    records, points = extended.records, extended.points
    best = best_rates(points, comparison.rate_choice) if points else None
    provenance["comparison"]["variants"] = [variant.spec() for variant in extended.variants]
    # Which runs this invocation trained: every one it planned that had not finished before it (the sweep's
    # included); the runs an earlier invocation finished, and those an earlier report adds, are reused.
    folders = list(dict.fromkeys([*(r.folder for r in records), *(run.folder for run in plan.sweep)]))
    reused = plan.finished | extended.earlier
    provenance["runs"] = {folder.relative_to(out).as_posix(): "reused" if folder in reused else "trained"
                          for folder in folders}  # fmt: skip
    # Every attempt at every run this report holds, this invocation's and earlier ones'.
    provenance["usage"] = usage_seconds(folders)
    results = {
        "provenance": provenance,
        "runs": [{**r.to_json(out), "reused": r.folder in reused} for r in records],
    }
    if points:
        results["learning_rates"] = {
            "shared": plan.shared_rate,
            "best": [
                {"scale": scale, "variant": spec, "learning_rate": rate}
                for (scale, spec), rate in best.items()
            ],
            "sweep": [dataclasses.asdict(point) for point in points],
        }
    folder = extended.folder
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / RESULTS_JSON, results)
    markdown, _ = build_report(
        records,
        extended.variants,
        data,
        plan.preset,
        comparison,
        folder,
        sweep=points,
        shared_rate=plan.shared_rate,
        best=best,
        origin=provenance["runs"],
    ).write(folder)
    if extended.beside:
        print(f"compare: this report is in {folder}, beside the one in {out}: {extended.beside}")
    return markdown
