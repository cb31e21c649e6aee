"""The report's section on DIFF's lambda during training: each layer's lambda (DIFF V1) or sigmoid(lambda) (DIFF V2)
as the runs' metrics.csv traced it, beside the training loss, and a table of the last values."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from difftransformer.compare.records import RunRecord
from difftransformer.compare.report.arms import Arm, group
from difftransformer.compare.report.curves import colors, run_curve
from difftransformer.compare.report.document import Report, mean_spread
from difftransformer.compare.variants import Variant
from difftransformer.plotting import pyplot, save_figure
from difftransformer.train.callbacks import read_metrics
from difftransformer.train.runner import METRICS_CSV
from difftransformer.train.traces import is_trace_column

LAMBDA_PNG = "lambda_traces.png"


def _trace_layers(record: RunRecord) -> tuple[str, list[int]]:
    """(kind, layer indices) of a run's lambda columns: "v1" (lambda), "v2" (mean and spread of sigmoid(lambda))
    or "" for a run without any (the baseline, or a run trained before the traces)."""
    rows = read_metrics(record.folder / METRICS_CSV)
    names = [name for name in (rows[0] if rows else {}) if is_trace_column(name)]
    v2 = [name for name in names if name.startswith("lambda_mean_layer_")]
    if v2:
        return "v2", sorted(int(name.rsplit("_", 1)[1]) for name in v2)
    return ("v1", sorted(int(name.rsplit("_", 1)[1]) for name in names)) if names else ("", [])


def lambda_section(
    report: Report, records: Sequence[RunRecord], variants: Sequence[Variant], out: Path
) -> None:
    """:func:`traces_section` of ``records`` grouped by arm (for callers that hold the records)."""
    traces_section(report, group(records, variants), out)


def traces_section(report: Report, arms: Sequence[Arm], out: Path) -> None:
    """DIFF's lambda per layer during training (metrics.csv's traces) beside the training loss, every run of
    ``arms`` overlaid, and a table of the final values per arm; nothing when no run logged traces."""
    traced = {(arm.name, record.seed): _trace_layers(record) for arm in arms for record in arm.runs}
    layers = sorted({layer for _, indices in traced.values() for layer in indices})
    if not layers:
        return
    plt = pyplot()
    figure, axes = plt.subplots(1, 1 + len(layers), figsize=(5.5 * (1 + len(layers)), 4.5), squeeze=False)
    color = colors(arms)
    for arm in arms:
        for record in arm.runs:
            name, line = f"{arm.name} s{record.seed}", color[arm.variant.spec()]
            axes[0][0].plot(*run_curve(record, "loss"), color=line, lw=1, alpha=0.7, label=name)
            kind, indices = traced[(arm.name, record.seed)]
            for axis, layer in zip(axes[0][1:], layers):
                if layer not in indices:
                    continue
                if kind == "v1":
                    axis.plot(*run_curve(record, f"lambda_layer_{layer}"), color=line, lw=1, label=name)
                    continue
                tokens, means = run_curve(record, f"lambda_mean_layer_{layer}")
                spreads = run_curve(record, f"lambda_std_layer_{layer}")[1]
                axis.plot(tokens, means, color=line, lw=1, ls="--", label=name)
                axis.fill_between(tokens, [m - s for m, s in zip(means, spreads)],
                                  [m + s for m, s in zip(means, spreads)], color=line, alpha=0.08)  # fmt: skip
    axes[0][0].set(xlabel="training tokens", ylabel="loss", title="training loss")
    for axis, layer in zip(axes[0][1:], layers):
        axis.set(xlabel="training tokens", ylabel="lambda", title=f"lambda, layer {layer}")
    for axis in axes[0]:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    save_figure(figure, out / LAMBDA_PNG)
    header = ["variant", *(f"layer {layer}" for layer in layers)]
    rows = []
    for arm in arms:
        kind = traced[(arm.name, arm.runs[0].seed)][0]
        if not kind:
            continue
        name = "lambda_layer_{}" if kind == "v1" else "lambda_mean_layer_{}"
        # A run shorter than its logging steps logged no value: its cell says so ("-").
        finals = [
            [values[-1] for r in arm.runs if (values := run_curve(r, name.format(layer))[1])]
            for layer in layers
        ]
        row_label = arm.name + (" (mean sigmoid(lambda))" if kind == "v2" else "")
        rows.append([row_label, *(mean_spread(values, 3) for values in finals)])
    report.heading("lambda during training")
    report.paragraph(
        "DIFF V1's lambda (one scalar a layer, exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + "
        "lambda_init) and DIFF V2's per-token, per-head sigmoid(lambda) (dashed: its mean over the training "
        "tokens between two logging steps, the band ± its standard deviation over those tokens and heads), "
        "beside the training loss; from each run's metrics.csv. The table gives the last logged value, mean ± "
        "spread across seeds"
        + (
            "."
            if any(cell != "-" for row in rows for cell in row[1:])
            else "; no run logged lambda (each ended before its first logging step: `logging_steps`)."
        )
    )
    report.table(header, rows)
    report.image(LAMBDA_PNG, "lambda per layer during training, beside the training loss")
