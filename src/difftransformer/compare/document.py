"""The report document at its earlier import path; it lives in :mod:`difftransformer.compare.report.document`."""

from difftransformer.compare.report.document import Report, mean_spread

__all__ = ["Report", "mean_spread"]
