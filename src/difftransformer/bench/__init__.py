"""`difftransformer bench`: DIFF against its matched baseline and DiffLlama, and every other attention kind against
the same baseline beside its FLOP ratio, interleaved in one process; `make bench-check` (``regression``) compares
such a run with the figures committed for this CPU."""

from difftransformer.bench.check import check_backends
from difftransformer.bench.machine import cpu_model, environment
from difftransformer.bench.report import format_kinds_table, format_table, load_json, plot_ratios, ratio_row
from difftransformer.bench.sections import measure
from difftransformer.bench.timing import interleaved_medians, interleaved_steps
from difftransformer.bench.workloads import (
    BenchShape,
    GreedyDecode,
    bench_configs,
    build_models,
    op_contenders,
    state_bytes,
    step_peak_bytes,
    train_step_fn,
)

__all__ = [
    "BenchShape",
    "GreedyDecode",
    "bench_configs",
    "build_models",
    "check_backends",
    "cpu_model",
    "environment",
    "format_kinds_table",
    "format_table",
    "interleaved_medians",
    "interleaved_steps",
    "load_json",
    "measure",
    "op_contenders",
    "plot_ratios",
    "ratio_row",
    "state_bytes",
    "step_peak_bytes",
    "train_step_fn",
]
