"""Learning curves of the gap: each DIFF variant's validation loss minus the baseline's, against tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from difftransformer.stats import mean, spread

Curve = Sequence[tuple[int, float]]  # (tokens seen, validation loss)


def gap_curves(
    curves: Mapping[str, Mapping[int, Curve]], baseline: str
) -> dict[str, list[tuple[int, float, float | None]]]:
    """For every variant but ``baseline``: (tokens, mean gap, spread or None) at each evaluation both were run at,
    where the gap of one seed is the variant's validation loss minus the baseline's of the same seed (same data
    order) and mean / spread are taken across the seeds both have."""
    gaps = {}
    for label, by_seed in curves.items():
        if label == baseline:
            continue
        per_tokens: dict[int, list[float]] = {}
        for seed, curve in by_seed.items():
            reference = dict(curves[baseline].get(seed, ()))
            for tokens, loss in curve:
                if tokens in reference:
                    per_tokens.setdefault(tokens, []).append(loss - reference[tokens])
        gaps[label] = [
            (tokens, mean(values), spread(values) if len(values) > 1 else None)
            for tokens, values in sorted(per_tokens.items())
        ]
    return gaps
