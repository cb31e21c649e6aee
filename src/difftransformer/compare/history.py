"""What an earlier comparison in the same folder reported, so that a rerun never leaves a smaller report.

A rerun of ``compare`` into a folder that holds a report extends it when both are one comparison (the same preset,
data, training and evaluation settings, differing in variants, seeds or sizes alone): the new report holds every
run of both (each read again from its folder) and every learning-rate sweep point. Any other rerun whose report
would hold less than the earlier one (fewer runs, fewer evaluation tasks) writes it beside, under
``reports/DATE/``, and leaves the earlier one as it was.

Runs are known by their folder relative to the comparison folder: a comparison folder copied or moved elsewhere and
rerun reads its own runs, each once, and never one outside it (results.json files written before folders were
relative name them absolutely; such a folder counts where it lies under the comparison folder the file records).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from difftransformer.compare.records import (
    EVALUATION_JSON,
    RESULTS_JSON,
    RunRecord,
    SweepPoint,
    read_evaluation,
)
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
        "allow_unjudged",
    }
)


@dataclass(frozen=True)
class Extended:
    """The runs, sweep points and variants to report, and the folder the report goes to (with why it is not the
    comparison folder itself, or None when it is); ``earlier``: the runs an earlier invocation reported that this
    one did not plan (the report holds them, reused)."""

    records: list[RunRecord]
    points: list[SweepPoint]
    variants: tuple[Variant, ...]
    folder: Path
    beside: str | None = None
    earlier: frozenset[Path] = frozenset()


def _earlier(out: Path) -> dict | None:
    """The results.json in ``out`` (None when there is none); a UsageError when it cannot be read."""
    path = out / RESULTS_JSON
    return read_json(path) if path.is_file() else None


def earlier_variants(out: Path) -> list[str]:
    """The variant specs of the report in the comparison folder ``out`` (none when it holds none, or one that
    cannot be read)."""
    try:
        earlier = _earlier(out)
        return list(earlier["provenance"]["comparison"]["variants"]) if earlier else []
    except (UsageError, KeyError, TypeError):
        return []


def _comparison_settings(provenance: dict) -> dict:
    """The comparison settings of a provenance, without what does not apply: ``rate_choice`` chooses among a
    sweep's rates (results.json files of comparisons without a sweep recorded its default)."""
    settings = dict(provenance.get("comparison", {}))
    if settings.get("learning_rates") is None:
        settings.pop("rate_choice", None)
    return settings


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
    first, second = _comparison_settings(earlier), _comparison_settings(now)
    return all(
        first.get(key, defaults.get(key)) == second.get(key, defaults.get(key))
        for key in (set(first) | set(second)) - _GRID_SETTINGS
    )


def _tasks(records: Sequence[RunRecord]) -> set[str]:
    return {task for record in records for task in record.suite.get("summary", {})}


def _here(folder: Path, out: Path, recorded_out: str | None) -> Path | None:
    """Where the run an earlier results.json names as ``folder`` lies in the comparison folder ``out``, or None
    when it lies outside: a relative folder is read in ``out``; an absolute one (older files) is taken relative to
    the comparison folder that file recorded (``recorded_out``), which is ``out`` itself unless it was copied or
    moved."""
    for root in (out, Path(recorded_out) if recorded_out else None):
        if root is not None and folder.is_relative_to(root):
            return out / folder.relative_to(root)
    return None


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
    try:
        earlier = _earlier(out)
        if earlier is None:
            return Extended(records, points, tuple(variants), out)
        recorded_out = earlier["provenance"]["comparison"].get("output_dir")
        earlier_records = [RunRecord.from_json(values, out) for values in earlier["runs"]]
        earlier_specs = list(earlier["provenance"]["comparison"]["variants"])
        sweep = (earlier.get("learning_rates") or {}).get("sweep", [])
        earlier_points = [SweepPoint.from_json(values) for values in sweep]
    except (UsageError, KeyError, TypeError) as err:
        return _beside(out, records, points, variants, f"{out / RESULTS_JSON} cannot be read ({err})")
    folders = {record.folder for record in records}
    earlier_folders = [_here(record.folder, out, recorded_out) for record in earlier_records]
    if _same_comparison(earlier["provenance"], provenance):
        kept = list(
            dict.fromkeys(
                folder
                for folder in earlier_folders
                if folder is not None and folder not in folders and (folder / EVALUATION_JSON).is_file()
            )
        )
        known = {(p.scale, p.variant, p.learning_rate, p.seed, p.steps) for p in points}
        grown = [
            p for p in earlier_points if (p.scale, p.variant, p.learning_rate, p.seed, p.steps) not in known
        ]
        specs = dict.fromkeys([*earlier_specs, *(variant.spec() for variant in variants)])
        return Extended(
            [*(read_evaluation(folder) for folder in kept), *records],
            [*grown, *points],
            tuple(parse_variant(spec) for spec in specs),
            out,
            earlier=frozenset(kept),
        )
    lost_runs = {folder for folder in earlier_folders if folder is not None} - folders
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
