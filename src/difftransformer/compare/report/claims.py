"""The paper's claims that a comparison measured, each judged by the verdict rule.

A claim is one measure read off every run (test loss, a scaling ratio, or an evaluation task's
:class:`~difftransformer.eval.task.Measure` that names what the paper reports). :func:`judge_claim` compares a DIFF
variant's runs with the matched baseline's, seed by seed, under :mod:`difftransformer.compare.report.verdict`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from difftransformer.compare.records import RunRecord, learned_recall, recall_curve
from difftransformer.compare.report.document import mean_spread
from difftransformer.compare.report.scaling import fit_power_law, matching_ratio
from difftransformer.compare.report.verdict import AT_CHANCE, Verdict, judge
from difftransformer.eval import paper
from difftransformer.eval.registry import get_task, task_names
from difftransformer.stats import Interval, mean_interval
from difftransformer.train.recall import RECALL_THRESHOLD, steps_to_recall


@dataclass(frozen=True)
class Claim:
    """One measured claim: its name, what the paper reports, which way is better, the digits shown, its value in
    one run (None where the run has none), whether one run sits at chance level and what chance is, and the value's
    95% sampling interval in one run (None where the measure or the run has none)."""

    name: str
    paper: str
    higher_is_better: bool
    digits: int
    value: Callable[[RunRecord], float | None]
    at_chance: Callable[[RunRecord], bool] | None = None
    chance: str = ""
    interval: Callable[[RunRecord], Interval | None] | None = None


@dataclass(frozen=True)
class Judgement:
    """A claim judged for one variant against the baseline: the per-seed values of both, the verdict, and each
    run's sampling interval where the measure has them."""

    values: list[float]
    baseline: list[float]
    verdict: Verdict
    chance: str = ""
    intervals: list[Interval | None] | None = None
    baseline_intervals: list[Interval | None] | None = None

    def values_text(self, digits: int, variant_label: str, baseline_label: str) -> str:
        """Both models' values, "DIFF 0.85 [0.81, 0.89] vs Transformer 0.99 [0.96, 1.00]": the mean (± the seed
        spread with several seeds) and the 95% sampling interval of the mean, where the measure has one."""
        return (
            f"{variant_label} {values_with_interval(self.values, self.intervals, digits)} vs {baseline_label} "
            f"{values_with_interval(self.baseline, self.baseline_intervals, digits)}"
        )

    def verdict_text(self) -> str:
        """The verdict, with what chance is when both models sit at it."""
        if self.verdict.word == AT_CHANCE and self.chance:
            return f"{AT_CHANCE} (both at chance: {self.chance})"
        return self.verdict.word


def values_with_interval(values: list[float], intervals: list[Interval | None] | None, digits: int) -> str:
    """'m' or 'm ± s' (the seed spread), then '[low, high]', the 95% sampling interval of the mean, when known."""
    text = mean_spread(values, digits)
    found = mean_interval(values, intervals) if intervals is not None else None
    return text if found is None else f"{text} [{found[0]:.{digits}f}, {found[1]:.{digits}f}]"


LOSS_CLAIM = Claim(
    "language-modelling loss at equal parameters and tokens (test loss)", paper.LOSS, False, 3,
    lambda record: record.test_loss,
)  # fmt: skip


def recall_steps(record: RunRecord) -> float | None:
    """Training steps until the run's MQAR probe first reached ``RECALL_THRESHOLD``; a run that never did counts
    as its full length (the claim's name says so); None for a run trained without recall rows."""
    steps, accuracies = recall_curve(record.folder)
    if not steps:
        return None
    reached = steps_to_recall(steps, accuracies)
    return float(reached if reached is not None else steps[-1])


RECALL_STEPS_CLAIM = Claim(
    f"training steps until MQAR accuracy {RECALL_THRESHOLD} (4 pairs at the block length; never reached: the "
    "run's length)", paper.RETRIEVAL, False, 0, recall_steps,
    at_chance=lambda record: not learned_recall(record.folder),
    chance=f"no run reached {RECALL_THRESHOLD}",
)  # fmt: skip


