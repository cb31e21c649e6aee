"""The report's judgement of the paper's claims: the claims table (one row per claim the runs measured, every
variant against the matched baseline, with the verdict) and one sentence per measure and variant."""

from __future__ import annotations

from collections.abc import Sequence

from difftransformer.compare.report.arms import Arm, at_scale, parameters_differ
from difftransformer.compare.report.claims import (
    LOSS_CLAIM,
    Claim,
    judge_claim,
    judge_ratio,
    matching_ratios,
    task_claims,
    training_claims,
)
from difftransformer.compare.report.document import Report, mean_spread
from difftransformer.compare.report.scaling import size_name
from difftransformer.compare.report.verdict import AT_CHANCE, RULE
from difftransformer.eval import paper


def _claim_name(claim: Claim, unequal: bool) -> str:
    """The claim's name; the loss claim says "equal tokens" alone where parameter counts differ."""
    if claim is LOSS_CLAIM and unequal:
        return claim.name.replace("equal parameters and tokens", "equal tokens; parameters differ (above)")
    return claim.name


def claims_section(
    report: Report,
    arms: Sequence[Arm],
    scale: str,
    by: str | None,
    heading: str = "The paper's claims, as measured here",
) -> None:
    """The claims table: one row per claim of the paper the runs measured (at ``scale``; the scaling rows when
    ``by`` is "parameters" or "tokens", over every scale), for every other variant's arm against the matched
    baseline's."""
    report.heading(heading)
    baseline, others = at_scale(arms, scale)
    if baseline is None or not others:
        report.paragraph(
            "No claim is judged: the comparison needs the matched baseline (softmax) and at least one DIFF variant."
        )
        return
    seeds = baseline.seeds
    report.paragraph(
        f"Ours: {others[0].runs[0].parameters:,} parameters ({others[0].variant.label}) and "
        f"{baseline.runs[0].parameters:,} ({baseline.variant.label}), {baseline.runs[0].tokens:,} training tokens, "
        f"{len(seeds)} seed(s) {seeds}"
        + (f", scale {scale}" if len({arm.scale for arm in arms}) > 1 else "")
        + ". Values are mean ± sample standard deviation across seeds. "
        + RULE
    )
    unequal = parameters_differ(baseline, others)
    header = ["claim", "the paper"]
    for arm in others:
        header += [f"ours: {arm.variant.label} vs {baseline.variant.label}", "verdict"]
    measured = [*baseline.runs, *(run for arm in others for run in arm.runs)]
    rows = []
    for claim in [*training_claims(measured), *task_claims(measured)]:
        judgements = [judge_claim(claim, arm.runs, baseline.runs) for arm in others]
        # What chance is, said once in the row, where a verdict cell says "not measurable here".
        at_chance = any(j is not None and j.verdict.word == AT_CHANCE for j in judgements)
        name = _claim_name(claim, unequal)
        row = [f"{name} (chance: {claim.chance})" if at_chance and claim.chance else name, claim.paper]
        for arm, judgement in zip(others, judgements):
            row += (
                ["-", "-"]
                if judgement is None
                else [judgement.values_text(claim.digits, arm.variant.label, baseline.variant.label),
                      judgement.verdict.word]
            )  # fmt: skip
        rows.append(row)
        if claim is LOSS_CLAIM and by is not None:
            rows.append(_scaling_row(arms, baseline, others, by))
    report.table(header, rows)


def _scaling_row(arms: Sequence[Arm], baseline: Arm, others: Sequence[Arm], by: str) -> list[str]:
    """The row of how much of the baseline's size each variant needs for its loss, from every scale's runs."""
    records = [run for arm in arms for run in arm.runs]
    name = f"{size_name(records, by)} DIFF needs for the baseline's loss (share, power-law fits per seed)"
    row = [name, paper.PARAMETERS if by == "parameters" else paper.TOKENS]
    for arm in others:
        spec = arm.variant.spec()
        judgement = judge_ratio(matching_ratios(records, spec, baseline.variant.spec(), by))
        row += (
            ["-", "-"]
            if judgement is None
            else [
                f"{arm.variant.label} {mean_spread(judgement.values, 2)} of {baseline.variant.label}'s",
                str(judgement.verdict),
            ]
        )
    return row


def verdict_sentences(arms: Sequence[Arm], scale: str) -> list[str]:
    """One sentence per measure (test loss, then every task measure, with or without a claim of the paper) and
    other variant at ``scale``: both values and the verdict under the rule."""
    baseline, others = at_scale(arms, scale)
    if baseline is None:
        return ["No verdicts: the comparison has no matched baseline (softmax)."]
    unequal = parameters_differ(baseline, others)
    measured = [*baseline.runs, *(run for arm in others for run in arm.runs)]
    sentences = []
    for claim in [*training_claims(measured), *task_claims(measured, with_paper_only=False)]:
        for arm in others:
            judgement = judge_claim(claim, arm.runs, baseline.runs)
            if judgement is not None:
                name = _claim_name(claim, unequal)
                values = judgement.values_text(claim.digits, arm.variant.label, baseline.variant.label)
                sentences.append(f"{name[0].upper()}{name[1:]}: {values}, {judgement.verdict_text()}.")
    return sentences
