"""What an earlier comparison in the same folder reported, so that a rerun never leaves a smaller report.

A rerun of ``compare`` into a folder that holds a report extends it when both are one comparison (the same preset,
data, training and evaluation settings, differing in variants, seeds or sizes alone): the new report holds every
run of both (each read again from its folder) and every learning-rate sweep point. Any other rerun whose report
would hold less than the earlier one (fewer runs, fewer evaluation tasks) writes it beside, under
``reports/DATE/``, and leaves the earlier one as it was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from difftransformer.compare.records import EVALUATION_JSON, RESULTS_JSON, RunRecord, SweepPoint
from difftransformer.compare.settings import ComparisonSettings
from difftransformer.compare.variants import Variant, parse_variant
from difftransformer.errors import UsageError
from difftransformer.storage import jsonable, read_json

# Comparison settings that choose which runs a comparison holds, or where and how they run: two comparisons that
# differ only in these are one comparison grown (or rerun elsewhere).
_GRID_SETTINGS = frozenset(
    {
        "variants",
        "seeds",
        "sizes",
        "token_budgets",
        "output_dir",
        "ray_address",
        "run_resources",
        "run_retries",
    }
)


@dataclass(frozen=True)
class Extended:
    """The runs, sweep points and variants to report, and the folder the report goes to (with why it is not the
    comparison folder itself, or None when it is)."""

    records: list[RunRecord]
    points: list[SweepPoint]
    variants: tuple[Variant, ...]
    folder: Path
    beside: str | None = None


def _same_comparison(earlier: dict, now: dict) -> bool:
    """Whether ``earlier`` (read from a results.json) and ``now`` (this invocation's provenance) are one comparison
    (:data:`_GRID_SETTINGS` aside). ``now`` is compared as results.json will hold it (:func:`jsonable`, as
    write_json writes it: tuples as lists), and a setting an older results.json lacks counts as its default."""
    now = jsonable(now)
    if any(earlier.get(key) != now.get(key) for key in ("preset", "training", "data")):
        return False
    fields = dataclasses.fields(ComparisonSettings)
    defaults = jsonable(
        {
            f.name: f.default
            for f in fields
            if f.name not in _GRID_SETTINGS and f.default is not dataclasses.MISSING
        }
    )
    first, second = earlier.get("comparison", {}), now.get("comparison", {})
    return all(
        first.get(key, defaults.get(key)) == second.get(key, defaults.get(key))
        for key in (set(first) | set(second)) - _GRID_SETTINGS
    )


def _tasks(records: Sequence[RunRecord]) -> set[str]:
    return {task for record in records for task in record.suite.get("summary", {})}


def extend_earlier(
    out: Path,
    provenance: dict,
    records: list[RunRecord],
    points: list[SweepPoint],
    variants: Sequence[Variant],
) -> Extended:
    """This invocation's ``records``, ``points`` and ``variants`` extended with what the report in ``out`` held
    (when both are one comparison), and where the report goes: ``out``, or ``out/reports/DATE`` when it would hold
    less than the report already there."""
    path = out / RESULTS_JSON
    if not path.is_file():
        return Extended(records, points, tuple(variants), out)
    try:
        earlier = read_json(path)
        earlier_records = [RunRecord.from_json(values) for values in earlier["runs"]]
        earlier_specs = list(earlier["provenance"]["comparison"]["variants"])
    except (UsageError, KeyError, TypeError) as err:
        return _beside(out, records, points, variants, f"{path} cannot be read ({err})")
    if _same_comparison(earlier["provenance"], provenance):
        folders = {record.folder for record in records}
        kept = [
            RunRecord.from_json(read_json(record.folder / EVALUATION_JSON))
            for record in earlier_records
            if record.folder not in folders and (record.folder / EVALUATION_JSON).is_file()
        ]
        known = {(p.scale, p.variant, p.learning_rate, p.seed, p.steps) for p in points}
        earlier_points = [
            SweepPoint(**values)
            for values in (earlier.get("learning_rates") or {}).get("sweep", [])
            if (values["scale"], values["variant"], values["learning_rate"], values["seed"], values["steps"])
            not in known
        ]
        specs = dict.fromkeys([*earlier_specs, *(variant.spec() for variant in variants)])
        return Extended(
            [*kept, *records], [*earlier_points, *points], tuple(parse_variant(spec) for spec in specs), out
        )
    lost_runs = {record.folder for record in earlier_records} - {record.folder for record in records}
    lost_tasks = _tasks(earlier_records) - _tasks(records)
    if not lost_runs and not lost_tasks:
        return Extended(records, points, tuple(variants), out)
    what = []
    if lost_runs:
        what.append(f"{len(lost_runs)} of its runs")
    if lost_tasks:
        what.append(f"the tasks {', '.join(sorted(lost_tasks))}")
    return _beside(
        out, records, points, variants, f"the report there holds {' and '.join(what)}, which this one lacks"
    )


def _beside(
    out: Path, records: list[RunRecord], points: list[SweepPoint], variants: Sequence[Variant], why: str
) -> Extended:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Extended(records, points, tuple(variants), out / "reports" / stamp, beside=why)