def training_claims(records: Sequence[RunRecord]) -> list[Claim]:
    """The claims read off training: test loss, and the steps to recall where every run trained with MQAR rows."""
    recall = all(recall_curve(record.folder)[0] for record in records)
    return [LOSS_CLAIM, RECALL_STEPS_CLAIM] if recall else [LOSS_CLAIM]


def task_claims(records: Sequence[RunRecord], with_paper_only: bool = True) -> list[Claim]:
    """A claim for every task measure (only those naming the paper's number, by default), for the tasks every run
    has."""
    claims = []
    first = records[0].suite["summary"]
    for name in task_names():
        if not all(name in record.suite["summary"] for record in records):
            continue
        for measure in get_task(name).measures(first[name]):
            if with_paper_only and not measure.paper:
                continue
            at_chance, interval = None, None
            if measure.at_chance is not None:
                at_chance = lambda record, m=measure, n=name: m.at_chance(record.suite["summary"][n])  # noqa: E731
            if measure.interval is not None:
                interval = lambda record, m=measure, n=name: m.interval(record.suite["summary"][n])  # noqa: E731
            claims.append(
                Claim(
                    measure.name, measure.paper, measure.higher_is_better, measure.digits,
                    lambda record, m=measure, n=name: m.value(record.suite["summary"][n]),
                    at_chance, measure.chance, interval,
                )
            )  # fmt: skip
    return claims


def judge_claim(claim: Claim, runs: Sequence[RunRecord], baseline: Sequence[RunRecord]) -> Judgement | None:
    """``claim`` for a variant's ``runs`` against the baseline's (the same seeds); None where a run lacks it or
    its value is not a number (a diverged run: the tables say which)."""
    values = [claim.value(record) for record in runs]
    reference = [claim.value(record) for record in baseline]
    if not values or not reference or any(v is None or not math.isfinite(v) for v in [*values, *reference]):
        return None
    at_chance = claim.at_chance is not None and all(claim.at_chance(r) for r in [*runs, *baseline])
    intervals = [claim.interval(r) for r in runs] if claim.interval is not None else None
    baseline_intervals = [claim.interval(r) for r in baseline] if claim.interval is not None else None
    verdict = judge(
        values, reference, higher_is_better=claim.higher_is_better, at_chance=at_chance,
        diff_intervals=intervals, baseline_intervals=baseline_intervals,
    )  # fmt: skip
    return Judgement(values, reference, verdict, claim.chance, intervals, baseline_intervals)


def matching_ratios(records: Sequence[RunRecord], variant: str, baseline: str, by: str) -> list[float]:
    """Per seed: the share of the baseline's size (:meth:`RunRecord.size` by ``by``, "parameters" or "tokens") at
    which the power law fitted to ``variant``'s test losses reaches the baseline's fitted loss at its largest scale.
    Seeds with fewer than two scales for either, or a loss that is not a number, are left out."""
    ratios = []
    for seed in sorted({r.seed for r in records}):
        points = {}
        for label in (variant, baseline):
            points[label] = [
                (r.size(by), r.test_loss) for r in records if r.variant == label and r.seed == seed
            ]
        unfit = [len({x for x, _ in pairs}) < 2 or not all(math.isfinite(y) for _, y in pairs)
                 for pairs in points.values()]  # fmt: skip
        if any(unfit):
            continue
        fits = {label: fit_power_law(*zip(*pairs)) for label, pairs in points.items()}
        largest = max(x for x, _ in points[baseline])
        ratios.append(matching_ratio(fits[variant], fits[baseline], largest))
    return ratios


def judge_ratio(ratios: list[float]) -> Judgement | None:
    """The verdict rule on per-seed matching ratios against 1 (below 1: DIFF needs less, as the paper says)."""
    if not ratios:
        return None
    return Judgement(ratios, [1.0], judge(ratios, 1.0, higher_is_better=False))
