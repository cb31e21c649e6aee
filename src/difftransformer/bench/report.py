"""The benchmark's outputs: a ratio table (text), JSON and a PNG of the ratios, written atomically.

DIFF's ratios keep their own columns (over the baseline, over DiffLlama, against the targets); every other kind
benchmarked beside them (GDA, gated attention) gets its cost over the baseline, labelled from its declaration."""

from __future__ import annotations

from pathlib import Path

from difftransformer.errors import UsageError
from difftransformer.models import KINDS
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
    section: str, setting: str, unit: str, values: dict[str, float], lower_is_better: bool = True
) -> dict:
    """One table row: the contenders' values, the ratios DIFF/baseline and DIFF/DiffLlama, and each other kind's
    cost over the baseline (``kinds_over_baseline``).

    Ratios are always expressed as the kind's cost over the other's (time, bytes, or 1 / tokens-per-second), so
    below 1 means the kind is cheaper.
    """

    def cost_ratio(name: str, other: str) -> float | None:
        if name not in values or other not in values:
            return None
        a, b = values[name], values[other]
        return a / b if lower_is_better else b / a

    limit = target_for(section, setting)
    ratio = cost_ratio("diff", "baseline")
    others = [name for name in values if name in KINDS and name not in ("diff", "softmax")]
    return dict(
        section=section,
        setting=setting,
        unit=unit,
        values=values,
        diff_over_baseline=ratio,
        diff_over_diffllama=cost_ratio("diff", "diffllama"),
        kinds_over_baseline={name: cost_ratio(name, "baseline") for name in others},
        target=limit,
        met=None if limit is None or ratio is None else ratio <= limit,
    )


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _kind_columns(rows: list[dict]) -> list[str]:
    """The other kinds the rows hold a ratio of, in the order they first appear."""
    return list(dict.fromkeys(name for row in rows for name in row.get("kinds_over_baseline", {})))


def format_table(rows: list[dict]) -> str:
    """Plain-text table, one line per row; the ratio columns are each kind's cost over the baseline's (and DIFF's
    over DiffLlama's)."""
    kinds = _kind_columns(rows)
    labels = [f"{KINDS[name].label.split()[0]}/base" for name in kinds]
    head = (
        f"{'section':<8} {'setting':<24} {'unit':<9} {'DIFF':>9} {'baseline':>9} {'DiffLlama':>9} "
        f"{'DIFF/base':>9} {'DIFF/DL':>8} {'target':>7}" + "".join(f" {label:>10}" for label in labels)
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        vals = row["values"]
        met = "" if row["met"] is None else (" ok" if row["met"] else " MISS")
        others = row.get("kinds_over_baseline", {})
        lines.append(
            f"{row['section']:<8} {row['setting']:<24} {row['unit']:<9} {_fmt(vals.get('diff')):>9} "
            f"{_fmt(vals.get('baseline')):>9} {_fmt(vals.get('diffllama')):>9} "
            f"{_fmt(row['diff_over_baseline'], '.3f'):>9} {_fmt(row['diff_over_diffllama'], '.3f'):>8} "
            f"{_fmt(row['target'], '.2f'):>7}{f'{met:<5}' if kinds else met}"
            + "".join(f" {_fmt(others.get(name), '.3f'):>10}" for name in kinds)
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
    for name in _kind_columns(shown):
        ratios = [r.get("kinds_over_baseline", {}).get(name) or 0.0 for r in shown]
        bars.append((f"{KINDS[name].label} / baseline", ratios))
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
