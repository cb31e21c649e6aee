"""Each arm's learning rate: where each sweep run ended (:func:`sweep_point`), the rate every arm chooses from them
(:func:`best_rates`), and the runs at a chosen rate (:func:`at_rates`). The report's learning-rate section draws
what these chose (:mod:`difftransformer.compare.report.learning_rates`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from difftransformer.compare.plan import PlannedRun
from difftransformer.compare.records import RunRecord, SweepPoint, learned_recall
from difftransformer.compare.settings import RateChoice
from difftransformer.storage import read_json
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.runner import METRICS_CSV, SUMMARY_JSON

Arm = tuple[str, str]  # (scale, variant spec)


def sweep_point(run: PlannedRun) -> SweepPoint:
    """Where a sweep run ended: its last validation loss and step (from train_summary.json when it finished,
    else from metrics.csv: early stopping ended it)."""
    if (run.folder / SUMMARY_JSON).is_file():
        summary = read_json(run.folder / SUMMARY_JSON)
        loss, step, stopped = summary["final_eval_loss"], summary["global_step"], False
    else:
        steps, losses = column(read_metrics(run.folder / METRICS_CSV), "eval_loss")
        loss, step, stopped = (losses[-1], steps[-1], True) if losses else (math.nan, 0, True)
    return SweepPoint(
        variant=run.variant.spec(),
        scale=run.scale,
        learning_rate=run.learning_rate,
        seed=run.seed,
        steps=run.max_steps,
        step=step,
        validation_loss=math.nan if loss is None else loss,
        stopped_early=stopped,
        learned_recall=learned_recall(run.folder),
    )


def best_rates(points: Sequence[SweepPoint], rate_choice: RateChoice = "validation_loss") -> dict[Arm, float]:
    """Each arm's rate with the lowest validation loss among its sweep runs that reached their last step (the
    lower rate on a tie); with ``rate_choice="learned_recall"``, among those whose recall probe reached 0.9, where
    any of the arm's did. An arm none of whose runs finished with a loss has no rate."""
    finished = [p for p in points if not p.stopped_early and not math.isnan(p.validation_loss)]
    learned = {p.arm for p in finished if p.learned_recall}
    best: dict[Arm, tuple[float, float]] = {}
    for point in finished:
        if rate_choice == "learned_recall" and point.arm in learned and not point.learned_recall:
            continue
        candidate = (point.validation_loss, point.learning_rate)
        best[point.arm] = min(best.get(point.arm, candidate), candidate)
    return {arm: rate for arm, (_, rate) in best.items()}


def at_rates(records: Sequence[RunRecord], rates: Mapping[Arm, float] | float) -> list[RunRecord]:
    """The runs at one rate shared by every arm (a number), or at each arm's own (by (scale, variant spec))."""
    if isinstance(rates, (int, float)):
        return [r for r in records if r.learning_rate is None or r.learning_rate == rates]
    return [r for r in records if rates.get((r.scale, r.variant)) == r.learning_rate]
