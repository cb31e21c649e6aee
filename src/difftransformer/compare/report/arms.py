"""The runs of a report grouped by arm (one variant at one scale), and the one place an arm's name is made: every
table row, plot legend and sentence of the report that speaks of an arm takes it from here."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from difftransformer.compare.records import RunRecord
from difftransformer.compare.variants import Variant

# A variant's parameter count that differs from its baseline's by more than this share is not "equal parameters".
UNEQUAL_PARAMETERS = 0.05


def arm_name(variant: Variant, scale: str, scales: Collection[str]) -> str:
    """How the report names an arm: the variant's label, with its scale where the report holds several."""
    return variant.label + (f" {scale}" if len(scales) > 1 else "")


@dataclass(frozen=True)
class Arm:
    """One variant at one scale: its report name and its runs, in seed order."""

    variant: Variant
    scale: str
    name: str
    runs: tuple[RunRecord, ...]

    @property
    def seeds(self) -> list[int]:
        return [run.seed for run in self.runs]


def group(records: Sequence[RunRecord], variants: Sequence[Variant]) -> list[Arm]:
    """Every arm that has runs among ``records``, scale by scale (in the records' order), variant by variant (in
    the order of ``variants``)."""
    scales = list(dict.fromkeys(record.scale for record in records))
    arms = []
    for scale in scales:
        for variant in variants:
            runs = sorted(
                (r for r in records if r.scale == scale and r.variant == variant.spec()), key=lambda r: r.seed
            )
            if runs:
                arms.append(Arm(variant, scale, arm_name(variant, scale, scales), tuple(runs)))
    return arms


def at_scale(arms: Sequence[Arm], scale: str) -> tuple[Arm | None, list[Arm]]:
    """(the matched baseline's arm or None, every other variant's arm) at ``scale``."""
    here = [arm for arm in arms if arm.scale == scale]
    baseline = next((arm for arm in here if arm.variant.is_baseline), None)
    return baseline, [arm for arm in here if not arm.variant.is_baseline]


def parameters_differ(baseline: Arm, others: Sequence[Arm]) -> bool:
    """Whether any variant's parameter count differs from the baseline's by more than :data:`UNEQUAL_PARAMETERS`
    (upcycled models, a variant that changes the shape)."""
    reference = baseline.runs[0].parameters
    return any(abs(arm.runs[0].parameters / reference - 1) > UNEQUAL_PARAMETERS for arm in others)
