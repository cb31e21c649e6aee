"""compare's "Recall against context length" section, on planted mqar grids: the table averages the pair counts every
length holds, the figure is written, and runs without a grid leave the section out."""

from __future__ import annotations

from difftransformer.compare.document import Report
from difftransformer.compare.length_curves import common_pairs, length_section

GRID = {
    "64": ["4", "8", "16"],
    "256": ["4", "8", "16", "32", "64"],
    "1024": ["4", "8", "16", "32", "64", "128"],
}


def planted_suite(accuracy: dict[str, float], context: float) -> dict:
    """One run's suite: mqar scored on GRID, accuracy ``accuracy[length]`` falling by 0.01 per doubling of the
    pairs, and ``context`` as its attention on the rest of the context at every length."""
    by_length = {
        length: {pairs: accuracy[length] - 0.01 * i for i, pairs in enumerate(counts)}
        for length, counts in GRID.items()
    }
    allocation = {length: dict(num_pairs=4, answer=0.4, context=context) for length in GRID}
    return {"summary": {"mqar": dict(by_length=by_length, allocation=allocation)}}


def test_length_section_tables_the_common_pairs_and_draws_the_curves(tmp_path):
    groups = [
        ("DIFF", [planted_suite({"64": 0.9, "256": 0.8, "1024": 0.5}, 0.2),
                  planted_suite({"64": 1.0, "256": 0.9, "1024": 0.7}, 0.3)]),
        ("Transformer", [planted_suite({"64": 0.95, "256": 0.7, "1024": 0.2}, 0.5),
                         planted_suite({"64": 0.95, "256": 0.7, "1024": 0.2}, 0.5)]),
    ]  # fmt: skip
    assert common_pairs(groups) == ["4", "8", "16"]
    report = Report("lengths")
    length_section(report, groups, 256, tmp_path)
    text = report.markdown()
    assert "| variant | 64 tokens | 256 tokens | 1024 tokens |" in text
    # Mean over the pairs 4, 8 and 16 (accuracy, -0.01, -0.02) of each seed, then mean ± spread over seeds.
    assert "| DIFF | 0.94 ± 0.07 | 0.84 ± 0.07 | 0.59 ± 0.14 |" in text
    assert "| Transformer | 0.94 ± 0.00 | 0.69 ± 0.00 | 0.19 ± 0.00 |" in text
    assert "trained at 256 tokens" in text and "(4, 8, 16)" in text
    grown = Report("grown")
    length_section(grown, groups, 256, tmp_path, ((0, 64), (3000, 256)))
    assert "trained on rows of 64 tokens from step 0, then 256 tokens from step 3000" in grown.markdown()
    assert (tmp_path / "mqar_length_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_learned_recall_is_counted_only_when_every_run_had_a_probe(tmp_path):
    suite = planted_suite({"64": 0.9, "256": 0.8, "1024": 0.5}, 0.2)
    groups = [("DIFF", [suite, suite, suite]), ("Transformer", [suite, suite, suite])]
    report = Report("counted")
    length_section(report, groups, 256, tmp_path, learned=[[True, False, True], [True, True, True]])
    text = report.markdown()
    assert "| variant | 64 tokens | 256 tokens | 1024 tokens | learned recall |" in text
    assert text.count("| 2 of 3 |") == 1 and text.count("| 3 of 3 |") == 1
    assert "the means include the runs that never did" in text
    unprobed = Report("unprobed")
    length_section(unprobed, groups, 256, tmp_path, learned=[[True, None, True], [True, True, True]])
    assert "learned recall" not in unprobed.markdown() and "| 3 of 3 |" not in unprobed.markdown()


def test_no_section_without_a_grid(tmp_path):
    one_length = {"summary": {"mqar": dict(accuracy={"4": 1.0}, answer_share=0.4, context_share=0.2)}}
    report = Report("no grid")
    length_section(report, [("DIFF", [one_length]), ("Transformer", [one_length])], 64, tmp_path)
    assert report.blocks == [] and not (tmp_path / "mqar_length_curves.png").exists()
    report = Report("no mqar")
    length_section(report, [("DIFF", [{"summary": {"quant": {}}}])], 64, tmp_path)
    assert report.blocks == []
