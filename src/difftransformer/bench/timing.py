"""Interleaved timing: contenders take turns, so load from other processes and machine drift hit all alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from difftransformer.errors import UsageError


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (a no-op on CPU), so wall time covers the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of wall time one call of ``fn`` takes, queued device work included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def rotated(names: list[str], turn: int) -> list[str]:
    """``names`` starting at position ``turn`` (cyclically). A call runs after whatever ran before it evicted the
    CPU caches; in a fixed order one contender would always follow the same other one (DIFF followed DiffLlama,
    the largest), so the order turns and each follows every other equally often."""
    start = turn % len(names)
    return names[start:] + names[:start]


def interleaved_medians(
    contenders: dict[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int,
    device: torch.device,
    desc: str,
) -> dict[str, dict[str, float | list[float]]]:
    """Run each callable ``warmup`` times, then ``repeats`` rounds of one call each, in turn (the order rotating
    from round to round, :func:`rotated`).

    Returns, per contender, ``{"median_s": ..., "runs_s": [...]}`` (seconds of wall time per call).
    """
    if repeats < 1 or warmup < 0:
        raise UsageError(f"repeats must be >= 1 and warmup >= 0; got repeats={repeats}, warmup={warmup}")
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    runs: dict[str, list[float]] = {name: [] for name in contenders}
    for round_index in tqdm(range(repeats), desc=desc, unit="round", leave=False):
        for name in rotated(list(contenders), round_index):
            runs[name].append(timed_call(contenders[name], device))
    return {name: {"median_s": statistics.median(r), "runs_s": r} for name, r in runs.items()}


def interleaved_steps(
    contenders: dict[str, tuple[Callable[[], object], Callable[[], object]]],
    *,
    steps: int,
    repeats: int,
    warmup: int,
    device: torch.device,
    desc: str,
) -> dict[str, dict[str, float | list[float]]]:
    """For work done in many short steps (a decode): each contender is ``(setup, step)``. A round runs every
    ``setup`` untimed, then ``steps`` turns in which each contender times one ``step`` (the order rotating from
    turn to turn, :func:`rotated`); its figure for the round
    is the sum of its step times. Taking turns step by step rather than run by run keeps drift on a timescale of
    seconds out of the ratios (measured: round-to-round DIFF/baseline decode ratios spread over 0.89-1.11 when a
    round ran each contender's whole decode in one go, 0.99-1.03 with turns per step). The first ``warmup``
    rounds are dropped.

    Returns, per contender, ``{"median_s": ..., "runs_s": [...]}`` (seconds of step time per round).
    """
    if repeats < 1 or warmup < 0 or steps < 1:
        raise UsageError(
            f"steps and repeats must be >= 1 and warmup >= 0; got steps={steps}, repeats={repeats}, warmup={warmup}"
        )
    runs: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in tqdm(range(warmup + repeats), desc=desc, unit="round", leave=False):
        for setup, _ in contenders.values():
            setup()
        totals = dict.fromkeys(contenders, 0.0)
        for turn in range(steps):
            for name in rotated(list(contenders), turn):
                totals[name] += timed_call(contenders[name][1], device)
        for name, total in totals.items():
            runs[name].append(total)
    runs = {name: r[warmup:] for name, r in runs.items()}
    return {name: {"median_s": statistics.median(r), "runs_s": r} for name, r in runs.items()}
