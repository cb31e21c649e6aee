"""A report as a list of blocks (headings, paragraphs, tables, images), rendered to Markdown and to HTML, and the
table cell for values across seeds."""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from difftransformer.stats import mean, spread
from difftransformer.storage import atomic_write


@dataclass
class Report:
    """A titled document built block by block (:meth:`heading`, :meth:`paragraph`, :meth:`table`, :meth:`image`)
    and written as report.md and report.html (:meth:`write`); images are files beside it, named relatively."""

    title: str
    blocks: list[tuple[str, object]] = field(default_factory=list)

    def heading(self, text: str) -> None:
        """A section heading."""
        self.blocks.append(("heading", text))

    def paragraph(self, text: str) -> None:
        """A paragraph of plain text."""
        self.blocks.append(("paragraph", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        """A table of text cells under ``header``."""
        self.blocks.append(("table", (header, rows)))

    def image(self, filename: str, caption: str) -> None:
        """An image file (relative to the report's folder) with its caption."""
        self.blocks.append(("image", (filename, caption)))

    def markdown(self) -> str:
        """The report as Markdown."""
        lines = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "heading":
                lines += [f"## {value}", ""]
            elif kind == "paragraph":
                lines += [value, ""]
            elif kind == "table":
                header, rows = value
                lines.append("| " + " | ".join(header) + " |")
                lines.append("|" + "|".join("---" for _ in header) + "|")
                lines += ["| " + " | ".join(row) + " |" for row in rows]
                lines.append("")
            else:
                filename, caption = value
                lines += [f"![{caption}]({filename})", ""]
        return "\n".join(lines)

    def html(self) -> str:
        """The report as one self-contained HTML page (images linked)."""
        body = [f"<h1>{html.escape(self.title)}</h1>"]
        for kind, value in self.blocks:
            if kind == "heading":
                body.append(f"<h2>{html.escape(value)}</h2>")
            elif kind == "paragraph":
                body.append(f"<p>{html.escape(value)}</p>")
            elif kind == "table":
                header, rows = value
                cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
                trs = "".join(
                    "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
                )
                body.append(f"<table><thead><tr>{cells}</tr></thead><tbody>{trs}</tbody></table>")
            else:
                filename, caption = value
                body.append(
                    f'<figure><img src="{html.escape(filename)}" alt="{html.escape(caption)}">'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>"
                )
        style = (
            "body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #bbb;padding:.3em .6em;text-align:right}img{max-width:100%}"
        )
        return (
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
        )

    def write(self, folder: str | os.PathLike) -> tuple[Path, Path]:
        """Write report.md and report.html into ``folder`` atomically; returns their paths."""
        folder = Path(folder)
        return atomic_write(folder / "report.md", self.markdown()), atomic_write(
            folder / "report.html", self.html()
        )


def mean_spread(values: Sequence[float | None], digits: int = 3) -> str:
    """'m' for one value, 'm ± s' (sample standard deviation) for several, '-' for none. A value that is not a
    finite number (NaN or None: a diverged run, NaN weights; results.json holds NaN as null) is left out and
    counted: 'm (1 of 2 not finite)', or 'not finite' when none is."""
    numbers = [value for value in values if value is not None and math.isfinite(value)]
    if not numbers:
        return "not finite" if values else "-"
    text = f"{mean(numbers):.{digits}f}"
    if len(numbers) > 1:
        text += f" ± {spread(numbers):.{digits}f}"
    missing = len(values) - len(numbers)
    return f"{text} ({missing} of {len(values)} not finite)" if missing else text
