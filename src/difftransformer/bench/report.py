"""The benchmark's outputs: two ratio tables (text), JSON and a PNG of the ratios, written atomically.

DIFF's ratios keep their own table (over the baseline, over DiffLlama, against the targets); the kinds table gives
DIFF and every other kind benchmarked beside it (named by its text, ``gda(gda_ratio=3)``) its cost over the
baseline beside its FLOPs over the baseline's, so that "at its floor" (a measured ratio no higher than the FLOP
ratio) reads off one line."""

from __future__ import annotations

from pathlib import Path

from difftransformer.bench.workloads import BASELINE, DIFF, DIFFLLAMA
from difftransformer.errors import UsageError
from difftransformer.storage import atomic_write, read_json

# The project's targets (2 CPU cores, fp32): DIFF / baseline at most this, per (section, setting) prefix.
TARGETS = {("train", ""): 1.05, ("decode", ""): 1.00, ("memory", ""): 1.10}


def target_for(section: str, setting: str) -> float | None:
    """The target ratio for a (section, setting) row, or None where it set none."""
    for (sec, prefix), limit in TARGETS.items():
        if sec == section and setting.startswith(prefix):
            return limit
    return None


def ratio_row(
    section: str,
    setting: str,
    unit: str,
    values: dict[str, float],
    lower_is_better: bool = True,
    flops: dict[str, float] | None = None,
) -> dict:
    """One table row: the contenders' values, the ratios DIFF/baseline and DIFF/DiffLlama, each other kind's cost
    over the baseline (``kinds_over_baseline``) and, given each contender's ``flops`` for the row's work, DIFF's and
    every other kind's FLOPs over the baseline's (``flops_over_baseline``; empty without them).

    Ratios are always expressed as the kind's cost over the other's (time, bytes, or 1 / tokens-per-second), so
    below 1 means the kind is cheaper.
    """

    def cost_ratio(name: str, other: str) -> float | None:
        if name not in values or other not in values:
            return None
        a, b = values[name], values[other]
        return a / b if lower_is_better else b / a

    limit = target_for(section, setting)
    ratio = cost_ratio(DIFF, BASELINE)
    others = [name for name in values if name not in (DIFF, BASELINE, DIFFLLAMA)]
    counted = flops or {}
    return dict(
        section=section,
        setting=setting,
        unit=unit,
        values=values,
        diff_over_baseline=ratio,
        diff_over_diffllama=cost_ratio(DIFF, DIFFLLAMA),
        kinds_over_baseline={name: cost_ratio(name, BASELINE) for name in others},
        flops_over_baseline={
            name: counted[name] / counted[BASELINE]
            for name in counted
            if name != BASELINE and BASELINE in counted
        },
        target=limit,
        met=None if limit is None or ratio is None else ratio <= limit,
    )


