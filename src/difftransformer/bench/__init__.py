"""`difftransformer bench`: DIFF against its matched baseline and DiffLlama, interleaved in one process."""

from difftransformer.bench.check import check_backends
from difftransformer.bench.report import format_table, load_json, plot_ratios, ratio_row
from difftransformer.bench.timing import interleaved_medians, interleaved_steps
from difftransformer.bench.workloads import (
    BenchShape,
    GreedyDecode,
    build_models,
    op_contenders,
    state_bytes,
    step_peak_bytes,
    train_step_fn,
)

__all__ = [
    "BenchShape",
    "GreedyDecode",
    "build_models",
    "check_backends",
    "format_table",
    "interleaved_medians",
    "interleaved_steps",
    "load_json",
    "op_contenders",
    "plot_ratios",
    "ratio_row",
    "state_bytes",
    "step_peak_bytes",
    "train_step_fn",
]
