"""The recall-against-length section at its earlier import path; it lives in
:mod:`difftransformer.compare.report.lengths`."""

from difftransformer.compare.report.lengths import common_pairs, length_section

__all__ = ["common_pairs", "length_section"]