def kind_ratios(row: dict) -> dict[str, float]:
    """Every kind's cost over the baseline in ``row``, DIFF's first: {"diff": ..., "gda(gda_ratio=3)": ...}."""
    ratios = {} if row["diff_over_baseline"] is None else {DIFF: row["diff_over_baseline"]}
    return {**ratios, **row.get("kinds_over_baseline", {})}


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: list[dict]) -> str:
    """Plain text: DIFF's table, one line per row (its values, the baseline's and DiffLlama's, DIFF's cost over
    each, the target), then the kinds table (:func:`format_kinds_table`) where the rows hold other kinds or FLOPs."""
    head = (
        f"{'section':<8} {'setting':<24} {'unit':<9} {'DIFF':>9} {'baseline':>9} {'DiffLlama':>9} "
        f"{'DIFF/base':>9} {'DIFF/DL':>8} {'target':>7}"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        vals = row["values"]
        met = "" if row["met"] is None else (" ok" if row["met"] else " MISS")
        lines.append(
            f"{row['section']:<8} {row['setting']:<24} {row['unit']:<9} {_fmt(vals.get(DIFF)):>9} "
            f"{_fmt(vals.get(BASELINE)):>9} {_fmt(vals.get(DIFFLLAMA)):>9} "
            f"{_fmt(row['diff_over_baseline'], '.3f'):>9} {_fmt(row['diff_over_diffllama'], '.3f'):>8} "
            f"{_fmt(row['target'], '.2f'):>7}{met}"
        )
    if any(row.get("kinds_over_baseline") or row.get("flops_over_baseline") for row in rows):
        lines += ["", format_kinds_table(rows)]
    return "\n".join(lines)


def format_kinds_table(rows: list[dict]) -> str:
    """Plain text, one line per (row, kind): the kind's measured cost over the baseline, its FLOPs over the
    baseline's ("-" where the section counts none) and the one over the other (at most 1: at its floor)."""
    specs = [kind for row in rows for kind in kind_ratios(row)]
    width = max(24, *(len(spec) for spec in specs)) if specs else 24
    head = f"{'section':<8} {'setting':<24} {'kind':<{width}} {'measured':>9} {'FLOPs':>7} {'meas/FLOPs':>10}"
    lines = ["each kind over the baseline (cost: time, bytes or 1/tokens-per-second; FLOPs per token)", head,
             "-" * len(head)]  # fmt: skip
    for row in rows:
        counted = row.get("flops_over_baseline", {})
        for kind, measured in kind_ratios(row).items():
            floor = counted.get(kind)
            over = None if floor is None or measured is None else measured / floor
            lines.append(
                f"{row['section']:<8} {row['setting']:<24} {kind:<{width}} {_fmt(measured, '.3f'):>9} "
                f"{_fmt(floor, '.3f'):>7} {_fmt(over, '.3f'):>10}"
            )
    return "\n".join(lines)


def load_json(path: Path) -> dict:
    """Read a results file (written with :func:`difftransformer.storage.write_json`); a missing, corrupt or
    foreign one is refused with its path."""
    try:
        payload = read_json(path)
    except UsageError as err:
        raise UsageError(f"cannot read benchmark results {path}: {err}") from err
    if not isinstance(payload, dict) or "rows" not in payload:
        raise UsageError(f"{path} is not a benchmark results file (no 'rows')")
    return payload


def plot_ratios(path: Path, rows: list[dict], title: str) -> None:
    """Horizontal bars of DIFF/baseline, DIFF/DiffLlama and each other kind's cost over the baseline per row, with
    the targets marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["diff_over_baseline"] is not None]
    labels = [f"{r['section']} {r['setting']}" for r in shown]
    bars = [("DIFF / baseline", [r["diff_over_baseline"] for r in shown])]
    bars.append(("DIFF / DiffLlama", [r["diff_over_diffllama"] or 0.0 for r in shown]))
    for name in dict.fromkeys(name for row in shown for name in row.get("kinds_over_baseline", {})):
        ratios = [r.get("kinds_over_baseline", {}).get(name) or 0.0 for r in shown]
        bars.append((f"{name} / baseline", ratios))
    fig, ax = plt.subplots(figsize=(8, 0.2 * len(bars) * len(shown) + 1.5))
    ys = range(len(shown))
    height = 0.8 / len(bars)
    for index, (label, values) in enumerate(bars):
        offset = (index - (len(bars) - 1) / 2) * height
        ax.barh([y + offset for y in ys], values, height=height, label=label)
    for y, r in zip(ys, shown):
        if r["target"] is not None:
            ax.plot([r["target"]] * 2, [y - 0.45, y + 0.45], color="black", linewidth=2)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.set_xlabel(
        "a kind's cost over the other's (below 1: the kind is cheaper); black ticks: DIFF's targets"
    )
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    try:
        atomic_write(path, lambda handle: fig.savefig(handle, format="png", dpi=120))
    finally:
        plt.close(fig)
