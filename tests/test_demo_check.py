"""scripts/demo_check.py (``make demo-check``): the README's demo rows must be the demo report's claims rows, cell
for cell; a number or verdict that moved, or a claim that is gone, fails with the row named."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "demo_check.py"
_spec = importlib.util.spec_from_file_location("demo_check", SCRIPT)
demo_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo_check)

REPORT = """# DIFF vs Transformer: preset retrieval

## The paper's claims, as measured here

Ours: ...

| claim | the paper | ours: DIFF vs Transformer | verdict |
|---|---|---|---|
| MQAR accuracy, 4 key-value pairs | no MQAR in the paper | DIFF 0.95 [0.92, 0.97] vs Transformer 1.00 [0.99, 1.00] | one seed: spread unknown |
| attention on the queried pair (MQAR) | DIFF 0.27-0.40 vs 0.03-0.09 | DIFF 0.399 [0.36, 0.44] vs Transformer 0.439 [0.40, 0.48] | within sampling noise |

## Setup
"""


def readme(*rows: str) -> str:
    table = "\n".join(["| claim | DIFF vs Transformer | verdict |", "|---|---|---|", *rows])
    return f"# x\n\ntext\n\n{demo_check.START}\n{table}\n{demo_check.END}\n\n| other | table |\n|---|---|\n| a | b |\n"


def test_rows_that_agree_pass_and_each_row_that_moved_is_named():
    report = demo_check.report_rows(REPORT)
    assert report[1] == ["attention on the queried pair (MQAR)",
                         "DIFF 0.399 [0.36, 0.44] vs Transformer 0.439 [0.40, 0.48]", "within sampling noise"]  # fmt: skip
    agree = demo_check.readme_rows(readme("| attention on the queried pair (MQAR) | DIFF 0.399 [0.36, 0.44] vs "
                                          "Transformer 0.439 [0.40, 0.48] | within sampling noise |"))  # fmt: skip
    assert demo_check.differences(report, agree) == []
    stale = demo_check.readme_rows(
        readme(
            "| MQAR accuracy, 4 key-value pairs | DIFF 0.95 [0.92, 0.97] vs Transformer 0.99 [0.98, 1.00] | one "
            "seed: spread unknown |",
            "| MQAR accuracy, 64 key-value pairs | DIFF 0.5 vs Transformer 0.6 | one seed: spread unknown |",
        )
    )
    found = demo_check.differences(report, stale)
    assert len(found) == 2 and "the demo measured DIFF 0.95 [0.92, 0.97] vs Transformer 1.00" in found[0]
    assert "not among the report's claims" in found[1]


def test_the_command_fails_on_a_stale_table_and_prints_the_measured_rows(tmp_path):
    (tmp_path / "report.md").write_text(REPORT)
    (tmp_path / "README.md").write_text(readme("| MQAR accuracy, 4 key-value pairs | DIFF 0.86 vs Transformer 1.00 | "
                                               "one seed: spread unknown |"))  # fmt: skip
    run = [sys.executable, str(SCRIPT), str(tmp_path / "report.md"), str(tmp_path / "README.md")]
    failed = subprocess.run(run, capture_output=True, text=True)
    assert failed.returncode == 1 and "1 of 1 rows of the README's demo table differ" in failed.stderr
    printed = subprocess.run([*run, "--print"], capture_output=True, text=True, check=True).stdout
    (tmp_path / "README.md").write_text(f"{demo_check.START}\n{printed}{demo_check.END}\n")
    assert subprocess.run(run, capture_output=True, text=True).returncode == 0


def test_the_readmes_demo_table_is_marked_and_in_the_reports_form():
    rows = demo_check.readme_rows((ROOT / "README.md").read_text(encoding="utf-8"))
    assert rows and all(len(row) == 3 and " vs Transformer " in row[1] for row in rows), rows
