"""A rerun of compare never leaves a smaller report: one comparison grown by variants, seeds or sizes reports every
run of both invocations; a narrower one (fewer tasks, other settings) writes its report beside the earlier one."""

from __future__ import annotations

import shutil
from pathlib import Path

from difftransformer.compare.history import extend_earlier
from difftransformer.compare.records import EVALUATION_JSON, RESULTS_JSON, RunRecord, SweepPoint
from difftransformer.compare.variants import parse_variants
from difftransformer.storage import write_json


def record(root: Path, spec: str, seed: int, tasks=("outliers", "quant")) -> RunRecord:
    folder = root / "runs" / f"{spec}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    suite = {part: {task: {"x": seed} for task in tasks} for part in ("options", "seconds", "summary")}
    made = RunRecord(spec, seed, "micro", folder, 10, 10, 1.0, 1.0, 2.0 + seed, 3.0, suite)
    write_json(folder / EVALUATION_JSON, made.to_json(folder))
    return made


def provenance(**comparison) -> dict:
    return {
        "preset": "micro",
        "training": {"seed": 0},
        "data": {"data": None},
        "comparison": {
            "variants": ["diff", "softmax"],
            "seeds": [0],
            "tasks": None,
            "test_blocks": 256,
            **comparison,
        },
    }


def earlier(root: Path, records, points=(), **comparison) -> None:
    results = {"provenance": provenance(**comparison), "runs": [r.to_json(root) for r in records]}
    if points:
        results["learning_rates"] = {"sweep": [point.__dict__ for point in points]}
    write_json(root / RESULTS_JSON, results)


def test_a_variant_added_to_a_comparison_reports_beside_the_earlier_ones(tmp_path):
    first = [record(tmp_path, "diff", 0), record(tmp_path, "softmax", 0)]
    point = SweepPoint("diff", "micro", 1e-3, 0, 6, 6, 5.0, False)
    earlier(tmp_path, first, [point])
    added = [record(tmp_path, "diff_v2", 0)]
    extended = extend_earlier(
        tmp_path, provenance(variants=["diff_v2"]), added, [], parse_variants("diff_v2")
    )
    assert extended.folder == tmp_path and extended.beside is None
    assert [r.variant for r in extended.records] == ["diff", "softmax", "diff_v2"]
    assert [v.spec() for v in extended.variants] == ["diff", "softmax", "diff_v2"] and extended.points == [
        point
    ]
    # A rerun of the same runs reads each run again from its folder, this invocation's record winning.
    again = [record(tmp_path, "diff", 0)]
    assert len(extend_earlier(tmp_path, provenance(), again, [], parse_variants("diff")).records) == 2


def test_a_narrower_rerun_writes_its_report_beside_the_earlier_one(tmp_path):
    earlier(tmp_path, [record(tmp_path, "diff", 0), record(tmp_path, "softmax", 0)])
    fewer_tasks = [record(tmp_path, v, 0, tasks=("outliers",)) for v in ("diff", "softmax")]
    narrower = extend_earlier(
        tmp_path, provenance(tasks=["outliers"]), fewer_tasks, [], parse_variants("diff,softmax")
    )
    assert narrower.folder.parent == tmp_path / "reports" and "the tasks quant" in narrower.beside
    assert narrower.records == fewer_tasks
    # Other settings and a superset of the earlier runs and tasks: the report is replaced, not narrowed.
    more = [record(tmp_path, v, 0, tasks=("outliers", "quant", "longctx")) for v in ("diff", "softmax")]
    wider = extend_earlier(tmp_path, provenance(tasks=["outliers", "quant", "longctx"]), more, [],
                           parse_variants("diff,softmax"))  # fmt: skip
    assert wider.folder == tmp_path and wider.beside is None
    (tmp_path / RESULTS_JSON).write_text("{not json")
    unreadable = extend_earlier(tmp_path, provenance(), more, [], parse_variants("diff,softmax"))
    assert unreadable.beside and "cannot be read" in unreadable.beside


def test_a_comparison_grown_by_seeds_extends_a_report_written_as_json_and_older_than_a_setting(tmp_path):
    from difftransformer.compare.settings import ComparisonSettings

    def settings(seeds, **more) -> dict:
        comparison = ComparisonSettings(variants=parse_variants("diff,softmax"), seeds=seeds, **more)
        return {"preset": "micro", "training": {"seed": 0}, "data": {}, "comparison": comparison.to_json()}

    written = settings((0,))
    # The needles default is a tuple of pairs, which results.json reads back as lists; rate_choice came later.
    assert isinstance(written["comparison"]["needles"], tuple)
    del written["comparison"]["rate_choice"]
    first = [record(tmp_path, "diff", 0), record(tmp_path, "softmax", 0)]
    write_json(tmp_path / RESULTS_JSON, {"provenance": written, "runs": [r.to_json(tmp_path) for r in first]})
    grown = [record(tmp_path, "diff", 1), record(tmp_path, "softmax", 1)]
    extended = extend_earlier(tmp_path, settings((1,)), grown, [], parse_variants("diff,softmax"))
    assert extended.beside is None and len(extended.records) == 4
    chosen_otherwise = settings((1,), learning_rates=(1e-3,), rate_choice="learned_recall")
    assert extend_earlier(tmp_path, chosen_otherwise, grown, [], parse_variants("diff,softmax")).beside


def test_an_older_results_json_of_a_copied_or_moved_folder_names_its_runs_where_they_are_now(tmp_path):
    """results.json files written before folders were relative name runs absolutely: a copy, or a move, of the
    comparison folder reads each run once, in its new place, and never a run outside it (the sweep report's defect
    1: a copy held 8 runs for a 4-run grid, half of them read from the source)."""
    source = tmp_path / "a"
    made = [record(source, spec, seed) for seed in (0, 1) for spec in ("diff", "softmax")]
    outside = record(tmp_path / "elsewhere", "diff", 2)
    absolute = [{**r.to_json(r.folder), "folder": str(r.folder)} for r in [*made, outside]]
    write_json(source / RESULTS_JSON, {"provenance": provenance(output_dir=str(source)), "runs": absolute})
    shutil.copytree(source, tmp_path / "b")
    copy = tmp_path / "b"
    rerun = [record(copy, spec, seed) for seed in (0, 1) for spec in ("diff", "softmax")]
    extended = extend_earlier(
        copy, provenance(output_dir=str(copy)), rerun, [], parse_variants("diff,softmax")
    )
    assert sorted(r.folder for r in extended.records) == sorted(r.folder for r in rerun)
    assert not extended.earlier
    shutil.move(source, tmp_path / "c")
    moved = tmp_path / "c"
    one = [record(moved, "diff", 0)]
    extended = extend_earlier(moved, provenance(output_dir=str(moved)), one, [], parse_variants("diff"))
    assert sorted(r.folder for r in extended.records) == sorted(moved / "runs" / f"{spec}-seed{seed}"
                                                                for seed in (0, 1) for spec in ("diff", "softmax"))  # fmt: skip
    assert extended.earlier == {
        moved / "runs" / name for name in ("softmax-seed0", "diff-seed1", "softmax-seed1")
    }
