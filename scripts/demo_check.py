"""Does the README's demo table still say what `make demo` measures? (`make demo-check` runs it after a fresh demo.)

The README's demo table sits between the markers ``<!-- demo claims -->`` and ``<!-- /demo claims -->``: rows of a
compare report's claims table with its "the paper" column left out (claim, DIFF vs Transformer, verdict). Every row
there must be, cell for cell, a row of the claims table of REPORT (runs/demo/report.md); the script lists each row
that differs or is gone and exits 1, else says how many rows agree. ``--print`` prints the report's rows in the
README's form instead (what to paste after a change that moves the numbers).

Usage: python scripts/demo_check.py REPORT README [--print]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

START, END = "<!-- demo claims -->", "<!-- /demo claims -->"
CLAIMS_HEADING = "## The paper's claims, as measured here"


def table_rows(lines: list[str]) -> list[list[str]]:
    """The cells of each row of the first Markdown table in ``lines``, header and separator left out."""
    rows, started = [], False
    for line in lines:
        if line.startswith("|"):
            started = True
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif started:
            break
    return [row for row in rows[1:] if not all(set(cell) <= set("-: ") for cell in row)]


def report_rows(report: str) -> list[list[str]]:
    """The report's claims table as the README shows it: claim, DIFF vs Transformer, verdict."""
    lines = report.splitlines()
    if CLAIMS_HEADING not in lines:
        raise SystemExit(f"the report has no claims table ({CLAIMS_HEADING!r})")
    rows = table_rows(lines[lines.index(CLAIMS_HEADING) :])
    return [[row[0], *row[2:4]] for row in rows]


def readme_rows(readme: str) -> list[list[str]]:
    """The rows of the README's demo table, between :data:`START` and :data:`END`."""
    if START not in readme or END not in readme:
        raise SystemExit(f"the README has no demo table between {START} and {END}")
    return table_rows(readme.split(START, 1)[1].split(END, 1)[0].splitlines())


def differences(report: list[list[str]], readme: list[list[str]]) -> list[str]:
    """One line per README row that the report does not hold as it is."""
    measured = {row[0]: row for row in report}
    found = []
    for row in readme:
        if row[0] not in measured:
            found.append(f"{row[0]!r}: not among the report's claims")
        elif row != measured[row[0]]:
            found.append(f"{row[0]!r}: the README says {' | '.join(row[1:])}; the demo measured "
                         f"{' | '.join(measured[row[0]][1:])}")  # fmt: skip
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("readme", type=Path)
    parser.add_argument("--print", action="store_true", help="print the report's rows in the README's form")
    args = parser.parse_args()
    report = report_rows(args.report.read_text(encoding="utf-8"))
    if args.print:
        print("| claim | DIFF vs Transformer | verdict |\n|---|---|---|")
        print("\n".join(f"| {' | '.join(row)} |" for row in report))
        return 0
    readme = readme_rows(args.readme.read_text(encoding="utf-8"))
    if not readme:
        raise SystemExit("the README's demo table has no rows")
    found = differences(report, readme)
    for line in found:
        print(f"demo-check: {line}", file=sys.stderr)
    if found:
        print(f"demo-check: {len(found)} of {len(readme)} rows of the README's demo table differ from {args.report}; "
              f"`python scripts/demo_check.py {args.report} {args.readme} --print` gives the measured rows",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"demo-check: the README's {len(readme)} demo rows are what {args.report} measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
