"""DIFF against its matched Transformer: train every variant alike, run the evaluation suite on each, write a report
with tables, plots and a verdict, and fit scaling laws. The only package that uses both ``train`` and ``eval``;
``difftransformer compare`` (``cli``) drives it."""

from difftransformer.compare.comparison import run_comparison
from difftransformer.compare.records import RunRecord
from difftransformer.compare.report.document import Report, mean_spread
from difftransformer.compare.report.scaling import PowerLaw, fit_power_law, matching_ratio
from difftransformer.compare.settings import ComparisonSettings

__all__ = [
    "ComparisonSettings",
    "PowerLaw",
    "Report",
    "RunRecord",
    "fit_power_law",
    "matching_ratio",
    "mean_spread",
    "run_comparison",
]
