"""compare's report: :func:`~.build.build_report` assembles it from its sections, one module each, every one taking
the runs grouped by arm (:mod:`.arms`, where an arm's name is made); the paper's claims (:mod:`.claims`) are judged
by one rule (:mod:`.verdict`); :mod:`.document` renders it as Markdown and HTML."""

from difftransformer.compare.report.build import build_report, provenance_line
from difftransformer.compare.report.claims_table import claims_section, verdict_sentences
from difftransformer.compare.report.harness import harness_section
from difftransformer.compare.report.lambda_traces import lambda_section

__all__ = [
    "build_report",
    "claims_section",
    "harness_section",
    "lambda_section",
    "provenance_line",
    "verdict_sentences",
]
